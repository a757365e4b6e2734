//! The cost of fences: 64-byte PUTs through the engine over the loopback
//! driver with four lanes that complete asynchronously, with a fence after
//! every 8 PUTs. Asynchronous means a latency: the loopback driver sits
//! behind a `FaultInjector` that releases every operation and flush at the
//! first progress round `LATENCY` (wall clock) after it was posted, a
//! stand-in for a network round trip.
//!
//! PUTs go to four endpoints in turn, 8 at a time: a strong fence orders
//! one endpoint and must leave the others flowing (R6, R16, R45), which is
//! where a blocking fence loses.
//!
//! - `no_fence`: PUTs spread over the three bandwidth lanes, no fence.
//! - `no_fence_one_lane`: PUTs on one lane, no fence (the baseline for the
//!   weak fence).
//! - `weak_every_8`: PUTs on one ordered lane, a weak FENCE after every 8:
//!   the engine turns it into a transport fence flag, no flush (docs/fence.md R8).
//! - `strong_every_8`: PUTs over three lanes, a strong FENCE after every 8:
//!   a selective flush that later PUTs wait for inside the engine, while
//!   the application keeps submitting, also to the other endpoints (R9,
//!   R16).
//! - `strong_every_8_blocking`: the simple blocking strong fence (flush
//!   everything, wait, continue), as UCX's strong fence mode does (a worker
//!   flush at each fence): at each fence point, after 8 PUTs on one
//!   endpoint, the application submits a FLUSH on every endpoint and waits
//!   for all of them before submitting more.
//!
//! Progress is inline (the bench thread); up to 128 PUTs are in flight.
//! Fences carry SKIP_SUCCESS, so only PUT completions (and the blocking
//! variant's FLUSH) are reaped. Throughput is in PUTs. Each function first
//! moves 10,000 PUTs and checks every completion.
//!
//! Run: `cargo bench -p ringfence-benches --bench fence`.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ringfence::{CompletionMode, EndpointId, Loopback, QueuePair, RegisteredBuf, RkeyId, Worker};
use ringfence_ring::{Cqe, FenceMode, RemoteBuf, Sqe, SqeFlags};
use ringfence_testkit::{FaultInjector, Timing};
use std::hint::{black_box, spin_loop};
use std::time::{Duration, Instant};

const LEN: u32 = 64;
/// Time between posting an operation or flush and its effect: about an
/// RDMA round trip on one switch.
const LATENCY: Duration = Duration::from_micros(3);
const EVERY: u64 = 8;
const DEPTH: u64 = 128;
/// Endpoints the PUTs go to, `EVERY` at a time each.
const EPS: u64 = 4;
const CHECK: u64 = 10_000;
/// user_data of the blocking variant's FLUSH.
const FLUSH_TAG: u64 = u64::MAX;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    NoFence,
    NoFenceOneLane,
    Weak,
    Strong,
    StrongBlocking,
}

struct Rig {
    _target: Worker,
    initiator: Worker,
    _window: RegisteredBuf,
    src: RegisteredBuf,
    eps: Vec<(EndpointId, RkeyId)>,
    window_addr: u64,
    qp: QueuePair,
}

fn rig(kind: Kind) -> Rig {
    // Below the threshold PUTs use lane 0; from it, the bandwidth lanes.
    let threshold = if matches!(kind, Kind::Weak | Kind::NoFenceOneLane) {
        1 << 20
    } else {
        1
    };
    let build = || {
        let (driver, fault) = FaultInjector::new(Loopback::with_mode(CompletionMode::Immediate));
        fault.set_timing(Timing::Latency(LATENCY));
        Worker::builder()
            .driver(driver)
            .lanes(4)
            .bw_threshold(threshold)
            .ignore_env()
            .build()
            .expect("worker")
    };
    let target = build();
    let initiator = build();
    let window = target.alloc_registered(1 << 16).expect("window");
    let key = target.pack_rkey(window.handle()).expect("pack");
    let eps = (0..EPS)
        .map(|_| {
            let ep = initiator.connect(target.address()).expect("connect");
            (ep, initiator.unpack_rkey(ep, &key).expect("unpack"))
        })
        .collect();
    let src = initiator.alloc_registered(LEN as usize).expect("src");
    src.write(0, &[0x5a; LEN as usize]);
    let qp = initiator.create_queue().expect("queue");
    let window_addr = window.addr();
    Rig {
        _target: target,
        initiator,
        _window: window,
        src,
        eps,
        window_addr,
        qp,
    }
}

impl Rig {
    /// The endpoint PUT number `i` goes to.
    fn ep_of(&self, i: u64) -> usize {
        ((i / EVERY) % EPS) as usize
    }

    fn put(&self, i: u64) -> Sqe {
        let (ep, rkey) = self.eps[self.ep_of(i)];
        let remote = RemoteBuf {
            rkey: rkey.as_raw(),
            addr: self.window_addr + (i % 1000) * u64::from(LEN),
        };
        Sqe::put(ep.as_raw(), self.src.local(0), remote, LEN).with_user_data(i)
    }

    fn push(&mut self, sqe: Sqe) {
        while self.qp.push(sqe).is_err() {
            self.qp.submit();
            self.initiator.progress();
        }
    }

    /// Reaps what is ready; returns the PUT completions seen.
    fn reap(&mut self, check: bool, flushes: &mut u64) -> u64 {
        let mut cqes = [Cqe::default(); 64];
        let n = self.qp.reap(&mut cqes).expect("CQ corrupt");
        let mut puts = 0;
        for c in &cqes[..n] {
            if c.user_data == FLUSH_TAG {
                *flushes -= 1;
            } else {
                puts += 1;
            }
            if check {
                assert!(
                    c.res >= 0,
                    "operation {} failed: {}",
                    c.user_data,
                    ringfence_ring::strerror(c.res)
                );
            }
        }
        black_box(&cqes[..n]);
        puts
    }

    /// Moves `n` PUTs; returns the elapsed time.
    fn run(&mut self, kind: Kind, n: u64, check: bool) -> Duration {
        let fence =
            |ep: EndpointId, mode| Sqe::fence(ep.as_raw(), mode).with_flags(SqeFlags::SKIP_SUCCESS);
        let start = Instant::now();
        let (mut sent, mut done) = (0u64, 0u64);
        // Blocking variant: FLUSHes not yet completed.
        let mut flushes = 0u64;
        while done < n {
            let mut pushed = false;
            while sent < n && sent - done < DEPTH && flushes == 0 {
                let ep = self.eps[self.ep_of(sent)].0;
                self.push(self.put(sent));
                sent += 1;
                pushed = true;
                match kind {
                    Kind::Weak if sent % EVERY == 0 => self.push(fence(ep, FenceMode::ORDER)),
                    Kind::Strong if sent % EVERY == 0 => self.push(fence(ep, FenceMode::COMPLETE)),
                    Kind::StrongBlocking if sent % EVERY == 0 => {
                        for k in 0..self.eps.len() {
                            self.push(Sqe::flush(self.eps[k].0.as_raw()).with_user_data(FLUSH_TAG));
                        }
                        flushes = EPS;
                    }
                    _ => {}
                }
            }
            if pushed {
                self.qp.submit();
            }
            self.initiator.progress();
            let got = self.reap(check, &mut flushes);
            done += got;
            if got == 0 {
                spin_loop();
            }
        }
        // The blocking variant's last flushes.
        while flushes > 0 {
            self.initiator.progress();
            self.reap(check, &mut flushes);
        }
        start.elapsed()
    }
}

fn fence_cost(c: &mut Criterion) {
    let kinds = [
        ("no_fence", Kind::NoFence),
        ("no_fence_one_lane", Kind::NoFenceOneLane),
        ("weak_every_8", Kind::Weak),
        ("strong_every_8", Kind::Strong),
        ("strong_every_8_blocking", Kind::StrongBlocking),
    ];
    for (name, kind) in kinds {
        let mut r = rig(kind);
        r.run(kind, CHECK, true);
        let stats = r.initiator.stats();
        match kind {
            Kind::Weak => assert!(
                stats.weak_fences > 0 && stats.flushes == 0,
                "{name}: {stats:?}"
            ),
            Kind::Strong => assert!(stats.flushes > 0, "{name}: {stats:?}"),
            _ => {}
        }
    }
    let mut group = c.benchmark_group("fence_cost");
    group.throughput(Throughput::Elements(1));
    for (name, kind) in kinds {
        let mut r = rig(kind);
        group.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter_custom(|iters| r.run(kind, iters, false))
        });
    }
    group.finish();
}

criterion_group!(benches, fence_cost);
criterion_main!(benches);
