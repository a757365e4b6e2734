//! Setups the engine's and the drivers' tests share: a loopback target
//! connected from an initiator, and a submit-progress-reap loop.

use ringfence::{EndpointId, Loopback, QueuePair, RegisteredBuf, RkeyId, Worker};
use ringfence_ring::{Cqe, Sqe};
use std::time::{Duration, Instant};

/// How long `run_sqes` waits before calling the run hung: a guard against
/// hangs only, never a timing assertion.
const HANG: Duration = Duration::from_secs(120);

/// Submits `sqes` on `qp`, runs `worker`'s progress until `expect` CQEs
/// came, checks that no more come (exactly once), and returns them in
/// completion order.
///
/// # Panics
/// If the queue fails, if the CQEs do not come within two minutes, or if one
/// more comes.
pub fn run_sqes(worker: &Worker, qp: &mut QueuePair, sqes: &[Sqe], expect: usize) -> Vec<Cqe> {
    let deadline = Instant::now() + HANG;
    let mut pushed = 0;
    let mut out = Vec::new();
    while out.len() < expect {
        if pushed < sqes.len() {
            pushed += qp.push_batch(&sqes[pushed..]).expect("push");
            qp.submit();
        }
        worker.progress();
        while let Some(cqe) = qp.pop().expect("pop") {
            out.push(cqe);
        }
        assert!(
            Instant::now() < deadline,
            "hung at {} of {expect} CQEs",
            out.len()
        );
    }
    for _ in 0..10 {
        worker.progress();
    }
    assert_eq!(
        qp.pop().expect("pop"),
        None,
        "a CQE beyond the expected count"
    );
    out
}

/// A loopback target worker exposing a registered window, connected from an
/// initiator whose endpoint and unpacked key of the window are at hand.
#[derive(Debug)]
pub struct LoopbackTarget {
    /// The target worker (one loopback driver); dropping it is the peer's
    /// death.
    pub worker: Worker,
    /// Its registered window.
    pub window: RegisteredBuf,
    /// The initiator's endpoint to it.
    pub ep: EndpointId,
    /// The initiator's key of the window.
    pub rkey: RkeyId,
}

impl LoopbackTarget {
    /// A target with a `window`-byte window, connected from `initiator`
    /// (which must have a loopback driver, possibly wrapped).
    ///
    /// # Panics
    /// If building, registering, connecting or unpacking fails.
    pub fn connect(initiator: &Worker, window: usize) -> LoopbackTarget {
        let mut builder = Worker::builder();
        builder.driver(Loopback::new());
        LoopbackTarget::offer(initiator, builder, window, |address| {
            initiator.connect(address)
        })
    }

    /// A target with a loopback driver for each of the driver names in
    /// `groups` and a `window`-byte window, connected from `initiator`
    /// (which needs a driver of each name) with one endpoint whose lanes
    /// are `groups` (driver name, lanes), as [`Worker::connect_lanes`]
    /// takes them.
    ///
    /// # Panics
    /// If building, registering, connecting or unpacking fails.
    pub fn connect_mixed(
        initiator: &Worker,
        groups: &[(&'static str, u8)],
        window: usize,
    ) -> LoopbackTarget {
        let mut builder = Worker::builder();
        for &(name, _) in groups {
            builder.driver(Loopback::new().named(name));
        }
        LoopbackTarget::offer(initiator, builder, window, |address| {
            initiator.connect_lanes(address, groups)
        })
    }

    /// Builds the target, registers its window, connects `initiator` to
    /// it with `connect` and unpacks the window's key on that endpoint.
    fn offer(
        initiator: &Worker,
        mut builder: ringfence::WorkerBuilder,
        window: usize,
        connect: impl FnOnce(&[u8]) -> Result<EndpointId, ringfence::Error>,
    ) -> LoopbackTarget {
        let worker = builder
            .ignore_env()
            .build()
            .expect("loopback target worker");
        let window = worker.alloc_registered(window).expect("target window");
        let ep = connect(worker.address()).expect("connect to the target");
        let key = worker.pack_rkey(window.handle()).expect("pack the window");
        let rkey = initiator.unpack_rkey(ep, &key).expect("unpack the window");
        LoopbackTarget {
            worker,
            window,
            ep,
            rkey,
        }
    }
}
