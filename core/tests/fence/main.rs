//! The fence engine against docs/fence.md, over the loopback driver wrapped in a
//! `FaultInjector`: one named test per rule family and per review warning
//! (W1–W6), memory-effect tests on out-of-order lanes, and a model-based
//! property test.
//!
//! Every test body runs twice (see `over_both!` below): over the
//! injector on a synchronous loopback (`<module>::over_loopback::`), and
//! over the injector on a `SimDriver` (`<module>::over_sim::`), where
//! nothing executes before the round's commit, effects land only at
//! completion, lanes complete out of order, and flushes wait for what they
//! cover. Tests about the synchronous path alone (a flush finished inside
//! its own start, runs of PUTs executed inline) run on loopback only, and
//! say so.
//!
//! One module per rule family or concept (below); the rig and the helpers
//! they share are here.

use ringfence::{CompletionMode, EndpointId, Loopback, QueuePair, RegisteredBuf, RkeyId, Worker};
use ringfence_ring::{Cqe, FenceMode, RemoteBuf, Sqe};
use ringfence_testkit::{
    Executed, FaultHandle, FaultInjector, SimDriver, SimHandle, SimTiming, Timing,
};
use std::time::{Duration, Instant};

const BIG: u32 = 1024;
const SLOT: u64 = 1024;
const HANG: Duration = Duration::from_secs(30);

/// The driver under the injector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Over {
    /// Loopback, completing inside `post`: the injector owns all timing.
    Loopback,
    /// `SimDriver` over loopback, completing what the injector releases
    /// to it with this timing after the commit that covers it.
    Sim(SimTiming),
}

/// An initiator whose driver is a FaultInjector over loopback (or over a
/// `SimDriver` over loopback), connected to `endpoints` targets; each
/// target exposes a window of `slots` slots.
struct Rig {
    _targets: Vec<Worker>,
    initiator: Worker,
    fault: FaultHandle,
    sim: Option<SimHandle>,
    windows: Vec<RegisteredBuf>,
    eps: Vec<(EndpointId, RkeyId)>,
    src: RegisteredBuf,
    qp: QueuePair,
}

fn rig(over: Over, lanes: u8, endpoints: usize, timing: Timing, cq: u32) -> Rig {
    rig_unordered(over, lanes, endpoints, timing, cq, 0)
}

/// [`rig`] whose injector reorders `unordered` lanes (and so claims
/// unordered lanes: the engine takes no weak fence over it, R9).
fn rig_unordered(
    over: Over,
    lanes: u8,
    endpoints: usize,
    timing: Timing,
    cq: u32,
    unordered: u64,
) -> Rig {
    let loopback = Loopback::with_mode(CompletionMode::Immediate);
    let (initiator, fault, sim) = {
        let mut builder = Worker::builder();
        builder
            .lanes(lanes)
            .bw_threshold(BIG)
            .ring_entries(1024, cq)
            .requests(2048)
            .ignore_env();
        match over {
            Over::Loopback => {
                let (injector, fault) = FaultInjector::new(loopback);
                fault.set_unordered(unordered);
                (builder.driver(injector).build().unwrap(), fault, None)
            }
            Over::Sim(timing) => {
                let (sim, handle) = SimDriver::new(loopback);
                handle.set_timing(timing);
                handle.seed(u64::from(lanes) * 31 + endpoints as u64);
                let (injector, fault) = FaultInjector::new(sim);
                fault.set_unordered(unordered);
                (
                    builder.driver(injector).build().unwrap(),
                    fault,
                    Some(handle),
                )
            }
        }
    };
    fault.set_timing(timing);
    let mut targets = Vec::new();
    let mut windows = Vec::new();
    let mut eps = Vec::new();
    for _ in 0..endpoints {
        let t = Worker::builder()
            .driver(Loopback::new())
            .ignore_env()
            .build()
            .unwrap();
        let w = t.alloc_registered(512 * SLOT as usize).unwrap();
        let ep = initiator.connect(t.address()).unwrap();
        let rkey = initiator
            .unpack_rkey(ep, &t.pack_rkey(w.handle()).unwrap())
            .unwrap();
        targets.push(t);
        windows.push(w);
        eps.push((ep, rkey));
    }
    let src = initiator.alloc_registered(4 * SLOT as usize).unwrap();
    src.write(0, &[0xaa; BIG as usize]);
    src.write(BIG as usize, &[0xbb; BIG as usize]);
    let qp = initiator.create_queue().unwrap();
    Rig {
        _targets: targets,
        initiator,
        fault,
        sim,
        windows,
        eps,
        src,
        qp,
    }
}

impl Rig {
    /// The operations that took effect at the target, in order: recorded
    /// by the injector when its inner driver completes inside `post`, by
    /// the `SimDriver` (which executes them late) otherwise.
    fn log(&self) -> Vec<Executed> {
        match &self.sim {
            Some(sim) => sim.log(),
            None => self.fault.log(),
        }
    }

    /// Seeds the injector's shuffles and the simulated driver's lane order.
    fn seed(&self, seed: u64) {
        self.fault.seed(seed);
        if let Some(sim) = &self.sim {
            sim.seed(seed);
        }
    }

    fn ep(&self, e: usize) -> u32 {
        self.eps[e].0.as_raw()
    }

    fn remote(&self, e: usize, slot: u64) -> RemoteBuf {
        RemoteBuf {
            rkey: self.eps[e].1.as_raw(),
            addr: self.windows[e].addr() + slot * SLOT,
        }
    }

    /// A PUT of 8 bytes (lane 0) or of `BIG` bytes (a bandwidth lane) of the
    /// A (0xaa) or B (0xbb) pattern.
    fn put(&self, e: usize, slot: u64, big: bool, b: bool) -> Sqe {
        let len = if big { BIG } else { 8 };
        Sqe::put(
            self.ep(e),
            self.src.local(if b { u64::from(BIG) } else { 0 }),
            self.remote(e, slot),
            len,
        )
    }

    fn submit(&mut self, sqes: &[Sqe]) {
        let mut done = 0;
        let deadline = Instant::now() + HANG;
        while done < sqes.len() {
            assert!(Instant::now() < deadline, "the SQ never drained");
            done += self.qp.push_batch(&sqes[done..]).unwrap();
            self.qp.submit();
            if done < sqes.len() {
                self.initiator.progress();
            }
        }
    }

    /// Progress until `n` CQEs arrived.
    fn drain(&mut self, n: usize) -> Vec<Cqe> {
        let deadline = Instant::now() + HANG;
        let mut out = Vec::new();
        while out.len() < n {
            self.initiator.progress();
            while let Some(c) = self.qp.pop().unwrap() {
                out.push(c);
            }
            assert!(
                Instant::now() < deadline,
                "hung at {} of {n} CQEs",
                out.len()
            );
        }
        for _ in 0..5 {
            self.initiator.progress();
        }
        assert_eq!(
            self.qp.pop().unwrap(),
            None,
            "more CQEs than submitted SQEs"
        );
        if let Some(sim) = &self.sim {
            assert!(sim.violations().is_empty(), "{:?}", sim.violations());
            assert_eq!(sim.stats().executed_uncommitted, 0);
        }
        out
    }

    fn run(&mut self, sqes: &[Sqe]) -> Vec<Cqe> {
        let sqes = numbered(sqes);
        self.submit(&sqes);
        let mut cqes = self.drain(sqes.len());
        cqes.sort_by_key(|c| c.user_data);
        cqes
    }

    fn byte_at(&self, e: usize, slot: u64) -> u8 {
        let mut b = [0u8; 1];
        self.windows[e].read((slot * SLOT) as usize, &mut b);
        b[0]
    }

    fn stats(&self, e: usize) -> ringfence::Stats {
        self.initiator.endpoint_stats(self.eps[e].0).unwrap()
    }
}

/// `sqes` with `user_data` set to each one's index.
fn numbered(sqes: &[Sqe]) -> Vec<Sqe> {
    sqes.iter()
        .enumerate()
        .map(|(i, s)| s.with_user_data(i as u64))
        .collect()
}

fn strong(ep: u32) -> Sqe {
    Sqe::fence(ep, FenceMode::COMPLETE)
}

fn weak(ep: u32) -> Sqe {
    Sqe::fence(ep, FenceMode::ORDER)
}

fn all_ok(cqes: &[Cqe]) {
    for c in cqes {
        assert!(
            c.res >= 0,
            "{}: {}",
            c.user_data,
            ringfence_ring::strerror(c.res)
        );
    }
}

/// Progress until the injector has seen `n` flushes.
fn until_flushes(r: &Rig, n: usize) {
    let deadline = Instant::now() + HANG;
    while r.fault.flushes().len() < n {
        r.initiator.progress();
        assert!(Instant::now() < deadline, "flush {n} never started");
    }
}

/// The lane masks of every flush the injector saw.
fn flush_masks(r: &Rig) -> Vec<u64> {
    r.fault.flushes().iter().map(|f| f.1).collect()
}

/// Each body that takes an `Over` runs as two tests: over the
/// injector on loopback, and over the injector on the asynchronous seam,
/// where each operation and flush completes 1 to 4 polls after its commit.
macro_rules! over_both {
    ($($name:ident),* $(,)?) => {
        mod over_loopback {
            $(
                #[test]
                fn $name() {
                    super::$name(crate::Over::Loopback);
                }
            )*
        }
        mod over_sim {
            $(
                #[test]
                fn $name() {
                    super::$name(crate::Over::Sim(crate::SimTiming::PollsBetween(1, 4)));
                }
            )*
        }
    };
}

mod atomics;
mod close;
mod epochs;
mod errors;
mod fences;
mod flush;
mod generations;
mod invariants;
mod model;
mod reentry;
mod ring;
mod worker_flush;
