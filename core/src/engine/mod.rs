//! The engine: everything the progress loop owns, and one bounded round of
//! it ([`Engine::progress`]).
//!
//! A round: move overflowed CQEs into their CQ; take SQEs (at most a batch
//! per queue pair, never more than free requests, none while that queue pair
//! has overflowed CQEs); validate each and hand it to its endpoint, which
//! starts it or queues it (docs/fence.md R14, R18); dispatch a bounded batch from
//! each endpoint that has queued work (R19); poll the drivers and complete
//! what finished; dispatch again what those completions admitted; post
//! incoming notifications; publish CQEs and ring CQ doorbells of
//! applications that sleep.
//!
//! # The direct path
//! Most operations need nothing from the fence engine: a PUT or GET on an
//! endpoint with nothing queued and no boundary pending (W = C) may start at
//! once (R14, R18). Those start straight from the SQE, without a request
//! slot, which they take only if the driver keeps them in flight; and a run
//! of them to one endpoint through the same keys goes to the driver in one
//! `DirectPath::execute` call when the driver finishes operations inside the
//! call (shm, loopback). Anything the driver does not run, and every other
//! SQE, takes the general path below, in order, so the rules and the
//! exactly-once guarantee are the same on both.
//!
//! Nothing here re-enters: a driver never calls the engine, a completion
//! only records its effect and schedules the endpoint, and dispatch runs
//! from the round, never from inside a completion (R25, R49, W1).
//!
//! # The fence engine (docs/fence.md)
//!
//! Per endpoint: W (`submit_epoch`) counts fences; every request captures W
//! at submission (R12, R13); C (`admitted_epoch`) is the epoch admitted so
//! far. A request starts only when its epoch is ≤ C and nothing is queued
//! ahead of it (R14, R18). When the head of the queue needs a later epoch,
//! one boundary action admits it (R15, R16), whatever number of fences lie
//! between (R11):
//! - nothing dirty: C moves at once, no driver call, no CQE (R10);
//! - no strong fence in between, and the dirty lanes plus the head's lane
//!   are one ordered lane: a weak fence, the transport fence flag on the
//!   head's post (R8);
//! - otherwise a strong fence: one flush of exactly the dirty lanes (R9,
//!   R17, R24), at most one per endpoint (R16), whose slot is owned before
//!   the driver is called (R25, W1). Its completion moves C to the exact
//!   target recorded at its start (R15c), clears only what was flushed (R17,
//!   W2), and schedules dispatch; it never dispatches itself (R19, R20, W1).
//!
//! A FENCE completes at once: it orders, it does not complete anything (R5).
//! Lanes carry generations: a lane replaced while dirty widens the next
//! flush to every lane (R38), and a flush during which a flushed lane was
//! replaced is repeated before C moves (R39).

use crate::config::Config;
use crate::driver::{Completion, Driver, Fails};
use crate::endpoint::{Endpoint, EndpointCold, MIXED};
use crate::memory::{MemRegistry, RkeyTable};
use crate::request::{Request, RequestId};
use crate::stats::Stats;
use crate::sys::notify::NotifyPool;
use ringfence_ring::Sqe;
use std::sync::Arc;

/// SQEs taken from one queue pair per round.
const INTAKE_BATCH: usize = 64;
/// Requests started from one endpoint's queue per round (R19).
const DISPATCH_BATCH: u32 = 16;
/// Driver completions handled per poll call.
const POLL_BATCH: usize = 64;
/// Largest NOTIFY payload.
pub(crate) const MAX_NOTIFY_LEN: u32 = 1 << 16;
/// Full batches of completions taken from one driver per round: what a
/// busy driver has beyond that waits for the next round, after the SQs.
const POLL_BATCHES: usize = 4;
/// In `EndpointCold::dirty_generation`: the lane was replaced while its
/// work was outstanding, so the next boundary flushes every lane (R38).
const REPLACED: u32 = u32::MAX;

/// What started a driver flush (counted apart in [`Stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FlushCause {
    Fence,
    Notify,
    User,
    Worker,
}

mod completion;
mod connect;
mod direct;
mod dispatch;
mod drivers;
mod fence;
mod intake;
mod lanes;
mod post;
mod queue;
mod quiet;
mod release;
mod teardown;
mod token;

use direct::DirectRun;
use dispatch::DispatchList;
use drivers::{DriverSet, SleepAnswer};
pub(crate) use queue::EngineQueue;
use release::Releases;
pub use release::UnreleasedMemory;
use token::Serials;

/// `a ≤ b` for 32-bit epoch snapshots (wrapping).
pub(super) fn epoch_le(a: u32, b: u32) -> bool {
    b.wrapping_sub(a) as i32 >= 0
}

/// What starting a request did.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Started {
    /// Posted, completed, or failed: handed on, no longer the endpoint's
    /// concern.
    Handed,
    /// The driver had no room: it goes back to the head of its queue.
    Blocked,
}

/// Everything the progress loop owns.
#[derive(Debug)]
pub(crate) struct Engine {
    pub(crate) config: Config,
    pub(crate) drivers: DriverSet,
    /// The core thread sleeps, and has not been woken yet. Set and cleared
    /// under the engine lock (by the core thread; cleared also by whoever
    /// takes the lock and rings the SQ doorbell meanwhile, see
    /// `Shared::engine`).
    pub(crate) core_asleep: bool,
    pub(crate) queues: Vec<EngineQueue>,
    pub(crate) endpoints: Vec<Endpoint>,
    pub(crate) cold: Vec<EndpointCold>,
    pub(crate) mem: MemRegistry,
    pub(crate) rkeys: RkeyTable,
    pub(crate) notify: Arc<NotifyPool>,
    /// The queue pair that receives notifications (the first one created).
    notify_queue: Option<usize>,
    dispatch_list: DispatchList,
    scratch: Box<[Completion]>,
    /// SQEs copied out of an SQ, one intake batch.
    sqe_scratch: Box<[Sqe]>,
    /// The direct path's lookups and run buffers.
    run: DirectRun,
    pub(crate) stats: Stats,
    /// Completions whose token matched nothing in flight (a driver bug,
    /// or a late or duplicated flush completion).
    pub(crate) stray_completions: u64,
    /// What the driver completion being applied says its failure means
    /// ([`Fails`]); [`Fails::ByStatus`] outside [`Engine::on_completion`],
    /// so that failures the engine itself produces are judged by status.
    verdict: Fails,
    /// Closed endpoints whose unpacked keys wait for their last operation
    /// in flight before they are released.
    closed_with_rkeys: Vec<usize>,
    /// Serials of flushes and connect attempts, carried in their tokens.
    serials: Serials,
    /// Memory withdrawn from drivers that have not all released it.
    releases: Releases,
    pub(crate) shut_down: bool,
}

impl Engine {
    pub(crate) fn new(
        config: Config,
        drivers: Vec<Box<dyn Driver>>,
        notify: Arc<NotifyPool>,
    ) -> Engine {
        let drivers = DriverSet::attach(drivers, &notify);
        Engine {
            config,
            drivers,
            core_asleep: false,
            queues: Vec::new(),
            endpoints: Vec::new(),
            cold: Vec::new(),
            mem: MemRegistry::default(),
            rkeys: RkeyTable::default(),
            notify,
            notify_queue: None,
            dispatch_list: DispatchList::default(),
            scratch: vec![Completion::default(); POLL_BATCH].into_boxed_slice(),
            sqe_scratch: vec![Sqe::default(); INTAKE_BATCH].into_boxed_slice(),
            run: DirectRun::new(INTAKE_BATCH),
            stats: Stats::default(),
            stray_completions: 0,
            verdict: Fails::ByStatus,
            closed_with_rkeys: Vec::new(),
            serials: Serials::default(),
            releases: Releases::default(),
            shut_down: false,
        }
    }

    pub(crate) fn add_queue(&mut self, queue: EngineQueue) -> usize {
        self.queues.push(queue);
        let index = self.queues.len() - 1;
        self.notify_queue.get_or_insert(index);
        index
    }

    pub(crate) fn add_endpoint(&mut self, ep: Endpoint, cold: EndpointCold) -> u32 {
        self.cold.push(cold);
        self.endpoints.push(ep);
        self.dispatch_list.reserve_one();
        self.endpoints.len() as u32 - 1
    }

    pub(super) fn request(&self, id: RequestId) -> &Request {
        self.queues[id.queue()]
            .pool
            .get(id.slot())
            .expect("request ids name live slots")
    }

    pub(super) fn request_mut(&mut self, id: RequestId) -> &mut Request {
        self.queues[id.queue()]
            .pool
            .get_mut(id.slot())
            .expect("request ids name live slots")
    }

    /// One bounded round. Returns how much work it did (0: idle).
    pub(crate) fn progress(&mut self) -> usize {
        let mut work = 0;
        for q in &mut self.queues {
            work += q.flush_overflow();
        }
        for qi in 0..self.queues.len() {
            work += self.intake(qi);
        }
        work += self.dispatch_scheduled();
        work += self.poll_drivers();
        if !self.releases.none_parked() {
            work += self.releases.reask(&mut self.drivers);
        }
        if !self.closed_with_rkeys.is_empty() {
            self.release_closed_rkeys();
        }
        // Requests a completion just admitted start in this round, not the
        // next: a second, separate pass (never from inside the completion).
        work += self.dispatch_scheduled();
        work += self.post_notifications();
        // One doorbell per round: the drivers submit what this round
        // posted and flushed, together.
        self.drivers.commit();
        for q in &mut self.queues {
            q.publish();
        }
        work
    }

    /// Whether the core thread may sleep after a round that did nothing,
    /// as far as the engine's own state goes: no CQE waits for room in its
    /// CQ (the application frees room without waking anyone), and no
    /// endpoint is scheduled (a driver said it had no room: only a retry
    /// finds out when it has). The drivers are asked next
    /// ([`prepare_drivers_sleep`](Engine::prepare_drivers_sleep)); SQs and
    /// notifications are checked by [`prepare_sleep`](Engine::prepare_sleep)
    /// and `NotifyPool::begin_sleep`, after their flags are set.
    pub(crate) fn may_sleep(&self) -> bool {
        self.dispatch_list.is_empty()
            && self.releases.none_parked()
            && self.queues.iter().all(|q| q.overflow.is_empty())
    }

    /// Asks every driver to prepare for sleep ([`Driver::prepare_sleep`]).
    /// `None` if the core thread must stay up: a driver answered
    /// [`Sleep::NotNow`], or one that answered [`Sleep::WhenIdle`] has
    /// work in flight on some endpoint (operations, a flush, a handshake;
    /// requests queued behind them wait for them, so are covered too). The
    /// drivers were then told they woke. Else the longest the core thread
    /// may sleep before polling again (`None` inside: until woken), and
    /// [`drivers_woke`](Engine::drivers_woke) must follow the sleep.
    pub(crate) fn prepare_drivers_sleep(&mut self) -> Option<Option<std::time::Duration>> {
        let (timeout, when_idle) = match self.drivers.prepare_sleep() {
            SleepAnswer::StayUp => return None,
            SleepAnswer::Sleep { timeout, when_idle } => (timeout, when_idle),
        };
        let stay = when_idle
            && self.endpoints.iter().zip(&self.cold).any(|(ep, cold)| {
                let busy = ep.inflight != 0 || ep.flushing != 0 || ep.is_connecting();
                // A mixed endpoint counts its work as a whole: busy if any
                // of its drivers needs polling.
                let polled = if ep.has(MIXED) {
                    cold.groups
                        .iter()
                        .any(|g| self.drivers.when_idle(g.driver as usize))
                } else {
                    self.drivers.when_idle(ep.driver as usize)
                };
                busy && polled
            });
        if stay {
            self.drivers.woke();
            return None;
        }
        Some(timeout)
    }

    /// Tells every driver that the core thread is up again after
    /// [`prepare_drivers_sleep`](Engine::prepare_drivers_sleep)
    /// ([`Driver::woke`]); nothing if they were not asked.
    pub(crate) fn drivers_woke(&mut self) {
        self.drivers.woke();
    }

    /// Sets NEED_WAKEUP on every SQ; returns whether all are still empty.
    pub(crate) fn prepare_sleep(&mut self) -> bool {
        let mut empty = true;
        for q in &mut self.queues {
            if !q.broken && !matches!(q.sq.prepare_wait(), Ok(true)) {
                empty = false;
            }
        }
        if !empty {
            self.finish_sleep();
        }
        empty
    }

    /// Clears NEED_WAKEUP on every SQ (but a failed one's: the engine
    /// writes nothing there any more).
    pub(crate) fn finish_sleep(&mut self) {
        for q in &mut self.queues {
            if !q.broken {
                q.sq.finish_wait();
            }
        }
    }

    /// The application dropped queue pair `qi`. Its ring stays the
    /// engine's (what is in flight still completes into it) until the
    /// worker goes; a failed one stops counting in
    /// [`failed_queues`](Engine::failed_queues).
    pub(crate) fn queue_dropped(&mut self, qi: usize) {
        if let Some(q) = self.queues.get_mut(qi) {
            q.dropped = true;
        }
    }

    /// Queue pairs that failed (their ring memory was found corrupt) and
    /// that the application has not dropped yet.
    pub(crate) fn failed_queues(&self) -> usize {
        self.queues
            .iter()
            .filter(|q| q.broken && !q.dropped)
            .count()
    }
}
