//! The core thread: progress on a dedicated thread that busy-polls, and
//! sleeps on the SQ doorbell and every driver's wake descriptor at once.
//!
//! It polls for `IDLE_SPIN` after its last work, then sleeps through
//! [`ringfence_ring::sleep`]: under the engine lock, one last progress
//! round, [`Engine::may_sleep`], and every driver asked to arm its wake
//! descriptors ([`Engine::prepare_drivers_sleep`], which may keep it up);
//! then NEED_WAKEUP on every SQ and the
//! notification pool's flag, each followed by a look at its source; then
//! `epoll_wait` on the SQ doorbell and the drivers' descriptors, with no
//! timeout. The docs of [`ringfence_ring::sleep`] give the argument
//! that no wake-up is missed; the loom models in
//! `ring/tests/loom_sleep.rs` check it. What wakes it:
//!
//! - a queue pair's `submit` that finds NEED_WAKEUP set (SQ doorbell);
//! - an incoming notification (the pool's waker is the SQ doorbell);
//! - a driver's descriptor: an operation, flush or handshake finished, or
//!   work arrived that the driver must progress (after the sleep, every
//!   driver is told it woke: [`Driver::woke`]);
//! - a timeout a driver asked for ([`Sleep::Within`](crate::Sleep::Within));
//! - any other thread that takes the engine lock while it sleeps
//!   ([`Shared::engine`] rings the SQ doorbell once per sleep): a new queue
//!   pair, a connect, a progress round run by the application;
//! - [`Worker::stop_core_thread`] (sets the stop flag, then rings).

use super::*;
use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use ringfence_ring::Sleeper;
use std::time::Instant;

#[derive(Debug)]
pub(super) struct CoreThread {
    pub(super) stop: Arc<AtomicBool>,
    pub(super) handle: JoinHandle<()>,
}

impl Worker {
    /// Runs progress on a dedicated thread until
    /// [`stop_core_thread`](Worker::stop_core_thread) or drop.
    ///
    /// It busy-polls while there is work and for 100 µs
    /// after the last, then sleeps until something needs it: a queue pair's
    /// `submit` (through NEED_WAKEUP on every SQ), an incoming notification,
    /// or a driver's wake descriptor ([`Driver::wake_fds`]). Before it
    /// sleeps it asks every driver to prepare ([`Driver::prepare_sleep`]):
    /// it may sleep with operations in flight on drivers that armed their
    /// descriptors; while a driver that answers
    /// [`Sleep::WhenIdle`](crate::Sleep::WhenIdle) (loopback in `NextPoll`
    /// mode, the test kit's `FaultInjector`) has work in flight, or one
    /// answers [`Sleep::NotNow`](crate::Sleep::NotNow), it keeps polling.
    ///
    /// # Where it runs
    /// On `cpu` if given, else on `RINGFENCE_CORE_CPU` if set (see
    /// [`Config`]). Otherwise it is pinned to a CPU the process may use
    /// (the caller's affinity and the main thread's) other than the one the
    /// caller runs on when it calls this: the highest-numbered such CPU.
    /// With a single CPU it is left unpinned.
    ///
    /// Why: measured on a 2-vCPU KVM guest (benches/RESULTS.md, group
    /// `wake`), an unpinned core thread shared the CPU of an application
    /// that busy-polls its CQ. Its idle phase then (960 `sched_yield`s
    /// before sleeping) handed that CPU to the application for a whole time
    /// slice at every yield: 1.35 s to fall asleep, 3.9 ms median from
    /// submit to CQE for an operation that arrived meanwhile, and a core
    /// thread woken on that CPU waited for the application's slice to end
    /// (the 0.53–0.80 ms a user measured). On a CPU of its own, submit to
    /// CQE from sleep takes 22.9 µs median, against 22.5 µs for a plain
    /// eventfd wake of a thread asleep as long (five runs): that time is the
    /// hypervisor waking an idle vCPU, not the engine (the same eventfd wake
    /// right after the sleeper went to sleep takes about 4 µs). Pass `cpu`,
    /// or set `RINGFENCE_CORE_CPU`, when the default does not fit (an
    /// application that pins its own threads onto that CPU).
    ///
    /// # Errors
    /// A core thread already runs ([`Status::Busy`]), the CPU does not exist
    /// or cannot be used, the wake descriptors cannot be put in an epoll
    /// set, or the thread cannot be spawned.
    pub fn start_core_thread(&mut self, cpu: Option<usize>) -> Result<(), Error> {
        if self.core.is_some() {
            return Err(Error::Status {
                op: "start_core_thread",
                status: Status::Busy,
            });
        }
        let cpu = cpu
            .or(self.shared.engine().config.core_cpu)
            .or_else(default_cpu);
        let epoll = wake_set(&self.shared)?;
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
                        core_loop(&shared, &stop, epoll);
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
                // Release: see `Shared::core_running`.
                self.shared.core_running.store(true, Ordering::Release);
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
            // Release: see `Shared::core_running`. Cleared first: a wait
            // that sees it cleared progresses inline, which is safe beside
            // a core thread still finishing its round.
            self.shared.core_running.store(false, Ordering::Release);
            // Release: pairs with the Acquire loads in `core_loop` and
            // `CoreNap::wait`; the ring below comes after it, so a core
            // thread that cleared the doorbell before the ring sees the flag.
            core.stop.store(true, Ordering::Release);
            self.shared.wake_core();
            if core.handle.join().is_err() {
                tracing::error!("core thread panicked");
            }
        }
    }
}

pub(super) fn pin_to(cpu: usize) -> Result<(), Error> {
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

/// The core thread's CPU when nobody chose one: the highest-numbered CPU
/// the process may use other than the one the calling thread runs on now;
/// `None` (unpinned) when there is no other (see `start_core_thread`).
/// "May use": the CPUs of the calling thread's affinity and of the main
/// thread's (an application that pinned the thread it starts the core
/// thread from has not thereby given up the process's other CPUs).
pub(super) fn default_cpu() -> Option<usize> {
    use nix::sched::{CpuSet, sched_getaffinity, sched_getcpu};
    use nix::unistd::Pid;
    let caller = sched_getaffinity(Pid::from_raw(0)).ok()?;
    // The main thread's id is the process id.
    let main = sched_getaffinity(Pid::this()).unwrap_or(caller);
    let here = sched_getcpu().ok();
    (0..CpuSet::count()).rev().find(|&cpu| {
        Some(cpu) != here
            && (caller.is_set(cpu).unwrap_or(false) || main.is_set(cpu).unwrap_or(false))
    })
}

/// How long the core thread keeps polling after its last work before it
/// sleeps. A wake from sleep costs about 25–35 µs on the 2-vCPU KVM guest
/// of benches/RESULTS.md (most of it the hypervisor waking the idle vCPU),
/// against under 1 µs for an operation that finds the thread polling; 100
/// µs keeps the extra latency of a sleep under a third of the time spent
/// polling for nothing. Polling, not yielding: a `sched_yield` on a CPU
/// shared with a busy-polling application hands it a whole time slice (the
/// measurements are in `start_core_thread`'s docs).
pub(super) const IDLE_SPIN: Duration = Duration::from_micros(100);

/// `epoll_data` of the SQ doorbell in the wake set; a driver's is its index.
const SQ_BELL: u64 = u64::MAX;

/// The core thread's wake set: the SQ doorbell and every driver's wake
/// descriptor, level-triggered. Drivers live as long as the engine, and
/// keep the same descriptor while they live, so they are registered once.
fn wake_set(shared: &Shared) -> Result<Epoll, Error> {
    let os = |op| {
        move |e: Errno| Error::Os {
            op,
            source: e.into(),
        }
    };
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(os("epoll_create"))?;
    epoll
        .add(
            &*shared.sq_bell,
            EpollEvent::new(EpollFlags::EPOLLIN, SQ_BELL),
        )
        .map_err(os("epoll_ctl (SQ doorbell)"))?;
    let engine = shared.engine();
    for (d, driver) in engine.drivers.iter().enumerate() {
        for fd in driver.wake_fds() {
            epoll
                .add(fd, EpollEvent::new(EpollFlags::EPOLLIN, d as u64))
                .map_err(os("epoll_ctl (driver wake descriptor)"))?;
        }
    }
    Ok(epoll)
}

pub(super) fn core_loop(shared: &Shared, stop: &AtomicBool, epoll: Epoll) {
    let mut nap = CoreNap {
        shared,
        stop,
        epoll,
        engine: None,
        asleep: false,
        timeout: EpollTimeout::NONE,
        events: [EpollEvent::empty(); 4],
    };
    let mut idle_since = None;
    // Acquire: pairs with the Release in `stop_core_thread`.
    while !stop.load(Ordering::Acquire) {
        if shared.engine().progress() > 0 {
            idle_since = None;
            continue;
        }
        let since = *idle_since.get_or_insert_with(Instant::now);
        if since.elapsed() < IDLE_SPIN {
            std::hint::spin_loop();
            continue;
        }
        ringfence_ring::sleep(&mut nap);
        idle_since = None;
    }
}

/// The core thread's steps of [`ringfence_ring::sleep`].
struct CoreNap<'a> {
    shared: &'a Shared,
    stop: &'a AtomicBool,
    epoll: Epoll,
    /// Held from a `last_round` that found nothing to the end of
    /// `announce`: the decision and the announcement see one engine state.
    engine: Option<EngineGuard<'a>>,
    /// Between a successful `announce` and its `withdraw`.
    asleep: bool,
    /// How long `wait` may sleep: until woken, unless a driver asked to be
    /// polled again sooner ([`Sleep::Within`](crate::Sleep::Within)).
    timeout: EpollTimeout,
    events: [EpollEvent; 4],
}

impl Sleeper for CoreNap<'_> {
    fn clear_doorbell(&mut self) {
        if let Err(e) = self.shared.sq_bell.clear() {
            tracing::error!(error = %e, "SQ doorbell failed");
        }
    }

    fn last_round(&mut self) -> bool {
        // The round and the decision under one lock hold: no other thread
        // polls a driver in between (a poll that returned a full batch
        // could leave completions behind a quiet descriptor).
        let mut engine = self.shared.lock_engine();
        if engine.progress() > 0 || !engine.may_sleep() {
            return false;
        }
        // The drivers arm what will wake the thread (or say not now);
        // `withdraw` tells them it woke.
        let Some(within) = engine.prepare_drivers_sleep() else {
            return false;
        };
        self.timeout = within.map_or(EpollTimeout::NONE, timeout_of);
        self.engine = Some(engine);
        true
    }

    fn announce(&mut self) -> bool {
        let Some(mut engine) = self.engine.take() else {
            return false;
        };
        if !(engine.prepare_sleep() && self.shared.notify.begin_sleep()) {
            return false;
        }
        // Whoever takes the lock from now on rings the SQ doorbell.
        engine.core_asleep = true;
        self.asleep = true;
        // Relaxed: a count for observers; it publishes nothing.
        self.shared.core_naps.fetch_add(1, Ordering::Relaxed);
        true
    }

    fn wait(&mut self) {
        // Acquire: pairs with the Release in `stop_core_thread`.
        if self.stop.load(Ordering::Acquire) {
            return;
        }
        match self.epoll.wait(&mut self.events, self.timeout) {
            // EINTR: a signal; the loop looks again, and sleeps again if
            // nothing is there.
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => tracing::error!(error = %e, "epoll_wait failed"),
        }
    }

    fn withdraw(&mut self) {
        let mut engine = self
            .engine
            .take()
            .unwrap_or_else(|| self.shared.lock_engine());
        engine.finish_sleep();
        engine.drivers_woke();
        self.shared.notify.end_sleep();
        engine.core_asleep = false;
        if std::mem::take(&mut self.asleep) {
            // Relaxed: as in `announce`.
            self.shared.core_naps.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// An epoll timeout of at least `within`, in whole milliseconds rounded
/// up (a driver that asked to be polled within 10 µs is polled within
/// 1 ms, never busy-waited for).
fn timeout_of(within: Duration) -> EpollTimeout {
    let ms = within.as_micros().div_ceil(1000).max(1);
    EpollTimeout::try_from(ms).unwrap_or(EpollTimeout::MAX)
}
