//! Queue pairs: an application thread's SQ and CQ.

use super::*;

/// An application thread's submission and completion queues.
///
/// SQEs are written straight into the SQ ring; [`submit`](QueuePair::submit)
/// publishes them with one store and wakes the core thread only if it
/// sleeps. CQEs are read straight out of the CQ ring.
#[derive(Debug)]
pub struct QueuePair {
    pub(super) sq: Producer<Sqe>,
    pub(super) cq: Consumer<Cqe>,
    pub(super) index: usize,
    pub(super) cq_bell: Arc<Doorbell>,
    pub(super) shared: Arc<Shared>,
}

impl QueuePair {
    /// Writes one SQE (not visible to the engine until `submit`).
    ///
    /// # Errors
    /// [`RingError::Full`]: reap completions and run progress, then retry.
    pub fn push(&mut self, sqe: Sqe) -> Result<(), RingError> {
        self.sq.push(sqe)
    }

    /// Writes as many of `sqes` as fit; returns how many.
    ///
    /// # Errors
    /// The SQ's shared indices are corrupt.
    pub fn push_batch(&mut self, sqes: &[Sqe]) -> Result<usize, Corrupt> {
        self.sq.push_batch(sqes)
    }

    /// The next SQ slot, zeroed, to fill in place.
    ///
    /// # Errors
    /// As [`push`](QueuePair::push).
    pub fn next_sqe(&mut self) -> Result<&mut Sqe, RingError> {
        self.sq.next_entry()
    }

    /// Publishes written SQEs; wakes the core thread if it sleeps. After the
    /// worker is dropped, they complete at once with CANCELED.
    pub fn submit(&mut self) -> u32 {
        let n = self.sq.submit();
        if self.shared.shut_down.load(Ordering::Acquire) {
            self.shared.engine().cancel_intake(self.index);
        } else if n > 0 && self.sq.needs_wakeup() {
            self.shared.wake_core();
        }
        n
    }

    /// Runs a PUT or GET at once, on this thread, where that keeps every
    /// rule of the ring: for the lowest latency (a ping-pong), the answer
    /// to `ucp_put_nbx` finishing inline.
    ///
    /// It runs only if the engine would start `sqe` at once anyway (a valid
    /// PUT or GET on a connected endpoint with nothing queued and no fence
    /// pending, or only a weak fence on the lane it takes (FENCE.md R8),
    /// through a driver that finishes operations inside the call,
    /// as shm and loopback do), this queue pair has no SQE the engine has
    /// not taken yet (pushed ones included: one could be a FENCE), and no
    /// other thread is inside the engine (a core thread's progress round).
    /// It is then done, remotely visible as after a PUT's CQE: its result
    /// (bytes, or the status its CQE would carry) is its one completion,
    /// and no CQE follows, whatever its flags. It is counted in the stats.
    ///
    /// On a failed endpoint (a dead peer, say) it fails at once with the
    /// endpoint's sticky first error, as the pushed SQE's CQE would.
    ///
    /// `None`: nothing was done; push the SQE as usual.
    pub fn try_now(&mut self, sqe: &Sqe) -> Option<Result<u32, Status>> {
        if self.sq.pending() != 0 {
            return None;
        }
        let mut engine = self.shared.try_engine()?;
        let result = engine.run_now(self.index, sqe);
        if engine.core_asleep && matches!(result, Some(Err(_))) {
            // A failure may have failed the endpoint, completing requests
            // whose CQEs the next round publishes: wake the core thread
            // (`Shared::engine` does so for every other caller).
            engine.core_asleep = false;
            self.shared.wake_core();
        }
        result
    }

    /// Takes one CQE.
    ///
    /// # Errors
    /// The CQ's shared indices are corrupt.
    pub fn pop(&mut self) -> Result<Option<Cqe>, Corrupt> {
        let cqe = self.cq.pop()?;
        if cqe.is_none() && self.cq.is_overflowed() && self.shared.shut_down.load(Ordering::Acquire)
        {
            // No progress loop runs any more: finish the work here.
            self.shared.engine().cancel_intake(self.index);
            return self.cq.pop();
        }
        Ok(cqe)
    }

    /// Takes up to `out.len()` CQEs; returns how many.
    ///
    /// # Errors
    /// The CQ's shared indices are corrupt.
    pub fn reap(&mut self, out: &mut [Cqe]) -> Result<usize, Corrupt> {
        let n = self.cq.pop_batch(out)?;
        if n == 0 && self.shared.shut_down.load(Ordering::Acquire) {
            self.shared.engine().cancel_intake(self.index);
            return self.cq.pop_batch(out);
        }
        Ok(n)
    }

    /// Whether the engine holds completions that did not fit the CQ (it
    /// takes no SQEs from this queue pair until they are reaped).
    pub fn is_overflowed(&self) -> bool {
        self.cq.is_overflowed()
    }

    /// Sleeps until a CQE is ready or `timeout` passes; returns whether one
    /// is ready. Needs the core thread (nothing else makes progress while
    /// this thread sleeps).
    ///
    /// # Errors
    /// Corrupt indices or a failed eventfd.
    pub fn wait_cqe(&mut self, timeout: Option<Duration>) -> Result<bool, WaitError> {
        self.cq.wait(&self.cq_bell, timeout)
    }

    /// Waits until at least `nr` CQEs are ready to reap, or `timeout`
    /// passes (`None`: no limit); returns how many are ready (at least
    /// `nr`; `nr` = 0 returns at once). Without a core thread it runs the
    /// worker's progress on this thread meanwhile (yielding the CPU between
    /// empty rounds); with one it sleeps on the CQ doorbell. It never waits
    /// past the deadline by more than one progress round.
    /// `io_uring_wait_cqe_nr` with `io_uring_wait_cqe_timeout`'s limit.
    ///
    /// # Errors
    /// `Timeout` if the deadline passed first (the CQEs that did arrive
    /// stay to be reaped); `InvalidArgument` if `nr` is more than the CQ
    /// holds; `RingCorrupt`; `Io` if the doorbell fails.
    pub fn wait_cqes(&mut self, nr: u32, timeout: Option<Duration>) -> Result<u32, Status> {
        super::wait::wait_cqes(&self.shared, &self.cq_bell, &mut self.cq, nr, timeout)
    }

    /// [`wait_cqes`](QueuePair::wait_cqes) for code that took the CQ over
    /// ([`as_raw_cq`](QueuePair::as_raw_cq)): counts from the head it
    /// published in ring memory. Call it from the thread that reaps.
    ///
    /// # Errors
    /// As `wait_cqes`.
    pub fn wait_cqes_published(
        &mut self,
        nr: u32,
        timeout: Option<Duration>,
    ) -> Result<u32, Status> {
        let mut cq = super::wait::Published(&mut self.cq);
        super::wait::wait_cqes(&self.shared, &self.cq_bell, &mut cq, nr, timeout)
    }

    /// The CQ's doorbell, an eventfd to put in epoll: readable after the
    /// engine posts CQEs while this queue pair is waiting (call
    /// [`wait_cqe`](QueuePair::wait_cqe), or arm it with
    /// [`arm_cq_doorbell`](QueuePair::arm_cq_doorbell) before `epoll_wait`).
    pub fn cq_doorbell(&self) -> &Doorbell {
        &self.cq_bell
    }

    /// Asks the engine to ring the CQ doorbell when it posts; returns
    /// `false` if CQEs are already ready (do not sleep). Call
    /// [`disarm_cq_doorbell`](QueuePair::disarm_cq_doorbell) after waking.
    ///
    /// # Errors
    /// Corrupt indices.
    pub fn arm_cq_doorbell(&mut self) -> Result<bool, Corrupt> {
        self.cq.prepare_wait()
    }

    /// Stops asking for CQ doorbell rings.
    pub fn disarm_cq_doorbell(&mut self) {
        self.cq.finish_wait();
    }

    /// One bounded round of the worker's progress on this thread.
    pub fn progress(&self) -> usize {
        self.shared.engine().progress()
    }

    /// The payload of an incoming notification CQE, readable until the
    /// returned guard drops (which gives the buffer back). `None` for any
    /// other CQE, or if this notification was already read.
    pub fn notification(&self, cqe: &Cqe) -> Option<Notification<'_>> {
        let buffer = cqe.buffer_id()?;
        let len = u32::try_from(cqe.res).ok()?;
        let data = self.shared.notify.read(buffer, len)?;
        Some(Notification {
            pool: &self.shared.notify,
            buffer,
            data,
        })
    }

    /// The SQ as raw pointers, for code that writes SQEs in place and
    /// publishes them itself: the C ABI's inline helpers (see
    /// [`RawParts`]). Whoever takes it over publishes with the ring's
    /// protocol, then calls [`raw_submitted`](QueuePair::raw_submitted)
    /// when the engine asked to be woken, and uses neither
    /// [`push`](QueuePair::push) nor [`submit`](QueuePair::submit) again.
    /// The pointers stay valid while this queue pair lives.
    pub fn as_raw_sq(&self) -> RawParts<Sqe> {
        self.sq.as_raw_parts()
    }

    /// The CQ as raw pointers, for code that reads CQEs in place and frees
    /// their slots itself (see [`as_raw_sq`](QueuePair::as_raw_sq)); it
    /// then uses neither [`pop`](QueuePair::pop) nor
    /// [`reap`](QueuePair::reap) again. The pointers stay valid while this
    /// queue pair lives.
    pub fn as_raw_cq(&self) -> RawParts<Cqe> {
        self.cq.as_raw_parts()
    }

    /// What [`submit`](QueuePair::submit) does after its store, for SQEs
    /// published through [`as_raw_sq`](QueuePair::as_raw_sq): wakes the
    /// core thread if it sleeps (NEED_WAKEUP, read after a SeqCst fence);
    /// after the worker is dropped, completes them at once with CANCELED.
    pub fn raw_submitted(&self) {
        if self.shared.shut_down.load(Ordering::Acquire) {
            self.shared.engine().cancel_intake(self.index);
        } else if self.sq.needs_wakeup() {
            self.shared.wake_core();
        }
    }
}

/// A notification payload, borrowed from its buffer until dropped.
#[derive(Debug)]
pub struct Notification<'a> {
    pool: &'a NotifyPool,
    buffer: u16,
    data: &'a [u8],
}

impl Deref for Notification<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.data
    }
}

impl Drop for Notification<'_> {
    fn drop(&mut self) {
        self.pool.release(self.buffer);
    }
}
