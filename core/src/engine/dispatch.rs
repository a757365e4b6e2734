//! Dispatch: each endpoint's FIFO of deferred requests (R18), the list of
//! endpoints with work to start, and the bounded pass that starts what the
//! fence engine admits (R19).

use super::{DISPATCH_BATCH, Engine, Started};
use crate::endpoint::{Endpoint, EpState, MIXED, QUIET, SCHEDULED};
use crate::request::{NONE, RequestId};

/// The endpoints with queued work to start: each at most once (the
/// endpoint's `SCHEDULED` flag), in the order they were scheduled.
#[derive(Debug, Default)]
pub(super) struct DispatchList {
    /// Scheduled for the next pass.
    next: Vec<u32>,
    /// Being dispatched by the current pass (which may schedule again).
    current: Vec<u32>,
}

impl DispatchList {
    /// Room for one more endpoint, so that scheduling never allocates.
    pub(super) fn reserve_one(&mut self) {
        self.next.reserve(1);
        self.current.reserve(1);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.next.is_empty()
    }

    /// Schedules endpoint `e` (flagged in `ep`) unless it is already.
    fn add(&mut self, e: usize, ep: &mut Endpoint) {
        if !ep.has(SCHEDULED) {
            ep.set(SCHEDULED, true);
            self.next.push(e as u32);
        }
    }

    /// Starts a pass: what was scheduled becomes the pass's list (its
    /// length returned), and scheduling starts a new one.
    fn begin(&mut self) -> usize {
        std::mem::swap(&mut self.next, &mut self.current);
        self.current.len()
    }

    /// Endpoint `i` of the current pass.
    fn current(&self, i: usize) -> usize {
        self.current[i] as usize
    }

    fn end(&mut self) {
        self.current.clear();
    }
}

impl Engine {
    pub(super) fn push_tail(&mut self, e: usize, id: RequestId) {
        self.request_mut(id).next = NONE;
        let tail = self.endpoints[e].tail;
        if tail == NONE {
            self.endpoints[e].head = id.0;
        } else {
            self.request_mut(RequestId(tail)).next = id.0;
        }
        self.endpoints[e].tail = id.0;
    }

    pub(super) fn push_head(&mut self, e: usize, id: RequestId) {
        let head = self.endpoints[e].head;
        self.request_mut(id).next = head;
        self.endpoints[e].head = id.0;
        if head == NONE {
            self.endpoints[e].tail = id.0;
        }
    }

    pub(super) fn pop_head(&mut self, e: usize) -> Option<RequestId> {
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

    /// Schedules endpoint `e` for the next dispatch pass (never
    /// dispatched from where it is scheduled: R19, R20, W1).
    pub(super) fn schedule(&mut self, e: usize) {
        self.dispatch_list.add(e, &mut self.endpoints[e]);
    }

    /// One dispatch pass over the endpoints scheduled before it (twice a
    /// round, nothing scheduled the common case: the check is inlined).
    #[inline]
    pub(super) fn dispatch_scheduled(&mut self) -> usize {
        if self.dispatch_list.is_empty() {
            return 0;
        }
        self.dispatch_pass()
    }

    fn dispatch_pass(&mut self) -> usize {
        let mut work = 0;
        for i in 0..self.dispatch_list.begin() {
            let e = self.dispatch_list.current(i);
            self.endpoints[e].set(SCHEDULED, false);
            work += self.dispatch(e);
        }
        self.dispatch_list.end();
        work
    }

    /// Starts queued requests of endpoint `e` whose epoch is admitted, and
    /// the boundary flush that admits the next epoch (R19).
    pub(super) fn dispatch(&mut self, e: usize) -> usize {
        if self.endpoints[e].has(MIXED) {
            // Flush parts a driver had no room for.
            self.retry_parts(e);
        }
        if self.endpoints[e].has(QUIET) {
            self.service_parts(e);
        }
        let mut started = 0;
        while matches!(
            self.endpoints[e].state,
            EpState::Connected | EpState::Closing
        ) && !self.endpoints[e].is_connecting()
        {
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
                if self.endpoints[e].has(QUIET) {
                    self.left_queue(e, id);
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
}
