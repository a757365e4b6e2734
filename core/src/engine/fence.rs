//! The fence engine proper: epochs and the boundary actions (docs/fence.md
//! §2–§4); the deferred FIFO and dispatch are in `dispatch.rs`.

use super::token::TokenTarget;
use super::{Engine, FlushCause, REPLACED, Started, epoch_le};
use crate::driver::{LaneMask, Posted, Token};
use crate::endpoint::{EpState, MIXED, NO_LANE, STRONG_ARMED, WEAK_FLAG_OWED};
use crate::request::{NONE, Request, RequestId};
use ringfence_ring::{FenceMode, Opcode, Status};

impl Engine {
    /// Captures the request's epoch (R13) and starts it, or queues it behind
    /// what is queued or behind an unresolved boundary (R14, R18).
    pub(super) fn submit(&mut self, id: RequestId) {
        let request = *self.request(id);
        if request.is_worker_flush() {
            return self.worker_flush(id);
        }
        let (opcode, e) = (request.opcode(), request.endpoint as usize);
        match opcode {
            Opcode::FENCE => return self.fence(id, e, request.subop()),
            Opcode::CLOSE if request.subop() == ringfence_ring::CloseMode::FORCE.as_raw() => {
                return self.force_close(id, e);
            }
            Opcode::CLOSE if self.endpoints[e].state == EpState::Failed => {
                // R34: closing a failed endpoint succeeds at once (but not
                // that of a dead peer: `close_status`).
                let status = self.close_status(e, Ok(0));
                self.close_now(e);
                return self.complete(id, status);
            }
            Opcode::CLOSE => self.endpoints[e].state = EpState::Closing,
            _ => {}
        }
        let ep = &mut self.endpoints[e];
        if opcode == Opcode::NOTIFY {
            // An implicit fence: delivered after everything earlier is
            // remotely complete (docs/fence.md R8). Strong, unless
            // the endpoint's one driver delivers a NOTIFY after the writes
            // before it on its lane (`notify_ordered`): then the boundary
            // takes the weak path when the NOTIFY's lane is the only dirty
            // one (R8), and a flush otherwise (R9).
            ep.submit_epoch += 1;
            let ordered = !ep.has(MIXED) && self.drivers.caps(ep.driver as usize).notify_ordered;
            if !ordered {
                ep.set(STRONG_ARMED, true);
            }
        }
        let strong = ep.has(STRONG_ARMED);
        ep.set(STRONG_ARMED, false);
        let epoch = ep.submit_epoch as u32;
        let queue_empty = ep.head == NONE;
        let r = self.request_mut(id);
        r.epoch = epoch;
        if strong {
            r.set_strong_boundary();
        }
        // While the handshake runs nothing starts and no boundary action is
        // taken: requests queue in order, and dispatch takes them (and the
        // boundaries between them) once the endpoint is up.
        let queue_empty = queue_empty && !self.endpoints[e].is_connecting();
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
            if self.start(id) == Started::Handed {
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
    /// endpoint it is accepted and does nothing (R34); on one whose peer is
    /// dead it fails with [`Status::PeerUnreachable`], as everything there
    /// does.
    pub(super) fn fence(&mut self, id: RequestId, e: usize, subop: u8) {
        let mode = FenceMode::try_from(subop).unwrap_or(FenceMode::COMPLETE);
        let ep = &mut self.endpoints[e];
        if ep.state == EpState::Connected {
            ep.submit_epoch += 1;
            if mode == FenceMode::COMPLETE {
                ep.set(STRONG_ARMED, true);
            }
        }
        tracing::trace!(endpoint = e, ?mode, epoch = ep.submit_epoch, "fence");
        self.stats.fences += 1;
        self.cold[e].stats.fences += 1;
        // A fence on an endpoint whose peer is gone fails as a graceful
        // close does.
        let result = self.close_status(e, Ok(0));
        self.complete(id, result);
    }

    /// Whether request `id` may start now (R14): its epoch is admitted; or a
    /// weak fence admitted its epoch on its lane (R8); or it is a FLUSH or a
    /// graceful CLOSE, which order nothing at the target and cover whatever
    /// was started before them (R21, R23, R41).
    pub(super) fn admitted(&self, id: RequestId) -> bool {
        let request = self.request(id);
        let ep = &self.endpoints[request.endpoint as usize];
        if epoch_le(request.epoch, ep.admitted_epoch as u32) {
            return true;
        }
        if matches!(request.opcode(), Opcode::FLUSH | Opcode::CLOSE) {
            return true;
        }
        match ep.weak() {
            Some((lane, epoch)) => {
                epoch == request.epoch
                    && self.lane_of(request) == Some(lane)
                    && self.weak_lane_kept(request.endpoint as usize, lane)
            }
            None => false,
        }
    }

    /// Whether lane `lane` of endpoint `e`, on which a weak fence admitted
    /// an epoch, is still the channel it was then. A lane replaced since
    /// is not ordered with what went before on the old one, so the
    /// admission is void and the boundary needs the strong flush after
    /// all, widened to every lane (R8, R38).
    pub(super) fn weak_lane_kept(&self, e: usize, lane: u8) -> bool {
        self.lane_generation(e, lane) == self.cold[e].weak_generation
    }

    /// C moves to `target`; a weak admission at or below it is used up.
    pub(super) fn admit(&mut self, e: usize, target: u64) {
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
    pub(super) fn lane_of(&self, head: &Request) -> Option<u8> {
        let e = head.endpoint as usize;
        let ep = &self.endpoints[e];
        if ep.has(MIXED) {
            return match head.opcode() {
                Opcode::PUT | Opcode::GET | Opcode::ATOMIC | Opcode::NOTIFY => {
                    self.mixed_lane(e, head).ok().map(|(lane, _)| lane)
                }
                _ => None,
            };
        }
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
    pub(super) fn cross_boundary(&mut self, e: usize, head: RequestId, target: u64) -> bool {
        let request = *self.request(head);
        // D, and the lanes user flushes in flight took out of it: their
        // work is outstanding too.
        let outstanding = self.outstanding(e);
        if outstanding == 0 {
            self.admit(e, target);
            return true;
        }
        let lanes = outstanding | self.lane_of(&request).map_or(0, |l| 1 << l);
        let weak = !request.strong_boundary()
            && lanes.count_ones() == 1
            && self.lane_ordered(e, lanes.trailing_zeros() as u8)
            && !self.any_replaced(e, outstanding);
        if weak {
            // C stays: the epoch is admitted on this one lane only. A later
            // request of the same epoch on another lane needs the flush
            // after all (R8: the condition holds per operation), and so
            // does this one if the lane is replaced before it is posted
            // (R38: `weak_lane_kept`).
            let lane = lanes.trailing_zeros() as u8;
            self.cold[e].weak_generation = self.lane_generation(e, lane);
            let ep = &mut self.endpoints[e];
            ep.weak_lane = lane | WEAK_FLAG_OWED;
            ep.weak_epoch = target as u32;
            self.stats.weak_fences += 1;
            self.cold[e].stats.weak_fences += 1;
            tracing::trace!(endpoint = e, lane, target, "weak fence");
            return true;
        }
        let cause = if request.opcode() == Opcode::NOTIFY {
            FlushCause::Notify
        } else {
            FlushCause::Fence
        };
        self.start_fence_flush(e, target, cause)
    }

    /// The lanes of endpoint `e` with work not known complete that no fence
    /// flush covers: D, and the lanes flushes in flight took out of D.
    pub(super) fn outstanding(&self, e: usize) -> LaneMask {
        self.endpoints[e].dirty | self.cold[e].covered
    }

    /// Counts a driver flush of endpoint `e` started for `cause`.
    pub(super) fn count_flush(&mut self, e: usize, cause: FlushCause) {
        for stats in [&mut self.stats, &mut self.cold[e].stats] {
            stats.flushes += 1;
            *match cause {
                FlushCause::Fence => &mut stats.fence_flushes,
                FlushCause::Notify => &mut stats.notify_flushes,
                FlushCause::User => &mut stats.user_flushes,
                FlushCause::Worker => &mut stats.worker_flushes,
            } += 1;
        }
    }

    /// A flush that took `cleans` out of D as it started (a user FLUSH, a
    /// CLOSE, a worker flush's part) ended with `result`. Done, the work
    /// it covered on those lanes is complete: they stay clean unless
    /// written since (W2, R17), and if nothing on the endpoint is
    /// outstanding any more, its epochs fast-forward (R10). Failed, the
    /// lanes are dirty again.
    pub(super) fn flush_ended(&mut self, e: usize, cleans: LaneMask, result: Result<u32, Status>) {
        let cold = &mut self.cold[e];
        let mut lanes = cleans;
        while lanes != 0 {
            let lane = lanes.trailing_zeros() as usize;
            lanes &= lanes - 1;
            if let Some(n) = cold.covering.get_mut(lane) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    cold.covered &= !(1 << lane);
                }
            }
        }
        if result.is_err() {
            self.endpoints[e].dirty |= cleans;
            return;
        }
        let ep = &self.endpoints[e];
        let idle = (ep.dirty | self.cold[e].covered | ep.flushing) == 0
            && ep.submit_epoch != ep.admitted_epoch
            && ep.state == EpState::Connected
            && !ep.is_connecting();
        if !idle {
            return;
        }
        if ep.head == NONE {
            // Nothing outstanding: every boundary up to W is free (R10),
            // and the direct path serves the endpoint again.
            let w = ep.submit_epoch;
            self.admit(e, w);
            self.endpoints[e].set(STRONG_ARMED, false);
        } else {
            self.schedule(e); // dispatch fast-forwards for the head
        }
    }

    /// Takes `cleans` (lanes of D) out of D for a flush that starts now and
    /// covers them: `flush_ended` puts them back or cleans them for good.
    pub(super) fn cover(&mut self, e: usize, cleans: LaneMask) {
        self.endpoints[e].dirty &= !cleans;
        let cold = &mut self.cold[e];
        cold.covered |= cleans;
        let mut lanes = cleans;
        while lanes != 0 {
            let lane = lanes.trailing_zeros() as usize;
            lanes &= lanes - 1;
            if let Some(n) = cold.covering.get_mut(lane) {
                *n = n.saturating_add(1);
            }
        }
    }

    /// Lane `lane` of endpoint `e` was clean and is written now, on a
    /// channel of generation `generation`: it becomes dirty with that
    /// generation (R14, R38). If a flush in flight covers earlier work on
    /// it and the lane was replaced since that work, the entry is marked
    /// replaced, so the next boundary flushes every lane (R38).
    pub(super) fn newly_dirty(&mut self, e: usize, lane: u8, generation: u32) {
        self.endpoints[e].dirty |= 1 << lane;
        let cold = &mut self.cold[e];
        let entry = &mut cold.dirty_generation[lane as usize];
        *entry = if cold.covered & (1 << lane) != 0 && *entry != generation {
            REPLACED
        } else {
            generation
        };
    }

    /// The lanes a flush must cover, from the dirty set `dirty`: all live
    /// lanes if any dirty lane was replaced since it was written (R38).
    pub(super) fn normalize(&self, e: usize, dirty: LaneMask) -> LaneMask {
        if self.any_replaced(e, dirty) {
            self.endpoints[e].all_lanes()
        } else {
            dirty
        }
    }

    /// Whether a lane of `dirty` was replaced since it was written (R38):
    /// its work is on a channel later work is not ordered with.
    pub(super) fn any_replaced(&self, e: usize, dirty: LaneMask) -> bool {
        (0..self.endpoints[e].lanes).any(|lane| {
            dirty & (1 << lane) != 0
                && self.lane_generation(e, lane) != self.cold[e].dirty_generation[lane as usize]
        })
    }

    /// Starts the strong flush of exactly the dirty lanes (R9, R17) that
    /// moves C to `target` when it completes (R15c). Returns whether C moved
    /// now (the driver finished the flush inside the call).
    pub(super) fn start_fence_flush(&mut self, e: usize, target: u64, cause: FlushCause) -> bool {
        let mask = self.normalize(e, self.outstanding(e));
        let cold = &mut self.cold[e];
        cold.fence_serial = cold.fence_serial.wrapping_add(1);
        let ep = &mut self.endpoints[e];
        let (driver, driver_ep) = (ep.driver as usize, crate::driver::DriverEp(ep.driver_ep));
        let mixed = ep.has(MIXED);
        ep.flushing = mask;
        ep.dirty = 0;
        // The slot is owned before the driver is called: a flush that
        // finishes inside the call cannot find it empty (R25, W1).
        ep.fence_target = target as u32;
        let lanes = ep.lanes;
        for lane in 0..lanes {
            if mask & (1 << lane) != 0 {
                self.cold[e].flush_generation[lane as usize] = self.lane_generation(e, lane);
            }
        }
        self.count_flush(e, cause);
        tracing::trace!(endpoint = e, lanes = mask, target, "fence flush");
        let token = self.fence_token(e);
        let posted = if mixed {
            // One part per driver, each of exactly its dirty lanes (R24).
            let (posted, parts) = self.start_split(e, mask, token);
            self.cold[e].fence_parts = parts;
            posted
        } else {
            self.drivers[driver].flush(driver_ep, mask, token)
        };
        match posted {
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

    /// The token of endpoint `e`'s fence flush in flight: it names this
    /// flush, not just the endpoint (R25).
    pub(super) fn fence_token(&self, e: usize) -> Token {
        TokenTarget::Fence {
            endpoint: e,
            serial: self.cold[e].fence_serial,
        }
        .token()
    }

    /// The fence flush of endpoint `e` finished (inside its start or from
    /// `poll`). The slot is cleared first (R33); on success C moves to the
    /// recorded target unless a flushed lane was replaced meanwhile, in
    /// which case every lane is flushed again before C moves (R39).
    /// Dispatch is scheduled, never run from here (R20, W1).
    pub(super) fn fence_flush_done(&mut self, e: usize, result: Result<u32, Status>) {
        let ep = &mut self.endpoints[e];
        let (target, flushed) = (ep.full_epoch(ep.fence_target), ep.flushing);
        ep.flushing = 0;
        // Lost with a replaced lane (Fails::Lost on a live endpoint): flush
        // again, over every lane (R38), rather than fail.
        let lost = result.is_err() && self.lost_on_replaced_lane(e);
        if let (Err(status), false) = (result, lost) {
            // A fence flush that fails fails its endpoint, whatever the
            // status; with the cause the driver named, if it named one.
            let cause = self.endpoint_failure(status).unwrap_or(status);
            return self.fail_endpoint(e, cause);
        }
        let ep = &self.endpoints[e];
        let replaced = lost
            || (0..ep.lanes).any(|lane| {
                flushed & (1 << lane) != 0
                    && self.lane_generation(e, lane) != self.cold[e].flush_generation[lane as usize]
            });
        let ep = &mut self.endpoints[e];
        if replaced {
            tracing::debug!(
                endpoint = e,
                "lane replaced during a fence flush; flushing every lane again"
            );
            ep.dirty |= ep.all_lanes();
            // Mark every lane as replaced so the next flush is normalized.
            self.cold[e].dirty_generation.fill(REPLACED);
        } else {
            self.admit(e, target);
            tracing::trace!(endpoint = e, epoch = target, "fence flush done");
        }
        self.schedule(e);
    }
}
