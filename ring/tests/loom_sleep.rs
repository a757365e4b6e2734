//! Loom models of a consumer that sleeps on several wake sources at once
//! ([`ringfence_ring::sleep`]): the engine's core thread, sleeping on the
//! SQ doorbell and every driver's wake descriptor.
//!
//! Run with:
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test -p ringfence-ring --release --test loom_sleep`
//!
//! What runs as written: the order of the steps ([`sleep`]), the SQ's
//! `NEED_WAKEUP` (`Consumer::prepare_wait`, `Producer::needs_wakeup`) and
//! [`WakeFlag`] (a notification queue's flag). What is modelled: the two
//! kernel objects. An eventfd is a counter whose write, read and readiness
//! check are atomic read-modify-writes and loads (the kernel does each under
//! the eventfd's lock); `epoll_wait` is a loop that returns when one of its
//! descriptors is readable. A driver is a counter of finished operations
//! and an eventfd it makes readable after publishing each, and clears in
//! `poll` before it takes them (a level-triggered descriptor). A one-shot
//! driver (`OneShot`, as a verbs completion channel) signals its
//! descriptor only when armed: the core thread arms it in its last round
//! (`Driver::prepare_sleep`: arm, then look once more, and stay up if
//! something finished), the first completion after the arming signals and
//! disarms it, and `withdraw` disarms it (`Driver::woke`).
//!
//! The sleeper panics with "lost wake-up" if it waits while every producer
//! has finished and none of its descriptors is readable: the outcome the
//! protocol must rule out.

#[cfg(loom)]
mod tests {
    use loom::sync::Arc;
    use loom::sync::atomic::{AtomicBool, AtomicU32, Ordering, fence};
    use loom::thread;
    use ringfence_ring::{Consumer, Cqe, Sleeper, WakeFlag, channel, sleep};

    /// An eventfd: a counter, readable while non-zero.
    #[derive(Default)]
    struct EventFd(AtomicU32);

    impl EventFd {
        /// `write(fd, 1)`.
        fn ring(&self) {
            // AcqRel: the kernel's lock orders the write after what the
            // writer did before it, and a reader's clear after it.
            self.0.fetch_add(1, Ordering::AcqRel);
        }
        /// `read(fd)` of a non-blocking eventfd.
        fn clear(&self) -> bool {
            // AcqRel: see `ring`.
            self.0.swap(0, Ordering::AcqRel) != 0
        }
        /// Readiness, as `epoll_wait` checks it.
        fn is_readable(&self) -> bool {
            // Acquire: pairs with `ring`.
            self.0.load(Ordering::Acquire) != 0
        }
    }

    /// A driver whose operations finish on a device thread.
    #[derive(Default)]
    struct Driver {
        /// Finished operations not yet returned by `poll`.
        finished: AtomicU32,
        /// Its wake descriptor.
        fd: EventFd,
    }

    impl Driver {
        /// The device finishes one operation: publishes it, then makes the
        /// descriptor readable.
        fn complete(&self) {
            // Release: publishes the completion; pairs with `poll`.
            self.finished.fetch_add(1, Ordering::Release);
            self.fd.ring();
        }
        /// `Driver::poll`: clears the descriptor first, then takes what has
        /// finished, so anything published after the take rings again.
        fn poll(&self) -> u32 {
            self.fd.clear();
            // Acquire: pairs with the Release in `complete`.
            self.finished.swap(0, Ordering::Acquire)
        }
    }

    /// A driver whose descriptor is one-shot: signalled by the first
    /// completion after it was armed, never while the core thread polls.
    #[derive(Default)]
    struct OneShot {
        finished: AtomicU32,
        armed: AtomicBool,
        fd: EventFd,
    }

    impl OneShot {
        /// The device finishes one operation: publishes it, then signals if
        /// armed (and disarms: one signal per arming).
        fn complete(&self) {
            // Release: publishes the completion; pairs with `poll`.
            self.finished.fetch_add(1, Ordering::Release);
            // SeqCst: with the one in `prepare_sleep`, either this look at
            // the arming sees it or that look sees the completion. (A load
            // and a store, not a swap: loom applies the fences' order to
            // plain loads only, and a device reads its arming and then
            // clears it anyway.)
            fence(Ordering::SeqCst);
            if self.armed.load(Ordering::Relaxed) {
                self.armed.store(false, Ordering::Relaxed);
                self.fd.ring();
            }
        }

        /// `Driver::poll`: takes what has finished; the descriptor is not
        /// touched.
        fn poll(&self) -> u32 {
            // Acquire: pairs with the Release in `complete`.
            self.finished.swap(0, Ordering::Acquire)
        }

        /// `Driver::prepare_sleep`: arm, then look once more. `false`: not
        /// now, something finished.
        fn prepare_sleep(&self) -> bool {
            self.armed.store(true, Ordering::Relaxed);
            // SeqCst: see `complete`.
            fence(Ordering::SeqCst);
            self.finished.load(Ordering::Relaxed) == 0
        }

        /// `Driver::woke`: disarm and acknowledge.
        fn woke(&self) {
            self.armed.store(false, Ordering::Relaxed);
            self.fd.clear();
        }
    }

    /// A notification queue: deliveries counted, and its "ring me" flag.
    #[derive(Default)]
    struct Notifications {
        delivered: AtomicU32,
        sleeping: WakeFlag,
    }

    /// Everything the producers and the sleeper share.
    #[derive(Default)]
    struct Shared {
        /// The SQ doorbell, also rung for notifications.
        bell: EventFd,
        driver: Driver,
        one_shot: OneShot,
        notify: Notifications,
        /// Producers that have finished everything they do.
        producers_done: AtomicU32,
    }

    /// The core thread's side.
    struct Core {
        shared: Arc<Shared>,
        sq: Consumer<Cqe>,
        /// Work items taken so far (SQEs, completions, notifications).
        taken: u32,
        producers: u32,
    }

    impl Sleeper for Core {
        fn clear_doorbell(&mut self) {
            self.shared.bell.clear();
        }

        fn last_round(&mut self) -> bool {
            let mut work = self.shared.driver.poll() + self.shared.one_shot.poll();
            while self.sq.pop().unwrap().is_some() {
                work += 1;
            }
            // Acquire: pairs with the deliverer's Release.
            work += self.shared.notify.delivered.swap(0, Ordering::Acquire);
            self.taken += work;
            if work != 0 {
                return false;
            }
            // The engine's `prepare_drivers_sleep`: not now means woke at
            // once, and another round.
            if !self.shared.one_shot.prepare_sleep() {
                self.shared.one_shot.woke();
                return false;
            }
            true
        }

        fn announce(&mut self) -> bool {
            if !self.sq.prepare_wait().unwrap() {
                return false;
            }
            self.shared.notify.sleeping.announce();
            // Relaxed is enough for a look: the fence in `announce` orders
            // it (as the SQ's own look in `prepare_wait`).
            self.shared.notify.delivered.load(Ordering::Relaxed) == 0
        }

        fn wait(&mut self) {
            loop {
                // Acquire: each producer's last step happens before.
                let all_done = self.shared.producers_done.load(Ordering::Acquire) == self.producers;
                if self.shared.bell.is_readable()
                    || self.shared.driver.fd.is_readable()
                    || self.shared.one_shot.fd.is_readable()
                {
                    return;
                }
                assert!(
                    !all_done,
                    "lost wake-up: asleep with every producer done and no descriptor readable"
                );
                thread::yield_now();
            }
        }

        fn withdraw(&mut self) {
            self.sq.finish_wait();
            self.shared.notify.sleeping.withdraw();
            self.shared.one_shot.woke();
        }
    }

    /// Runs the sleeper until it has taken `total` items from `producers`
    /// producer threads.
    fn run_core(shared: Arc<Shared>, sq: Consumer<Cqe>, producers: u32, total: u32) {
        let mut core = Core {
            shared,
            sq,
            taken: 0,
            producers,
        };
        while core.taken < total {
            sleep(&mut core);
        }
    }

    /// A producer thread: runs `work`, then counts itself done.
    fn producer(
        shared: &Arc<Shared>,
        work: impl FnOnce(&Shared) + Send + 'static,
    ) -> thread::JoinHandle<()> {
        let shared = shared.clone();
        thread::spawn(move || {
            work(&shared);
            // Release: pairs with the Acquire in `Core::wait`.
            shared.producers_done.fetch_add(1, Ordering::Release);
        })
    }

    /// A device finishing one operation.
    fn device(shared: &Arc<Shared>) -> thread::JoinHandle<()> {
        producer(shared, |s| s.driver.complete())
    }

    /// An SQE submitted by an application, and an operation a device
    /// finishes on its own, while the core thread goes to sleep.
    #[test]
    fn sq_and_driver_wake_a_sleeping_core_thread() {
        loom::model(|| {
            let (mut tx, sq) = channel::<Cqe>(2);
            let shared = Arc::new(Shared::default());
            let app = producer(&shared, move |s| {
                tx.push(Cqe::new(1, 0, 0)).unwrap();
                tx.submit();
                if tx.needs_wakeup() {
                    s.bell.ring();
                }
            });
            let device = device(&shared);
            run_core(shared, sq, 2, 2);
            app.join().unwrap();
            device.join().unwrap();
        });
    }

    /// A notification delivered (the waker rings the SQ doorbell) and an
    /// operation a device finishes, while the core thread goes to sleep.
    #[test]
    fn notification_and_driver_wake_a_sleeping_core_thread() {
        loom::model(|| {
            let (_tx, sq) = channel::<Cqe>(2);
            let shared = Arc::new(Shared::default());
            let deliverer = producer(&shared, |s| {
                // Release: publishes the delivery; pairs with the Acquire
                // in `last_round`.
                s.notify.delivered.fetch_add(1, Ordering::Release);
                if s.notify.sleeping.is_announced() {
                    s.bell.ring();
                }
            });
            let device = device(&shared);
            run_core(shared, sq, 2, 2);
            deliverer.join().unwrap();
            device.join().unwrap();
        });
    }

    /// A device finishing two operations, one on each side of the core
    /// thread's last poll: the second must leave the descriptor readable.
    #[test]
    fn completions_around_the_last_poll_are_not_lost() {
        loom::model(|| {
            let (_tx, sq) = channel::<Cqe>(2);
            let shared = Arc::new(Shared::default());
            let device = producer(&shared, |s| {
                s.driver.complete();
                thread::yield_now();
                s.driver.complete();
            });
            run_core(shared, sq, 1, 2);
            device.join().unwrap();
        });
    }

    /// A one-shot driver's device finishing two operations, one on each
    /// side of the core thread's last poll and its arming: the second must
    /// be seen by the look after the arming or signal the armed
    /// descriptor.
    #[test]
    fn a_one_shot_descriptor_armed_for_sleep_loses_no_completion() {
        loom::model(|| {
            let (_tx, sq) = channel::<Cqe>(2);
            let shared = Arc::new(Shared::default());
            let device = producer(&shared, |s| {
                s.one_shot.complete();
                thread::yield_now();
                s.one_shot.complete();
            });
            run_core(shared, sq, 1, 2);
            device.join().unwrap();
        });
    }

    /// An SQE and a one-shot driver's completion while the core thread
    /// goes to sleep.
    #[test]
    fn sq_and_one_shot_driver_wake_a_sleeping_core_thread() {
        loom::model(|| {
            let (mut tx, sq) = channel::<Cqe>(2);
            let shared = Arc::new(Shared::default());
            let app = producer(&shared, move |s| {
                tx.push(Cqe::new(1, 0, 0)).unwrap();
                tx.submit();
                if tx.needs_wakeup() {
                    s.bell.ring();
                }
            });
            let device = producer(&shared, |s| s.one_shot.complete());
            run_core(shared, sq, 2, 2);
            app.join().unwrap();
            device.join().unwrap();
        });
    }
}
