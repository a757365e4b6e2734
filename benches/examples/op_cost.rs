//! The cost of one 8-byte PUT on each path, for callgrind: a shm worker
//! connected to itself runs `N` PUTs through the ring (push, submit, one
//! progress round: what `put_lat_8B/ringfence_shm` does per PUT) or with
//! `try_now` (`put_lat_8B/ringfence_shm_now`), inside `ring_puts` or
//! `now_puts`, which `benches/compare/op_cost.sh` gives callgrind to count;
//! or `N` NOPs in batches of 32, each batch pushed, submitted, run by one
//! progress round and reaped (`nop_roundtrip/ringfence/inline`), inside
//! `nop_batches`.
//!
//! ```sh
//! cargo run --release -p ringfence-benches --example op_cost -- ring 100000
//! ```

use ringfence::Worker;
use ringfence_benches::link::Link;
use ringfence_ring::{Cqe, Sqe};
use std::hint::black_box;

/// NOPs per submit, as `nop_roundtrip`.
const BATCH: usize = 32;

/// `n` NOPs (rounded up to whole batches), each checked back.
#[inline(never)]
fn nop_batches(link: &mut Link, n: u64) {
    let mut batch = [Sqe::nop(); BATCH];
    let mut cqes = [Cqe::default(); BATCH];
    let mut done = 0u64;
    while done < n {
        for (k, sqe) in batch.iter_mut().enumerate() {
            *sqe = Sqe::nop().with_user_data(done + k as u64);
        }
        let pushed = link.qp.push_batch(&batch).expect("SQ corrupt");
        assert_eq!(pushed, BATCH, "the SQ has room for a batch");
        link.qp.submit();
        let mut reaped = 0;
        while reaped < BATCH {
            link.qp.progress().expect("queue pair failed");
            let got = link.qp.reap(&mut cqes).expect("CQ corrupt");
            for c in &cqes[..got] {
                assert_eq!((c.user_data, c.res), (done + reaped as u64, 0));
                reaped += 1;
            }
        }
        done += BATCH as u64;
    }
}

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
    nop_batches(&mut link, 1024);
    match path.as_str() {
        "ring" => ring_puts(&mut link, n),
        "now" => now_puts(&mut link, n),
        "nop" => return nop_batches(&mut link, n),
        other => panic!("path: ring, now or nop, not {other}"),
    }
    assert_eq!(window.load_u64(0), n, "the last PUT landed");
}
