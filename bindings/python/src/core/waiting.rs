//! Completions and waits: polling, routing CQEs to their transfers, the
//! leader and followers of a wait, and an asyncio event loop's part in it.

use super::*;

impl Core {
    /// Runs a progress round when no core thread runs, then routes every
    /// CQE; returns the work done (0: nothing happened).
    pub(crate) fn poll(&self) -> Res<usize> {
        let work = if self.core_thread {
            0
        } else {
            self.worker()?
                .as_ref()
                .expect("checked by worker()")
                .progress()
        };
        Ok(work + self.route_all(false, false)?)
    }

    /// Routes every CQE in the CQ (after disarming the CQ eventfd, with
    /// `disarm`), then drops what finished transfers kept, with no lock
    /// held, and signals the waiters if anything came.
    pub(super) fn route_all(&self, disarm: bool, from_async: bool) -> Res<usize> {
        let (routed, released) = {
            let _w = self.worker()?;
            let mut guard = self.queue();
            let q = &mut *guard;
            let routed = match q.qp.as_mut() {
                Some(qp) => {
                    if disarm {
                        qp.disarm_cq_doorbell();
                    }
                    reap(qp, &mut q.book)
                }
                None => Ok(0),
            };
            (routed, std::mem::take(&mut q.book.released))
        };
        drop(released);
        let routed = routed?;
        if routed > 0 {
            self.signal(from_async);
        }
        Ok(routed)
    }

    /// Wakes the waiters that may find their condition met now.
    pub(super) fn signal(&self, from_async: bool) {
        // SeqCst: against the followers' SeqCst add and load (see
        // `wait_until`): either a follower sees the new count, or this
        // sees the follower and wakes it.
        self.events.fetch_add(1, Ordering::SeqCst);
        if self.followers.load(Ordering::SeqCst) > 0 {
            drop(lock(&self.waits));
            self.cv.notify_all();
        }
        if !from_async && self.async_waiters.load(Ordering::SeqCst) > 0 {
            let _ = self.relay.ring();
        }
    }

    /// Waits (without the GIL) until `cond` holds for the bookkeeping, or
    /// `timeout` passes. `cond` returns `Some` to end the wait. Once the
    /// worker is closed, `cond` is asked once more, and the wait fails if
    /// it still does not hold.
    pub(crate) fn wait_until<R>(
        &self,
        timeout: Option<Duration>,
        mut cond: impl FnMut(&mut Book) -> Option<R>,
    ) -> Res<R> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut idle = 0u32;
        loop {
            // SeqCst: read before the condition is checked (see `signal`).
            let seen = self.events.load(Ordering::SeqCst);
            let work = match self.poll() {
                Ok(work) => work,
                Err(f) => {
                    if self.is_closed()
                        && let Some(r) = cond(&mut self.queue().book)
                    {
                        return Ok(r);
                    }
                    return Err(f);
                }
            };
            if let Some(r) = cond(&mut self.queue().book) {
                return Ok(r);
            }
            let remaining = left(deadline)?;
            if !self.core_thread {
                if work > 0 {
                    idle = 0;
                } else {
                    backoff(&mut idle);
                }
                continue;
            }
            let mut waits = lock(&self.waits);
            if waits.leader != Leader::None {
                // Follow: sleep until completions are routed or the leader
                // leaves.
                self.followers.fetch_add(1, Ordering::SeqCst);
                if self.events.load(Ordering::SeqCst) == seen {
                    let slice = remaining.unwrap_or(Duration::from_secs(1));
                    let _ = self
                        .cv
                        .wait_timeout_while(waits, slice, |_| {
                            self.events.load(Ordering::SeqCst) == seen
                        })
                        .unwrap_or_else(|e| e.into_inner());
                } else {
                    drop(waits);
                }
                self.followers.fetch_sub(1, Ordering::SeqCst);
                continue;
            }
            waits.leader = Leader::Thread;
            drop(waits);
            let led = self.lead_once(remaining);
            lock(&self.waits).leader = Leader::None;
            self.signal(false);
            led?;
        }
    }

    /// The leader's turn: arms the CQ eventfd, sleeps on it unless CQEs
    /// are ready, and routes what came.
    pub(super) fn lead_once(&self, remaining: Option<Duration>) -> Res<()> {
        let armed = {
            let _w = self.worker()?;
            let mut guard = self.queue();
            let q = &mut *guard;
            let qp = q.qp.as_mut().ok_or_else(Fail::closed)?;
            qp.arm_cq_doorbell().map_err(|_| corrupt())?
        };
        if armed {
            self.bell
                .wait(remaining)
                .map_err(|e| io_fail("waiting on the CQ eventfd", e))?;
        }
        self.route_all(true, false).map(|_| ())
    }

    /// The eventfds an event loop watches: the CQ's and the relay.
    pub(crate) fn async_fds(&self) -> (i32, i32) {
        use std::os::fd::AsRawFd;
        (self.bell.as_raw_fd(), self.relay.as_raw_fd())
    }

    /// An async waiter of event loop `loop_id` starts waiting.
    pub(crate) fn async_begin(&self, loop_id: u64) -> Res<()> {
        self.check_fork()?;
        let mut waits = lock(&self.waits);
        if waits.async_waiters > 0 && waits.async_loop != Some(loop_id) {
            return Err(Fail::new(
                Status::Busy,
                "this worker is awaited from another event loop: await a worker from one \
                 loop at a time",
            ));
        }
        waits.async_loop = Some(loop_id);
        waits.async_waiters += 1;
        self.async_waiters.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// An async waiter is done; the last one gives up the lead.
    pub(crate) fn async_end(&self) {
        let mut waits = lock(&self.waits);
        waits.async_waiters = waits.async_waiters.saturating_sub(1);
        self.async_waiters.fetch_sub(1, Ordering::SeqCst);
        if waits.async_waiters == 0 {
            waits.async_loop = None;
            if waits.leader == Leader::Async {
                waits.leader = Leader::None;
                drop(waits);
                self.disarm();
                self.signal(true);
            }
        }
    }

    /// Progress (without a core thread) and routing, then what the loop
    /// should watch: see [`arm`].
    pub(crate) fn async_arm(&self) -> Res<u8> {
        let work = self.poll()?;
        if !self.core_thread {
            return Ok(if work > 0 { arm::READY } else { arm::POLL });
        }
        if work > 0 {
            return Ok(arm::READY);
        }
        let mut waits = lock(&self.waits);
        match waits.leader {
            Leader::Thread => return Ok(arm::FOLLOW),
            Leader::None => waits.leader = Leader::Async,
            Leader::Async => {}
        }
        drop(waits);
        let armed = {
            let _w = self.worker()?;
            let mut guard = self.queue();
            let qp = guard.qp.as_mut().ok_or_else(Fail::closed)?;
            qp.arm_cq_doorbell().map_err(|_| corrupt())?
        };
        if armed {
            return Ok(arm::LEAD);
        }
        self.route_all(false, true)?;
        Ok(arm::READY)
    }

    /// The CQ's eventfd woke the loop: clears it, gives up the lead, and
    /// routes what came.
    pub(crate) fn async_wake(&self) -> Res<()> {
        {
            let mut waits = lock(&self.waits);
            if waits.leader == Leader::Async {
                waits.leader = Leader::None;
            }
        }
        self.disarm();
        self.route_all(false, true)?;
        // Whatever came, the lead changed hands: thread followers may take
        // it.
        self.signal(true);
        Ok(())
    }

    /// The relay woke the loop: clears it.
    pub(crate) fn async_relay_clear(&self) {
        let _ = self.relay.clear();
    }

    /// Stops asking for CQ eventfd rings and clears it.
    pub(super) fn disarm(&self) {
        let mut guard = self.queue();
        if let Some(qp) = guard.qp.as_mut() {
            qp.disarm_cq_doorbell();
        }
        drop(guard);
        let _ = self.bell.clear();
    }
}
