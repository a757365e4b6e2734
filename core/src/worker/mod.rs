//! The worker: the public face of the engine.

use crate::config::Config;
use crate::driver::MemKind;
use crate::driver::{
    Capabilities, Driver, DriverEp, DriverMemKey, KeyPart, MAX_LANES, MemDesc, Prepare, Prepared,
    Registered, Unpacked,
};
use crate::endpoint::{EndpointId, EndpointState, FenceState};
use crate::engine::{Engine, EngineQueue, UnreleasedMemory};
use crate::error::Error;
use crate::limits;
use crate::memory::{MAX_GROUPS, MemHandle, Registration, Rkey, RkeyId, blob};
use crate::request::MAX_QUEUES;
use crate::stats::Stats;
use crate::sys::mem::OwnedMem;
use crate::sys::notify::NotifyPool;
use ringfence_ring::{
    Consumer, Corrupt, Cqe, Doorbell, LocalBuf, Producer, RawParts, Region, RingError, Sqe, Status,
    WaitError,
};
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::thread::JoinHandle;
use std::time::Duration;

mod buffer;
mod builder;
mod core_thread;
mod memory;
mod out_of_band;
mod queue_pair;
mod wait;

pub use buffer::RegisteredBuf;
pub use builder::WorkerBuilder;
use core_thread::CoreThread;
use out_of_band::{decode_address, decode_key, encode_address, encode_key};
pub use queue_pair::{Notification, QueuePair};

/// What the application threads, the core thread and the worker share.
#[derive(Debug)]
pub(super) struct Shared {
    engine: Mutex<Engine>,
    /// Rung by a queue pair's `submit` when the core thread sleeps.
    sq_bell: Arc<Doorbell>,
    notify: Arc<NotifyPool>,
    shut_down: AtomicBool,
    /// Counts the core thread's sleeps twice: once as it goes to sleep,
    /// once as it wakes; odd while it sleeps.
    core_naps: std::sync::atomic::AtomicU64,
    /// A core thread runs (set after it started, cleared after it
    /// stopped): waits sleep instead of progressing inline.
    core_running: AtomicBool,
    /// What registration and unpacking need to know of each driver before
    /// they take the engine lock (same order as the engine's drivers).
    drivers: Vec<DriverInfo>,
}

/// A driver's name, capabilities and first phase of registration
/// ([`Driver::prepare`]): fixed when the worker is built.
#[derive(Debug)]
pub(super) struct DriverInfo {
    name: &'static str,
    caps: Capabilities,
    prepare: Option<Arc<dyn Prepare>>,
}

impl Shared {
    /// The engine, locked. Whoever takes the lock while the core thread
    /// sleeps wakes it (rings the SQ doorbell, once per sleep), so that it
    /// looks again after whatever the caller changes: a new queue pair
    /// (whose SQ has no NEED_WAKEUP yet), a connect whose handshake needs
    /// polling, a progress round that left work behind. The core thread
    /// then takes the lock after the caller, and sees the change.
    pub(super) fn engine(&self) -> EngineGuard<'_> {
        let mut engine = self.lock_engine();
        if engine.core_asleep {
            engine.core_asleep = false;
            self.wake_core();
        }
        engine
    }

    /// The engine, locked, without waking the core thread: for the core
    /// thread itself.
    ///
    /// # Panics
    /// If this thread holds the engine already: a driver called back into
    /// the worker that drives it (its `progress`, a connect, a
    /// registration, ...), which would otherwise deadlock in silence.
    pub(super) fn lock_engine(&self) -> EngineGuard<'_> {
        let me = self.id();
        if HELD.get() == me {
            reentered();
        }
        // A panic while holding the lock leaves counters possibly off by one
        // but no memory unsafety; keep going rather than poison every call.
        EngineGuard::new(self.engine.lock().unwrap_or_else(|e| e.into_inner()), me)
    }

    /// The engine, if no other thread holds it (the direct path's
    /// `try_now`). This thread holding it already returns `None` too.
    pub(super) fn try_engine(&self) -> Option<EngineGuard<'_>> {
        let guard = match self.engine.try_lock() {
            Ok(engine) => engine,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        Some(EngineGuard::new(guard, self.id()))
    }

    /// This worker's engine, as `HELD` names it.
    fn id(&self) -> usize {
        std::ptr::from_ref(&self.engine) as usize
    }

    /// Whether a core thread runs.
    pub(super) fn core_running(&self) -> bool {
        // Acquire: pairs with the Release stores in `start_core_thread`
        // and `stop_core_thread`; only a hint for how to wait.
        self.core_running.load(Ordering::Acquire)
    }

    /// Rings the SQ doorbell: wakes the core thread if it sleeps (or ends
    /// its next sleep at once).
    pub(super) fn wake_core(&self) {
        if let Err(e) = self.sq_bell.ring() {
            tracing::error!(error = %e, "SQ doorbell failed");
        }
    }
}

thread_local! {
    /// The engine this thread holds locked (`Shared::id`), 0 if none.
    static HELD: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A drivers' contract violation, caught: see `Shared::lock_engine`.
#[cold]
#[inline(never)]
fn reentered() -> ! {
    panic!(
        "ringfence: a worker was entered again from inside its own engine (a Driver method \
         called back into the Worker, QueuePair or buffer that drives it); drivers must never \
         call the engine (docs/architecture.md, threads: nothing re-enters)"
    )
}

/// The engine, locked by this thread: marks it held (for `lock_engine`'s
/// re-entry check) until dropped.
#[derive(Debug)]
pub(super) struct EngineGuard<'a> {
    guard: MutexGuard<'a, Engine>,
    /// What `HELD` was before (another worker's engine, or 0).
    previous: usize,
}

impl<'a> EngineGuard<'a> {
    fn new(guard: MutexGuard<'a, Engine>, me: usize) -> EngineGuard<'a> {
        EngineGuard {
            guard,
            previous: HELD.replace(me),
        }
    }
}

impl Drop for EngineGuard<'_> {
    fn drop(&mut self) {
        HELD.set(self.previous);
    }
}

impl std::ops::Deref for EngineGuard<'_> {
    type Target = Engine;
    fn deref(&self) -> &Engine {
        &self.guard
    }
}

impl std::ops::DerefMut for EngineGuard<'_> {
    fn deref_mut(&mut self) -> &mut Engine {
        &mut self.guard
    }
}

/// A ringfence worker: drivers, endpoints, memory, queue pairs, and the
/// progress loop that connects them.
///
/// Application threads talk to it through their own [`QueuePair`]s; the
/// engine runs on whichever thread calls [`progress`](Worker::progress), or
/// on the core thread ([`start_core_thread`](Worker::start_core_thread)).
///
/// # Examples
/// ```
/// use ringfence::{Loopback, Worker};
/// use ringfence_ring::{RemoteBuf, Sqe};
///
/// let target = Worker::builder().driver(Loopback::new()).ignore_env().build()?;
/// let initiator = Worker::builder().driver(Loopback::new()).ignore_env().build()?;
/// let window = target.alloc_registered(4096)?;
/// let ep = initiator.connect(target.address())?;
/// let rkey = initiator.unpack_rkey(ep, &target.pack_rkey(window.handle())?)?;
///
/// let src = initiator.alloc_registered(64)?;
/// src.write(0, b"hello");
/// let mut qp = initiator.create_queue()?;
/// let remote = RemoteBuf { rkey: rkey.as_raw(), addr: window.addr() + 100 };
/// qp.push(Sqe::put(ep.as_raw(), src.local(0), remote, 5).with_user_data(1))?;
/// qp.push(Sqe::flush(ep.as_raw()).with_user_data(2))?;
/// qp.submit();
/// let mut done = 0;
/// while done < 2 {
///     initiator.progress();
///     while let Some(cqe) = qp.pop()? {
///         assert_eq!(cqe.res >= 0, true);
///         done += 1;
///     }
/// }
/// let mut out = [0u8; 5];
/// window.read(100, &mut out);
/// assert_eq!(&out, b"hello");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Worker {
    shared: Arc<Shared>,
    core: Option<CoreThread>,
    address: Vec<u8>,
}

impl Worker {
    /// A builder with the defaults of [`Config`].
    pub fn builder() -> WorkerBuilder {
        WorkerBuilder::default()
    }

    /// This worker's address, for peers to [`connect`](Worker::connect) to.
    pub fn address(&self) -> &[u8] {
        &self.address
    }

    /// The configuration in force.
    pub fn config(&self) -> Config {
        self.shared.engine().config.clone()
    }

    /// Connects to a peer through the first driver both workers have, and
    /// returns at once, without waiting for the peer: the endpoint is
    /// usable straight away. If the driver needs a handshake (tcp, verbs),
    /// the endpoint is connecting until progress sees it finish; SQEs
    /// submitted meanwhile queue in order under the usual fence rules and
    /// start when it is up. A FENCE only orders, so it is not queued: it
    /// completes successfully when it is submitted. If the handshake
    /// fails, the endpoint fails with its error and each queued SQE
    /// completes once, in submission order: with that error, except a
    /// graceful CLOSE, which succeeds and closes the endpoint (unless the
    /// error is [`Status::PeerUnreachable`], which it then returns); a
    /// worker FLUSH waiting on the queue fails with the error. Later SQEs
    /// to the failed endpoint complete at once, a FENCE or CLOSE as just
    /// said and anything else with the error.
    /// [`endpoint_state`](Worker::endpoint_state) tells where it is.
    ///
    /// # Errors
    /// [`Error::Malformed`] ([`Status::InvalidArgument`]) for a malformed
    /// address or one that fails its integrity check (damaged on its way),
    /// before any driver sees it; [`Status::PeerUnreachable`] if no driver
    /// is shared, or the driver's error.
    pub fn connect(&self, peer: &[u8]) -> Result<EndpointId, Error> {
        let parts = decode_address(peer).map_err(|what| Error::Malformed {
            op: "connect",
            what,
        })?;
        let (d, lanes) = {
            let engine = self.shared.engine();
            let Some(d) = (0..engine.drivers.len())
                .find(|&d| parts.iter().any(|(n, _)| *n == engine.drivers[d].name()))
            else {
                return Err(Error::Status {
                    op: "connect",
                    status: Status::PeerUnreachable,
                });
            };
            let max = engine.drivers[d].capabilities().max_lanes;
            (
                engine.drivers[d].name(),
                engine.config.lanes.min(max).max(1),
            )
        };
        self.connect_lanes(peer, &[(d, lanes)])
    }

    /// Connects to a peer with lanes on the drivers named in `groups`, in
    /// order: `(driver name, lanes)`, say `[("shm", 2), ("cuda", 4)]` for
    /// lanes 0–1 over shared memory and 2–5 over CUDA, all under one fence
    /// domain (docs/fence.md R28). Both workers need each named driver. Returns
    /// at once, as [`connect`](Worker::connect) does.
    ///
    /// Each operation takes a lane of a driver that can run it: one that
    /// supports it and its length, registered its local memory (device
    /// memory goes only to a driver of its kind) and has a part in its
    /// remote key. Small PUTs and GETs and NOTIFYs take the first such
    /// group's first lane, large ones (from the bandwidth threshold) the
    /// last such group's other lanes in turn, atomics the last such
    /// group's last lane. A strong fence flushes exactly the dirty lanes of
    /// each driver. One group is an ordinary endpoint over that driver.
    ///
    /// # Errors
    /// [`Error::Malformed`] ([`Status::InvalidArgument`]) for a malformed
    /// or damaged address (as for `connect`); [`Status::InvalidArgument`]
    /// for no group, more
    /// than four, a driver named twice, zero lanes, more lanes than a
    /// driver supports or more than 64 in all; [`Status::PeerUnreachable`]
    /// if this worker or the peer lacks a named driver; or a driver's
    /// error (the groups already started are released).
    pub fn connect_lanes(&self, peer: &[u8], groups: &[(&str, u8)]) -> Result<EndpointId, Error> {
        let status = |status| Error::Status {
            op: "connect",
            status,
        };
        let parts = decode_address(peer).map_err(|what| Error::Malformed {
            op: "connect",
            what,
        })?;
        if groups.is_empty()
            || groups.len() > MAX_GROUPS
            || groups.iter().map(|&(_, l)| u32::from(l)).sum::<u32>() > u32::from(MAX_LANES)
        {
            return Err(status(Status::InvalidArgument));
        }
        let mut engine = self.shared.engine();
        if engine.endpoints.len() >= usize::from(u16::MAX) {
            return Err(status(Status::NoResource));
        }
        let mut plan: Vec<(usize, &[u8], u8)> = Vec::with_capacity(groups.len());
        for (i, &(name, lanes)) in groups.iter().enumerate() {
            if groups[..i].iter().any(|(n, _)| *n == name) {
                return Err(status(Status::InvalidArgument));
            }
            let d = (0..engine.drivers.len())
                .find(|&d| engine.drivers[d].name() == name)
                .ok_or(status(Status::PeerUnreachable))?;
            let part = parts
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, p)| *p)
                .ok_or(status(Status::PeerUnreachable))?;
            if lanes == 0 || lanes > engine.drivers[d].capabilities().max_lanes {
                return Err(status(Status::InvalidArgument));
            }
            plan.push((d, part, lanes));
        }
        let index = engine.connect(&plan).map_err(|(g, source)| Error::Driver {
            driver: engine.drivers[plan[g].0].name(),
            op: "connect",
            source,
        })?;
        tracing::debug!(endpoint = index, ?groups, "connect started");
        Ok(EndpointId(index))
    }

    /// Where endpoint `ep` is in its life: connecting, connected, closing,
    /// failed (with its sticky first error) or closed. A snapshot: progress
    /// may change it at any time.
    ///
    /// # Errors
    /// [`Status::InvalidEndpoint`] for an unknown endpoint.
    pub fn endpoint_state(&self, ep: EndpointId) -> Result<EndpointState, Error> {
        self.shared
            .engine()
            .endpoint_state(ep.0 as usize)
            .ok_or(Error::Status {
                op: "endpoint_state",
                status: Status::InvalidEndpoint,
            })
    }

    /// A queue pair with the configured ring sizes (see
    /// [`create_queue_with`](Worker::create_queue_with)).
    ///
    /// # Errors
    /// As `create_queue_with`.
    pub fn create_queue(&self) -> Result<QueuePair, Error> {
        let (sq, cq) = {
            let engine = self.shared.engine();
            (engine.config.sq_entries, engine.config.cq_entries)
        };
        self.create_queue_with(sq, cq)
    }

    /// A queue pair (one SQ, one CQ) for one application thread. The first
    /// queue pair of a worker also receives its incoming notifications.
    ///
    /// # Errors
    /// Bad entry counts, the queue limit (4096), or memory.
    pub fn create_queue_with(&self, sq_entries: u32, cq_entries: u32) -> Result<QueuePair, Error> {
        let mut region = Region::builder()
            .sq_entries(sq_entries)
            .cq_entries(cq_entries)
            .build_anonymous()?;
        let (sq, cq) = region.app_side()?;
        let (engine_sq, engine_cq) = region.engine_side()?;
        let cq_bell = Arc::new(Doorbell::new().map_err(|source| Error::Os {
            op: "eventfd",
            source,
        })?);
        let mut engine = self.shared.engine();
        if engine.queues.len() >= MAX_QUEUES as usize {
            return Err(Error::Status {
                op: "create_queue",
                status: Status::NoResource,
            });
        }
        let (requests, buffers) = (engine.config.requests, engine.notify.count());
        let failed = Arc::new(AtomicBool::new(false));
        let index = engine.add_queue(EngineQueue::new(
            engine_sq,
            engine_cq,
            requests,
            buffers,
            Some(cq_bell.clone()),
            failed.clone(),
        ));
        Ok(QueuePair {
            sq,
            cq,
            index,
            cq_bell,
            failed,
            shared: self.shared.clone(),
        })
    }

    /// One bounded round of progress on the caller's thread; returns how
    /// much work it did (0: nothing to do).
    ///
    /// A queue pair that failed (its ring memory was found corrupt, see
    /// [`QueuePair`]) does not stop it: the round serves the others. Its
    /// own calls report the failure; [`failed_queues`](Worker::failed_queues)
    /// and [`progress_checked`](Worker::progress_checked) tell it at the
    /// worker's level.
    pub fn progress(&self) -> usize {
        self.shared.engine().progress()
    }

    /// [`progress`](Worker::progress), then whether a queue pair of this
    /// worker has failed: the round runs either way (the other queue pairs
    /// keep working), and its work count is lost in the error.
    ///
    /// # Errors
    /// [`Status::RingCorrupt`] while a queue pair whose ring memory the
    /// engine found corrupt is still alive (not dropped); each failed
    /// queue pair's own calls say which it is.
    pub fn progress_checked(&self) -> Result<usize, Status> {
        let mut engine = self.shared.engine();
        let work = engine.progress();
        if engine.failed_queues() > 0 {
            return Err(Status::RingCorrupt);
        }
        Ok(work)
    }

    /// How many queue pairs of this worker failed (the engine found their
    /// ring memory corrupt, see [`QueuePair`]) and are still alive:
    /// dropping a failed queue pair takes it out of the count.
    pub fn failed_queues(&self) -> usize {
        self.shared.engine().failed_queues()
    }

    /// Counters of the whole worker.
    pub fn stats(&self) -> Stats {
        self.shared.engine().stats
    }

    /// How many times the core thread has gone to sleep (decided to wait on
    /// the SQ doorbell and the drivers' wake descriptors), over the
    /// worker's life. Reads one counter: it does not take the engine lock,
    /// and does not wake the core thread.
    pub fn core_thread_sleeps(&self) -> u64 {
        // Relaxed: a count; nothing is read on the strength of it.
        self.shared.core_naps.load(Ordering::Relaxed).div_ceil(2)
    }

    /// Whether the core thread sleeps now (or is about to: it has decided
    /// to, and released the engine lock). Does not wake it.
    ///
    /// # Staleness
    /// It may wake, or fall asleep, right after this returns.
    pub fn is_core_thread_asleep(&self) -> bool {
        // Relaxed: as in `core_thread_sleeps`.
        self.shared.core_naps.load(Ordering::Relaxed) % 2 == 1
    }

    /// Counters of one endpoint.
    pub fn endpoint_stats(&self, ep: EndpointId) -> Option<Stats> {
        self.shared
            .engine()
            .cold
            .get(ep.0 as usize)
            .map(|c| c.stats)
    }

    /// A snapshot of endpoint `ep`'s fence engine: its epochs, dirty and
    /// covered lanes, the fence flush in flight, the weak admission, and
    /// how many requests wait or are in flight. Its flush counters by
    /// cause are in [`endpoint_stats`](Worker::endpoint_stats).
    ///
    /// # Errors
    /// `InvalidEndpoint` if this worker has no such endpoint.
    pub fn fence_state(&self, ep: EndpointId) -> Result<FenceState, Error> {
        self.shared
            .engine()
            .fence_state(ep.0 as usize)
            .ok_or(Error::Status {
                op: "fence_state",
                status: Status::InvalidEndpoint,
            })
    }

    /// The driver's handle of endpoint `ep` (of its first lane group):
    /// what a driver wrapper such as the test kit's `FaultInjector` sees
    /// as the endpoint.
    pub fn driver_endpoint(&self, ep: EndpointId) -> Option<DriverEp> {
        self.shared
            .engine()
            .endpoints
            .get(ep.0 as usize)
            .map(|e| DriverEp(e.driver_ep))
    }
}

impl Drop for Worker {
    /// Stops the core thread, then completes everything outstanding with
    /// CANCELED (queue pairs that outlive the worker can still reap those
    /// CQEs), and drops the drivers, so that no peer reaches this worker's
    /// memory any more.
    fn drop(&mut self) {
        self.stop_core_thread();
        self.shared.shut_down.store(true, Ordering::Release);
        self.shared.engine().shutdown();
    }
}
