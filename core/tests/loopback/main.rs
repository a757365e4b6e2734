//! The engine over the loopback driver: two workers in one process.
//!
//! Each test runs over loopback (completing inside `post`, or on the next
//! poll) and over `SimDriver` (the asynchronous seam: nothing executes
//! before the round's commit, effects land at completion, lanes complete
//! out of order), except where it is about the synchronous path alone
//! (`try_now`, runs of PUTs executed inline), which it says.

use ringfence::{
    CompletionMode, EndpointId, Loopback, QueuePair, RegisteredBuf, RkeyId, Worker, WorkerBuilder,
};
use ringfence_ring::{Cqe, RemoteBuf, Sqe};
use ringfence_testkit::{SimDriver, SimTiming};
use std::time::{Duration, Instant};

const HANG: Duration = Duration::from_secs(120);

/// The driver a worker is built with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Over {
    /// Loopback, completing inside `post`.
    Immediate,
    /// Loopback, completing on the next poll.
    NextPoll,
    /// `SimDriver` over loopback: completing 1 to 3 polls after the
    /// round's commit, each operation on its own.
    Sim,
}

/// Every driver.
const ALL: [Over; 3] = [Over::Immediate, Over::NextPoll, Over::Sim];

/// Adds `over`'s driver to `builder`.
fn with_driver(builder: &mut WorkerBuilder, over: Over) -> &mut WorkerBuilder {
    match over {
        Over::Immediate => builder.driver(Loopback::new()),
        Over::NextPoll => builder.driver(Loopback::with_mode(CompletionMode::NextPoll)),
        Over::Sim => {
            let (sim, handle) = SimDriver::new(Loopback::new());
            handle.set_timing(SimTiming::PollsBetween(1, 3));
            builder.driver(sim)
        }
    }
}

fn worker(over: Over, lanes: u8) -> Worker {
    with_driver(&mut Worker::builder(), over)
        .lanes(lanes)
        .bw_threshold(4096)
        .notify_buffers(8, 256)
        .ignore_env()
        .build()
        .unwrap()
}

/// An initiator connected to a target that exposes a window.
struct Pair {
    target: Worker,
    initiator: Worker,
    window: RegisteredBuf,
    ep: EndpointId,
    rkey: RkeyId,
}

impl Pair {
    fn new(over: Over, lanes: u8, window: usize) -> Pair {
        let target = worker(over, lanes);
        let initiator = worker(over, lanes);
        let window = target.alloc_registered(window).unwrap();
        let ep = initiator.connect(target.address()).unwrap();
        let rkey = initiator
            .unpack_rkey(ep, &target.pack_rkey(window.handle()).unwrap())
            .unwrap();
        // The key tells the address PUTs name and the window's length.
        assert_eq!(
            initiator.rkey_bounds(ep, rkey).unwrap(),
            (window.addr(), window.len() as u64)
        );
        let bogus = ringfence::RkeyId::from_raw(rkey.as_raw() + 1000);
        assert_eq!(
            initiator.rkey_bounds(ep, bogus).unwrap_err().status(),
            ringfence_ring::Status::InvalidRkey
        );
        Pair {
            target,
            initiator,
            window,
            ep,
            rkey,
        }
    }

    fn remote(&self, offset: u64) -> RemoteBuf {
        RemoteBuf {
            rkey: self.rkey.as_raw(),
            addr: self.window.addr() + offset,
        }
    }
}

/// Submits `sqes` and runs progress until `expect` CQEs arrived; returns them.
fn run(worker: &Worker, qp: &mut QueuePair, sqes: &[Sqe], expect: usize) -> Vec<Cqe> {
    let deadline = Instant::now() + HANG;
    let mut pushed = 0;
    let mut out = Vec::new();
    while out.len() < expect {
        if pushed < sqes.len() {
            pushed += qp.push_batch(&sqes[pushed..]).unwrap();
            qp.submit();
        }
        worker.progress();
        let mut batch = [Cqe::default(); 64];
        let n = qp.reap(&mut batch).unwrap();
        out.extend_from_slice(&batch[..n]);
        assert!(
            Instant::now() < deadline,
            "hung with {} of {expect} CQEs",
            out.len()
        );
    }
    // Nothing more may come: exactly once.
    for _ in 0..10 {
        worker.progress();
    }
    assert_eq!(qp.pop().unwrap(), None, "a CQE beyond the expected count");
    out
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

mod completions;
mod direct_path;
mod fences;
mod refusals;
mod rma;
