//! The engine: everything the progress loop owns, and one bounded round of
//! it ([`Engine::progress`]).
//!
//! A round: move overflowed CQEs into their CQ; take SQEs (at most a batch
//! per queue pair, never more than free requests, none while that queue pair
//! has overflowed CQEs); validate each and hand it to its endpoint, which
//! starts it or queues it (FENCE.md R14, R18); dispatch a bounded batch from
//! each endpoint that has queued work (R19); poll the drivers and complete
//! what finished; post incoming notifications; publish CQEs and ring CQ
//! doorbells of applications that sleep.
//!
//! Nothing here re-enters: a driver never calls the engine, a completion
//! only records its effect and schedules the endpoint, and dispatch runs
//! from the round, never from inside a completion (R25, R49, W1).
//!
//! The fence implemented here is the strong one for both FENCE modes: a
//! correct but simple engine (weak fences become strong; lane generations
//! are not tracked yet), which the fence-engine issue refines.

use crate::config::Config;
use crate::driver::{Completion, Driver, DriverContext, Op, OpKind, Posted, Token};
use crate::endpoint::{Endpoint, EndpointCold, EpState};
use crate::memory::{MemRegistry, RkeyTable, within};
use crate::request::{NONE, Pool, Request, RequestId, State};
use crate::stats::Stats;
use crate::sys::notify::{Delivery, NotifyPool};
use ringfence_ring::{
    AtomicOp, CQE_BUFFER_SHIFT, Consumer, Cqe, CqeFlags, Doorbell, FenceMode, Opcode, Producer,
    RingError, Sqe, Status,
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
    /// CQEs that found the CQ full, oldest first. Capacity covers every
    /// request plus every notification buffer, so it never grows.
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
            overflow: VecDeque::with_capacity(requests as usize + notify_buffers as usize),
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
        Engine {
            config,
            drivers,
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
        self.endpoints.push(ep);
        self.cold.push(EndpointCold::default());
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
        let mut sqes = [Sqe::default(); INTAKE_BATCH];
        let n = match q.sq.pop_batch(&mut sqes[..room]) {
            Ok(n) => n,
            Err(c) => {
                tracing::error!(%c, queue = qi, "SQ indices corrupt; this queue pair takes no more SQEs");
                q.broken = true;
                return 0;
            }
        };
        for sqe in &sqes[..n] {
            self.accept(qi, sqe);
        }
        n
    }

    /// Takes one SQE: a request slot first, so that every path below ends
    /// in exactly one completion (R31).
    fn accept(&mut self, qi: usize, sqe: &Sqe) {
        let placeholder = Request {
            user_data: sqe.user_data,
            ..Request::EMPTY
        };
        let mut queued = placeholder;
        queued.set_state(State::Queued);
        let slot = self.queues[qi]
            .pool
            .alloc(queued)
            .expect("intake never takes more SQEs than free requests");
        let id = RequestId::new(qi as u32, slot);
        if self.shut_down {
            return self.complete(id, Err(Status::Canceled));
        }
        match self.validate(sqe) {
            Err(status) => self.complete(id, Err(status)),
            Ok(request) if request.opcode() == Opcode::NOP => {
                // Complete at once, honouring SKIP_SUCCESS.
                *self.request_mut(id) = request;
                self.complete(id, Ok(0));
            }
            Ok(request) => {
                *self.request_mut(id) = request;
                if request.holds_mem() {
                    if let Some(r) = self.mem.get_mut(request.local_mem) {
                        r.inflight += 1;
                    }
                }
                self.submit(id);
            }
        }
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
        if ep.state == EpState::Failed {
            return Err(ep.error());
        }
        let caps = self.drivers[ep.driver as usize].capabilities();
        let mut request = Request::from_sqe(sqe, opcode, ep_index as u16, flags);
        let len = u64::from(sqe.len);
        match opcode {
            Opcode::PUT | Opcode::GET => {
                if sqe.subop != 0 {
                    return Err(Status::InvalidSubop);
                }
                if opcode == Opcode::GET && !caps.get {
                    return Err(Status::Unsupported);
                }
                if sqe.len == 0 || sqe.len > caps.max_len {
                    return Err(Status::InvalidLength);
                }
                self.mem.check(sqe.local_mem, sqe.local_addr, len)?;
                self.check_remote(sqe, len)?;
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

    fn check_remote(&self, sqe: &Sqe, len: u64) -> Result<(), Status> {
        let key = self
            .rkeys
            .get(sqe.rkey, sqe.endpoint)
            .ok_or(Status::InvalidRkey)?;
        if within(key.base, key.len, sqe.remote_addr, len) {
            Ok(())
        } else {
            Err(Status::OutOfBounds)
        }
    }

    // ------------------------------------------------------------ endpoints

    /// Captures the request's epoch (R13) and starts it, or queues it behind
    /// what is queued or behind an unresolved fence (R14, R18).
    fn submit(&mut self, id: RequestId) {
        let (opcode, subop) = (self.request(id).opcode(), self.request(id).subop());
        let e = self.request(id).endpoint as usize;
        let ep = &mut self.endpoints[e];
        if opcode == Opcode::FENCE || opcode == Opcode::NOTIFY {
            // A NOTIFY carries an implicit strong fence before it: it is
            // delivered after everything earlier is remotely complete.
            ep.submit_epoch += 1;
            if opcode == Opcode::FENCE {
                self.stats.fences += 1;
                self.cold[e].stats.fences += 1;
                let mode = FenceMode::try_from(subop).unwrap_or(FenceMode::STRONG);
                tracing::trace!(endpoint = e, ?mode, epoch = ep.submit_epoch, "fence");
            }
        }
        let epoch = ep.submit_epoch as u32;
        let admitted = ep.admitted_epoch as u32;
        let can_start = ep.head == NONE && epoch_le(epoch, admitted);
        self.request_mut(id).epoch = epoch;
        if can_start && self.start(id) == Started::Gone {
            return;
        }
        if !can_start {
            self.stats.deferrals += 1;
            self.cold[e].stats.deferrals += 1;
            self.push_tail(e, id);
        } else {
            self.push_head(e, id);
        }
        self.schedule(e);
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
        while self.endpoints[e].state == EpState::Connected {
            let head = self.endpoints[e].head;
            if head == NONE {
                break;
            }
            let epoch = self.request(RequestId(head)).epoch;
            let ep = &self.endpoints[e];
            if epoch_le(epoch, ep.admitted_epoch as u32) {
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
            if ep.fence_target != 0 {
                break; // R16: its completion reschedules us.
            }
            // The exact target epoch: the head's own (R15, R16).
            let target = ep.submit_epoch - u64::from((ep.submit_epoch as u32).wrapping_sub(epoch));
            if !self.start_fence_flush(e, target) {
                break;
            }
        }
        started as usize
    }

    /// Moves C to `target`: at once if no lane is dirty (R10, R15a), else by
    /// a flush of exactly the dirty lanes (R15c, R17). Returns whether C
    /// moved now.
    fn start_fence_flush(&mut self, e: usize, target: u64) -> bool {
        let ep = &mut self.endpoints[e];
        if ep.dirty == 0 {
            ep.admitted_epoch = target;
            return true;
        }
        let mask = ep.dirty;
        let (driver, driver_ep) = (ep.driver as usize, ep.driver_ep);
        ep.flushing = mask;
        ep.dirty = 0;
        // The slot is owned before the driver is called (R25, W1).
        ep.fence_target = target;
        self.stats.flushes += 1;
        self.cold[e].stats.flushes += 1;
        tracing::trace!(endpoint = e, lanes = mask, target, "fence flush");
        let posted = self.drivers[driver].flush(
            crate::driver::DriverEp(driver_ep),
            mask,
            Token(FENCE_TOKEN | e as u64),
        );
        let ep = &mut self.endpoints[e];
        match posted {
            Posted::InFlight => false,
            Posted::Done(Ok(_)) => {
                ep.fence_target = 0;
                ep.flushing = 0;
                ep.admitted_epoch = target;
                true
            }
            Posted::Done(Err(status)) => {
                self.fail_endpoint(e, status);
                false
            }
            Posted::NoResource => {
                ep.fence_target = 0;
                ep.dirty |= mask;
                ep.flushing = 0;
                self.schedule(e);
                false
            }
        }
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
            Opcode::FLUSH => {
                // Everything submitted before this flush has been started
                // (FIFO); the lanes it wrote are dirty or being flushed (R21).
                let mask = ep.dirty | ep.flushing;
                if mask == 0 {
                    self.complete(id, Ok(0));
                    return Started::Gone;
                }
                self.stats.flushes += 1;
                self.cold[e].stats.flushes += 1;
                self.drivers[driver].flush(driver_ep, mask, Token(u64::from(id.0)))
            }
            opcode => {
                let (kind, lane) = match opcode {
                    Opcode::PUT => (
                        OpKind::Put,
                        ep.data_lane(request.len, self.config.bw_threshold),
                    ),
                    Opcode::GET => (
                        OpKind::Get,
                        ep.data_lane(request.len, self.config.bw_threshold),
                    ),
                    Opcode::ATOMIC => {
                        let op = AtomicOp::try_from(request.subop()).unwrap_or(AtomicOp::CSWAP);
                        (OpKind::Atomic(op), ep.atomic_lane())
                    }
                    _ => (OpKind::Notify, 0),
                };
                // Dirty before posting (R14).
                ep.dirty |= 1 << lane;
                let local_key = if request.holds_mem() {
                    self.mem.get(request.local_mem).map(|r| r.keys[driver])
                } else {
                    None
                };
                let remote = if kind == OpKind::Notify {
                    None
                } else {
                    self.rkeys
                        .get(request.rkey, e as u32)
                        .map(|k| (k.driver, request.remote_addr))
                };
                let op = Op {
                    kind,
                    lane,
                    local_addr: request.local_addr,
                    local_key,
                    remote,
                    len: request.len,
                    operand: request.operand,
                    operand2: request.operand2,
                };
                self.drivers[driver].post(driver_ep, &op, Token(u64::from(id.0)))
            }
        };
        match posted {
            Posted::InFlight => {
                self.request_mut(id).set_state(State::Posted);
                self.endpoints[e].inflight += 1;
                Started::Gone
            }
            Posted::Done(result) => {
                self.complete(id, result);
                if let Err(status) = result {
                    if is_fatal(status) {
                        self.fail_endpoint(e, status);
                    }
                }
                Started::Gone
            }
            Posted::NoResource => Started::Blocked,
        }
    }

    /// Fails endpoint `e` with a sticky first error: the fence slot is
    /// cleared first, then every queued request completes with the error in
    /// FIFO order (R20, R32, R33). Requests already posted complete through
    /// the driver.
    pub(crate) fn fail_endpoint(&mut self, e: usize, status: Status) {
        let ep = &mut self.endpoints[e];
        if ep.state == EpState::Failed {
            return;
        }
        tracing::warn!(endpoint = e, %status, "endpoint failed");
        ep.state = EpState::Failed;
        ep.set_error(status);
        ep.fence_target = 0;
        ep.flushing = 0;
        while let Some(id) = self.pop_head(e) {
            self.complete(id, Err(status));
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
            let Some(ep) = self.endpoints.get_mut(e).filter(|ep| ep.fence_target != 0) else {
                self.stray_completions += 1;
                return;
            };
            // Clear the slot before anything else (R33); only the flushed
            // subset leaves D: `dirty` already holds just the lanes written
            // since the flush started (R17, W2).
            let target = ep.fence_target;
            ep.fence_target = 0;
            ep.flushing = 0;
            match c.result {
                Ok(_) => {
                    ep.admitted_epoch = target;
                    tracing::trace!(endpoint = e, epoch = target, "fence flush done");
                    self.schedule(e);
                }
                Err(status) => self.fail_endpoint(e, status),
            }
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
        self.complete(id, c.result);
        if let Err(status) = c.result {
            if is_fatal(status) {
                self.fail_endpoint(e, status);
            }
        }
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
        let ep_stats = if opcode == Opcode::NOP {
            None
        } else {
            self.cold.get_mut(request.endpoint as usize)
        };
        let bytes = match (opcode, result) {
            (Opcode::PUT | Opcode::GET | Opcode::ATOMIC | Opcode::NOTIFY, Ok(n)) => u64::from(n),
            _ => 0,
        };
        for stats in std::iter::once(&mut self.stats).chain(ep_stats.map(|c| &mut c.stats)) {
            stats.ops += 1;
            stats.bytes += bytes;
            stats.errors += u64::from(result.is_err());
        }
        let q = &mut self.queues[id.queue()];
        if !(result.is_ok() && request.skip_success()) {
            let res = match result {
                Ok(n) => n.min(i32::MAX as u32) as i32,
                Err(status) => status.as_raw(),
            };
            q.post(Cqe::new(request.user_data, res, 0), &mut self.stats);
        }
        q.pool.free(id.slot() as u32);
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
            self.fail_endpoint(e, Status::Canceled);
            let ep = &self.endpoints[e];
            self.drivers[ep.driver as usize].disconnect(crate::driver::DriverEp(ep.driver_ep));
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
