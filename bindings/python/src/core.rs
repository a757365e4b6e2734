//! What every Python object of one worker shares: the ringfence `Worker`,
//! its queue pair and bookkeeping, the registrations' backing memory, and
//! the waits.
//!
//! # Locks
//! `worker` (read for every call, write only to close), then `queue` or
//! `regs` (never both), then the engine's own lock (inside ringfence's
//! calls). Nothing is done while holding any of them that needs the GIL:
//! a Python buffer (whose release takes the GIL) is dropped only after
//! every lock is let go. A thread that holds the GIL may block on these
//! locks; whoever holds one lets it go without needing the GIL.
//!
//! # Waiting
//! Without a core thread a wait runs the worker's progress itself, on the
//! waiting thread, yielding the CPU between empty rounds. With one, one
//! waiter at a time (the leader) arms the CQ's eventfd and sleeps on it;
//! the others (followers) sleep on a condition variable that is signalled
//! whenever completions are routed or the leader leaves. An asyncio event
//! loop takes part as one more waiter: it leads by watching the eventfd in
//! the loop, or follows by watching `relay`, a second eventfd rung for it
//! where the condition variable is signalled.

use crate::book::{Book, INTERNAL, Keep, TransferId};
use crate::errors::{Fail, Res};
use pyo3::buffer::PyUntypedBuffer;
use ringfence::{Cqe, EndpointId, MemHandle, QueuePair, RegisteredBuf, RkeyId, Worker};
use ringfence_ring::{CloseMode, Doorbell, Sqe, Status};
use std::collections::{HashMap, HashSet};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

/// Bumped in a forked child (`pthread_atfork`): a worker made under an
/// older value belongs to the parent.
static FORK_GENERATION: AtomicU64 = AtomicU64::new(0);

extern "C" fn forked_child() {
    // Relaxed: the child runs one thread when this runs; an atomic add is
    // async-signal-safe, as a fork handler must be.
    FORK_GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// Registers the fork handler, once per process.
pub(crate) fn watch_fork() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a child handler that only does an atomic add
        // (async-signal-safe, as it must be); nothing else is passed.
        let rc = unsafe { libc::pthread_atfork(None, None, Some(forked_child)) };
        debug_assert_eq!(rc, 0, "pthread_atfork failed");
    });
}

/// How long `close` lets outstanding operations finish and drivers let go
/// of memory before it gives up on them.
const CLOSE_DRAIN: Duration = Duration::from_secs(10);

/// Empty progress rounds between two yields of the CPU.
const SPINS_PER_YIELD: u32 = 64;

/// What a registration's memory is: held, never read; dropping it lets
/// the memory go (a Python buffer's export is released).
#[derive(Debug)]
#[allow(dead_code)]
pub(crate) enum Backing {
    /// Allocated by the worker (`Worker.alloc`).
    Owned(RegisteredBuf),
    /// A Python object's buffer, exported to us (pinned: a bytearray cannot
    /// be resized, a memoryview not released, while it is).
    Object(PyUntypedBuffer),
}

#[derive(Debug)]
struct Reg {
    handle: MemHandle,
    backing: Backing,
}

#[derive(Debug)]
enum Parked {
    /// A deregistration the engine answered `Busy` for: the memory stays
    /// until a later try succeeds.
    Mem(Reg),
    /// A key the engine would not release yet (its endpoint had work).
    Key(RkeyId),
}

#[derive(Debug, Default)]
struct Registry {
    live: HashMap<u32, Reg>,
    parked: Vec<Parked>,
}

/// The queue pair and its bookkeeping.
#[derive(Debug)]
pub(crate) struct Queue {
    /// `None` once the worker is closed.
    pub(crate) qp: Option<QueuePair>,
    pub(crate) book: Book,
}

/// Who sleeps on the CQ's eventfd now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leader {
    None,
    Thread,
    Async,
}

#[derive(Debug)]
struct Waits {
    leader: Leader,
    /// The event loop (its id) of the async waiters, while there are any.
    async_loop: Option<u64>,
    async_waiters: usize,
}

/// What an async waiter should do next (`Core::async_arm`).
pub(crate) mod arm {
    /// Completions were routed: look again now.
    pub(crate) const READY: u8 = 0;
    /// The loop leads: watch the CQ's eventfd (and the relay).
    pub(crate) const LEAD: u8 = 1;
    /// A thread leads: watch the relay.
    pub(crate) const FOLLOW: u8 = 2;
    /// No core thread: progress ran; yield to the loop and look again.
    pub(crate) const POLL: u8 = 3;
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Core {
    worker: RwLock<Option<Worker>>,
    queue: Mutex<Queue>,
    regs: Mutex<Registry>,
    parked: AtomicUsize,
    endpoints: Mutex<HashSet<u32>>,
    closing: AtomicBool,
    born: u64,
    core_thread: bool,
    /// A duplicate of the queue pair's CQ eventfd: it outlives the queue
    /// pair, so a sleeper never holds a closed descriptor.
    bell: Doorbell,
    /// Rung for async followers (see the module documentation).
    relay: Doorbell,
    waits: Mutex<Waits>,
    cv: Condvar,
    /// Bumped whenever completions are routed or a leader leaves.
    events: AtomicU64,
    followers: AtomicUsize,
    async_waiters: AtomicUsize,
    pub(crate) address: Vec<u8>,
    pub(crate) notify_size: u32,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a lock leaves the bookkeeping as it was at an
    // operation's edge; keep going rather than poison every later call.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn io_fail(what: &str, e: std::io::Error) -> Fail {
    Fail::new(Status::Io, format!("{what}: {e}"))
}

fn corrupt() -> Fail {
    Fail::new(
        Status::RingCorrupt,
        "the queue pair's ring memory is corrupt",
    )
}

/// The time left before `deadline`, `Timeout` once it passed.
pub(crate) fn left(deadline: Option<Instant>) -> Res<Option<Duration>> {
    match deadline {
        None => Ok(None),
        Some(d) => d
            .checked_duration_since(Instant::now())
            .filter(|l| !l.is_zero())
            .map(Some)
            .ok_or_else(|| Fail::new(Status::Timeout, "timed out")),
    }
}

impl Core {
    /// Wraps a built worker (its core thread started or not).
    pub(crate) fn new(worker: Worker, core_thread: bool) -> Res<Core> {
        let qp = worker.create_queue()?;
        let bell = Doorbell::from_fd(
            qp.cq_doorbell()
                .as_fd()
                .try_clone_to_owned()
                .map_err(|e| io_fail("dup of the CQ eventfd", e))?,
        );
        let relay = Doorbell::new().map_err(|e| io_fail("eventfd", e))?;
        let notify_size = worker.config().notify_size;
        Ok(Core {
            address: worker.address().to_vec(),
            worker: RwLock::new(Some(worker)),
            queue: Mutex::new(Queue {
                qp: Some(qp),
                book: Book::new(notify_size),
            }),
            regs: Mutex::default(),
            parked: AtomicUsize::new(0),
            endpoints: Mutex::default(),
            closing: AtomicBool::new(false),
            // Relaxed: read and written by this thread, or by a fork child
            // handler while no other thread runs.
            born: FORK_GENERATION.load(Ordering::Relaxed),
            core_thread,
            bell,
            relay,
            waits: Mutex::new(Waits {
                leader: Leader::None,
                async_loop: None,
                async_waiters: 0,
            }),
            cv: Condvar::new(),
            events: AtomicU64::new(0),
            followers: AtomicUsize::new(0),
            async_waiters: AtomicUsize::new(0),
            notify_size,
        })
    }

    /// Whether this process is a fork child of the one that made the
    /// worker.
    fn forked(&self) -> bool {
        FORK_GENERATION.load(Ordering::Relaxed) != self.born
    }

    /// `Err` in a fork child.
    pub(crate) fn check_fork(&self) -> Res<()> {
        if self.forked() {
            return Err(Fail::forked());
        }
        Ok(())
    }

    pub(crate) fn core_thread(&self) -> bool {
        self.core_thread
    }

    /// Whether `close` has begun.
    pub(crate) fn is_closed(&self) -> bool {
        // Acquire: pairs with the store in `close`.
        self.closing.load(Ordering::Acquire)
    }

    /// The worker, read-locked: `Err` once closed or in a fork child.
    pub(crate) fn worker(&self) -> Res<RwLockReadGuard<'_, Option<Worker>>> {
        self.check_fork()?;
        let w = self.worker.read().unwrap_or_else(|e| e.into_inner());
        if w.is_none() || self.is_closed() {
            return Err(Fail::closed());
        }
        Ok(w)
    }

    /// The queue, locked.
    pub(crate) fn queue(&self) -> MutexGuard<'_, Queue> {
        lock(&self.queue)
    }

    // ------------------------------------------------------------ memory

    /// Keeps `backing` as the memory of registration `handle`.
    pub(crate) fn keep(&self, handle: MemHandle, backing: Backing) {
        lock(&self.regs)
            .live
            .insert(handle.as_raw(), Reg { handle, backing });
    }

    /// Deregisters `handle` and gives back its memory: at once if the
    /// engine lets go, else it is parked and let go later. With `refuse`,
    /// a registration that operations still use is kept as it was and
    /// the call answers `Busy` instead.
    ///
    /// Returns the memory to drop with no lock held (a Python buffer's
    /// release takes the GIL).
    pub(crate) fn deregister(&self, handle: MemHandle, refuse: bool) -> Res<Option<Backing>> {
        let w = match self.worker() {
            Ok(w) => w,
            // Closed: `close` let every registration go.
            Err(_) if self.is_closed() => return Ok(None),
            Err(f) => return Err(f),
        };
        let w = w.as_ref().expect("checked by worker()");
        let mut regs = lock(&self.regs);
        let Some(reg) = regs.live.remove(&handle.as_raw()) else {
            return Ok(None);
        };
        match w.deregister(handle) {
            Ok(()) => Ok(Some(reg.backing)),
            Err(e) if e.status() == Status::InvalidMemHandle => Ok(Some(reg.backing)),
            Err(e) if e.status() == Status::Busy => {
                // Busy means either that requests use it (nothing changed:
                // it is still registered) or that it was withdrawn and a
                // driver still holds it (the handle is unknown now).
                let registered = !matches!(
                    w.pack_rkey(handle),
                    Err(ref p) if p.status() == Status::InvalidMemHandle
                );
                if refuse && registered {
                    regs.live.insert(handle.as_raw(), reg);
                    return Err(Fail::new(
                        Status::Busy,
                        "operations in flight use this memory: wait for their transfers, \
                         then release it (or drop it: it is released when they are done)",
                    ));
                }
                regs.parked.push(Parked::Mem(reg));
                // Relaxed: a hint that `retry_parked` has work; it looks
                // under the lock.
                self.parked.fetch_add(1, Ordering::Relaxed);
                Ok(None)
            }
            Err(e) => {
                regs.live.insert(handle.as_raw(), reg);
                Err(e.into())
            }
        }
    }

    /// Releases remote key `rkey`, or parks it while its endpoint has work.
    pub(crate) fn release_key(&self, rkey: RkeyId) {
        let Ok(w) = self.worker() else { return };
        let w = w.as_ref().expect("checked by worker()");
        if let Err(e) = w.release_rkey(rkey)
            && e.status() == Status::Busy
        {
            lock(&self.regs).parked.push(Parked::Key(rkey));
            self.parked.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Tries the parked deregistrations and key releases again; returns
    /// the memory let go, to drop with no lock held.
    pub(crate) fn retry_parked(&self) -> Vec<Backing> {
        // Relaxed: see `deregister`.
        if self.parked.load(Ordering::Relaxed) == 0 {
            return Vec::new();
        }
        let Ok(w) = self.worker() else {
            return Vec::new();
        };
        let w = w.as_ref().expect("checked by worker()");
        let mut regs = lock(&self.regs);
        let mut freed = Vec::new();
        let parked = std::mem::take(&mut regs.parked);
        for p in parked {
            match p {
                Parked::Mem(reg) => match w.deregister(reg.handle) {
                    Err(e) if e.status() == Status::Busy => regs.parked.push(Parked::Mem(reg)),
                    // Ok, or unknown: nothing holds it any more.
                    _ => freed.push(reg.backing),
                },
                Parked::Key(rkey) => {
                    if let Err(e) = w.release_rkey(rkey)
                        && e.status() == Status::Busy
                    {
                        regs.parked.push(Parked::Key(rkey));
                    }
                }
            }
        }
        self.parked.store(regs.parked.len(), Ordering::Relaxed);
        freed
    }

    // ------------------------------------------------------------ endpoints

    pub(crate) fn add_endpoint(&self, ep: EndpointId) {
        lock(&self.endpoints).insert(ep.as_raw());
    }

    pub(crate) fn remove_endpoint(&self, ep: EndpointId) {
        lock(&self.endpoints).remove(&ep.as_raw());
    }

    // ------------------------------------------------------------ posting

    /// Pushes `sqes` (their `user_data` are set here) as one transfer, with
    /// staged payloads where `payloads` has one (by index); submits them.
    /// Waits for room while the SQ is full. Returns the transfer.
    pub(crate) fn post(
        &self,
        sqes: &[Sqe],
        payloads: &[(usize, Vec<u8>)],
        keep: Option<Arc<Keep>>,
    ) -> Res<TransferId> {
        let (result, released) = {
            let w = self.worker()?;
            let w = w.as_ref().expect("checked by worker()");
            let mut guard = self.queue();
            let result = self.post_locked(w, &mut guard, sqes, payloads, keep);
            (result, std::mem::take(&mut guard.book.released))
        };
        // With no lock held: see `Book::released`.
        drop(released);
        result
    }

    /// Unlocks the queue, then drops what finished transfers kept: for
    /// `close`, whose worker lock is no obstacle (a closed worker's
    /// memory does not take it again).
    fn unlock(&self, mut guard: MutexGuard<'_, Queue>) {
        let released = std::mem::take(&mut guard.book.released);
        drop(guard);
        drop(released);
    }

    fn post_locked(
        &self,
        w: &Worker,
        guard: &mut MutexGuard<'_, Queue>,
        sqes: &[Sqe],
        payloads: &[(usize, Vec<u8>)],
        keep: Option<Arc<Keep>>,
    ) -> Res<TransferId> {
        let q = &mut **guard;
        let qp = q.qp.as_mut().ok_or_else(Fail::closed)?;
        let book = &mut q.book;
        let n = u32::try_from(sqes.len()).map_err(|_| Fail::invalid("too many operations"))?;
        let id = book.new_transfer(n, keep);
        let mut ready: Vec<Sqe> = Vec::with_capacity(sqes.len());
        let mut payloads = payloads.iter().peekable();
        for (i, sqe) in sqes.iter().enumerate() {
            let mut sqe = *sqe;
            let mut staged = None;
            if let Some((_, bytes)) = payloads.next_if(|(at, _)| *at == i) {
                match book.stage(w, bytes) {
                    Ok((slot, local)) => {
                        staged = Some(slot);
                        sqe.local_mem = local.mem;
                        sqe.local_addr = local.addr;
                    }
                    Err(f) => {
                        for s in &ready {
                            book.cancel_slot(s.user_data);
                        }
                        book.discard(id);
                        return Err(f);
                    }
                }
            }
            sqe.user_data = book.new_slot(id.index, i as u32, staged);
            ready.push(sqe);
        }
        let mut pushed = 0;
        let mut idle = 0u32;
        loop {
            let k = match qp.push_batch(&ready[pushed..]) {
                Ok(k) => k,
                Err(_) => {
                    qp.submit();
                    for (i, s) in ready.iter().enumerate().skip(pushed) {
                        book.cancel_slot(s.user_data);
                        book.settle(id, i as u32, Status::RingCorrupt.as_raw());
                    }
                    return Err(corrupt());
                }
            };
            book.pushed(k);
            pushed += k;
            qp.submit();
            if pushed == ready.len() {
                return Ok(id);
            }
            // The SQ is full: make room (completions must be reaped for
            // the engine to take more SQEs once the CQ fills).
            if self.is_closed() {
                for (i, s) in ready.iter().enumerate().skip(pushed) {
                    book.cancel_slot(s.user_data);
                    book.settle(id, i as u32, Status::Canceled.as_raw());
                }
                return Ok(id);
            }
            let mut work = 0;
            if !self.core_thread {
                work += w.progress();
            }
            work += reap(qp, book)?;
            if work > 0 {
                self.signal(false);
                idle = 0;
            } else {
                backoff(&mut idle);
            }
        }
    }

    /// Pushes one SQE of the package's own (a CLOSE at close time), whose
    /// result goes nowhere.
    fn post_internal(&self, sqe: Sqe) {
        let mut guard = self.queue();
        let q = &mut *guard;
        let Some(qp) = q.qp.as_mut() else { return };
        let mut sqe = sqe;
        sqe.user_data = q.book.new_slot(INTERNAL, 0, None);
        if qp.push(sqe).is_ok() {
            q.book.pushed(1);
            qp.submit();
        } else {
            q.book.cancel_slot(sqe.user_data);
        }
    }

    // ------------------------------------------------------------ completions

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
    fn route_all(&self, disarm: bool, from_async: bool) -> Res<usize> {
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
    fn signal(&self, from_async: bool) {
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
    fn lead_once(&self, remaining: Option<Duration>) -> Res<()> {
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

    // ------------------------------------------------------------ asyncio

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
    fn disarm(&self) {
        let mut guard = self.queue();
        if let Some(qp) = guard.qp.as_mut() {
            qp.disarm_cq_doorbell();
        }
        drop(guard);
        let _ = self.bell.clear();
    }

    // ------------------------------------------------------------ close

    /// Closes the worker: refuses new calls, force-closes its endpoints,
    /// lets outstanding operations finish (bounded by [`CLOSE_DRAIN`]),
    /// deregisters every registration, drops the worker (which cancels
    /// whatever is left) and completes every operation still without a
    /// result. Returns the memory let go, to drop with no lock held.
    ///
    /// A registration that a driver still holds when the drain ends is
    /// never given back (its Python buffer stays exported, so its object
    /// can be neither resized nor freed): the count is returned with it.
    pub(crate) fn close(&self) -> (Vec<Backing>, usize) {
        if self.forked() || self.closing.swap(true, Ordering::AcqRel) {
            return (Vec::new(), 0);
        }
        let deadline = Instant::now() + CLOSE_DRAIN;
        let eps: Vec<u32> = lock(&self.endpoints).drain().collect();
        for ep in eps {
            self.post_internal(Sqe::close(ep, CloseMode::FORCE));
        }
        let mut idle = 0u32;
        let mut freed = Vec::new();
        let mut stuck = 0;
        {
            let w = self.worker.read().unwrap_or_else(|e| e.into_inner());
            if let Some(w) = w.as_ref() {
                // Let what is outstanding finish.
                while Instant::now() < deadline {
                    let work = if self.core_thread { 0 } else { w.progress() };
                    let mut guard = self.queue();
                    let q = &mut *guard;
                    let routed = match q.qp.as_mut() {
                        Some(qp) => reap(qp, &mut q.book).unwrap_or(0),
                        None => 0,
                    };
                    let outstanding = q.book.outstanding();
                    self.unlock(guard);
                    if outstanding == 0 {
                        break;
                    }
                    if work + routed > 0 {
                        idle = 0;
                    } else {
                        backoff(&mut idle);
                    }
                }
                // Deregister everything, parked memory included.
                let mut regs = lock(&self.regs);
                let mut pending: Vec<Reg> = regs.live.drain().map(|(_, r)| r).collect();
                for p in std::mem::take(&mut regs.parked) {
                    match p {
                        Parked::Mem(reg) => pending.push(reg),
                        Parked::Key(rkey) => {
                            let _ = w.release_rkey(rkey);
                        }
                    }
                }
                drop(regs);
                loop {
                    let mut busy = Vec::new();
                    for reg in pending.drain(..) {
                        match w.deregister(reg.handle) {
                            Err(e) if e.status() == Status::Busy => busy.push(reg),
                            // Ok, or unknown: nothing holds it any more.
                            _ => freed.push(reg.backing),
                        }
                    }
                    pending = busy;
                    if pending.is_empty() || Instant::now() >= deadline {
                        break;
                    }
                    if !self.core_thread {
                        w.progress();
                    }
                    backoff(&mut idle);
                }
                stuck = pending.len();
                for reg in pending {
                    // A driver still holds it: never let it go.
                    std::mem::forget(reg);
                }
            }
        }
        let worker = self
            .worker
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        // Dropping the worker stops its core thread and cancels what is
        // left; its CQEs land in the queue pair, which outlives it here.
        drop(worker);
        let mut guard = self.queue();
        let q = &mut *guard;
        if let Some(mut qp) = q.qp.take() {
            let _ = reap(&mut qp, &mut q.book);
            // Unread notifications give their buffers back with it.
            q.book.notifications.clear();
            drop(qp);
        }
        q.book.settle_all(Status::Canceled.as_raw());
        self.unlock(guard);
        let _ = self.bell.ring();
        self.signal(false);
        (freed, stuck)
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        if self.forked() {
            // The parent's worker: its threads are not in this process, and
            // its rings and connections are the parent's. Leave it alone.
            if let Some(w) = self
                .worker
                .get_mut()
                .unwrap_or_else(|e| e.into_inner())
                .take()
            {
                std::mem::forget(w);
            }
            if let Some(qp) = self
                .queue
                .get_mut()
                .unwrap_or_else(|e| e.into_inner())
                .qp
                .take()
            {
                std::mem::forget(qp);
            }
            return;
        }
        let (freed, _) = self.close();
        drop(freed);
    }
}

/// Routes every CQE in `qp`'s CQ into `book`; returns how many.
fn reap(qp: &mut QueuePair, book: &mut Book) -> Res<usize> {
    let mut buf = [Cqe::default(); 64];
    let mut total = 0;
    loop {
        let n = qp.reap(&mut buf).map_err(|_| corrupt())?;
        for cqe in &buf[..n] {
            book.route(*cqe);
        }
        total += n;
        if n < buf.len() {
            return Ok(total);
        }
    }
}

/// One empty round: spin, and yield the CPU every [`SPINS_PER_YIELD`].
fn backoff(idle: &mut u32) {
    *idle += 1;
    if *idle % SPINS_PER_YIELD == 0 {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}
