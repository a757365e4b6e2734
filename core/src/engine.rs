//! The engine: everything the progress loop owns, and one bounded round of
//! it ([`Engine::progress`]).
//!
//! A round: move overflowed CQEs into their CQ; take SQEs (at most a batch
//! per queue pair, never more than free requests, none while that queue pair
//! has overflowed CQEs); validate each and hand it to its endpoint, which
//! starts it or queues it (FENCE.md R14, R18); dispatch a bounded batch from
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
//! `Driver::execute` call when the driver finishes operations inside the
//! call (shm, loopback). Anything the driver does not run, and every other
//! SQE, takes the general path below, in order, so the rules and the
//! exactly-once guarantee are the same on both.
//!
//! Nothing here re-enters: a driver never calls the engine, a completion
//! only records its effect and schedules the endpoint, and dispatch runs
//! from the round, never from inside a completion (R25, R49, W1).
//!
//! # The fence engine (FENCE.md)
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
use crate::driver::{
    Completion, Driver, DriverContext, DriverMemKey, DriverRkey, LaneMask, Op, OpKind, Posted,
    Token,
};
use crate::endpoint::{Endpoint, EndpointCold, EpState, NO_LANE, WEAK_FLAG_OWED};
use crate::memory::{MemRegistry, RkeyTable, within};
use crate::request::{NONE, Pool, Request, RequestId, State};
use crate::stats::Stats;
use crate::sys::notify::{Delivery, NotifyPool};
use ringfence_ring::{
    AtomicOp, CQE_BUFFER_SHIFT, Consumer, Cqe, CqeFlags, Doorbell, FenceMode, Opcode, Producer,
    RingError, Sqe, SqeFlags, Status,
};
use std::collections::VecDeque;
use std::sync::Arc;

/// SQEs taken from one queue pair per round.
const INTAKE_BATCH: usize = 64;
/// Requests started from one endpoint's queue per round (R19).
const DISPATCH_BATCH: u32 = 16;
/// Driver completions handled per poll call.
const POLL_BATCH: usize = 64;
/// Largest NOTIFY payload.
pub(crate) const MAX_NOTIFY_LEN: u32 = 1 << 16;
/// Token bit marking a fence flush (the rest is the endpoint index).
const FENCE_TOKEN: u64 = 1 << 63;

/// The engine's side of one queue pair.
#[derive(Debug)]
pub(crate) struct EngineQueue {
    sq: Consumer<Sqe>,
    cq: Producer<Cqe>,
    pool: Pool,
    /// CQEs that found the CQ full, oldest first. Its capacity covers the
    /// most that can wait here (see `new`), so it never grows.
    overflow: VecDeque<Cqe>,
    cq_bell: Option<Arc<Doorbell>>,
    /// CQEs pushed this round, to publish.
    pushed: bool,
    /// The SQ's shared indices were found corrupt: nothing more is taken.
    broken: bool,
}

impl EngineQueue {
    pub(crate) fn new(
        sq: Consumer<Sqe>,
        cq: Producer<Cqe>,
        requests: u32,
        notify_buffers: u32,
        cq_bell: Option<Arc<Doorbell>>,
    ) -> EngineQueue {
        EngineQueue {
            sq,
            cq,
            pool: Pool::new(requests),
            // Bound: one CQE per request, per notification buffer, and per
            // SQE of the intake batch that overflowed (NOPs and invalid SQEs
            // complete without a request).
            overflow: VecDeque::with_capacity(
                requests as usize + notify_buffers as usize + INTAKE_BATCH,
            ),
            cq_bell,
            pushed: false,
            broken: false,
        }
    }

    /// Posts one CQE, or keeps it in order in the overflow list.
    fn post(&mut self, cqe: Cqe, stats: &mut Stats) {
        if self.overflow.is_empty() {
            match self.cq.push(cqe) {
                Ok(()) => {
                    self.pushed = true;
                    return;
                }
                Err(RingError::Full) => {}
                Err(RingError::Corrupt(c)) => {
                    tracing::error!(%c, "CQ indices corrupt; completions kept in the overflow list");
                }
            }
            self.cq.set_overflow(true);
        }
        stats.cq_overflows += 1;
        self.overflow.push_back(cqe);
    }

    /// Posts the CQE of an operation that finished with `result` (bytes or
    /// a status), unless it succeeded and asked to skip its CQE.
    #[inline]
    fn finish(
        &mut self,
        user_data: u64,
        result: Result<u32, Status>,
        skip_success: bool,
        stats: &mut Stats,
    ) {
        let res = match result {
            Ok(_) if skip_success => return,
            Ok(n) => n.min(i32::MAX as u32) as i32,
            Err(status) => status.as_raw(),
        };
        self.post(Cqe::new(user_data, res, 0), stats);
    }

    /// Moves overflowed CQEs into the CQ while it has room.
    pub(crate) fn flush_overflow(&mut self) -> usize {
        let mut moved = 0;
        while let Some(&cqe) = self.overflow.front() {
            if self.cq.push(cqe).is_err() {
                break;
            }
            self.overflow.pop_front();
            moved += 1;
        }
        if moved > 0 {
            self.pushed = true;
            if self.overflow.is_empty() {
                self.cq.set_overflow(false);
            }
        }
        moved
    }

    /// Publishes this round's CQEs; rings the doorbell of a sleeping reaper.
    pub(crate) fn publish(&mut self) {
        if self.pushed {
            self.pushed = false;
            self.cq.submit();
            if let Some(bell) = &self.cq_bell {
                if self.cq.needs_wakeup() {
                    if let Err(e) = bell.ring() {
                        tracing::error!(error = %e, "CQ doorbell failed");
                    }
                }
            }
        }
    }
}

/// A PUT or GET: an SQE the direct path may take.
#[inline]
fn is_rma(sqe: &Sqe) -> bool {
    sqe.opcode == Opcode::PUT.as_raw() || sqe.opcode == Opcode::GET.as_raw()
}

/// The opcode of a PUT or GET; `None` for any other SQE.
#[inline]
fn rma_opcode(sqe: &Sqe) -> Option<Opcode> {
    match sqe.opcode {
        op if op == Opcode::PUT.as_raw() => Some(Opcode::PUT),
        op if op == Opcode::GET.as_raw() => Some(Opcode::GET),
        _ => None,
    }
}

/// What the direct path needs of an SQE it admits.
#[derive(Debug, Clone, Copy)]
struct Direct {
    opcode: Opcode,
    skip_success: bool,
    keys: OpKeys,
}

/// The lookups of the last PUT or GET the direct path took, reused for the
/// following SQEs (of this intake batch or a later one) that name the same endpoint,
/// registration and remote key (the common case: a stream of PUTs from one
/// buffer into one window, or a ping-pong). Remote keys are never removed,
/// a driver's capabilities never change, and registrations change only
/// outside intake: the lookups stay valid until a registration is removed
/// (`MemRegistry::removals` moves), which intake checks first.
#[derive(Debug, Clone, Copy)]
struct Resolved {
    endpoint: u32,
    local_mem: u32,
    rkey: u32,
    max_len: u32,
    get: bool,
    /// The endpoint's driver runs runs (`Capabilities::execute`).
    execute: bool,
    /// `MemRegistry::removals` when resolved.
    removals: u64,
    /// Base and length of the registration, and of the remote key.
    local: (u64, u64),
    remote: (u64, u64),
    keys: OpKeys,
}

impl Resolved {
    /// Matches no SQE: remote key 0 is never valid.
    const NONE: Resolved = Resolved {
        endpoint: 0,
        local_mem: 0,
        rkey: 0,
        max_len: 0,
        get: false,
        execute: false,
        removals: 0,
        local: (0, 0),
        remote: (0, 0),
        keys: OpKeys {
            local: None,
            remote: None,
        },
    };

    /// The keys of `sqe` if it names what was resolved and passes every
    /// check `Engine::check_rma` makes; `None` sends it to the full checks.
    #[inline]
    fn admits(&self, sqe: &Sqe, opcode: Opcode) -> Option<OpKeys> {
        self.covers(sqe, opcode).then(|| OpKeys {
            local: self.keys.local,
            remote: self.keys.remote.map(|(key, _)| (key, sqe.remote_addr)),
        })
    }

    /// Whether `sqe` names what was resolved and passes every check
    /// `Engine::check_rma` makes.
    #[inline]
    fn covers(&self, sqe: &Sqe, opcode: Opcode) -> bool {
        let len = u64::from(sqe.len);
        sqe.rkey == self.rkey
            && sqe.endpoint == self.endpoint
            && sqe.local_mem == self.local_mem
            && sqe.subop == 0
            && (opcode == Opcode::PUT || self.get)
            && sqe.len != 0
            && sqe.len <= self.max_len
            && within(self.local.0, self.local.1, sqe.local_addr, len)
            && within(self.remote.0, self.remote.1, sqe.remote_addr, len)
    }
}

/// The driver's keys an operation names: its local registration's and its
/// remote key's (with the remote address).
#[derive(Debug, Clone, Copy, Default)]
struct OpKeys {
    local: Option<DriverMemKey>,
    remote: Option<(DriverRkey, u64)>,
}

/// Whether an error fails the whole endpoint (the connection is unusable)
/// rather than only the operation (the target refused this access).
fn is_fatal(status: Status) -> bool {
    matches!(
        status,
        Status::Transport
            | Status::PeerUnreachable
            | Status::Timeout
            | Status::EndpointClosed
            | Status::Canceled
    )
}

/// `a ≤ b` for 32-bit epoch snapshots (wrapping).
fn epoch_le(a: u32, b: u32) -> bool {
    b.wrapping_sub(a) as i32 >= 0
}

/// What starting a request did.
#[derive(Debug, PartialEq, Eq)]
enum Started {
    /// Posted, completed, or failed: it is no longer the endpoint's concern.
    Gone,
    /// The driver had no room: it goes back to the head of its queue.
    Blocked,
}

/// Everything the progress loop owns.
#[derive(Debug)]
pub(crate) struct Engine {
    pub(crate) config: Config,
    pub(crate) drivers: Vec<Box<dyn Driver>>,
    /// Each driver's capabilities, read once: validation consults them for
    /// every SQE.
    capabilities: Vec<crate::driver::Capabilities>,
    pub(crate) queues: Vec<EngineQueue>,
    pub(crate) endpoints: Vec<Endpoint>,
    pub(crate) cold: Vec<EndpointCold>,
    pub(crate) mem: MemRegistry,
    pub(crate) rkeys: RkeyTable,
    pub(crate) notify: Arc<NotifyPool>,
    /// The queue pair that receives notifications (the first one created).
    notify_queue: Option<usize>,
    scheduled: Vec<u32>,
    scheduled_next: Vec<u32>,
    scratch: Box<[Completion]>,
    /// SQEs copied out of an SQ, one intake batch.
    sqe_scratch: Box<[Sqe]>,
    /// The direct path's lookups, valid until a registration is removed.
    resolved: Resolved,
    /// A run's operations for `Driver::execute`, and their results (both
    /// allocated once, for a whole intake batch).
    run_ops: Vec<Op>,
    run_results: Box<[Result<u32, Status>]>,
    pub(crate) stats: Stats,
    /// Completions whose token matched nothing in flight (a driver bug).
    pub(crate) stray_completions: u64,
    pub(crate) shut_down: bool,
}

impl Engine {
    pub(crate) fn new(
        config: Config,
        mut drivers: Vec<Box<dyn Driver>>,
        notify: Arc<NotifyPool>,
    ) -> Engine {
        for d in &mut drivers {
            d.attach(DriverContext {
                notify: notify.clone(),
            });
        }
        let capabilities = drivers.iter().map(|d| d.capabilities()).collect();
        Engine {
            config,
            drivers,
            capabilities,
            queues: Vec::new(),
            endpoints: Vec::new(),
            cold: Vec::new(),
            mem: MemRegistry::default(),
            rkeys: RkeyTable::default(),
            notify,
            notify_queue: None,
            scheduled: Vec::new(),
            scheduled_next: Vec::new(),
            scratch: vec![Completion::default(); POLL_BATCH].into_boxed_slice(),
            sqe_scratch: vec![Sqe::default(); INTAKE_BATCH].into_boxed_slice(),
            resolved: Resolved::NONE,
            run_ops: Vec::with_capacity(INTAKE_BATCH),
            run_results: vec![Ok(0); INTAKE_BATCH].into_boxed_slice(),
            stats: Stats::default(),
            stray_completions: 0,
            shut_down: false,
        }
    }

    pub(crate) fn add_queue(&mut self, queue: EngineQueue) -> usize {
        self.queues.push(queue);
        let index = self.queues.len() - 1;
        self.notify_queue.get_or_insert(index);
        index
    }

    pub(crate) fn add_endpoint(&mut self, ep: Endpoint) -> u32 {
        self.cold.push(EndpointCold::new(ep.lanes));
        self.endpoints.push(ep);
        self.scheduled.reserve(1);
        self.scheduled_next.reserve(1);
        self.endpoints.len() as u32 - 1
    }

    fn request(&self, id: RequestId) -> &Request {
        self.queues[id.queue()]
            .pool
            .get(id.slot())
            .expect("request ids name live slots")
    }

    fn request_mut(&mut self, id: RequestId) -> &mut Request {
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
        // Requests a completion just admitted start in this round, not the
        // next: a second, separate pass (never from inside the completion).
        work += self.dispatch_scheduled();
        work += self.post_notifications();
        for q in &mut self.queues {
            q.publish();
        }
        work
    }

    /// Whether nothing is in flight or waiting: the core thread may sleep.
    pub(crate) fn is_idle(&self) -> bool {
        self.queues
            .iter()
            .all(|q| q.pool.in_use() == 0 && q.overflow.is_empty())
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

    pub(crate) fn finish_sleep(&mut self) {
        for q in &mut self.queues {
            q.sq.finish_wait();
        }
    }

    // ------------------------------------------------------------ intake

    fn intake(&mut self, qi: usize) -> usize {
        let q = &mut self.queues[qi];
        if q.broken || !q.overflow.is_empty() {
            return 0;
        }
        let room = (q.pool.available() as usize).min(INTAKE_BATCH);
        if room == 0 {
            return 0;
        }
        // A buffer kept across rounds: zeroing 4 KiB on every round costs
        // more than a small batch's processing.
        let mut sqes = std::mem::take(&mut self.sqe_scratch);
        if self.resolved.removals != self.mem.removals() {
            // A registration went away since the lookups were made.
            self.resolved = Resolved::NONE;
        }
        let q = &mut self.queues[qi];
        let n = match q.sq.pop_batch(&mut sqes[..room]) {
            Ok(n) => n,
            Err(c) => {
                tracing::error!(%c, queue = qi, "SQ indices corrupt; this queue pair takes no more SQEs");
                q.broken = true;
                self.sqe_scratch = sqes;
                return 0;
            }
        };
        if n > 0 && is_rma(&sqes[0]) {
            self.prefetch(&sqes[0]);
        }
        // Runs of direct PUTs and GETs to one endpoint go to its driver in
        // one call; anything else first ends the run (order is kept).
        let (mut i, mut start) = (0, 0);
        while i < n {
            let sqe = &sqes[i];
            let rma = is_rma(sqe) && !self.shut_down;
            if rma && self.extends_run(sqe, i - start, sqes[start].endpoint) {
                i += 1;
                continue;
            }
            if i > start {
                self.execute_run(qi, &sqes[start..i]);
                start = i;
                continue; // `sqe` may start the next run
            }
            if !(rma && self.try_direct(qi, sqe)) {
                self.accept(qi, sqe);
            }
            i += 1;
            start = i;
        }
        if i > start {
            self.execute_run(qi, &sqes[start..i]);
        }
        self.sqe_scratch = sqes;
        n
    }

    /// Takes one SQE. Every path ends in exactly one completion (R31): an
    /// invalid SQE or a NOP completes here, without a request slot (its CQE
    /// is all there is to it); anything else gets a slot and goes to its
    /// endpoint.
    #[inline]
    fn accept(&mut self, qi: usize, sqe: &Sqe) {
        let validated = if self.shut_down {
            Err(Status::Canceled)
        } else {
            self.validate(sqe)
        };
        match validated {
            Err(status) => self.complete_now(qi, sqe.user_data, Err(status), false),
            Ok(request) if request.opcode() == Opcode::NOP => {
                self.complete_now(qi, sqe.user_data, Ok(0), request.skip_success());
            }
            Ok(request) => {
                let id = self.take_slot(qi, request);
                self.submit(id);
            }
        }
    }

    /// Gives a validated request a slot of queue `qi`, with its reference
    /// on its local registration.
    fn take_slot(&mut self, qi: usize, request: Request) -> RequestId {
        let slot = self.queues[qi]
            .pool
            .alloc(request)
            .expect("intake never takes more SQEs than free requests");
        if request.holds_mem() {
            if let Some(r) = self.mem.get_mut(request.local_mem) {
                r.inflight += 1;
            }
        }
        RequestId::new(qi as u32, slot)
    }

    /// Whether `sqe` may take the direct path: a valid PUT or GET on an
    /// endpoint that is connected with nothing queued (R18) and no boundary
    /// pending (W = C, so its epoch is admitted, R14; no weak admission or
    /// strong fence is outstanding either, as both need W > C). Returns what
    /// the path needs, from the lookups of the previous SQE when it names
    /// the same endpoint, registration and remote key. `None` for anything
    /// else, which takes the general path: that one validates again and
    /// reports any error.
    #[inline]
    fn direct(&mut self, sqe: &Sqe) -> Option<Direct> {
        let opcode = rma_opcode(sqe)?;
        let flags = sqe.flags().ok()?;
        let ep = self.endpoints.get(sqe.endpoint as usize)?;
        let ready = ep.head == NONE
            && ep.submit_epoch == ep.admitted_epoch
            && !ep.strong_armed
            && ep.state == EpState::Connected;
        if !ready || !sqe.reserved_are_zero() {
            return None;
        }
        debug_assert_eq!(ep.weak_lane, NO_LANE);
        let keys = match self.resolved.admits(sqe, opcode) {
            Some(keys) => keys,
            None => {
                let mut keys = OpKeys::default();
                self.check_rma(sqe, opcode, ep.driver, &mut keys).ok()?;
                self.resolved = self.resolve(sqe, ep.driver, keys);
                keys
            }
        };
        Some(Direct {
            opcode,
            skip_success: flags.contains(SqeFlags::SKIP_SUCCESS),
            keys,
        })
    }

    /// Whether the run of SQEs that ends before `sqe` (`run` of them, all
    /// on endpoint `run_ep`) may take it too: the direct path admits it, on
    /// the same endpoint, on lane 0, with the same keys, and its driver
    /// executes runs.
    #[inline]
    fn extends_run(&mut self, sqe: &Sqe, run: usize, run_ep: u32) -> bool {
        let Some(opcode) = rma_opcode(sqe) else {
            return false;
        };
        let threshold = self.config.bw_threshold;
        if run == 0 && self.starts_as_run(sqe, opcode) {
            return true;
        }
        if run == 0 {
            // The first of a run: every check of the direct path, and the
            // lookups the rest of the run reuses.
            let Some(ep) = self.endpoints.get(sqe.endpoint as usize) else {
                return false;
            };
            return self.capabilities[ep.driver as usize].execute
                && ep.peek_data_lane(sqe.len, threshold) == 0
                && self.direct(sqe).is_some();
        }
        // The rest: the endpoint's state cannot change before the run
        // executes, and the keys are the first one's.
        sqe.endpoint == run_ep
            && sqe.flags().is_ok()
            && sqe.reserved_are_zero()
            && self.endpoints[run_ep as usize].peek_data_lane(sqe.len, threshold) == 0
            && self.resolved.covers(sqe, opcode)
    }

    /// `extends_run` for the first SQE of a run, from the kept lookups
    /// alone: `sqe` names what `resolved` holds and passes the direct
    /// path's every check (see `direct`). `false` may still start a run
    /// after the full lookups.
    #[inline]
    fn starts_as_run(&self, sqe: &Sqe, opcode: Opcode) -> bool {
        let Some(ep) = self.endpoints.get(sqe.endpoint as usize) else {
            return false;
        };
        self.resolved.execute
            && self.resolved.covers(sqe, opcode)
            && sqe.flags().is_ok()
            && sqe.reserved_are_zero()
            && ep.head == NONE
            && ep.submit_epoch == ep.admitted_epoch
            && !ep.strong_armed
            && ep.state == EpState::Connected
            && ep.peek_data_lane(sqe.len, self.config.bw_threshold) == 0
    }

    /// Runs `sqes` (a run that `extends_run` admitted, all on one endpoint
    /// and lane 0) through its driver's `execute`: one call for the run
    /// instead of one `post` each. What the driver did not run goes through
    /// the general path, in order.
    fn execute_run(&mut self, qi: usize, sqes: &[Sqe]) {
        let e = sqes[0].endpoint as usize;
        let ran = self.execute_ops(e, sqes);
        let (mut bytes, mut errors) = (0u64, 0u64);
        for (sqe, &result) in sqes[..ran].iter().zip(&self.run_results[..ran]) {
            let skip = sqe.flags & SqeFlags::SKIP_SUCCESS.bits() != 0;
            match result {
                Ok(n) => bytes += u64::from(n),
                Err(_) => errors += 1,
            }
            self.queues[qi].finish(sqe.user_data, result, skip, &mut self.stats);
        }
        self.count(e, ran as u64, bytes, errors);
        if let Some(&Err(status)) = self.run_results[..ran].last() {
            if is_fatal(status) {
                self.fail_endpoint(e, status);
            }
        }
        for sqe in &sqes[ran..] {
            if self.shut_down || !self.try_direct(qi, sqe) {
                self.accept(qi, sqe);
            }
        }
    }

    /// Hands `sqes` (PUTs and GETs of endpoint `e` on lane 0, with the keys
    /// in `resolved`) to the driver's `execute`; returns how many it ran,
    /// their results in `run_results`. Marks lane 0 dirty first (R14), with
    /// its generation (R38).
    #[inline]
    fn execute_ops(&mut self, e: usize, sqes: &[Sqe]) -> usize {
        let ep = &mut self.endpoints[e];
        let (driver, driver_ep) = (ep.driver as usize, crate::driver::DriverEp(ep.driver_ep));
        if ep.dirty & 1 == 0 {
            ep.dirty |= 1;
            self.cold[e].dirty_generation[0] = self.drivers[driver].lane_generation(driver_ep, 0);
        }
        let keys = self.resolved.keys;
        let op = |sqe: &Sqe| Op {
            kind: if sqe.opcode == Opcode::PUT.as_raw() {
                OpKind::Put
            } else {
                OpKind::Get
            },
            lane: 0,
            local_addr: sqe.local_addr,
            local_key: keys.local,
            remote: keys.remote.map(|(key, _)| (key, sqe.remote_addr)),
            len: sqe.len,
            operand: 0,
            operand2: 0,
            fence: false,
        };
        let driver = &mut self.drivers[driver];
        if let [sqe] = sqes {
            // A run of one (a ping-pong): the driver's single-operation path.
            return match driver.execute_one(driver_ep, &op(sqe)) {
                Some(result) => {
                    self.run_results[0] = result;
                    1
                }
                None => 0,
            };
        }
        self.run_ops.clear();
        self.run_ops.extend(sqes.iter().map(op));
        driver
            .execute(
                driver_ep,
                &self.run_ops,
                &mut self.run_results[..sqes.len()],
            )
            .min(sqes.len())
    }

    /// Runs `sqe` now, on the caller's thread, if the direct path would
    /// start it as a run of one: a valid PUT or GET, on lane 0 of a
    /// connected endpoint with nothing queued and no boundary pending (R14,
    /// R18), through a driver that finishes operations inside `execute`;
    /// and only if queue pair `qi` holds no SQE the engine has not taken
    /// (an earlier one could be a FENCE that must go first, R12). Returns
    /// its result, which is its one completion (R31): no CQE follows.
    /// `None`: nothing was done, and nothing was counted.
    pub(crate) fn run_now(&mut self, qi: usize, sqe: &Sqe) -> Option<Result<u32, Status>> {
        rma_opcode(sqe)?;
        if self.resolved.removals != self.mem.removals() {
            self.resolved = Resolved::NONE;
        }
        self.prefetch(sqe);
        // `extends_run` tries the kept lookups first (`starts_as_run`).
        let admitted = self.extends_run(sqe, 0, sqe.endpoint) && self.resolved.execute;
        let q = &mut self.queues[qi];
        if !admitted || self.shut_down || q.broken || !matches!(q.sq.ready(), Ok(0)) {
            return None;
        }
        let e = sqe.endpoint as usize;
        if self.execute_ops(e, std::slice::from_ref(sqe)) == 0 {
            return None;
        }
        let result = self.run_results[0];
        match result {
            Ok(n) => self.count(e, 1, u64::from(n), 0),
            Err(status) => self.ran_now_failed(e, status),
        }
        Some(result)
    }

    /// Hands the driver a prefetch hint for `sqe` if it names the kept
    /// lookups' endpoint and remote key (a ping-pong: the next PUT goes to
    /// the same line): the peer's line starts moving here while `run_now`
    /// checks the SQE. Only a hint: nothing is accessed before the checks.
    #[inline]
    fn prefetch(&self, sqe: &Sqe) {
        let r = &self.resolved;
        let Some((rkey, _)) = r.keys.remote else {
            return;
        };
        if sqe.rkey != r.rkey || sqe.endpoint != r.endpoint {
            return;
        }
        // No driver after shutdown: nothing to hint.
        let Some(ep) = self.endpoints.get(sqe.endpoint as usize) else {
            return;
        };
        if let Some(driver) = self.drivers.get(ep.driver as usize) {
            let write = sqe.opcode == Opcode::PUT.as_raw();
            driver.prefetch(
                crate::driver::DriverEp(ep.driver_ep),
                rkey,
                sqe.remote_addr,
                write,
            );
        }
    }

    /// Counts an operation `run_now` ran that failed with `status`, and
    /// fails its endpoint if the error is fatal: its other requests
    /// complete now, with CQEs.
    #[cold]
    #[inline(never)]
    fn ran_now_failed(&mut self, e: usize, status: Status) {
        self.count(e, 1, 0, 1);
        if is_fatal(status) {
            self.fail_endpoint(e, status);
            for q in &mut self.queues {
                q.publish();
            }
        }
    }

    /// The direct path for one SQE: it starts from the SQE without a
    /// request slot, which is all it needs on drivers that finish
    /// operations inside `post` (shm, loopback). Its token names the slot
    /// the pool hands out next: if the driver keeps the operation in flight
    /// (or has no room for it), it takes exactly that slot, as if it had
    /// gone through `submit`. Returns `false` (nothing done) if the SQE
    /// does not qualify (see `direct`). Not inlined: intake's loop, which
    /// every SQE passes, stays small for the others (NOPs above all).
    #[inline(never)]
    fn try_direct(&mut self, qi: usize, sqe: &Sqe) -> bool {
        let Some(Direct {
            opcode,
            skip_success,
            keys,
        }) = self.direct(sqe)
        else {
            return false;
        };
        let e = sqe.endpoint as usize;
        let kind = if opcode == Opcode::PUT {
            OpKind::Put
        } else {
            OpKind::Get
        };
        let slot = self.queues[qi]
            .pool
            .next_free()
            .expect("intake never takes more SQEs than free requests");
        let id = RequestId::new(qi as u32, slot);
        let mut op = Op {
            kind,
            lane: 0,
            local_addr: sqe.local_addr,
            local_key: keys.local,
            remote: keys.remote,
            len: sqe.len,
            operand: 0,
            operand2: 0,
            fence: false,
        };
        match self.post_lane_op(e, &mut op, id) {
            Posted::Done(result) => {
                let (bytes, error) = match result {
                    Ok(n) => (u64::from(n), 0),
                    Err(_) => (0, 1),
                };
                self.count(e, 1, bytes, error);
                self.queues[qi].finish(sqe.user_data, result, skip_success, &mut self.stats);
                if let Err(status) = result {
                    if is_fatal(status) {
                        self.fail_endpoint(e, status);
                    }
                }
            }
            posted => {
                let flags = if skip_success {
                    SqeFlags::SKIP_SUCCESS
                } else {
                    SqeFlags::EMPTY
                };
                let mut request = Request::from_sqe(sqe, opcode, e as u16, flags);
                request.set_holds_mem();
                request.epoch = self.endpoints[e].submit_epoch as u32;
                let taken = self.take_slot(qi, request);
                debug_assert_eq!(taken, id, "the token named the next free slot");
                if posted == Posted::InFlight {
                    self.request_mut(id).set_state(State::Posted);
                    self.endpoints[e].inflight += 1;
                } else {
                    // No room in the driver: first in line (the queue was
                    // empty), it starts again from dispatch, ahead of
                    // anything submitted after it.
                    self.push_head(e, id);
                    self.schedule(e);
                }
            }
        }
        true
    }

    /// Completes an SQE that never became a request.
    fn complete_now(
        &mut self,
        qi: usize,
        user_data: u64,
        result: Result<u32, Status>,
        skip_success: bool,
    ) {
        self.stats.ops += 1;
        self.stats.errors += u64::from(result.is_err());
        self.queues[qi].finish(user_data, result, skip_success, &mut self.stats);
    }

    /// Checks every field of an SQE and copies what the engine needs.
    fn validate(&self, sqe: &Sqe) -> Result<Request, Status> {
        let opcode = sqe.opcode().map_err(|e| e.status())?;
        let flags = sqe.flags().map_err(|e| e.status())?;
        if !sqe.reserved_are_zero() {
            return Err(Status::InvalidFlags);
        }
        if opcode == Opcode::NOP {
            return Ok(Request::from_sqe(sqe, opcode, 0, flags));
        }
        let ep_index = sqe.endpoint as usize;
        let ep = self
            .endpoints
            .get(ep_index)
            .ok_or(Status::InvalidEndpoint)?;
        match (ep.state, opcode) {
            (EpState::Connected, _) => {}
            // R34: a fence and a close on a failed endpoint are accepted.
            (EpState::Failed, Opcode::FENCE | Opcode::CLOSE) => {}
            (EpState::Failed, _) => return Err(ep.error()),
            // R43: nothing is queued behind a close.
            (EpState::Closing | EpState::Closed, _) => return Err(Status::EndpointClosed),
        }
        let caps = &self.capabilities[ep.driver as usize];
        let mut request = Request::from_sqe(sqe, opcode, ep_index as u16, flags);
        let len = u64::from(sqe.len);
        match opcode {
            Opcode::PUT | Opcode::GET => {
                self.check_rma(sqe, opcode, ep.driver, &mut OpKeys::default())?;
                request.set_holds_mem();
            }
            Opcode::ATOMIC => {
                let op = sqe.atomic_op().map_err(|e| e.status())?;
                if !caps.atomics {
                    return Err(Status::Unsupported);
                }
                if sqe.len != 8 {
                    return Err(Status::InvalidLength);
                }
                if sqe.remote_addr % 8 != 0 {
                    return Err(Status::Misaligned);
                }
                self.check_remote(sqe, 8)?;
                if op != AtomicOp::ADD {
                    if sqe.local_addr % 8 != 0 {
                        return Err(Status::Misaligned);
                    }
                    self.mem.check(sqe.local_mem, sqe.local_addr, 8)?;
                    request.set_holds_mem();
                }
            }
            Opcode::FENCE => {
                sqe.fence_mode().map_err(|e| e.status())?;
            }
            Opcode::FLUSH => {
                if sqe.subop != 0 {
                    return Err(Status::InvalidSubop);
                }
            }
            Opcode::CLOSE => {
                sqe.close_mode().map_err(|e| e.status())?;
            }
            Opcode::NOTIFY => {
                if sqe.subop != 0 {
                    return Err(Status::InvalidSubop);
                }
                if !caps.notify {
                    return Err(Status::Unsupported);
                }
                if sqe.len > MAX_NOTIFY_LEN {
                    return Err(Status::InvalidLength);
                }
                if sqe.len > 0 {
                    self.mem.check(sqe.local_mem, sqe.local_addr, len)?;
                    request.set_holds_mem();
                }
            }
            _ => return Err(Status::InvalidOpcode),
        }
        Ok(request)
    }

    /// What the direct path may reuse for the next SQE that names the same
    /// endpoint, registration and remote key as `sqe`, which passed
    /// `check_rma` with `keys`.
    fn resolve(&self, sqe: &Sqe, driver: u8, keys: OpKeys) -> Resolved {
        let caps = &self.capabilities[driver as usize];
        match (
            self.mem.get(sqe.local_mem),
            self.rkeys.get(sqe.rkey, sqe.endpoint),
        ) {
            (Some(local), Some(remote)) => Resolved {
                endpoint: sqe.endpoint,
                local_mem: sqe.local_mem,
                rkey: sqe.rkey,
                max_len: caps.max_len,
                get: caps.get,
                execute: caps.execute,
                removals: self.mem.removals(),
                local: (local.base, local.len),
                remote: (remote.base, remote.len),
                keys,
            },
            _ => Resolved::NONE,
        }
    }

    /// The checks of a PUT or GET beyond its opcode, flags and endpoint;
    /// puts the driver's keys of both ranges in `keys`.
    #[inline]
    fn check_rma(
        &self,
        sqe: &Sqe,
        opcode: Opcode,
        driver: u8,
        keys: &mut OpKeys,
    ) -> Result<(), Status> {
        let caps = &self.capabilities[driver as usize];
        if sqe.subop != 0 {
            return Err(Status::InvalidSubop);
        }
        if opcode == Opcode::GET && !caps.get {
            return Err(Status::Unsupported);
        }
        if sqe.len == 0 || sqe.len > caps.max_len {
            return Err(Status::InvalidLength);
        }
        let len = u64::from(sqe.len);
        let local = self.mem.check(sqe.local_mem, sqe.local_addr, len)?;
        keys.local = Some(local.keys[driver as usize]);
        keys.remote = Some(self.check_remote(sqe, len)?);
        Ok(())
    }

    /// The driver's key and the address of an SQE's remote range, after
    /// checking that it lies inside a key unpacked for its endpoint.
    fn check_remote(&self, sqe: &Sqe, len: u64) -> Result<(DriverRkey, u64), Status> {
        let key = self
            .rkeys
            .get(sqe.rkey, sqe.endpoint)
            .ok_or(Status::InvalidRkey)?;
        if within(key.base, key.len, sqe.remote_addr, len) {
            Ok((key.driver, sqe.remote_addr))
        } else {
            Err(Status::OutOfBounds)
        }
    }

    // ------------------------------------------------------------ endpoints

    /// Captures the request's epoch (R13) and starts it, or queues it behind
    /// what is queued or behind an unresolved boundary (R14, R18).
    fn submit(&mut self, id: RequestId) {
        let request = *self.request(id);
        let (opcode, e) = (request.opcode(), request.endpoint as usize);
        match opcode {
            Opcode::FENCE => return self.fence(id, e, request.subop()),
            Opcode::CLOSE if request.subop() == ringfence_ring::CloseMode::FORCE.as_raw() => {
                return self.force_close(id, e);
            }
            Opcode::CLOSE if self.endpoints[e].state == EpState::Failed => {
                // R34: closing a failed endpoint succeeds at once.
                self.close_now(e);
                return self.complete(id, Ok(0));
            }
            Opcode::CLOSE => self.endpoints[e].state = EpState::Closing,
            _ => {}
        }
        let ep = &mut self.endpoints[e];
        if opcode == Opcode::NOTIFY {
            // An implicit strong fence: delivered after everything earlier
            // is remotely complete (DESIGN.md, Notifications).
            ep.submit_epoch += 1;
            ep.strong_armed = true;
        }
        let strong = std::mem::take(&mut ep.strong_armed);
        let epoch = ep.submit_epoch as u32;
        let queue_empty = ep.head == NONE;
        let r = self.request_mut(id);
        r.epoch = epoch;
        if strong {
            r.set_strong_boundary();
        }
        let mut can_start = queue_empty && self.admitted(id);
        if queue_empty && !can_start && self.endpoints[e].flushing == 0 {
            // First in line for a new epoch: take the boundary action now,
            // from the submitting round (never from a completion, R19).
            let target = self.endpoints[e].full_epoch(epoch);
            can_start = self.cross_boundary(e, id, target) && self.admitted(id);
            if self.endpoints[e].state == EpState::Failed {
                // The boundary flush failed inside its start and the
                // endpoint's queue was purged; this request was not in it
                // yet (R20, R32).
                let status = self.endpoints[e].error();
                return self.complete(id, Err(status));
            }
        }
        if can_start {
            // No boundary lies between C and this request (its epoch is
            // admitted), so it starts now, in the submitting round.
            if self.start(id) == Started::Gone {
                return;
            }
            self.push_head(e, id);
        } else {
            self.stats.deferrals += 1;
            self.cold[e].stats.deferrals += 1;
            self.push_tail(e, id);
        }
        self.schedule(e);
    }

    /// A FENCE bumps W and completes at once (R5): it orders; the boundary
    /// action happens when the next request needs it (R10, R11). On a failed
    /// endpoint it is accepted and does nothing (R34).
    fn fence(&mut self, id: RequestId, e: usize, subop: u8) {
        let mode = FenceMode::try_from(subop).unwrap_or(FenceMode::STRONG);
        let ep = &mut self.endpoints[e];
        if ep.state == EpState::Connected {
            ep.submit_epoch += 1;
            ep.strong_armed |= mode == FenceMode::STRONG;
        }
        tracing::trace!(endpoint = e, ?mode, epoch = ep.submit_epoch, "fence");
        self.stats.fences += 1;
        self.cold[e].stats.fences += 1;
        self.complete(id, Ok(0));
    }

    /// R42: a forced close cancels the queue and the in-flight fence at
    /// once, and releases the connection; requests already posted come back
    /// through the driver.
    fn force_close(&mut self, id: RequestId, e: usize) {
        self.fail_endpoint(e, Status::Canceled);
        self.close_now(e);
        self.complete(id, Ok(0));
    }

    /// Releases the connection and marks the endpoint closed.
    fn close_now(&mut self, e: usize) {
        let ep = &mut self.endpoints[e];
        if ep.state == EpState::Closed {
            return;
        }
        ep.state = EpState::Closed;
        ep.set_error(Status::EndpointClosed);
        ep.flushing = 0;
        ep.weak_lane = NO_LANE;
        let (driver, driver_ep) = (ep.driver as usize, crate::driver::DriverEp(ep.driver_ep));
        self.drivers[driver].disconnect(driver_ep);
        tracing::debug!(endpoint = e, "endpoint closed");
    }

    /// Completes a request that finished and applies what its result means
    /// for its endpoint: a fatal error fails it (R20); a graceful CLOSE's
    /// final flush closes it, and the close succeeds even if the endpoint
    /// failed meanwhile (R34, R41).
    fn finish(&mut self, id: RequestId, e: usize, result: Result<u32, Status>) {
        if self.request(id).opcode() == Opcode::CLOSE {
            self.close_now(e);
            return self.complete(id, Ok(0));
        }
        self.complete(id, result);
        if let Err(status) = result {
            if is_fatal(status) {
                self.fail_endpoint(e, status);
            }
        }
    }

    fn push_tail(&mut self, e: usize, id: RequestId) {
        self.request_mut(id).next = NONE;
        let tail = self.endpoints[e].tail;
        if tail == NONE {
            self.endpoints[e].head = id.0;
        } else {
            self.request_mut(RequestId(tail)).next = id.0;
        }
        self.endpoints[e].tail = id.0;
    }

    fn push_head(&mut self, e: usize, id: RequestId) {
        let head = self.endpoints[e].head;
        self.request_mut(id).next = head;
        self.endpoints[e].head = id.0;
        if head == NONE {
            self.endpoints[e].tail = id.0;
        }
    }

    fn pop_head(&mut self, e: usize) -> Option<RequestId> {
        let head = self.endpoints[e].head;
        if head == NONE {
            return None;
        }
        let id = RequestId(head);
        let next = self.request(id).next;
        self.endpoints[e].head = next;
        if next == NONE {
            self.endpoints[e].tail = NONE;
        }
        Some(id)
    }

    fn schedule(&mut self, e: usize) {
        if !self.endpoints[e].scheduled {
            self.endpoints[e].scheduled = true;
            self.scheduled.push(e as u32);
        }
    }

    fn dispatch_scheduled(&mut self) -> usize {
        if self.scheduled.is_empty() {
            return 0;
        }
        std::mem::swap(&mut self.scheduled, &mut self.scheduled_next);
        let mut work = 0;
        for i in 0..self.scheduled_next.len() {
            let e = self.scheduled_next[i] as usize;
            self.endpoints[e].scheduled = false;
            work += self.dispatch(e);
        }
        self.scheduled_next.clear();
        work
    }

    /// Starts queued requests of endpoint `e` whose epoch is admitted, and
    /// the boundary flush that admits the next epoch (R19).
    fn dispatch(&mut self, e: usize) -> usize {
        let mut started = 0;
        while matches!(
            self.endpoints[e].state,
            EpState::Connected | EpState::Closing
        ) {
            let head = self.endpoints[e].head;
            if head == NONE {
                break;
            }
            let epoch = self.request(RequestId(head)).epoch;
            if self.admitted(RequestId(head)) {
                if started == DISPATCH_BATCH {
                    self.schedule(e);
                    break;
                }
                let id = self.pop_head(e).expect("head checked above");
                started += 1;
                if self.start(id) == Started::Blocked {
                    self.push_head(e, id);
                    self.schedule(e);
                    break;
                }
                continue;
            }
            let ep = &self.endpoints[e];
            if ep.flushing != 0 {
                break; // R16: its completion reschedules us.
            }
            // The exact target epoch: the head's own (R15, R16).
            let target = ep.full_epoch(epoch);
            if !self.cross_boundary(e, RequestId(head), target) {
                break;
            }
        }
        started as usize
    }

    /// Whether request `id` may start now (R14): its epoch is admitted; or a
    /// weak fence admitted its epoch on its lane (R8); or it is a FLUSH or a
    /// graceful CLOSE, which order nothing at the target and cover whatever
    /// was started before them (R21, R23, R41).
    fn admitted(&self, id: RequestId) -> bool {
        let request = self.request(id);
        let ep = &self.endpoints[request.endpoint as usize];
        if epoch_le(request.epoch, ep.admitted_epoch as u32) {
            return true;
        }
        if matches!(request.opcode(), Opcode::FLUSH | Opcode::CLOSE) {
            return true;
        }
        match ep.weak() {
            Some((lane, epoch)) => epoch == request.epoch && self.lane_of(request) == Some(lane),
            None => false,
        }
    }

    /// C moves to `target`; a weak admission at or below it is used up.
    fn admit(&mut self, e: usize, target: u64) {
        let ep = &mut self.endpoints[e];
        ep.admitted_epoch = target;
        if ep
            .weak()
            .is_some_and(|(_, epoch)| epoch_le(epoch, target as u32))
        {
            ep.weak_lane = NO_LANE;
        }
    }

    /// The lane request `head` will use, if it is a lane operation.
    fn lane_of(&self, head: &Request) -> Option<u8> {
        let ep = &self.endpoints[head.endpoint as usize];
        match head.opcode() {
            Opcode::PUT | Opcode::GET => {
                Some(ep.peek_data_lane(head.len, self.config.bw_threshold))
            }
            Opcode::ATOMIC => Some(ep.atomic_lane()),
            Opcode::NOTIFY => Some(0),
            _ => None,
        }
    }

    /// Moves C to `target` for the queue head `head` (R15): at once if no
    /// lane is dirty (R10), by a weak fence if one ordered lane suffices
    /// (R8), else by a strong flush (R9). Returns whether C moved now.
    fn cross_boundary(&mut self, e: usize, head: RequestId, target: u64) -> bool {
        let request = *self.request(head);
        let ep = &self.endpoints[e];
        if ep.dirty == 0 {
            self.admit(e, target);
            return true;
        }
        let lanes = ep.dirty | self.lane_of(&request).map_or(0, |l| 1 << l);
        let driver = &self.drivers[ep.driver as usize];
        let driver_ep = crate::driver::DriverEp(ep.driver_ep);
        let weak = !request.strong_boundary()
            && lanes.count_ones() == 1
            && driver.lane_ordered(driver_ep, lanes.trailing_zeros() as u8)
            && self.normalize(e, ep.dirty) == ep.dirty;
        if weak {
            // C stays: the epoch is admitted on this one lane only. A later
            // request of the same epoch on another lane needs the flush
            // after all (R8: the condition holds per operation).
            let lane = lanes.trailing_zeros() as u8;
            let ep = &mut self.endpoints[e];
            ep.weak_lane = lane | WEAK_FLAG_OWED;
            ep.weak_epoch = target as u32;
            self.stats.weak_fences += 1;
            self.cold[e].stats.weak_fences += 1;
            tracing::trace!(endpoint = e, lane, target, "weak fence");
            return true;
        }
        self.start_fence_flush(e, target)
    }

    /// The lanes a flush must cover, from the dirty set `dirty`: all live
    /// lanes if any dirty lane was replaced since it was written (R38).
    fn normalize(&self, e: usize, dirty: LaneMask) -> LaneMask {
        let ep = &self.endpoints[e];
        let driver = &self.drivers[ep.driver as usize];
        let driver_ep = crate::driver::DriverEp(ep.driver_ep);
        let replaced = (0..ep.lanes).any(|lane| {
            dirty & (1 << lane) != 0
                && driver.lane_generation(driver_ep, lane)
                    != self.cold[e].dirty_generation[lane as usize]
        });
        if replaced { ep.all_lanes() } else { dirty }
    }

    /// Starts the strong flush of exactly the dirty lanes (R9, R17) that
    /// moves C to `target` when it completes (R15c). Returns whether C moved
    /// now (the driver finished the flush inside the call).
    fn start_fence_flush(&mut self, e: usize, target: u64) -> bool {
        let mask = self.normalize(e, self.endpoints[e].dirty);
        let ep = &mut self.endpoints[e];
        let (driver, driver_ep) = (ep.driver as usize, crate::driver::DriverEp(ep.driver_ep));
        ep.flushing = mask;
        ep.dirty = 0;
        // The slot is owned before the driver is called: a flush that
        // finishes inside the call cannot find it empty (R25, W1).
        ep.fence_target = target as u32;
        let lanes = ep.lanes;
        for lane in 0..lanes {
            if mask & (1 << lane) != 0 {
                self.cold[e].flush_generation[lane as usize] =
                    self.drivers[driver].lane_generation(driver_ep, lane);
            }
        }
        self.stats.flushes += 1;
        self.cold[e].stats.flushes += 1;
        tracing::trace!(endpoint = e, lanes = mask, target, "fence flush");
        match self.drivers[driver].flush(driver_ep, mask, Token(FENCE_TOKEN | e as u64)) {
            Posted::InFlight => false,
            Posted::Done(result) => {
                self.fence_flush_done(e, result);
                self.endpoints[e].admitted_epoch == target
            }
            Posted::NoResource => {
                let ep = &mut self.endpoints[e];
                ep.dirty |= mask;
                ep.flushing = 0;
                self.schedule(e);
                false
            }
        }
    }

    /// The fence flush of endpoint `e` finished (inside its start or from
    /// `poll`). The slot is cleared first (R33); on success C moves to the
    /// recorded target unless a flushed lane was replaced meanwhile, in
    /// which case every lane is flushed again before C moves (R39).
    /// Dispatch is scheduled, never run from here (R20, W1).
    fn fence_flush_done(&mut self, e: usize, result: Result<u32, Status>) {
        let ep = &mut self.endpoints[e];
        let (target, flushed) = (ep.full_epoch(ep.fence_target), ep.flushing);
        ep.flushing = 0;
        if let Err(status) = result {
            return self.fail_endpoint(e, status);
        }
        let ep = &self.endpoints[e];
        let driver = &self.drivers[ep.driver as usize];
        let driver_ep = crate::driver::DriverEp(ep.driver_ep);
        let replaced = (0..ep.lanes).any(|lane| {
            flushed & (1 << lane) != 0
                && driver.lane_generation(driver_ep, lane)
                    != self.cold[e].flush_generation[lane as usize]
        });
        let ep = &mut self.endpoints[e];
        if replaced {
            tracing::debug!(
                endpoint = e,
                "lane replaced during a fence flush; flushing every lane again"
            );
            ep.dirty |= ep.all_lanes();
            // Mark every lane as replaced so the next flush is normalized.
            self.cold[e].dirty_generation.fill(u32::MAX);
        } else {
            self.admit(e, target);
            tracing::trace!(endpoint = e, epoch = target, "fence flush done");
        }
        self.schedule(e);
    }

    /// Starts an admitted request.
    fn start(&mut self, id: RequestId) -> Started {
        let request = *self.request(id);
        let e = request.endpoint as usize;
        let ep = &mut self.endpoints[e];
        let (driver, driver_ep) = (ep.driver as usize, crate::driver::DriverEp(ep.driver_ep));
        let posted = match request.opcode() {
            Opcode::FENCE => {
                // The boundary has been crossed: the fence is done.
                self.complete(id, Ok(0));
                return Started::Gone;
            }
            Opcode::FLUSH | Opcode::CLOSE => {
                // Everything submitted before this flush has been started
                // (FIFO); the lanes it wrote are dirty or being flushed
                // (R21, R23). A graceful CLOSE ends with the same flush (R41).
                let mask = ep.dirty | ep.flushing;
                if mask == 0 {
                    if request.opcode() == Opcode::CLOSE {
                        self.close_now(e);
                    }
                    self.complete(id, Ok(0));
                    return Started::Gone;
                }
                let mask = self.normalize(e, mask);
                self.stats.flushes += 1;
                self.cold[e].stats.flushes += 1;
                self.drivers[driver].flush(driver_ep, mask, Token(u64::from(id.0)))
            }
            _ => {
                let mut op = self.lane_op(&request);
                let posted = self.post_lane_op(e, &mut op, id);
                if op.fence && matches!(posted, Posted::NoResource) {
                    // Nothing was posted: the fence flag is still owed (R19).
                    self.endpoints[e].weak_lane |= WEAK_FLAG_OWED;
                }
                posted
            }
        };
        match posted {
            Posted::InFlight => {
                self.request_mut(id).set_state(State::Posted);
                self.endpoints[e].inflight += 1;
                Started::Gone
            }
            Posted::Done(result) => {
                self.finish(id, e, result);
                Started::Gone
            }
            Posted::NoResource => Started::Blocked,
        }
    }

    /// The operation a queued PUT, GET, ATOMIC or NOTIFY request asks for,
    /// with its driver's keys looked up again as it starts (its
    /// registration is held; remote keys live as long as the worker).
    fn lane_op(&self, request: &Request) -> Op {
        let driver = self.endpoints[request.endpoint as usize].driver as usize;
        let local_key = if request.holds_mem() {
            self.mem.get(request.local_mem).map(|r| r.keys[driver])
        } else {
            None
        };
        let kind = match request.opcode() {
            Opcode::PUT => OpKind::Put,
            Opcode::GET => OpKind::Get,
            Opcode::ATOMIC => {
                OpKind::Atomic(AtomicOp::try_from(request.subop()).unwrap_or(AtomicOp::CSWAP))
            }
            _ => OpKind::Notify,
        };
        let remote = if kind == OpKind::Notify {
            None
        } else {
            self.rkeys
                .get(request.rkey, u32::from(request.endpoint))
                .map(|k| (k.driver, request.remote_addr))
        };
        Op {
            kind,
            lane: 0,
            local_addr: request.local_addr,
            local_key,
            remote,
            len: request.len,
            operand: request.operand,
            operand2: request.operand2,
            fence: false,
        }
    }

    /// Hands `op` to endpoint `e`'s driver on the lane its kind and size
    /// call for, marking the lane dirty first (R14) and carrying a weak
    /// fence's owed transport fence flag (R8), which `op.fence` then shows.
    /// Returns what the driver said.
    #[inline]
    fn post_lane_op(&mut self, e: usize, op: &mut Op, id: RequestId) -> Posted {
        let ep = &mut self.endpoints[e];
        let (driver, driver_ep) = (ep.driver as usize, crate::driver::DriverEp(ep.driver_ep));
        let lane = match op.kind {
            OpKind::Put | OpKind::Get => ep.data_lane(op.len, self.config.bw_threshold),
            OpKind::Atomic(_) => ep.atomic_lane(),
            OpKind::Notify => 0,
        };
        // Dirty before posting (R14), with the lane's generation (R38).
        if ep.dirty & (1 << lane) == 0 {
            ep.dirty |= 1 << lane;
            self.cold[e].dirty_generation[lane as usize] =
                self.drivers[driver].lane_generation(driver_ep, lane);
        }
        let ep = &mut self.endpoints[e];
        op.lane = lane;
        op.fence = ep.weak_lane == lane | WEAK_FLAG_OWED;
        if op.fence {
            ep.weak_lane = lane;
        }
        self.drivers[driver].post(driver_ep, op, Token(u64::from(id.0)))
    }

    /// Fails endpoint `e` with a sticky first error: the fence slot is
    /// cleared first, then every queued request completes with the error in
    /// FIFO order (R20, R32, R33). Requests already posted complete through
    /// the driver.
    pub(crate) fn fail_endpoint(&mut self, e: usize, status: Status) {
        let ep = &mut self.endpoints[e];
        if matches!(ep.state, EpState::Failed | EpState::Closed) {
            return;
        }
        tracing::warn!(endpoint = e, %status, "endpoint failed");
        let closing = ep.state == EpState::Closing;
        ep.state = EpState::Failed;
        ep.set_error(status);
        ep.flushing = 0;
        ep.weak_lane = NO_LANE;
        while let Some(id) = self.pop_head(e) {
            if self.request(id).opcode() == Opcode::CLOSE {
                // R34: the close of a failed endpoint succeeds.
                self.complete(id, Ok(0));
            } else {
                self.complete(id, Err(status));
            }
        }
        if closing {
            self.close_now(e);
        }
    }

    // ------------------------------------------------------------ completions

    fn poll_drivers(&mut self) -> usize {
        let mut work = 0;
        for d in 0..self.drivers.len() {
            loop {
                let n = self.drivers[d].poll(&mut self.scratch);
                for i in 0..n {
                    let c = self.scratch[i];
                    self.on_completion(c);
                }
                work += n;
                if n < self.scratch.len() {
                    break;
                }
            }
        }
        work
    }

    fn on_completion(&mut self, c: Completion) {
        if c.token.0 & FENCE_TOKEN != 0 {
            let e = (c.token.0 & !FENCE_TOKEN) as usize;
            let Some(ep) = self.endpoints.get_mut(e).filter(|ep| ep.flushing != 0) else {
                self.stray_completions += 1;
                return;
            };
            // Only the flushed subset leaves D: `dirty` already holds just
            // the lanes written since the flush started (R17, W2).
            let _ = ep;
            self.fence_flush_done(e, c.result);
            return;
        }
        let id = RequestId(c.token.0 as u32);
        let live = c.token.0 <= u64::from(u32::MAX)
            && self
                .queues
                .get(id.queue())
                .and_then(|q| q.pool.get(id.slot()))
                .is_some_and(|r| r.state() == State::Posted);
        if !live {
            self.stray_completions += 1;
            return;
        }
        let e = self.request(id).endpoint as usize;
        self.endpoints[e].inflight -= 1;
        self.finish(id, e, c.result);
    }

    /// The single place a request ends: releases what it held, counts it,
    /// posts its CQE (unless it asked to skip a success), frees its slot.
    fn complete(&mut self, id: RequestId, result: Result<u32, Status>) {
        let request = *self.request(id);
        if request.holds_mem() {
            if let Some(r) = self.mem.get_mut(request.local_mem) {
                r.inflight -= 1;
            }
        }
        let opcode = request.opcode();
        let bytes = match (opcode, result) {
            (Opcode::PUT | Opcode::GET | Opcode::ATOMIC | Opcode::NOTIFY, Ok(n)) => n,
            _ => 0,
        };
        let error = u64::from(result.is_err());
        if opcode == Opcode::NOP {
            self.stats.ops += 1;
            self.stats.errors += error;
        } else {
            self.count(request.endpoint as usize, 1, u64::from(bytes), error);
        }
        let q = &mut self.queues[id.queue()];
        q.finish(
            request.user_data,
            result,
            request.skip_success(),
            &mut self.stats,
        );
        q.pool.free(id.slot() as u32);
    }

    /// Counts `ops` finished operations of endpoint `e` (`bytes` moved,
    /// `errors` failed), in the worker's counters and the endpoint's.
    #[inline]
    fn count(&mut self, e: usize, ops: u64, bytes: u64, errors: u64) {
        let add = |stats: &mut Stats| {
            stats.ops += ops;
            stats.bytes += bytes;
            stats.errors += errors;
        };
        add(&mut self.stats);
        if let Some(cold) = self.cold.get_mut(e) {
            add(&mut cold.stats);
        }
    }

    fn post_notifications(&mut self) -> usize {
        let Some(qi) = self.notify_queue else {
            return 0;
        };
        let q = &mut self.queues[qi];
        if !q.overflow.is_empty() {
            return 0;
        }
        let mut posted = 0;
        self.notify.drain(|d: Delivery| {
            let flags = CqeFlags::NOTIFICATION.bits() | u32::from(d.buffer) << CQE_BUFFER_SHIFT;
            let ok = q.cq.push(Cqe::new(d.tag, d.len as i32, flags)).is_ok();
            posted += usize::from(ok);
            ok
        });
        if posted > 0 {
            q.pushed = true;
            self.stats.notifications += posted as u64;
        }
        posted
    }

    // ------------------------------------------------------------ teardown

    /// Completes everything with CANCELED (R44): queued requests, posted
    /// ones (after the drivers give them back), and SQEs not yet taken.
    pub(crate) fn shutdown(&mut self) {
        if self.shut_down {
            return;
        }
        self.shut_down = true;
        for e in 0..self.endpoints.len() {
            if self.endpoints[e].state == EpState::Closed {
                continue;
            }
            self.fail_endpoint(e, Status::Canceled);
            self.close_now(e);
        }
        // Disconnected drivers hand back what they held; a driver that
        // keeps something anyway gets it canceled below.
        for _ in 0..1000 {
            if self.endpoints.iter().all(|ep| ep.inflight == 0) {
                break;
            }
            self.poll_drivers();
        }
        for qi in 0..self.queues.len() {
            let q = &self.queues[qi];
            let posted: Vec<u32> = (0..q.pool_len())
                .filter(|&s| q.pool.get(s).is_some_and(|r| r.state() == State::Posted))
                .map(|s| s as u32)
                .collect();
            for slot in posted {
                let id = RequestId::new(qi as u32, slot);
                let e = self.request(id).endpoint as usize;
                self.endpoints[e].inflight -= 1;
                tracing::error!(
                    endpoint = e,
                    "driver kept a request past disconnect; canceled"
                );
                self.complete(id, Err(Status::Canceled));
            }
        }
        // SQEs still in the rings.
        for qi in 0..self.queues.len() {
            self.cancel_intake(qi);
        }
        // The drivers go now: no peer may reach this worker's memory again.
        self.drivers.clear();
    }

    /// After shutdown: completes whatever is in queue pair `qi`'s SQ with
    /// CANCELED and publishes.
    pub(crate) fn cancel_intake(&mut self, qi: usize) {
        // Intake stops while CQEs wait in the overflow list; keep moving
        // them into the CQ until neither side moves (the CQ is full, or
        // everything is done). The application's next reap calls again.
        while self.queues[qi].flush_overflow() + self.intake(qi) > 0 {}
        self.queues[qi].publish();
    }
}

impl EngineQueue {
    fn pool_len(&self) -> usize {
        self.pool.available() as usize + self.pool.in_use() as usize
    }
}
