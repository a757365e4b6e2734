//! The engine over the asynchronous driver seam, through `SimDriver`: a
//! handshake that fails or succeeds with SQEs queued behind it, teardown
//! and deregistration while the driver holds operations (quiesce before
//! free), the one doorbell per round, and the driver's own contract (its
//! wake descriptor, quiesce, the violation log).
//!
//! Deterministic on a loaded machine: nothing sleeps to synchronize, no
//! assertion is about time; loops are bounded by a generous deadline that
//! only catches hangs. Delays that are waited for are waited for on the
//! wake descriptor itself.

use ringfence::{EndpointId, Loopback, QueuePair, RegisteredBuf, RkeyId, Worker};
use ringfence_ring::{Cqe, FenceMode, RemoteBuf, Sqe};
use ringfence_testkit::{SimDriver, SimEvent, SimHandle};
use std::time::{Duration, Instant};

const HANG: Duration = Duration::from_secs(30);
const SLOT: u64 = 64;
/// PUTs of this size or more go to the bandwidth lanes.
const BIG: u32 = 256;

/// A target with a plain loopback driver and a registered window.
fn target(window: usize) -> (Worker, RegisteredBuf) {
    let t = Worker::builder()
        .driver(Loopback::new())
        .ignore_env()
        .build()
        .unwrap();
    let w = t.alloc_registered(window).unwrap();
    (t, w)
}

/// An initiator whose only driver is a `SimDriver` over loopback.
fn initiator(lanes: u8) -> (Worker, SimHandle) {
    let (sim, handle) = SimDriver::new(Loopback::new());
    let w = Worker::builder()
        .driver(sim)
        .lanes(lanes)
        .bw_threshold(BIG)
        .ring_entries(512, 512)
        .requests(1024)
        .ignore_env()
        .build()
        .unwrap();
    (w, handle)
}

/// Pushes `sqes`, then runs progress until `n` CQEs arrived; checks that
/// no more follow.
fn run(w: &Worker, qp: &mut QueuePair, sqes: &[Sqe], n: usize) -> Vec<Cqe> {
    let deadline = Instant::now() + HANG;
    let mut pushed = 0;
    let mut out = Vec::new();
    while out.len() < n {
        if pushed < sqes.len() {
            pushed += qp.push_batch(&sqes[pushed..]).unwrap();
            qp.submit();
        }
        w.progress();
        while let Some(c) = qp.pop().unwrap() {
            out.push(c);
        }
        assert!(
            Instant::now() < deadline,
            "hung at {} of {n} CQEs",
            out.len()
        );
    }
    for _ in 0..10 {
        w.progress();
    }
    assert_eq!(qp.pop().unwrap(), None, "more CQEs than SQEs");
    out
}

/// 100 SQEs on `ep`: PUTs of slot numbers (small ones on lane 0, big
/// ones on the bandwidth lanes), weak and strong FENCEs, a FLUSH, fetching
/// atomics. `user_data` is the index; SQE `i` reads `src` at `256 * i`
/// and writes the window at `256 * i`.
fn mixed(ep: EndpointId, rkey: RkeyId, window: u64, src: &RegisteredBuf) -> Vec<Sqe> {
    let remote = |slot: u64| RemoteBuf {
        rkey: rkey.as_raw(),
        addr: window + slot * SLOT * 4,
    };
    let e = ep.as_raw();
    (0..100u64)
        .map(|i| {
            match i % 10 {
                3 => Sqe::fence(e, FenceMode::ORDER),
                7 => Sqe::fence(e, FenceMode::COMPLETE),
                9 if i == 49 => Sqe::flush(e),
                9 => Sqe::atomic_fadd(e, src.local(28 * 1024 + 8 * i), remote(i), 1),
                k if k % 2 == 0 => Sqe::put(e, src.local(u64::from(BIG) * i), remote(i), 8),
                _ => Sqe::put(e, src.local(u64::from(BIG) * i), remote(i), BIG),
            }
            .with_user_data(i)
        })
        .collect()
}

fn is_fence(sqe: &Sqe) -> bool {
    sqe.opcode == ringfence_ring::Opcode::FENCE.as_raw()
}

/// Whether the memory from `alloc_memory` at `addr` has been freed.
fn freed(sim: &SimHandle, addr: u64) -> bool {
    sim.events()
        .iter()
        .any(|e| matches!(e, SimEvent::Freed { addr: a, .. } if *a == addr))
}

mod deregistration;
mod doorbell;
mod driver;
mod handshake;
mod teardown;
