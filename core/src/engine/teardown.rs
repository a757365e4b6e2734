//! Closing endpoints and tearing the engine down (docs/fence.md §8).

use super::Engine;
use crate::driver::{Quiesce, Quiesced};
use crate::endpoint::{EpState, NO_LANE, QUIET};
use crate::request::{RequestId, State};
use ringfence_ring::Status;

impl Engine {
    /// R42: a forced close cancels the queue and the in-flight fence at
    /// once, and releases the connection; requests already posted come back
    /// through the driver.
    pub(super) fn force_close(&mut self, id: RequestId, e: usize) {
        self.fail_endpoint(e, Status::Canceled);
        self.close_now(e);
        self.complete(id, Ok(0));
    }

    /// Releases the connection and marks the endpoint closed.
    pub(super) fn close_now(&mut self, e: usize) {
        let ep = &mut self.endpoints[e];
        if ep.state == EpState::Closed {
            return;
        }
        ep.state = EpState::Closed;
        ep.set_error(Status::EndpointClosed);
        ep.flushing = 0;
        ep.weak_lane = NO_LANE;
        if ep.has(QUIET) {
            // Everything submitted before the close is complete.
            self.end_parts(e, None);
        }
        for gi in 0..self.cold[e].groups.len() {
            let g = self.cold[e].groups[gi];
            self.drivers[g.driver as usize].disconnect(crate::driver::DriverEp(g.driver_ep));
        }
        // Its keys go once nothing posted on it is in flight any more
        // (a draining driver may still run what it holds).
        if self.endpoints[e].inflight == 0 {
            self.release_endpoint_rkeys(e);
        } else {
            self.closed_with_rkeys.push(e);
        }
        tracing::debug!(endpoint = e, "endpoint closed");
    }

    /// Releases every key still unpacked for endpoint `e`.
    fn release_endpoint_rkeys(&mut self, e: usize) {
        for key in self.rkeys.remove_all(Some(e as u32)) {
            self.release_rkey_parts(&key);
        }
    }

    /// Releases the keys of closed endpoints whose last operation has
    /// completed (the progress round calls this only when some wait).
    pub(super) fn release_closed_rkeys(&mut self) {
        let mut i = 0;
        while i < self.closed_with_rkeys.len() {
            let e = self.closed_with_rkeys[i];
            if self.endpoints[e].inflight == 0 {
                self.closed_with_rkeys.swap_remove(i);
                self.release_endpoint_rkeys(e);
            } else {
                i += 1;
            }
        }
    }

    /// Tells each driver of `key`'s endpoint to release its part of it.
    pub(crate) fn release_rkey_parts(&mut self, key: &crate::memory::Rkey) {
        let Some(cold) = self.cold.get(key.endpoint as usize) else {
            return;
        };
        for (g, part) in cold.groups.iter().zip(key.parts) {
            if let Some(part) = part {
                self.drivers[g.driver as usize]
                    .release_rkey(crate::driver::DriverEp(g.driver_ep), part);
            }
        }
    }

    /// Releases the remote key `raw` names (`Worker::release_rkey`).
    pub(crate) fn release_rkey(&mut self, raw: u32) -> Result<(), Status> {
        let key = self.rkeys.peek(raw).ok_or(Status::InvalidRkey)?;
        let ep = &self.endpoints[key.endpoint as usize];
        if ep.inflight != 0 || ep.head != crate::request::NONE {
            return Err(Status::Busy);
        }
        if let Some(key) = self.rkeys.remove(raw) {
            self.release_rkey_parts(&key);
        }
        Ok(())
    }

    /// Completes everything with CANCELED (R44): queued requests, posted
    /// ones (after the drivers give them back, or once they have quiesced),
    /// and SQEs not yet taken. Frees nothing a driver may still touch: the
    /// registrations (and the memory the registry owns) go with the engine,
    /// after every driver's `quiesce(All)` answered `Done`. A driver that
    /// still answers `Pending` is asked again between rounds that poll the
    /// drivers, for at most [`Config::quiesce_timeout`]; if it has not
    /// answered `Done` by then, or answered `Leak`, every registration is
    /// leaked instead (a warning says so), never freed.
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
        // Disconnected drivers hand back what they held. Then each one
        // quiesces: when that returns nothing it started can touch memory
        // (a device still writing a GET's buffer, a peer's PUT landing), so
        // what it still holds may be completed and the memory freed.
        for _ in 0..1000 {
            if self.endpoints.iter().all(|ep| ep.inflight == 0) {
                break;
            }
            self.poll_drivers();
        }
        let release = self.quiesce_all();
        // Nothing is in flight any more: every key still unpacked goes.
        self.closed_with_rkeys.clear();
        for key in self.rkeys.remove_all(None) {
            self.release_rkey_parts(&key);
        }
        self.release_all(release);
        // What the quiesce canceled comes out of the next polls, and one
        // `poll_drivers` takes at most `POLL_BATCHES` batches per driver:
        // poll until the drivers have nothing more (bounded, in case one
        // never stops returning completions).
        for _ in 0..1000 {
            if self.poll_drivers() == 0 {
                break;
            }
        }
        // Worker flushes whose parts a driver kept past its quiesce.
        self.cancel_parts();
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
                    "driver kept a request past disconnect and quiesce; canceled"
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

    /// Asks every driver to quiesce everything, again after rounds of
    /// polling while some answer `Pending`, for a bounded time; whether
    /// all answered `Done`.
    fn quiesce_all(&mut self) -> bool {
        let mut pending: Vec<usize> = (0..self.drivers.len()).collect();
        let mut release = true;
        let deadline = std::time::Instant::now() + self.config.quiesce_timeout;
        loop {
            let drivers = &mut self.drivers;
            pending.retain(|&d| match drivers[d].quiesce(Quiesce::All) {
                Quiesced::Done => false,
                Quiesced::Pending => true,
                Quiesced::Leak => {
                    tracing::warn!(
                        driver = drivers[d].name(),
                        "a driver cannot release this worker's memory at teardown"
                    );
                    release = false;
                    false
                }
            });
            if pending.is_empty() {
                return release;
            }
            if std::time::Instant::now() >= deadline {
                for &d in &pending {
                    tracing::warn!(
                        driver = self.drivers[d].name(),
                        timeout = ?self.config.quiesce_timeout,
                        "a driver's teardown did not finish in time"
                    );
                }
                return false;
            }
            self.poll_drivers();
            // The driver may wait for the kernel or another thread of this
            // process (a peer on the same host): give it the core.
            std::thread::yield_now();
        }
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
