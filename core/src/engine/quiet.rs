//! The worker flush (a quiet, docs/fence.md R26): the union of every endpoint's
//! flush, bounded to what was submitted before it.
//!
//! A worker flush takes one request slot, whatever the number of
//! endpoints. When it is taken, each endpoint contributes one *part*:
//! - nothing, if it is closed, or has nothing outstanding and nothing
//!   queued;
//! - if it is failed: nothing if it holds no work (its failure was
//!   reported on its own operations), else its sticky error, at once: work
//!   still in flight or written and never flushed on a failed endpoint
//!   cannot be promised complete. Closing a failed endpoint (which
//!   succeeds at once, R34) ends that;
//! - a driver flush now, of what is outstanding (D, the lanes in flight
//!   under a fence flush or other flushes), if nothing is queued;
//! - if requests are queued (behind a boundary or a handshake), a wait for
//!   the last of them to start, then that driver flush: it covers the
//!   queued requests submitted before the worker flush (R23) and nothing
//!   submitted after it has to finish first;
//! - on a closing endpoint, a wait for the close, which comes after
//!   everything else submitted on it (R41).
//!
//! The worker flush completes when every part has: with success, or the
//! first error of a part (an endpoint that failed meanwhile). A part's
//! flush cleans the lanes it covered, as a user FLUSH does (W2).

use super::token::TokenTarget;
use super::{Engine, FlushCause};
use crate::driver::{Posted, Token};
use crate::endpoint::{EpState, MIXED, QUIET};
use crate::endpoint::{PartState, QuietPart};
use crate::request::{NONE, RequestId, State};
use ringfence_ring::Status;

impl Engine {
    /// Takes worker flush `id`: one part per endpoint with something to
    /// cover; completes it at once if none has.
    pub(super) fn worker_flush(&mut self, id: RequestId) {
        // Its own bookkeeping, over what the SQE carried in the fields a
        // FLUSH does not use: parts not finished, no failure yet, and the
        // serial its parts' tokens carry (the slot is handed out again
        // after it completes; a late part of this flush must not count for
        // the next one's).
        let serial = self.serials.next_worker_flush();
        let r = self.request_mut(id);
        r.len = 0;
        r.operand2 = 0;
        r.remote_addr = u64::from(serial);
        let mut parts = 0u32;
        for e in 0..self.endpoints.len() {
            let ep = &self.endpoints[e];
            let state = match ep.state {
                EpState::Closed => continue,
                EpState::Failed => {
                    if ep.inflight > 0 || (ep.dirty | ep.flushing | self.cold[e].covered) != 0 {
                        let status = ep.error();
                        self.note_part_result(e, id, Err(status));
                    }
                    continue;
                }
                EpState::Closing => PartState::UntilClosed,
                EpState::Connected if ep.head != NONE => PartState::After(ep.tail),
                EpState::Connected => PartState::Ready,
            };
            if state == PartState::Ready {
                match self.start_worker_part(e, id) {
                    Some(PartState::Ready) => {}
                    Some(started) => {
                        self.add_part(e, id, started);
                        parts += 1;
                        continue;
                    }
                    None => continue, // nothing to flush, or done inside the call
                }
            }
            self.add_part(e, id, state);
            parts += 1;
            if state == PartState::Ready {
                self.schedule(e);
            }
        }
        if parts == 0 {
            let result = self.worker_result(id);
            return self.complete(id, result);
        }
        let r = self.request_mut(id);
        r.len = parts;
        r.set_state(State::Posted);
    }

    fn add_part(&mut self, e: usize, flush: RequestId, state: PartState) {
        self.cold[e].quiet_parts.push(QuietPart {
            flush: flush.0,
            state,
        });
        self.endpoints[e].set(QUIET, true);
        if matches!(state, PartState::Started(_)) {
            self.endpoints[e].inflight += 1;
        }
    }

    /// Starts the driver flush of worker flush `flush`'s part on endpoint
    /// `e`: of every lane with outstanding work. `None` if there was
    /// nothing to flush or the flush finished inside the call (its result
    /// is recorded in the worker flush), else the part's new state
    /// (`Started`, or `Ready` if the driver had no room).
    fn start_worker_part(&mut self, e: usize, flush: RequestId) -> Option<PartState> {
        let ep = &self.endpoints[e];
        let cleans = ep.dirty;
        let mask = ep.dirty | ep.flushing | self.cold[e].covered;
        if mask == 0 {
            return None;
        }
        let mask = self.normalize(e, mask);
        let token = self.worker_part_token(e, flush);
        self.count_flush(e, FlushCause::Worker);
        self.cover(e, cleans);
        let ep = &self.endpoints[e];
        let posted = if ep.has(MIXED) {
            let (posted, parts) = self.start_split(e, mask, token);
            if posted == Posted::InFlight {
                self.cold[e].user_flushes.push((flush.0, parts));
            }
            posted
        } else {
            let driver_ep = crate::driver::DriverEp(ep.driver_ep);
            self.drivers[ep.driver as usize].flush(driver_ep, mask, token)
        };
        match posted {
            Posted::InFlight => Some(PartState::Started(cleans)),
            Posted::Done(result) => {
                self.flush_ended(e, cleans, result);
                self.note_part_result(e, flush, result);
                None
            }
            Posted::NoResource => {
                self.flush_ended(e, cleans, Err(Status::NoResource));
                Some(PartState::Ready)
            }
        }
    }

    /// Request `id` of endpoint `e` left its queue (started or completed):
    /// worker flush parts waiting for it may start.
    pub(super) fn left_queue(&mut self, e: usize, id: RequestId) {
        let mut ready = false;
        for part in &mut self.cold[e].quiet_parts {
            if part.state == PartState::After(id.0) {
                part.state = PartState::Ready;
                ready = true;
            }
        }
        if ready {
            self.service_parts(e);
        }
    }

    /// Starts the parts of endpoint `e` that are ready (from dispatch).
    pub(super) fn service_parts(&mut self, e: usize) {
        let mut i = 0;
        while i < self.cold[e].quiet_parts.len() {
            let part = self.cold[e].quiet_parts[i];
            if part.state != PartState::Ready {
                i += 1;
                continue;
            }
            match self.start_worker_part(e, RequestId(part.flush)) {
                Some(PartState::Ready) => {
                    self.schedule(e);
                    i += 1;
                }
                Some(started) => {
                    self.cold[e].quiet_parts[i].state = started;
                    self.endpoints[e].inflight += 1;
                    i += 1;
                }
                None => {
                    self.remove_part(e, i);
                    self.part_finished(RequestId(part.flush));
                }
            }
        }
    }

    fn remove_part(&mut self, e: usize, i: usize) {
        let parts = &mut self.cold[e].quiet_parts;
        parts.swap_remove(i);
        if parts.is_empty() {
            self.endpoints[e].set(QUIET, false);
        }
    }

    /// The token of worker flush `flush`'s part on endpoint `e`.
    pub(super) fn worker_part_token(&self, e: usize, flush: RequestId) -> Token {
        TokenTarget::WorkerPart {
            endpoint: e,
            flush,
            serial: self.request(flush).remote_addr as u32,
        }
        .token()
    }

    /// Driver `d` completed the driver flush of worker flush `flush`'s
    /// part on endpoint `e` with `result` (one part of it, on an endpoint
    /// with lanes on several drivers); `serial` is what its token carried.
    /// A completion that names no part in flight, or a part of an earlier
    /// worker flush whose slot `flush` has taken since, is stray.
    pub(super) fn worker_part_done(
        &mut self,
        d: usize,
        e: usize,
        flush: RequestId,
        serial: u32,
        result: Result<u32, Status>,
    ) {
        let current = self
            .queues
            .get(flush.queue())
            .and_then(|q| q.pool.get(flush.slot()))
            .is_some_and(|r| {
                r.is_worker_flush()
                    && r.state() == State::Posted
                    && TokenTarget::same_part_serial(r.remote_addr as u32, serial)
            });
        let part = self.cold.get(e).and_then(|c| {
            c.quiet_parts
                .iter()
                .position(|p| p.flush == flush.0 && matches!(p.state, PartState::Started(_)))
        });
        let (true, Some(i)) = (current, part) else {
            self.stray_completions += 1;
            return;
        };
        let result = self.own_result(e, result);
        let result = if self.endpoints[e].has(MIXED) {
            let Some(all) = self.split_part_done(d, e, Some(flush.0), result) else {
                return;
            };
            all
        } else {
            result
        };
        self.worker_part_finished(e, i, result);
    }

    /// Part `i` of endpoint `e`, whose driver flush was in flight, finished
    /// with `result`.
    pub(super) fn worker_part_finished(&mut self, e: usize, i: usize, result: Result<u32, Status>) {
        let part = self.cold[e].quiet_parts[i];
        let PartState::Started(cleans) = part.state else {
            return;
        };
        self.endpoints[e].inflight -= 1;
        self.remove_part(e, i);
        self.flush_ended(e, cleans, result);
        let flush = RequestId(part.flush);
        self.note_part_result(e, flush, result);
        self.part_finished(flush);
        if let Some(cause) = result
            .err()
            .and_then(|status| self.endpoint_failure(status))
        {
            self.fail_endpoint(e, cause);
        }
    }

    /// Whether request `id` is a worker flush's whose part on endpoint
    /// `e` has a flush split over several drivers (see `retry_parts`).
    pub(super) fn is_worker_part(&self, e: usize, id: u32) -> bool {
        self.cold[e]
            .quiet_parts
            .iter()
            .any(|p| p.flush == id && matches!(p.state, PartState::Started(_)))
    }

    /// The part of worker flush `id` on endpoint `e`, split over several
    /// drivers, finished with `result` (from `retry_parts` or
    /// `abandon_parts`).
    pub(super) fn split_worker_part_finished(
        &mut self,
        e: usize,
        id: u32,
        result: Result<u32, Status>,
    ) {
        if let Some(i) = self.cold[e]
            .quiet_parts
            .iter()
            .position(|p| p.flush == id && matches!(p.state, PartState::Started(_)))
        {
            self.worker_part_finished(e, i, result);
        }
    }

    /// Records a part's failure in worker flush `flush` (the first one is
    /// its result).
    fn note_part_result(&mut self, e: usize, flush: RequestId, result: Result<u32, Status>) {
        if let Err(status) = result {
            tracing::debug!(endpoint = e, %status, "worker flush part failed");
            let r = self.request_mut(flush);
            if r.operand2 == 0 {
                r.operand2 = status.as_raw() as i64 as u64;
            }
        }
    }

    /// The result a worker flush completes with.
    fn worker_result(&self, flush: RequestId) -> Result<u32, Status> {
        match self.request(flush).operand2 {
            0 => Ok(0),
            raw => Err(Status::try_from(raw as i64 as i32).unwrap_or(Status::EndpointFailed)),
        }
    }

    /// One part of worker flush `flush` finished; the last completes it.
    fn part_finished(&mut self, flush: RequestId) {
        let r = self.request_mut(flush);
        if r.state() != State::Posted {
            return; // still being taken: `worker_flush` counts what is left
        }
        r.len -= 1;
        if r.len == 0 {
            let result = self.worker_result(flush);
            self.complete(flush, result);
        }
    }

    /// Endpoint `e` ended (failed with `status`, or closed with `None`):
    /// parts that wait on it finish now, with the failure; a part whose
    /// driver flush is in flight finishes when its driver returns it.
    pub(super) fn end_parts(&mut self, e: usize, status: Option<Status>) {
        let mut i = 0;
        while i < self.cold[e].quiet_parts.len() {
            let part = self.cold[e].quiet_parts[i];
            if matches!(part.state, PartState::Started(_)) {
                i += 1;
                continue;
            }
            self.remove_part(e, i);
            let flush = RequestId(part.flush);
            if let Some(status) = status {
                self.note_part_result(e, flush, Err(status));
            }
            self.part_finished(flush);
        }
    }

    /// At shutdown, after the drivers quiesced: parts still in flight
    /// finish canceled.
    pub(super) fn cancel_parts(&mut self) {
        for e in 0..self.endpoints.len() {
            while let Some(i) = self.cold[e]
                .quiet_parts
                .iter()
                .position(|p| matches!(p.state, PartState::Started(_)))
            {
                self.worker_part_finished(e, i, Err(Status::Canceled));
            }
            self.end_parts(e, Some(Status::Canceled));
        }
    }
}
