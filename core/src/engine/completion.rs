//! Driver completions: polled, matched to what is in flight, and applied
//! to their endpoints.

use super::token::TokenTarget;
use super::{Engine, POLL_BATCHES};
use crate::driver::{Completion, Fails, fails_endpoint};
use crate::endpoint::{CONNECTING, EpState, FlushParts, MIXED, NO_LANE, QUIET};
use crate::request::{RequestId, State};
use ringfence_ring::{Opcode, Status};

impl Engine {
    /// Polls every driver for at most [`POLL_BATCHES`] full batches and
    /// applies what finished.
    pub(super) fn poll_drivers(&mut self) -> usize {
        let mut work = 0;
        for d in 0..self.drivers.len() {
            // Bounded: a driver that keeps returning full batches leaves the
            // rest for the next round, so the SQs are not starved.
            for _ in 0..POLL_BATCHES {
                let n = self.drivers[d].poll(&mut self.scratch);
                for i in 0..n {
                    let c = self.scratch[i];
                    self.on_completion(d, c);
                }
                work += n;
                if n < self.scratch.len() {
                    break;
                }
            }
        }
        work
    }

    /// Applies completion `c`, which driver `d` returned.
    pub(super) fn on_completion(&mut self, d: usize, c: Completion) {
        if c.result.is_err() {
            self.verdict = c.fails;
        }
        self.apply(d, c);
        self.verdict = Fails::ByStatus;
    }

    fn apply(&mut self, d: usize, c: Completion) {
        match TokenTarget::of(c.token) {
            TokenTarget::Request(id) => self.request_done(d, id, None, c.result),
            TokenTarget::Flush { id, serial } => self.request_done(d, id, Some(serial), c.result),
            TokenTarget::Connect { endpoint, attempt } => {
                self.connect_done(d, endpoint, attempt, c.result);
            }
            TokenTarget::Fence { endpoint, serial } => {
                self.fence_part_done(d, endpoint, serial, c.result);
            }
            TokenTarget::WorkerPart {
                endpoint,
                flush,
                serial,
            } => self.worker_part_done(d, endpoint, flush, serial, c.result),
        }
    }

    /// The status a failure with `status`, from the completion being
    /// applied, fails its endpoint with, if it does ([`Fails`]).
    pub(super) fn endpoint_failure(&self, status: Status) -> Option<Status> {
        match self.verdict {
            Fails::ByStatus => fails_endpoint(status).then_some(status),
            Fails::Operation | Fails::Lost => None,
            Fails::Endpoint(cause) => Some(cause),
        }
    }

    /// Whether the completion being applied was lost to an earlier
    /// failure ([`Fails::Lost`]) while endpoint `e` is still up: its lane
    /// was replaced.
    pub(super) fn lost_on_replaced_lane(&self, e: usize) -> bool {
        self.verdict == Fails::Lost && self.endpoints[e].state != EpState::Failed
    }

    /// The result a completion with `result` gives its operation on
    /// endpoint `e`: one lost to the endpoint's failure completes with the
    /// endpoint's sticky error, the first real cause (R32).
    pub(super) fn own_result(&self, e: usize, result: Result<u32, Status>) -> Result<u32, Status> {
        let ep = &self.endpoints[e];
        // A verdict other than `ByStatus` comes only with an error.
        if self.verdict == Fails::Lost && ep.state == EpState::Failed {
            Err(ep.error())
        } else {
            result
        }
    }

    /// A completion of fence flush `serial` of endpoint `e`: the flush in
    /// flight's, or stray (an earlier flush's late or duplicated
    /// completion, or none in flight: R25). Stray, it changes nothing.
    fn fence_part_done(&mut self, d: usize, e: usize, serial: u32, result: Result<u32, Status>) {
        let live = self.endpoints.get(e).is_some_and(|ep| ep.flushing != 0)
            && TokenTarget::same_serial(self.cold[e].fence_serial, serial);
        if !live {
            self.stray_completions += 1;
            return;
        }
        let result = if self.endpoints[e].has(MIXED) {
            let Some(all) = self.split_part_done(d, e, None, result) else {
                return;
            };
            all
        } else {
            result
        };
        // Only the flushed subset leaves D: `dirty` already holds just
        // the lanes written since the flush started (R17, W2).
        self.fence_flush_done(e, result);
    }

    /// A completion of request `id`, posted to a driver: of its flush
    /// number `serial` if it is a user FLUSH or CLOSE. A completion that
    /// does not match what the slot holds now is stray.
    fn request_done(
        &mut self,
        d: usize,
        id: RequestId,
        serial: Option<u32>,
        result: Result<u32, Status>,
    ) {
        let live = self
            .queues
            .get(id.queue())
            .and_then(|q| q.pool.get(id.slot()))
            .is_some_and(|r| {
                let flush = matches!(r.opcode(), Opcode::FLUSH | Opcode::CLOSE);
                let matches = match serial {
                    Some(serial) => flush && r.remote_addr == u64::from(serial),
                    None => !flush,
                };
                r.state() == State::Posted && !r.is_worker_flush() && matches
            });
        if !live {
            self.stray_completions += 1;
            return;
        }
        let request = *self.request(id);
        let e = request.endpoint as usize;
        let mut result = self.own_result(e, result);
        if self.endpoints[e].has(MIXED) && matches!(request.opcode(), Opcode::FLUSH | Opcode::CLOSE)
        {
            // One part of a flush split over the endpoint's drivers.
            let Some(all) = self.split_part_done(d, e, Some(id.0), result) else {
                return;
            };
            result = all;
        }
        self.endpoints[e].inflight -= 1;
        self.finish(id, e, result);
    }

    /// Completes a request that finished and applies what its result means
    /// for its endpoint: a fatal error fails it (R20); a graceful CLOSE's
    /// final flush closes it, and the close succeeds even if the endpoint
    /// failed meanwhile (R34, R41), unless its peer is dead
    /// (`close_status`).
    pub(super) fn finish(&mut self, id: RequestId, e: usize, result: Result<u32, Status>) {
        let request = self.request(id);
        if matches!(request.opcode(), Opcode::FLUSH | Opcode::CLOSE) {
            // What it took out of D as it started (`start`).
            let cleans = request.operand;
            self.flush_ended(e, cleans, result);
        }
        if self.request(id).opcode() == Opcode::CLOSE {
            let status = self.close_status(e, result);
            self.close_now(e);
            return self.complete(id, status);
        }
        self.complete(id, result);
        if let Some(cause) = result
            .err()
            .and_then(|status| self.endpoint_failure(status))
        {
            self.fail_endpoint(e, cause);
        }
    }

    /// The result of a graceful CLOSE of endpoint `e` whose final flush
    /// ended with `flushed`: success (R34: even on a failed endpoint),
    /// except where the peer is known dead: a close, like a flush,
    /// succeeds only if the peer was alive when it completed, so it fails
    /// with [`Status::PeerUnreachable`] (the endpoint is closed all the
    /// same). This overrides R34 for that one status.
    pub(super) fn close_status(
        &self,
        e: usize,
        flushed: Result<u32, Status>,
    ) -> Result<u32, Status> {
        let ep = &self.endpoints[e];
        let dead = flushed == Err(Status::PeerUnreachable)
            || (ep.state == EpState::Failed && ep.error() == Status::PeerUnreachable);
        if dead {
            Err(Status::PeerUnreachable)
        } else {
            Ok(0)
        }
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
        ep.set(CONNECTING, false);
        if ep.has(MIXED) {
            self.abandon_parts(e, status);
        }
        while let Some(id) = self.pop_head(e) {
            if self.request(id).opcode() == Opcode::CLOSE {
                // R34: the close of a failed endpoint succeeds, unless the
                // peer is dead (`close_status`).
                let closed = self.close_status(e, Ok(0));
                self.complete(id, closed);
            } else {
                self.complete(id, Err(status));
            }
        }
        if self.endpoints[e].has(QUIET) {
            self.end_parts(e, Some(status));
        }
        if closing {
            self.close_now(e);
        }
    }

    /// Endpoint `e` (one with lanes on several drivers) failed with
    /// `status`: flush parts that no driver took yet never will be. A user
    /// flush with no part left at a driver completes now, with the error;
    /// one with parts still out completes when they come back (its drivers
    /// return them, with an error, after `disconnect`). The fence flush's
    /// slot was cleared by the failure (R33).
    fn abandon_parts(&mut self, e: usize, status: Status) {
        self.cold[e].fence_parts = FlushParts::default();
        let mut i = 0;
        while i < self.cold[e].user_flushes.len() {
            let (id, parts) = &mut self.cold[e].user_flushes[i];
            parts.remaining = 0;
            parts.error.get_or_insert(status);
            if parts.pending > 0 {
                i += 1;
                continue;
            }
            let (id, result) = (RequestId(*id), parts.result());
            self.cold[e].user_flushes.swap_remove(i);
            if self.is_worker_part(e, id.0) {
                self.split_worker_part_finished(e, id.0, result);
            } else {
                self.endpoints[e].inflight -= 1;
                self.finish(id, e, result);
            }
        }
    }
}
