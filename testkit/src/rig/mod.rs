//! Setups the engine's and the drivers' tests share: a loopback target
//! connected from an initiator, two workers of any driver connected to
//! each other ([`Pair`], what the conformance suite runs on), the
//! submit-progress-reap loop with its hang guard, and the exactly-once
//! check of a batch's completions.

mod pair;

pub use pair::{Pair, PairConfig};

use ringfence::{EndpointId, Loopback, QueuePair, RegisteredBuf, RkeyId, Worker};
use ringfence_ring::{Cqe, Sqe};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long a wait of these rigs may last before it is called hung: a
/// guard against hangs only, never a timing assertion.
pub const HANG: Duration = Duration::from_secs(120);

/// Progress rounds after a batch completed in which no further CQE may
/// come (exactly once).
const QUIET_ROUNDS: usize = 32;

/// A wait bounded by [`HANG`] that spins a few rounds, then yields the CPU
/// at each idle round (so two busy-polling workers share two cores).
#[derive(Debug)]
pub struct Wait {
    end: Instant,
    what: &'static str,
    idle: u32,
}

impl Wait {
    /// A wait for `what`, from now.
    pub fn new(what: &'static str) -> Wait {
        Wait {
            end: Instant::now() + HANG,
            what,
            idle: 0,
        }
    }

    /// One more round: `worked` says whether it made progress (which
    /// starts the spinning over); idle rounds spin, then yield.
    ///
    /// # Panics
    /// When [`HANG`] has passed, with `detail`.
    #[track_caller]
    pub fn round(&mut self, worked: bool, detail: impl FnOnce() -> String) {
        if worked {
            self.idle = 0;
        } else {
            self.idle = self.idle.saturating_add(1);
            if self.idle < 16 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        if Instant::now() > self.end {
            panic!("{} hung (no end after {HANG:?}): {}", self.what, detail());
        }
    }
}

/// Submits `sqes` on `qp` and progresses every worker of `workers` (in
/// order, each round) until `expect` CQEs came, calling `each` with every
/// one as it is reaped; returns them in completion order.
pub(crate) fn drive(
    workers: &[&Worker],
    qp: &mut QueuePair,
    sqes: &[Sqe],
    expect: usize,
    each: &mut dyn FnMut(&Cqe),
) -> Vec<Cqe> {
    let mut wait = Wait::new("completing SQEs");
    let mut pushed = 0;
    let mut out = Vec::with_capacity(expect);
    while out.len() < expect {
        if pushed < sqes.len() {
            pushed += qp.push_batch(&sqes[pushed..]).expect("push");
            qp.submit();
        }
        let mut work = 0;
        for w in workers {
            work += w.progress();
        }
        let before = out.len();
        while let Some(cqe) = qp.pop().expect("pop") {
            each(&cqe);
            out.push(cqe);
        }
        wait.round(work > 0 || out.len() > before, || {
            format!(
                "{} of {expect} CQEs, {pushed} of {} SQEs pushed",
                out.len(),
                sqes.len()
            )
        });
    }
    out
}

/// Progresses `workers` some more rounds and panics if `qp` gets another
/// CQE: each SQE completes exactly once.
pub(crate) fn assert_quiet(workers: &[&Worker], qp: &mut QueuePair) {
    for _ in 0..QUIET_ROUNDS {
        for w in workers {
            w.progress();
        }
        if let Some(cqe) = qp.pop().expect("pop") {
            panic!("a CQE beyond the expected count: {cqe:?}");
        }
    }
}

/// Submits `sqes` on `qp`, runs `worker`'s progress until `expect` CQEs
/// came, checks that no more come (exactly once), and returns them in
/// completion order.
///
/// # Panics
/// If the queue fails, if the CQEs do not come within [`HANG`], or if one
/// more comes.
pub fn run_sqes(worker: &Worker, qp: &mut QueuePair, sqes: &[Sqe], expect: usize) -> Vec<Cqe> {
    let out = drive(&[worker], qp, sqes, expect, &mut |_| {});
    assert_quiet(&[worker], qp);
    out
}

/// Checks that `cqes` hold exactly one CQE for each of `sqes` (matched by
/// `user_data`, which must be unique among them) and nothing else.
///
/// # Panics
/// If two SQEs share a `user_data`, or a CQE is missing, duplicated or
/// names no SQE.
#[track_caller]
pub fn assert_exactly_once(sqes: &[Sqe], cqes: &[Cqe]) {
    let mut counts: HashMap<u64, u32> = HashMap::with_capacity(sqes.len());
    for sqe in sqes {
        assert!(
            counts.insert(sqe.user_data, 0).is_none(),
            "two SQEs share user_data {}: give each its own",
            sqe.user_data
        );
    }
    for cqe in cqes {
        match counts.get_mut(&cqe.user_data) {
            Some(n) => *n += 1,
            None => panic!("a CQE for no submitted SQE: {cqe:?}"),
        }
    }
    let mut wrong: Vec<(u64, u32)> = counts.into_iter().filter(|&(_, n)| n != 1).collect();
    wrong.sort_unstable();
    assert!(
        wrong.is_empty(),
        "SQEs (user_data, CQEs) that did not complete exactly once: {wrong:?}"
    );
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
