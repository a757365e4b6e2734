//! Queue pairs: an application thread's SQ and CQ.

use super::*;

/// An application thread's submission and completion queues.
///
/// SQEs are written straight into the SQ ring; [`submit`](QueuePair::submit)
/// publishes them with one store and wakes the core thread only if it
/// sleeps. CQEs are read straight out of the CQ ring.
///
/// # A failed queue pair
///
/// The ring memory is shared with the engine and the engine trusts none of
/// it: when it finds an index there that cannot be (an SQ tail more than
/// the SQ holds ahead of what it took, an SQ head it did not write, a CQ
/// head that contradicts what it posted, garbage over the index lines), it
/// fails this queue pair, for good, and only this one: the worker's other
/// queue pairs keep working. It then
/// - publishes the CQEs it had pushed, and sets the FAILED flag of both
///   rings ([`ConsumerLine::FAILED`](ringfence_ring::ConsumerLine::FAILED)
///   on the SQ, [`ProducerLine::FAILED`](ringfence_ring::ProducerLine::FAILED)
///   on the CQ) and rings the CQ doorbell;
/// - takes no more SQEs from the SQ and posts no more CQEs to the CQ; CQEs
///   still waiting for room (the overflow list) are dropped;
/// - keeps running the requests of this queue pair that it had taken: they
///   finish as they would have (their effects on the target happen or not,
///   as for any operation in flight), their request slots and their holds
///   on registered memory are released, but their CQEs are dropped.
///
/// This queue pair reports it from then on with
/// [`Status::RingCorrupt`] (or a [`Corrupt`] error): [`check`](QueuePair::check),
/// [`progress`](QueuePair::progress), the waits ([`wait_cqes`](QueuePair::wait_cqes),
/// [`wait_cqes_published`](QueuePair::wait_cqes_published),
/// [`wait_cqe`](QueuePair::wait_cqe)), [`try_now`](QueuePair::try_now), and
/// [`pop`](QueuePair::pop) and [`reap`](QueuePair::reap) once the CQ is
/// empty; [`push`](QueuePair::push) once the SQ looks full. The worker
/// counts it in [`Worker::failed_queues`](crate::Worker::failed_queues)
/// until it is dropped. Dropping it is the way to tear it down, and is
/// always safe: the engine keeps the ring memory until the worker goes and
/// reads nothing from it any more.
///
/// What the application may assume (the exactly-once rule, R31, as far as
/// a corrupt ring allows): every CQE it read is the one completion of its
/// SQE. CQEs published before the failure stay readable, while the CQ's
/// indices are intact, before `pop` reports the failure. Every other SQE
/// submitted on this queue pair gets no completion, ever: the engine did
/// not take it, or took it and dropped its CQE; which of the two, and
/// whether it took effect at the target, is unknown. To know that such
/// operations are over, flush their endpoint (or the worker) from another
/// queue pair: that flush completes only after them. Their memory stays
/// held as for any operation in flight (deregistering it fails with
/// `Busy` while they hold it).
#[derive(Debug)]
pub struct QueuePair {
    pub(super) sq: Producer<Sqe>,
    pub(super) cq: Consumer<Cqe>,
    pub(super) index: usize,
    pub(super) cq_bell: Arc<Doorbell>,
    /// Set by the engine when it fails this queue pair (`EngineQueue::fail`);
    /// in process memory, so that scribbles over the ring's flags do not
    /// hide it.
    pub(super) failed: Arc<AtomicBool>,
    pub(super) shared: Arc<Shared>,
}

impl Drop for QueuePair {
    /// The engine keeps the ring (SQEs already submitted still run) until
    /// the worker goes; a failed queue pair stops counting in
    /// [`Worker::failed_queues`](crate::Worker::failed_queues).
    fn drop(&mut self) {
        self.shared.engine().queue_dropped(self.index);
    }
}

impl QueuePair {
    /// Whether the engine failed this queue pair: it found its ring memory
    /// corrupt (see [`QueuePair`]).
    pub fn is_failed(&self) -> bool {
        // Acquire: pairs with the Release store in `EngineQueue::fail`.
        self.failed.load(Ordering::Acquire)
    }

    /// `Ok` while this queue pair works.
    ///
    /// # Errors
    /// [`Status::RingCorrupt`] once the engine failed it (see
    /// [`QueuePair`]): drop it.
    pub fn check(&self) -> Result<(), Status> {
        if self.is_failed() {
            return Err(Status::RingCorrupt);
        }
        Ok(())
    }

    /// The error of a failed queue pair's CQ, as the indices look here.
    #[cold]
    fn failed_cq(&self) -> Corrupt {
        let parts = self.cq.as_raw_parts();
        Corrupt {
            head: parts.index,
            tail: parts.cached_peer,
            capacity: parts.capacity,
        }
    }

    /// Writes one SQE (not visible to the engine until `submit`).
    ///
    /// # Errors
    /// [`RingError::Full`]: reap completions and run progress, then retry.
    /// [`RingError::Corrupt`]: the SQ's shared head is corrupt, or the SQ
    /// looked full and this queue pair failed (see [`QueuePair`]).
    pub fn push(&mut self, sqe: Sqe) -> Result<(), RingError> {
        self.sq.push(sqe)
    }

    /// Writes as many of `sqes` as fit; returns how many.
    ///
    /// # Errors
    /// The SQ's shared indices are corrupt, or the SQ looked full and this
    /// queue pair failed.
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
    /// pending, or only a weak fence on the lane it takes (docs/fence.md R8),
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
    /// `Some(Err(RingCorrupt))`: this queue pair failed (see [`QueuePair`]);
    /// nothing was done, and this is the SQE's one completion.
    pub fn try_now(&mut self, sqe: &Sqe) -> Option<Result<u32, Status>> {
        if self.sq.pending() != 0 {
            return self.is_failed().then_some(Err(Status::RingCorrupt));
        }
        let mut engine = self.shared.try_engine()?;
        let result = engine.run_now(self.index, sqe);
        if result.is_none() && self.is_failed() {
            return Some(Err(Status::RingCorrupt));
        }
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
    /// The CQ's shared indices are corrupt, or the CQ is empty and this
    /// queue pair failed (see [`QueuePair`]).
    pub fn pop(&mut self) -> Result<Option<Cqe>, Corrupt> {
        let cqe = self.cq.pop()?;
        if cqe.is_none() && self.is_failed() {
            return Err(self.failed_cq());
        }
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
    /// The CQ's shared indices are corrupt, or the CQ is empty and this
    /// queue pair failed (see [`QueuePair`]).
    pub fn reap(&mut self, out: &mut [Cqe]) -> Result<usize, Corrupt> {
        let n = self.cq.pop_batch(out)?;
        if n == 0 && !out.is_empty() && self.is_failed() {
            return Err(self.failed_cq());
        }
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
    /// Corrupt indices, this queue pair failed (once the CQ is empty; the
    /// engine rings the doorbell as it fails it), or a failed eventfd.
    pub fn wait_cqe(&mut self, timeout: Option<Duration>) -> Result<bool, WaitError> {
        if self.is_failed() && matches!(self.cq.ready(), Ok(0)) {
            return Err(WaitError::Corrupt(self.failed_cq()));
        }
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
    /// holds; `RingCorrupt` if the CQ's indices are corrupt, or fewer than
    /// `nr` CQEs are ready and this queue pair failed (at once: the engine
    /// rings the doorbell as it fails it; see [`QueuePair`]); `Io` if the
    /// doorbell fails.
    pub fn wait_cqes(&mut self, nr: u32, timeout: Option<Duration>) -> Result<u32, Status> {
        super::wait::wait_cqes(
            &self.shared,
            &self.cq_bell,
            &self.failed,
            &mut self.cq,
            nr,
            timeout,
        )
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
        super::wait::wait_cqes(
            &self.shared,
            &self.cq_bell,
            &self.failed,
            &mut cq,
            nr,
            timeout,
        )
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
    /// Corrupt indices, or the CQ is empty and this queue pair failed (see
    /// [`QueuePair`]; nothing will come: do not sleep).
    pub fn arm_cq_doorbell(&mut self) -> Result<bool, Corrupt> {
        let empty = self.cq.prepare_wait()?;
        if empty && self.is_failed() {
            self.cq.finish_wait();
            return Err(self.failed_cq());
        }
        Ok(empty)
    }

    /// Stops asking for CQ doorbell rings.
    pub fn disarm_cq_doorbell(&mut self) {
        self.cq.finish_wait();
    }

    /// One bounded round of the worker's progress on this thread; returns
    /// how much work it did (0: nothing to do).
    ///
    /// # Errors
    /// [`Status::RingCorrupt`] if this queue pair failed (see
    /// [`QueuePair`]); the round ran all the same, for the worker's other
    /// queue pairs.
    pub fn progress(&self) -> Result<usize, Status> {
        let work = self.shared.engine().progress();
        self.check()?;
        Ok(work)
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
