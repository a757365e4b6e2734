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

mod posting;
mod registry;
mod waiting;

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
    if (*idle).is_multiple_of(SPINS_PER_YIELD) {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}
