//! The cost of one 8-byte PUT on each path, for callgrind: a shm worker
//! connected to itself runs `N` PUTs through the ring (push, submit, one
//! progress round: what `put_lat_8B/ringfence_shm` does per PUT) or with
//! `try_now` (`put_lat_8B/ringfence_shm_now`), inside `ring_puts` or
//! `now_puts`, which `benches/compare/op_cost.sh` gives callgrind to count.
//!
//! ```sh
//! cargo run --release -p ringfence-benches --example op_cost -- ring 100000
//! ```

use ringfence::Worker;
use ringfence_benches::link::Link;
use std::hint::black_box;

/// `n` PUTs through the ring, one progress round each.
#[inline(never)]
fn ring_puts(link: &mut Link, n: u64) {
    for seq in 1..=n {
        link.put_seq(black_box(seq), false);
    }
}

/// `n` PUTs with `try_now`.
#[inline(never)]
fn now_puts(link: &mut Link, n: u64) {
    for seq in 1..=n {
        link.put_seq(black_box(seq), true);
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().unwrap_or_else(|| "ring".into());
    let n: u64 = args.next().map_or(100_000, |n| n.parse().expect("a count"));
    let worker = Worker::builder()
        .driver(ringfence_shm::Shm::new().expect("the shm driver"))
        .ignore_env()
        .build()
        .expect("a worker");
    let window = worker.alloc_registered(4096).expect("a window");
    let ep = worker
        .connect(worker.address())
        .expect("connected to itself");
    let key = worker.pack_rkey(window.handle()).expect("a key");
    let rkey = worker.unpack_rkey(ep, &key).expect("unpacked");
    let mut link = Link::new(worker, ep, rkey, window.addr(), 4096);
    // Warm: the first PUTs fault in the rings and take the slow paths.
    ring_puts(&mut link, 1000);
    now_puts(&mut link, 1000);
    match path.as_str() {
        "ring" => ring_puts(&mut link, n),
        "now" => now_puts(&mut link, n),
        other => panic!("path: ring or now, not {other}"),
    }
    assert_eq!(window.load_u64(0), n, "the last PUT landed");
}
