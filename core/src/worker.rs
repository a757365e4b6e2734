//! The worker: the public face of the engine.

use crate::config::Config;
use crate::driver::{Driver, DriverEp, MemDesc};
use crate::endpoint::{Endpoint, EndpointId};
use crate::engine::{Engine, EngineQueue};
use crate::error::Error;
use crate::memory::{MemHandle, MemKind, Registration, Rkey, RkeyId, blob};
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

/// What the application threads, the core thread and the worker share.
#[derive(Debug)]
struct Shared {
    engine: Mutex<Engine>,
    /// Rung by a queue pair's `submit` when the core thread sleeps.
    sq_bell: Arc<Doorbell>,
    notify: Arc<NotifyPool>,
    shut_down: AtomicBool,
}

impl Shared {
    fn engine(&self) -> MutexGuard<'_, Engine> {
        // A panic while holding the lock leaves counters possibly off by one
        // but no memory unsafety; keep going rather than poison every call.
        self.engine.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Builds a [`Worker`].
///
/// Setters take `&mut self` and return `&mut Self`; [`build`](Self::build)
/// applies the `RINGFENCE_*` environment overrides (see [`Config`]) on top.
#[derive(Debug, Default)]
pub struct WorkerBuilder {
    config: Config,
    drivers: Vec<Box<dyn Driver>>,
    ignore_env: bool,
}

impl WorkerBuilder {
    /// Adds a driver; earlier drivers are preferred when connecting.
    pub fn driver(&mut self, driver: impl Driver) -> &mut Self {
        self.drivers.push(Box::new(driver));
        self
    }

    /// SQ and CQ entries of each queue pair.
    pub fn ring_entries(&mut self, sq: u32, cq: u32) -> &mut Self {
        self.config.sq_entries = sq;
        self.config.cq_entries = cq;
        self
    }

    /// Requests in flight per queue pair.
    pub fn requests(&mut self, requests: u32) -> &mut Self {
        self.config.requests = requests;
        self
    }

    /// Lanes per endpoint (capped by the driver).
    pub fn lanes(&mut self, lanes: u8) -> &mut Self {
        self.config.lanes = lanes;
        self
    }

    /// Notification buffers: `count` of `size` bytes.
    pub fn notify_buffers(&mut self, count: u32, size: u32) -> &mut Self {
        self.config.notify_buffers = count;
        self.config.notify_size = size;
        self
    }

    /// PUT/GET size from which bandwidth lanes are used.
    pub fn bw_threshold(&mut self, bytes: u32) -> &mut Self {
        self.config.bw_threshold = bytes;
        self
    }

    /// Ignores `RINGFENCE_*` variables (tests that must not be steered by
    /// the environment).
    pub fn ignore_env(&mut self) -> &mut Self {
        self.ignore_env = true;
        self
    }

    /// Builds the worker; the drivers move into it.
    ///
    /// # Errors
    /// [`Error::Config`] for a malformed environment variable,
    /// [`Error::InvalidConfig`] for a bad builder value, [`Error::Drivers`]
    /// if no driver is left or `RINGFENCE_DRIVERS` names one not provided.
    pub fn build(&mut self) -> Result<Worker, Error> {
        let mut config = self.config.clone();
        if !self.ignore_env {
            config.apply_env(|var| std::env::var(var).ok())?;
        }
        config.validate()?;
        let mut drivers = std::mem::take(&mut self.drivers);
        if let Some(names) = &config.drivers {
            let mut chosen = Vec::new();
            for name in names {
                let i = drivers
                    .iter()
                    .position(|d| d.name() == name)
                    .ok_or_else(|| {
                        let known: Vec<&str> = drivers.iter().map(|d| d.name()).collect();
                        Error::Drivers(format!(
                            "RINGFENCE_DRIVERS names {name:?}; this program provides {known:?}"
                        ))
                    })?;
                chosen.push(drivers.remove(i));
            }
            drivers = chosen;
        }
        if drivers.is_empty() {
            return Err(Error::Drivers("a worker needs at least one driver".into()));
        }
        if drivers.len() > usize::from(u8::MAX) {
            return Err(Error::Drivers("at most 255 drivers".into()));
        }
        let notify = Arc::new(
            NotifyPool::new(config.notify_buffers, config.notify_size)
                .map_err(Error::status_of("notification buffers"))?,
        );
        let sq_bell = Arc::new(Doorbell::new().map_err(|source| Error::Os {
            op: "eventfd",
            source,
        })?);
        notify.set_waker(sq_bell.clone());
        let engine = Engine::new(config, drivers, notify.clone());
        let address = encode_address(&engine.drivers);
        tracing::debug!(drivers = ?engine.drivers.iter().map(|d| d.name()).collect::<Vec<_>>(), "worker built");
        Ok(Worker {
            shared: Arc::new(Shared {
                engine: Mutex::new(engine),
                sq_bell,
                notify,
                shut_down: AtomicBool::new(false),
            }),
            core: None,
            address,
        })
    }
}

/// The worker address: `"RFWA"`, version 1, then per driver its name and
/// its part.
fn encode_address(drivers: &[Box<dyn Driver>]) -> Vec<u8> {
    let mut out = b"RFWA\x01".to_vec();
    out.push(drivers.len() as u8);
    for d in drivers {
        let part = d.address();
        out.push(d.name().len() as u8);
        out.extend_from_slice(d.name().as_bytes());
        out.extend_from_slice(&(part.len() as u16).to_le_bytes());
        out.extend_from_slice(&part);
    }
    out
}

/// The (name, part) pairs of a peer's address; `None` if malformed.
fn decode_address(address: &[u8]) -> Option<Vec<(&str, &[u8])>> {
    let rest = address.strip_prefix(b"RFWA\x01")?;
    let (&count, mut rest) = rest.split_first()?;
    let mut parts = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let (&name_len, r) = rest.split_first()?;
        let (name, r) = r.split_at_checked(name_len as usize)?;
        let (len, r) = r.split_at_checked(2)?;
        let (part, r) = r.split_at_checked(u16::from_le_bytes([len[0], len[1]]) as usize)?;
        parts.push((std::str::from_utf8(name).ok()?, part));
        rest = r;
    }
    rest.is_empty().then_some(parts)
}

#[derive(Debug)]
struct CoreThread {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<()>,
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

    /// Connects to a peer through the first driver both workers have.
    ///
    /// # Errors
    /// [`Status::InvalidArgument`] for a malformed address,
    /// [`Status::PeerUnreachable`] if no driver is shared, or the driver's
    /// error.
    pub fn connect(&self, peer: &[u8]) -> Result<EndpointId, Error> {
        let parts = decode_address(peer).ok_or(Error::Status {
            op: "connect",
            status: Status::InvalidArgument,
        })?;
        let mut engine = self.shared.engine();
        if engine.endpoints.len() >= usize::from(u16::MAX) {
            return Err(Error::Status {
                op: "connect",
                status: Status::NoResource,
            });
        }
        for d in 0..engine.drivers.len() {
            let name = engine.drivers[d].name();
            let Some((_, part)) = parts.iter().find(|(n, _)| *n == name) else {
                continue;
            };
            let lanes = engine
                .config
                .lanes
                .min(engine.drivers[d].capabilities().max_lanes)
                .max(1);
            let driver_ep =
                engine.drivers[d]
                    .connect(part, lanes)
                    .map_err(|source| Error::Driver {
                        driver: name,
                        op: "connect",
                        source,
                    })?;
            let index = engine.add_endpoint(Endpoint::new(d as u8, driver_ep.0, lanes));
            tracing::debug!(endpoint = index, driver = name, lanes, "connected");
            return Ok(EndpointId(index));
        }
        Err(Error::Status {
            op: "connect",
            status: Status::PeerUnreachable,
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
        let index = engine.add_queue(EngineQueue::new(
            engine_sq,
            engine_cq,
            requests,
            buffers,
            Some(cq_bell.clone()),
        ));
        Ok(QueuePair {
            sq,
            cq,
            index,
            cq_bell,
            shared: self.shared.clone(),
        })
    }

    fn register_desc(
        &self,
        addr: u64,
        len: u64,
        kind: MemKind,
        owned: Option<Arc<OwnedMem>>,
    ) -> Result<MemHandle, Error> {
        if len == 0 || addr.checked_add(len).is_none() {
            return Err(Error::Status {
                op: "register",
                status: Status::InvalidLength,
            });
        }
        let secret = getrandom::u64().map_err(|e| Error::Os {
            op: "getrandom",
            source: std::io::Error::other(e.to_string()),
        })?;
        let desc = MemDesc {
            addr,
            len,
            kind,
            secret,
        };
        let mut engine = self.shared.engine();
        let mut keys = Vec::with_capacity(engine.drivers.len());
        for d in 0..engine.drivers.len() {
            let name = engine.drivers[d].name();
            match engine.drivers[d].register(&desc) {
                Ok(key) => keys.push(key),
                Err(source) => {
                    for (i, key) in keys.into_iter().enumerate() {
                        engine.drivers[i].deregister(key);
                    }
                    return Err(Error::Driver {
                        driver: name,
                        op: "register",
                        source,
                    });
                }
            }
        }
        let registration = Registration {
            base: addr,
            len,
            keys,
            inflight: 0,
            _owned: owned,
        };
        engine
            .mem
            .insert(registration)
            .map_err(Error::status_of("register"))
    }

    /// Registers existing memory for local use in SQEs and remote access by
    /// peers that receive its key.
    ///
    /// # Errors
    /// Zero or overflowing length, an unsupported kind, or no free slot.
    ///
    /// # Safety
    /// - `[addr, addr + len)` stays valid, writable memory until
    ///   [`deregister`](Worker::deregister) succeeds or the worker is
    ///   dropped.
    /// - While registered, peers and the engine may write it at any time:
    ///   the owner reads it only in ways that tolerate that (volatile or
    ///   atomic accesses, or after a completion or a notification says the
    ///   writes are done).
    #[allow(unsafe_code)]
    pub unsafe fn register(
        &self,
        addr: *mut u8,
        len: usize,
        kind: MemKind,
    ) -> Result<MemHandle, Error> {
        self.register_desc(addr as usize as u64, len as u64, kind, None)
    }

    /// Allocates `len` zeroed, 64-byte aligned bytes and registers them: the
    /// zero-copy way to start.
    ///
    /// The memory comes from the first driver that provides its own
    /// ([`Driver::alloc_memory`], e.g. a sealed memfd that a shared-memory
    /// peer maps), else from the heap.
    ///
    /// # Errors
    /// As [`register`](Worker::register), the driver's allocation error, or
    /// the allocation failed.
    pub fn alloc_registered(&self, len: usize) -> Result<RegisteredBuf, Error> {
        let no_memory = Error::Status {
            op: "alloc_registered",
            status: Status::NoMemory,
        };
        let from_driver = if len == 0 {
            None
        } else {
            let mut engine = self.shared.engine();
            engine.drivers.iter_mut().find_map(|d| {
                let name = d.name();
                d.alloc_memory(len).map(|r| {
                    r.map_err(|source| Error::Driver {
                        driver: name,
                        op: "alloc_memory",
                        source,
                    })
                })
            })
        };
        let mem = Arc::new(match from_driver {
            Some(mem) => OwnedMem::from_driver(mem?, len).ok_or(no_memory)?,
            None => OwnedMem::new(len).ok_or(no_memory)?,
        });
        let handle =
            self.register_desc(mem.addr(), len as u64, MemKind::Host, Some(mem.clone()))?;
        Ok(RegisteredBuf { mem, handle, len })
    }

    /// Withdraws a registration. Fails cleanly, changing nothing, while
    /// requests that use it are in flight.
    ///
    /// # Errors
    /// [`Status::InvalidMemHandle`] for an unknown handle, [`Status::Busy`]
    /// while in use.
    pub fn deregister(&self, handle: MemHandle) -> Result<(), Error> {
        let mut engine = self.shared.engine();
        let registration = engine
            .mem
            .remove(handle.as_raw())
            .map_err(Error::status_of("deregister"))?;
        for (d, key) in registration.keys.into_iter().enumerate() {
            if let Some(driver) = engine.drivers.get_mut(d) {
                driver.deregister(key);
            }
        }
        Ok(())
    }

    /// The blob a peer unpacks to access a registration: exact bounds plus
    /// the driver's part, which carries a random secret.
    ///
    /// # Errors
    /// [`Status::InvalidMemHandle`] for an unknown handle.
    pub fn pack_rkey(&self, handle: MemHandle) -> Result<Vec<u8>, Error> {
        let engine = self.shared.engine();
        let r = engine.mem.get(handle.as_raw()).ok_or(Error::Status {
            op: "pack_rkey",
            status: Status::InvalidMemHandle,
        })?;
        let mut parts = Vec::new();
        for (d, key) in r.keys.iter().enumerate() {
            let driver = &engine.drivers[d];
            let part = driver.pack_rkey(*key).map_err(|source| Error::Driver {
                driver: driver.name(),
                op: "pack_rkey",
                source,
            })?;
            parts.push(blob::encode(driver.name(), r.base, r.len, &part));
        }
        // One blob per driver, each length-prefixed.
        let mut out = Vec::new();
        for p in parts {
            out.extend_from_slice(&(p.len() as u32).to_le_bytes());
            out.extend_from_slice(&p);
        }
        Ok(out)
    }

    /// Turns a peer's key blob into an id for SQEs on `ep`.
    ///
    /// # Errors
    /// [`Status::InvalidEndpoint`], [`Status::InvalidArgument`] for a
    /// malformed blob or one without a part for `ep`'s driver, or the
    /// driver's error.
    pub fn unpack_rkey(&self, ep: EndpointId, key: &[u8]) -> Result<RkeyId, Error> {
        let bad = || Error::Status {
            op: "unpack_rkey",
            status: Status::InvalidArgument,
        };
        let mut engine = self.shared.engine();
        let endpoint = engine.endpoints.get(ep.0 as usize).ok_or(Error::Status {
            op: "unpack_rkey",
            status: Status::InvalidEndpoint,
        })?;
        let (driver, driver_ep) = (endpoint.driver as usize, DriverEp(endpoint.driver_ep));
        let name = engine.drivers[driver].name();
        let mut rest = key;
        while !rest.is_empty() {
            let (len, r) = rest.split_at_checked(4).ok_or_else(bad)?;
            let len = u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
            let (part, r) = r.split_at_checked(len).ok_or_else(bad)?;
            rest = r;
            let decoded = blob::decode(part).map_err(Error::status_of("unpack_rkey"))?;
            if decoded.driver != name {
                continue;
            }
            let rkey = engine.drivers[driver]
                .unpack_rkey(driver_ep, decoded.driver_blob)
                .map_err(|source| Error::Driver {
                    driver: name,
                    op: "unpack_rkey",
                    source,
                })?;
            let entry = Rkey {
                endpoint: ep.0,
                driver: rkey,
                base: decoded.base,
                len: decoded.len,
            };
            return engine
                .rkeys
                .insert(entry)
                .map_err(Error::status_of("unpack_rkey"));
        }
        Err(bad())
    }

    /// One bounded round of progress on the caller's thread; returns how
    /// much work it did (0: nothing to do).
    pub fn progress(&self) -> usize {
        self.shared.engine().progress()
    }

    /// Counters of the whole worker.
    pub fn stats(&self) -> Stats {
        self.shared.engine().stats
    }

    /// Counters of one endpoint.
    pub fn endpoint_stats(&self, ep: EndpointId) -> Option<Stats> {
        self.shared
            .engine()
            .cold
            .get(ep.0 as usize)
            .map(|c| c.stats)
    }

    /// Runs progress on a dedicated thread, pinned to `cpu` (or to
    /// `RINGFENCE_CORE_CPU`, or unpinned), until
    /// [`stop_core_thread`](Worker::stop_core_thread) or drop. It busy-polls
    /// and sleeps only when nothing is in flight, through NEED_WAKEUP on
    /// every SQ: a queue pair's `submit` wakes it.
    ///
    /// # Errors
    /// A core thread already runs ([`Status::Busy`]), the CPU does not exist
    /// or cannot be used, or the thread cannot be spawned.
    pub fn start_core_thread(&mut self, cpu: Option<usize>) -> Result<(), Error> {
        if self.core.is_some() {
            return Err(Error::Status {
                op: "start_core_thread",
                status: Status::Busy,
            });
        }
        let cpu = cpu.or(self.shared.engine().config.core_cpu);
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let handle = {
            let (shared, stop) = (self.shared.clone(), stop.clone());
            std::thread::Builder::new()
                .name("ringfence-core".into())
                .spawn(move || {
                    let pinned = cpu.map(pin_to).transpose();
                    let ok = pinned.is_ok();
                    let _ = ready_tx.send(pinned);
                    if ok {
                        core_loop(&shared, &stop);
                    }
                })
                .map_err(|source| Error::Os {
                    op: "spawn core thread",
                    source,
                })?
        };
        match ready_rx.recv() {
            Ok(Ok(_)) => {
                tracing::debug!(?cpu, "core thread started");
                self.core = Some(CoreThread { stop, handle });
                Ok(())
            }
            Ok(Err(e)) => {
                let _ = handle.join();
                Err(e)
            }
            Err(_) => {
                let _ = handle.join();
                Err(Error::Status {
                    op: "start_core_thread",
                    status: Status::Io,
                })
            }
        }
    }

    /// Stops the core thread, if one runs; progress is then the caller's.
    pub fn stop_core_thread(&mut self) {
        if let Some(core) = self.core.take() {
            core.stop.store(true, Ordering::Release);
            let _ = self.shared.sq_bell.ring();
            if core.handle.join().is_err() {
                tracing::error!("core thread panicked");
            }
        }
    }
}

fn pin_to(cpu: usize) -> Result<(), Error> {
    use nix::sched::{CpuSet, sched_setaffinity};
    let mut set = CpuSet::new();
    set.set(cpu).map_err(|e| Error::Os {
        op: "CPU set",
        source: e.into(),
    })?;
    sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).map_err(|e| Error::Os {
        op: "sched_setaffinity",
        source: e.into(),
    })
}

/// Spins this long (rounds with no work) before yielding, and this long
/// before trying to sleep.
const SPIN_ROUNDS: u32 = 64;
const SLEEP_ROUNDS: u32 = 1024;

fn core_loop(shared: &Shared, stop: &AtomicBool) {
    let mut idle = 0u32;
    while !stop.load(Ordering::Acquire) {
        if shared.engine().progress() > 0 {
            idle = 0;
            continue;
        }
        idle = idle.saturating_add(1);
        if idle < SPIN_ROUNDS {
            std::hint::spin_loop();
        } else if idle < SLEEP_ROUNDS {
            std::thread::yield_now();
        } else {
            let asleep = {
                let mut engine = shared.engine();
                engine.is_idle()
                    && shared.notify.begin_sleep()
                    && (engine.prepare_sleep() || {
                        shared.notify.end_sleep();
                        false
                    })
            };
            if asleep {
                if !stop.load(Ordering::Acquire) {
                    // Every wake source rings this bell: SQ submissions
                    // (NEED_WAKEUP), incoming notifications, and stop. The
                    // timeout is only a backstop.
                    let _ = shared.sq_bell.wait(Some(Duration::from_secs(1)));
                }
                shared.engine().finish_sleep();
                shared.notify.end_sleep();
            }
            idle = 0;
        }
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

/// An application thread's submission and completion queues.
///
/// SQEs are written straight into the SQ ring; [`submit`](QueuePair::submit)
/// publishes them with one store and wakes the core thread only if it
/// sleeps. CQEs are read straight out of the CQ ring.
#[derive(Debug)]
pub struct QueuePair {
    sq: Producer<Sqe>,
    cq: Consumer<Cqe>,
    index: usize,
    cq_bell: Arc<Doorbell>,
    shared: Arc<Shared>,
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
            if let Err(e) = self.shared.sq_bell.ring() {
                tracing::error!(error = %e, "SQ doorbell failed");
            }
        }
        n
    }

    /// Runs a PUT or GET at once, on this thread, where that keeps every
    /// rule of the ring: for the lowest latency (a ping-pong), the answer
    /// to `ucp_put_nbx` finishing inline.
    ///
    /// It runs only if the engine would start `sqe` at once anyway (a valid
    /// PUT or GET on a connected endpoint with nothing queued and no fence
    /// pending, through a driver that finishes operations inside the call,
    /// as shm and loopback do), this queue pair has no SQE the engine has
    /// not taken yet (pushed ones included: one could be a FENCE), and no
    /// other thread is inside the engine (a core thread's progress round).
    /// It is then done, remotely visible as after a PUT's CQE: its result
    /// (bytes, or the status its CQE would carry) is its one completion,
    /// and no CQE follows, whatever its flags. It is counted in the stats.
    ///
    /// `None`: nothing was done; push the SQE as usual.
    pub fn try_now(&mut self, sqe: &Sqe) -> Option<Result<u32, Status>> {
        if self.sq.pending() != 0 {
            return None;
        }
        let mut engine = match self.shared.engine.try_lock() {
            Ok(engine) => engine,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        engine.run_now(self.index, sqe)
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
            if let Err(e) = self.shared.sq_bell.ring() {
                tracing::error!(error = %e, "SQ doorbell failed");
            }
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

/// Registered memory owned by ringfence (from
/// [`Worker::alloc_registered`]).
///
/// Peers write it at any time, so it is read and written by copies
/// ([`read`](RegisteredBuf::read), [`write`](RegisteredBuf::write)) or
/// atomically ([`load_u64`](RegisteredBuf::load_u64)), never through Rust
/// references. The memory stays allocated while it is registered, even if
/// this handle is dropped.
#[derive(Debug, Clone)]
pub struct RegisteredBuf {
    mem: Arc<OwnedMem>,
    handle: MemHandle,
    len: usize,
}

impl RegisteredBuf {
    /// The registration handle, for SQEs and keys.
    pub fn handle(&self) -> MemHandle {
        self.handle
    }

    /// The start address.
    pub fn addr(&self) -> u64 {
        self.mem.addr()
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the length is zero (never, for a registration).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A local buffer `offset` bytes in, for SQE builders.
    pub fn local(&self, offset: u64) -> LocalBuf {
        LocalBuf {
            mem: self.handle.as_raw(),
            addr: self.addr() + offset,
        }
    }

    /// Copies bytes out.
    ///
    /// # Panics
    /// If the range is out of bounds.
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        assert!(
            offset
                .checked_add(out.len())
                .is_some_and(|end| end <= self.len),
            "read out of bounds"
        );
        self.mem.read(offset, out);
    }

    /// Copies bytes in.
    ///
    /// # Panics
    /// If the range is out of bounds.
    pub fn write(&self, offset: usize, data: &[u8]) {
        assert!(
            offset
                .checked_add(data.len())
                .is_some_and(|end| end <= self.len),
            "write out of bounds"
        );
        self.mem.write(offset, data);
    }

    /// The 8-byte word at `offset`, read atomically (for words that peers
    /// update with atomics).
    ///
    /// # Panics
    /// If `offset` is not 8-byte aligned or out of bounds.
    pub fn load_u64(&self, offset: usize) -> u64 {
        self.check_word(offset);
        self.mem.load_u64(offset)
    }

    /// Writes the 8-byte word at `offset` atomically, with Release order:
    /// one store, for a word a peer polls or reads with atomics (a
    /// ping-pong's sequence number, a flag after a payload).
    ///
    /// # Panics
    /// If `offset` is not 8-byte aligned or out of bounds.
    pub fn store_u64(&self, offset: usize, value: u64) {
        self.check_word(offset);
        self.mem.store_u64(offset, value);
    }

    /// Panics unless the 8-byte word at `offset` lies inside this buffer
    /// (the allocation under it may be longer).
    fn check_word(&self, offset: usize) {
        assert!(
            offset.checked_add(8).is_some_and(|end| end <= self.len),
            "word out of bounds"
        );
    }
}
