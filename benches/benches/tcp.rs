//! The tcp driver between two processes over loopback: PUT bandwidth with
//! 1 and 4 lanes, the 8-byte PUT rate, the one-way latency of an 8-byte
//! PUT ping-pong, and the cost of a strong fence over 4 lanes. The peers
//! (iperf3 for the kernel's own TCP ceiling, `ucx_perftest` over UCX's tcp
//! transport) run beside this bench in `benches/compare/tcp.sh`.
//!
//! The bench binary re-executes itself as the peer process (the
//! environment variable `RINGFENCE_BENCH_TCP_ROLE` names its role; a socket
//! pair on its standard input carries addresses and keys):
//!
//! - `put_bw` (throughput in bytes), `put_rate_8B` (elements) and
//!   `fence_4lanes` (elements): the peer (`target`) allocates a window,
//!   sends its address and key, starts its worker's core thread (a tcp
//!   target executes requests from its own progress) and waits on its
//!   socket. This process connects an endpoint of 1 or 4 lanes; the bench
//!   thread pushes PUTs of one size from a registered source buffer to
//!   offset 0 of the window (cache-resident, as `ucx_perftest` reuses its
//!   buffers), every one with `SKIP_SUCCESS`, running its worker's
//!   progress inline after each submit of up to 32. One FLUSH at the end
//!   of each sample must come back as the only CQE: the time includes
//!   every byte's acknowledgement by the target. PUTs from 8 KiB (the
//!   worker's bandwidth threshold) go to the endpoint's lanes in turn.
//! - `put_lat_8B`: the peer (`pong`) connects back; each round trip is an
//!   8-byte PUT of a sequence number into the peer's window, which the
//!   peer, progressing inline, spins on and answers with a PUT of the same
//!   number into ours. The reported time is half a round trip (one way),
//!   as `ucx_perftest -t ucp_put_lat` reports it.
//! - `fence_4lanes`: 64-byte PUTs spread over the three bandwidth lanes of
//!   a 4-lane endpoint (bandwidth threshold 1 byte), at most 128 in flight,
//!   each completion reaped; `no_fence`, then `strong_every_8` (a strong
//!   FENCE after every 8 PUTs: a flush of the lanes written, later PUTs
//!   held in the engine until it completes, docs/fence.md R9/R16), then
//!   `flush_every_8` (the blocking alternative: a FLUSH after every 8 and
//!   a wait for it before submitting more).
//!
//! Before timing, PUTs of a pattern at each size are read back with GET
//! and checked. Both processes busy-poll in the latency group (spinning,
//! then yielding after 4,096 idle spins): on two vCPUs they need both.
//!
//! Run: `cargo bench -p ringfence-benches --bench tcp`.

use criterion::{BenchmarkId, Criterion, Throughput};
use ringfence::{EndpointState, Worker};
use ringfence_benches::link::{HANG, Link, pause};
use ringfence_benches::peer::{Peer, recv, send, socket_of_peer};
use ringfence_ring::{Cqe, FenceMode, RemoteBuf, Sqe, SqeFlags};
use ringfence_tcp::Tcp;
use std::hint::{black_box, spin_loop};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

const ROLE_ENV: &str = "RINGFENCE_BENCH_TCP_ROLE";
const BW_SIZES: [usize; 2] = [64 << 10, 1 << 20];
/// The fence group: PUT size, PUTs per fence, PUTs in flight.
const FENCE_LEN: u32 = 64;
const EVERY: u64 = 8;
const DEPTH: u64 = 128;
/// The window (and the source buffer) in bytes.
const WINDOW: usize = 2 << 20;

/// Runs `worker`'s progress until one byte arrives on `socket` (the other
/// process's "go on"), so that the other process can connect to it
/// meanwhile.
fn progress_until_byte(worker: &Worker, socket: &mut UnixStream) -> u8 {
    socket.set_nonblocking(true).unwrap();
    let deadline = Instant::now() + HANG;
    let mut byte = [0u8; 1];
    let got = loop {
        worker.progress();
        match socket.read(&mut byte) {
            Ok(1) => break byte[0],
            Ok(_) => panic!("the other process closed the socket"),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => panic!("socket: {e}"),
        }
        assert!(Instant::now() < deadline, "the other process hung");
        std::thread::yield_now();
    };
    socket.set_nonblocking(false).unwrap();
    got
}

/// A worker with the tcp driver on 127.0.0.1; PUTs from `threshold` bytes
/// go to the bandwidth lanes.
fn worker(threshold: u32) -> Worker {
    Worker::builder()
        .driver(Tcp::builder().ignore_env().build().expect("tcp driver"))
        .ring_entries(1024, 4096)
        .requests(4096)
        .lanes(4)
        .bw_threshold(threshold)
        .ignore_env()
        .build()
        .expect("worker")
}

/// Connects an endpoint of `lanes` lanes to the window whose address, key
/// and base come next on `socket` (the peer makes progress meanwhile: a
/// core thread, or a loop waiting for our byte), and waits until it is up.
fn connect(worker: Worker, socket: &mut UnixStream, lanes: u8) -> Link {
    let (address, key) = (recv(socket), recv(socket));
    let base = u64::from_le_bytes(recv(socket).try_into().unwrap());
    let ep = worker.connect_lanes(&address, &[("tcp", lanes)]).unwrap();
    let deadline = Instant::now() + HANG;
    while worker.endpoint_state(ep).unwrap() == EndpointState::Connecting {
        worker.progress();
        assert!(Instant::now() < deadline, "connect hung");
        std::thread::yield_now();
    }
    assert_eq!(worker.endpoint_state(ep).unwrap(), EndpointState::Connected);
    let rkey = worker.unpack_rkey(ep, &key).unwrap();
    Link::new(worker, ep, rkey, base, WINDOW)
}

fn bw_groups(c: &mut Criterion) {
    for lanes in [1u8, 4] {
        let mut peer = Peer::spawn(ROLE_ENV, "target");
        let mut link = connect(worker(8 << 10), &mut peer.socket, lanes);
        for len in [8, 4096, 64 << 10, 1 << 20] {
            link.check(len, 20);
        }
        let mut group = c.benchmark_group("put_bw");
        for len in BW_SIZES {
            group.throughput(Throughput::Bytes(len as u64));
            let id = BenchmarkId::new(format!("ringfence_tcp/{lanes}_lanes"), len);
            group.bench_function(id, |b| {
                b.iter_custom(|iters| {
                    let start = Instant::now();
                    link.puts(iters, len);
                    start.elapsed()
                })
            });
        }
        group.finish();
        if lanes == 1 {
            // The message rate on the latency lane.
            let mut rate = c.benchmark_group("put_rate_8B");
            rate.throughput(Throughput::Elements(1));
            rate.bench_function("ringfence_tcp", |b| {
                b.iter_custom(|iters| {
                    let start = Instant::now();
                    link.puts(iters, 8);
                    start.elapsed()
                })
            });
            rate.finish();
        }
    }
}

fn latency_group(c: &mut Criterion) {
    let mut group = c.benchmark_group("put_lat_8B");
    let mut peer = Peer::spawn(ROLE_ENV, "pong");
    let mut link = connect(worker(8 << 10), &mut peer.socket, 1);
    // Our window for the answers, for the peer to connect to; the peer
    // connects while this process progresses.
    let window = link.worker.alloc_registered(4096).unwrap();
    peer.socket.write_all(b"g").unwrap();
    send(&mut peer.socket, link.worker.address());
    send(
        &mut peer.socket,
        &link.worker.pack_rkey(window.handle()).unwrap(),
    );
    send(&mut peer.socket, &window.addr().to_le_bytes());
    assert_eq!(progress_until_byte(&link.worker, &mut peer.socket), b'r');
    let mut seq = 0u64;
    let mut round_trip = |link: &mut Link| {
        seq += 1;
        link.put_seq(seq, false);
        let deadline = Instant::now() + HANG;
        let mut spins = 0u64;
        loop {
            link.worker.progress();
            if window.load_u64(0) == seq {
                break;
            }
            pause(spins);
            spins += 1;
            if spins.is_multiple_of(1 << 16) {
                assert!(Instant::now() < deadline, "no answer from the peer");
            }
        }
    };
    for _ in 0..1000 {
        round_trip(&mut link);
    }
    group.bench_function("ringfence_tcp", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                round_trip(&mut link);
            }
            start.elapsed() / 2
        })
    });
    // Tell the peer to stop: u64::MAX.
    link.put_seq(u64::MAX, false);
    let flush = Sqe::flush(link.ep).with_user_data(7);
    link.push(flush);
    link.qp.submit();
    assert_eq!(link.one_cqe().res, 0);
    group.finish();
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Fence {
    None,
    Strong,
    Flush,
}

/// Moves `n` 64-byte PUTs over the bandwidth lanes with `fence` after
/// every 8 on `link`, at most `DEPTH` in flight; returns the elapsed time.
fn fenced(link: &mut Link, fence: Fence, n: u64, check: bool) -> Duration {
    let flush_tag = u64::MAX;
    let start = Instant::now();
    let (mut sent, mut done) = (0u64, 0u64);
    let mut flushing = false;
    let mut cqes = [Cqe::default(); 64];
    while done < n || flushing {
        let mut pushed = false;
        while sent < n && sent - done < DEPTH && !flushing {
            let remote = RemoteBuf {
                addr: link.remote.addr + (sent % 1000) * u64::from(FENCE_LEN),
                ..link.remote
            };
            let put = Sqe::put(link.ep, link.src.local(0), remote, FENCE_LEN);
            link.push(put.with_user_data(sent));
            sent += 1;
            pushed = true;
            if sent % EVERY == 0 {
                match fence {
                    Fence::None => {}
                    Fence::Strong => link.push(
                        Sqe::fence(link.ep, FenceMode::COMPLETE).with_flags(SqeFlags::SKIP_SUCCESS),
                    ),
                    Fence::Flush => {
                        link.push(Sqe::flush(link.ep).with_user_data(flush_tag));
                        flushing = true;
                    }
                }
            }
        }
        if pushed {
            link.qp.submit();
        }
        link.worker.progress();
        let got = link.qp.reap(&mut cqes).expect("CQ corrupt");
        for c in &cqes[..got] {
            if check {
                assert!(c.res >= 0, "{c:?}");
            }
            if c.user_data == flush_tag {
                flushing = false;
            } else {
                done += 1;
            }
        }
        black_box(&cqes[..got]);
        if got == 0 {
            spin_loop();
        }
    }
    start.elapsed()
}

fn fence_group(c: &mut Criterion) {
    let mut group = c.benchmark_group("fence_4lanes");
    group.throughput(Throughput::Elements(1));
    let mut peer = Peer::spawn(ROLE_ENV, "target");
    // Every PUT is a bandwidth PUT: they spread over lanes 1 to 3.
    let mut link = connect(worker(1), &mut peer.socket, 4);
    for (name, fence) in [
        ("no_fence", Fence::None),
        ("strong_every_8", Fence::Strong),
        ("flush_every_8", Fence::Flush),
    ] {
        fenced(&mut link, fence, 10_000, true);
        group.bench_function(name, |b| {
            b.iter_custom(|iters| fenced(&mut link, fence, iters, false))
        });
    }
    group.finish();
}

/// The peer: a window; `target` serves it from a core thread until the
/// bench closes the socket; `pong` answers every sequence number.
fn peer_main(role: &str) {
    let mut socket = socket_of_peer();
    let mut w = worker(8 << 10);
    let window = w.alloc_registered(WINDOW).unwrap();
    if role == "target" {
        w.start_core_thread(None).expect("core thread");
    }
    send(&mut socket, w.address());
    send(&mut socket, &w.pack_rkey(window.handle()).unwrap());
    send(&mut socket, &window.addr().to_le_bytes());
    if role == "target" {
        // Until the bench closes the socket or kills us.
        let _ = socket.read(&mut [0u8; 1]);
        return;
    }
    // The bench connects to us while we progress, then says "go".
    assert_eq!(progress_until_byte(&w, &mut socket), b'g');
    let mut back = connect(w, &mut socket, 1);
    socket.write_all(b"r").unwrap();
    let mut answered = 0u64;
    loop {
        let mut spins = 0u64;
        let seen = loop {
            back.worker.progress();
            let seen = window.load_u64(0);
            if seen != answered {
                break seen;
            }
            pause(spins);
            spins += 1;
        };
        if seen == u64::MAX {
            // The bench's last FLUSH needs our progress: serve until it
            // closes the socket (or kills us).
            socket.set_nonblocking(true).unwrap();
            loop {
                back.worker.progress();
                match socket.read(&mut [0u8; 1]) {
                    Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::yield_now(),
                    _ => return,
                }
            }
        }
        back.put_seq(seen, false);
        answered = seen;
    }
}

fn main() {
    if let Ok(role) = std::env::var(ROLE_ENV) {
        return peer_main(&role);
    }
    let mut c = Criterion::default().configure_from_args();
    bw_groups(&mut c);
    latency_group(&mut c);
    fence_group(&mut c);
    c.final_summary();
}
