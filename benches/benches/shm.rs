//! The shm driver between two processes: PUT bandwidth and 8-byte PUT rate
//! through the engine into a peer process's memory, beside a same-run
//! `memcpy` of the same sizes, and the one-way latency of an 8-byte PUT
//! ping-pong.
//!
//! The bench binary re-executes itself as the peer process (the
//! environment variable `RINGFENCE_BENCH_SHM_ROLE` names its role; a
//! socket pair on its standard input carries addresses and keys):
//!
//! - `put_bw` (throughput in bytes) and `put_rate_8B` (elements): the peer
//!   allocates a window (a sealed memfd), sends its address and key, and
//!   then sleeps on its socket: one-sided PUTs need nothing from it. This
//!   process connects, and the bench thread pushes PUTs of one size from a
//!   registered source buffer to offset 0 of the window (cache-resident,
//!   as `ucx_perftest` reuses its buffers), every one with `SKIP_SUCCESS`,
//!   running the worker's progress inline after each submit of up to 32;
//!   one FLUSH at the end of each sample must come back as the only CQE.
//!   `memcpy/<size>` copies between two local buffers of the same size.
//! - `put_lat_8B`: the peer connects back; each round trip is an 8-byte
//!   PUT of a sequence number into the peer's window, which the peer spins
//!   on and answers with a PUT of the same number into ours. The reported
//!   time is half a round trip (one way). `ringfence_shm`: each PUT is
//!   pushed, submitted and run by one progress round; `ringfence_shm_now`:
//!   each PUT goes through `QueuePair::try_now` on both sides (through the
//!   ring when it declines, which the first one after connecting may).
//!
//! Before timing, 1,000 PUTs of a pattern are read back with GET and
//! checked. Both processes busy-poll in the latency group (spinning, then
//! yielding after 4,096 idle spins): on two vCPUs they need both, and a
//! figure taken while anything else runs measures the scheduler.
//!
//! Run: `cargo bench -p ringfence-benches --bench shm`.

use criterion::{BenchmarkId, Criterion, Throughput};
use ringfence::Worker;
use ringfence_benches::link::{Link, pause};
use ringfence_benches::peer::{Peer, recv, send, socket_of_peer};
use ringfence_shm::Shm;
use std::hint::black_box;
use std::io::Read;
use std::os::unix::net::UnixStream;
use std::time::Instant;

const ROLE_ENV: &str = "RINGFENCE_BENCH_SHM_ROLE";
const SIZES: [usize; 4] = [8, 4 << 10, 64 << 10, 1 << 20];

fn worker() -> Worker {
    Worker::builder()
        .driver(Shm::new().expect("shm driver"))
        .ring_entries(256, 512)
        .ignore_env()
        .build()
        .expect("worker")
}

/// Connects to the window whose address, key and base come next on
/// `socket`, with a source buffer of `src_len` bytes.
fn connect(socket: &mut UnixStream, src_len: usize) -> Link {
    let (address, key) = (recv(socket), recv(socket));
    let base = u64::from_le_bytes(recv(socket).try_into().unwrap());
    let worker = worker();
    let ep = worker.connect(&address).unwrap();
    let rkey = worker.unpack_rkey(ep, &key).unwrap();
    Link::new(worker, ep, rkey, base, src_len)
}

fn put_groups(c: &mut Criterion) {
    let mut peer = Peer::spawn(ROLE_ENV, "target");
    let mut link = connect(&mut peer.socket, 2 << 20);
    for len in SIZES {
        link.check(len.min(64 << 10), 1000);
    }

    let mut group = c.benchmark_group("put_bw");
    for len in SIZES {
        group.throughput(Throughput::Bytes(len as u64));
        group.bench_function(BenchmarkId::new("ringfence_shm", len), |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                link.puts(iters, len);
                start.elapsed()
            })
        });
        let src = vec![7u8; len];
        let mut dst = vec![0u8; len];
        group.bench_function(BenchmarkId::new("memcpy", len), |b| {
            b.iter(|| {
                dst.copy_from_slice(black_box(&src));
                black_box(&mut dst);
            })
        });
    }
    group.finish();

    let mut group = c.benchmark_group("put_rate_8B");
    group.throughput(Throughput::Elements(1));
    group.bench_function("ringfence_shm", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            link.puts(iters, 8);
            start.elapsed()
        })
    });
    let src = [7u8; 8];
    let mut dst = [0u8; 8];
    group.bench_function("memcpy", |b| {
        b.iter(|| {
            dst.copy_from_slice(black_box(&src));
            black_box(&mut dst);
        })
    });
    group.finish();
}

fn latency_group(c: &mut Criterion) {
    let mut group = c.benchmark_group("put_lat_8B");
    // Through the ring (push, submit, progress), then with `try_now`.
    for (name, now) in [("ringfence_shm", false), ("ringfence_shm_now", true)] {
        let mut peer = Peer::spawn(ROLE_ENV, if now { "pong-now" } else { "pong" });
        let mut link = connect(&mut peer.socket, 4096);
        // Our window for the answers, for the peer to connect to.
        let window = link.worker.alloc_registered(4096).unwrap();
        send(&mut peer.socket, link.worker.address());
        send(
            &mut peer.socket,
            &link.worker.pack_rkey(window.handle()).unwrap(),
        );
        send(&mut peer.socket, &window.addr().to_le_bytes());
        let mut seq = 0u64;
        let mut round_trip = |link: &mut Link| {
            seq += 1;
            link.put_seq(seq, now);
            let mut spins = 0u64;
            while window.load_u64(0) != seq {
                pause(spins);
                spins += 1;
                if spins.is_multiple_of(1 << 20) {
                    // A PUT that did not run in the first round (never
                    // seen), or a hang.
                    link.worker.progress();
                    assert!(spins < 1 << 30, "no answer from the peer");
                }
            }
        };
        for _ in 0..1000 {
            round_trip(&mut link);
        }
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    round_trip(&mut link);
                }
                start.elapsed() / 2
            })
        });
        // Tell the peer to stop: u64::MAX.
        link.put_seq(u64::MAX, now);
    }
    group.finish();
}

/// The peer: a window; for `pong`, answers every sequence number.
fn peer_main(role: &str) {
    let mut socket = socket_of_peer();
    let w = worker();
    let window = w.alloc_registered(2 << 20).unwrap();
    send(&mut socket, w.address());
    send(&mut socket, &w.pack_rkey(window.handle()).unwrap());
    send(&mut socket, &window.addr().to_le_bytes());
    if !role.starts_with("pong") {
        // Until the bench closes the socket or kills us.
        let _ = socket.read(&mut [0u8; 1]);
        return;
    }
    let now = role == "pong-now";
    let mut back = connect(&mut socket, 4096);
    loop {
        let mut seen = window.load_u64(0);
        let mut spins = 0u64;
        while seen == 0 || seen == back.src.load_u64(0) {
            pause(spins);
            spins += 1;
            seen = window.load_u64(0);
        }
        if seen == u64::MAX {
            return;
        }
        back.put_seq(seen, now);
    }
}

fn main() {
    if let Ok(role) = std::env::var(ROLE_ENV) {
        return peer_main(&role);
    }
    let mut c = Criterion::default().configure_from_args();
    put_groups(&mut c);
    latency_group(&mut c);
    c.final_summary();
}
