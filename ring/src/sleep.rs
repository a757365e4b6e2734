//! Sleeping on several wake sources at once without missing a wake-up:
//! [`sleep`] (the steps, and why no wake-up is missed), [`Sleeper`] and
//! [`WakeFlag`].

use crate::sync::{AtomicU32, Ordering, fence};

/// The steps of a consumer that sleeps on a doorbell and on level-triggered
/// descriptors at once; [`sleep`] runs them in order, and says why no
/// wake-up is missed.
pub trait Sleeper {
    /// Drops rings left on the doorbell from earlier sleeps.
    fn clear_doorbell(&mut self);

    /// One last round of work. `true` if it found nothing to do, and
    /// everything still in flight will make a descriptor readable when it
    /// finishes: the consumer may go on to sleep.
    fn last_round(&mut self) -> bool;

    /// Asks every flag-based producer to ring the doorbell (a store and a
    /// SeqCst fence each), then looks at each of their sources once more.
    /// `false` if work arrived: the consumer stays up.
    fn announce(&mut self) -> bool;

    /// Blocks until the doorbell or a descriptor is readable (or returns at
    /// once if the consumer is told to stop).
    fn wait(&mut self);

    /// Clears what [`announce`](Sleeper::announce) set; called once after
    /// every `announce`, whatever it returned.
    fn withdraw(&mut self);
}

/// Sleeping on several wake sources at once without missing a wake-up.
///
/// A consumer that busy-polls several sources of work (the SQs of many
/// queue pairs, a queue of incoming notifications, drivers' completion
/// queues) wants to sleep when none has anything, and to wake as soon as
/// any has. It sleeps in one blocking call (`epoll_wait`) on a set of
/// descriptors: a **doorbell** (an eventfd) that producers ring when the
/// consumer asked them to, and **level-triggered descriptors** that a source
/// keeps readable on its own while it holds something (a driver's
/// completion eventfd).
///
/// [`sleep`] runs the consumer's side, through the five steps of a
/// [`Sleeper`], always in this order:
///
/// 1. [`clear_doorbell`](Sleeper::clear_doorbell): rings left from an
///    earlier sleep are dropped (they would only end the next wait at once).
/// 2. [`last_round`](Sleeper::last_round): one more round of work, which
///    also polls every level-triggered source; the consumer goes on only if
///    it found nothing, and if nothing it has started can finish without
///    making one of its descriptors readable.
/// 3. [`announce`](Sleeper::announce): tells every flag-based producer
///    "ring me" (an SQ's `NEED_WAKEUP`, a [`WakeFlag`]), each store followed
///    by a SeqCst fence, then looks at each of those sources once more. If
///    anything arrived, it does not sleep.
/// 4. [`wait`](Sleeper::wait): blocks until the doorbell or a descriptor is
///    readable.
/// 5. [`withdraw`](Sleeper::withdraw): the flags are cleared again (also
///    after a failed `announce`).
///
/// # Why no wake-up is missed
///
/// Take anything that arrives while the consumer runs these steps.
///
/// - **A flag-based producer** (an SQ, a notification) publishes, then (after
///   a SeqCst fence) reads the flag, and rings the doorbell if it is set.
///   The consumer stores the flag, fences, then looks at the source (step
///   3). That is the store-buffering pattern: of the two fences, whichever
///   comes second sees the other side's store, so either the consumer sees
///   the new work and stays up, or the producer sees the flag and rings.
///   The ring comes after the flag was set, hence after step 1's clear,
///   so it is still there at step 4 and ends the wait.
/// - **A level-triggered source** (a driver) promises that after a poll
///   which left nothing behind, anything new makes its descriptor readable,
///   and that it stays readable until the next poll. The last poll is in
///   step 2 and nothing polls it again before step 4, so whatever arrives
///   after that poll leaves the descriptor readable at step 4; whatever
///   arrived before it was taken by that poll, and step 2 then did not
///   report idle.
/// - **Anything else that can give the consumer work** (another thread that
///   takes the engine's lock while the consumer sleeps, a request to stop)
///   rings the doorbell itself after making its change; the ring comes
///   after step 1, so the wait ends.
///
/// The clear (step 1) must come before the flags are set (step 3): a ring
/// that a producer sends after seeing a flag must never be cleared unseen.
/// A ring from an earlier sleep that arrives late only ends one wait early.
///
/// `ring/tests/loom_sleep.rs` model-checks the steps with an SQ, a
/// [`WakeFlag`] source and a driver's descriptor.
///
/// Returns whether it slept (waited); `false`: it found work, and did not
/// sleep.
pub fn sleep(sleeper: &mut impl Sleeper) -> bool {
    sleeper.clear_doorbell();
    if !sleeper.last_round() {
        return false;
    }
    let announced = sleeper.announce();
    if announced {
        sleeper.wait();
    }
    sleeper.withdraw();
    announced
}

/// A "ring me" flag between a consumer that may sleep and a producer that
/// publishes work outside a ring (a queue behind a lock, a counter): the
/// same protocol as an SQ's `NEED_WAKEUP`
/// ([`Producer::needs_wakeup`](crate::Producer::needs_wakeup)), for
/// sources that have no ring.
///
/// The consumer calls [`announce`](WakeFlag::announce), then looks at the
/// source; the producer publishes, then calls
/// [`is_announced`](WakeFlag::is_announced) and rings the consumer's
/// doorbell if it returns `true`.
#[derive(Debug)]
pub struct WakeFlag {
    /// 1 while the consumer sleeps or is about to; 0 otherwise. Written
    /// only by the consumer.
    flag: AtomicU32,
}

impl Default for WakeFlag {
    fn default() -> Self {
        WakeFlag::new()
    }
}

impl WakeFlag {
    /// A flag that is not set.
    pub fn new() -> WakeFlag {
        WakeFlag {
            flag: AtomicU32::new(0),
        }
    }

    /// The consumer is about to sleep: sets the flag. Look at the source
    /// after this returns.
    pub fn announce(&self) {
        // Relaxed: the fence below orders it.
        self.flag.store(1, Ordering::Relaxed);
        // SeqCst fence: the flag store before the consumer's look at the
        // source; pairs with the fence in `is_announced` (store-buffering:
        // see `Producer::needs_wakeup`).
        fence(Ordering::SeqCst);
    }

    /// The consumer is awake again.
    pub fn withdraw(&self) {
        // Relaxed: a stale `1` costs a producer one spurious ring.
        self.flag.store(0, Ordering::Relaxed);
    }

    /// Whether the consumer asked to be woken. Call it after publishing;
    /// if it returns `true`, ring the consumer's doorbell.
    pub fn is_announced(&self) -> bool {
        // SeqCst fence: the producer's publication before the flag load;
        // pairs with the fence in `announce`.
        fence(Ordering::SeqCst);
        // Relaxed: the fence provides the ordering.
        self.flag.load(Ordering::Relaxed) != 0
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Records the steps it is asked to run.
    struct Steps {
        idle: bool,
        quiet: bool,
        log: Vec<&'static str>,
    }

    impl Sleeper for Steps {
        fn clear_doorbell(&mut self) {
            self.log.push("clear");
        }
        fn last_round(&mut self) -> bool {
            self.log.push("round");
            self.idle
        }
        fn announce(&mut self) -> bool {
            self.log.push("announce");
            self.quiet
        }
        fn wait(&mut self) {
            self.log.push("wait");
        }
        fn withdraw(&mut self) {
            self.log.push("withdraw");
        }
    }

    #[test]
    fn steps_run_in_order() {
        let mut s = Steps {
            idle: true,
            quiet: true,
            log: vec![],
        };
        assert!(sleep(&mut s));
        assert_eq!(s.log, ["clear", "round", "announce", "wait", "withdraw"]);
        let mut s = Steps {
            idle: true,
            quiet: false,
            log: vec![],
        };
        assert!(!sleep(&mut s));
        assert_eq!(s.log, ["clear", "round", "announce", "withdraw"]);
        let mut s = Steps {
            idle: false,
            quiet: true,
            log: vec![],
        };
        assert!(!sleep(&mut s));
        assert_eq!(s.log, ["clear", "round"]);
    }

    #[test]
    fn wake_flag() {
        let flag = WakeFlag::default();
        assert!(!flag.is_announced());
        flag.announce();
        assert!(flag.is_announced());
        flag.withdraw();
        assert!(!flag.is_announced());
    }
}
