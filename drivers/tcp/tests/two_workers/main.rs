//! Two workers over loopback TCP in one process, both progressed by the
//! test: PUT, GET, atomics, notifications, flushes and fences.

use ringfence::{Cqe, EndpointId, EndpointState, QueuePair, RegisteredBuf, RkeyId, Worker};
use ringfence_ring::Sqe;
use ringfence_tcp::Tcp;
use std::time::{Duration, Instant};

fn worker() -> Worker {
    Worker::builder()
        .driver(Tcp::builder().ignore_env().build().unwrap())
        .notify_buffers(8, 256)
        .ring_entries(1024, 4096)
        .requests(4096)
        .ignore_env()
        .build()
        .unwrap()
}

/// Submits `sqes`, runs both workers' progress until `expect` CQEs came.
fn run(w: &Worker, other: &Worker, qp: &mut QueuePair, sqes: &[Sqe], expect: usize) -> Vec<Cqe> {
    let deadline = Instant::now() + Duration::from_secs(60);
    run_with(qp, sqes, expect, deadline, || {
        w.progress();
        other.progress();
    })
}

/// Submits `sqes`, runs `progress` until `expect` CQEs came, by
/// `deadline`.
fn run_with(
    qp: &mut QueuePair,
    sqes: &[Sqe],
    expect: usize,
    deadline: Instant,
    progress: impl Fn(),
) -> Vec<Cqe> {
    let mut pushed = 0;
    let mut out = Vec::new();
    while out.len() < expect {
        if pushed < sqes.len() {
            pushed += qp.push_batch(&sqes[pushed..]).unwrap();
            qp.submit();
        }
        progress();
        let mut batch = [Cqe::default(); 64];
        let n = qp.reap(&mut batch).unwrap();
        out.extend_from_slice(&batch[..n]);
        assert!(Instant::now() < deadline, "hung: {} of {expect}", out.len());
        if out.len() < expect {
            std::thread::yield_now();
        }
    }
    out
}

struct Pair {
    target: Worker,
    initiator: Worker,
    window: RegisteredBuf,
    ep: EndpointId,
    rkey: RkeyId,
}

fn pair(len: usize, lanes: u8) -> Pair {
    let target = worker();
    let initiator = worker();
    let window = target.alloc_registered(len).unwrap();
    let ep = initiator
        .connect_lanes(target.address(), &[("tcp", lanes)])
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while initiator.endpoint_state(ep).unwrap() == EndpointState::Connecting {
        initiator.progress();
        target.progress();
        assert!(Instant::now() < deadline, "connect hung");
        std::thread::yield_now();
    }
    assert_eq!(
        initiator.endpoint_state(ep).unwrap(),
        EndpointState::Connected
    );
    let blob = target.pack_rkey(window.handle()).unwrap();
    let rkey = initiator.unpack_rkey(ep, &blob).unwrap();
    Pair {
        target,
        initiator,
        window,
        ep,
        rkey,
    }
}

/// Data of `len` bytes, different for each `seed`.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u64)
                .wrapping_mul(31)
                .wrapping_add(seed.wrapping_mul(7)) as u8
        })
        .collect()
}

mod damaged;
mod failure;
mod fences;
mod notify;
mod rma;
mod sleep;
