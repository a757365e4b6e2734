//! The core thread: progress on a dedicated thread that busy-polls and
//! sleeps only when nothing is in flight.

use super::*;

#[derive(Debug)]
pub(super) struct CoreThread {
    pub(super) stop: Arc<AtomicBool>,
    pub(super) handle: JoinHandle<()>,
}

impl Worker {
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

/// Spins this long (rounds with no work) before yielding, and this long
/// before trying to sleep.
pub(super) const SPIN_ROUNDS: u32 = 64;
pub(super) const SLEEP_ROUNDS: u32 = 1024;

pub(super) fn core_loop(shared: &Shared, stop: &AtomicBool) {
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
