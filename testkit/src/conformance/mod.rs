//! The driver conformance suite: seam-level checks that every driver runs
//! the same way, through two real workers ([`Pair`](crate::Pair)) connected by the
//! driver under test.
//!
//! A driver's test file runs the whole suite with one macro call, given
//! an expression that makes a [`Subject`] (evaluated afresh for each
//! check):
//!
//! ```ignore
//! mod loopback {
//!     ringfence_testkit::conformance_suite!(
//!         ringfence_testkit::conformance::Drivers(ringfence::Loopback::new)
//!     );
//! }
//! ```
//!
//! Each check is a `#[test]` of that name ([`checks`] lists them). They
//! are deterministic: waits are bounded spins that yield and only catch
//! hangs ([`HANG`](crate::HANG)), nothing sleeps to synchronize, and
//! nothing asserts on time.

pub mod checks;

use crate::rig::PairConfig;
use ringfence::Driver;

/// What a conformance check runs on: the driver each worker of the pair
/// gets, how the pair is built, and the subject's own verdict afterwards.
pub trait Subject {
    /// The driver under test.
    type Driver: Driver;

    /// A driver for one more worker (each check builds two).
    fn driver(&mut self) -> Self::Driver;

    /// How the pair is built ([`PairConfig::default`] unless overridden).
    fn config(&self) -> PairConfig {
        PairConfig::default()
    }

    /// Called after a check passed, its workers dropped: the subject's own
    /// findings (a `SimDriver`'s contract violations) fail it here. The
    /// default finds nothing.
    fn verdict(&mut self) {}

    /// Checks this subject is known to fail, by name, each with what is
    /// wrong: [`run`] expects each of them to fail (so a known deviation
    /// stays visible in the test output, and one that was fixed fails
    /// until it is taken off the list). None by default; see
    /// [`Deviating`].
    fn deviations(&self) -> &[(&'static str, &'static str)] {
        &[]
    }
}

/// A subject from a function that makes each worker's driver:
/// `Drivers(Loopback::new)`, `Drivers(|| Shm::new().unwrap())`.
#[derive(Debug, Clone, Copy)]
pub struct Drivers<F>(pub F);

impl<D: Driver, F: FnMut() -> D> Subject for Drivers<F> {
    type Driver = D;

    fn driver(&mut self) -> D {
        (self.0)()
    }
}

/// A subject with checks it is known to fail ([`Subject::deviations`]):
/// `Deviating(Drivers(make), &[("check", "what the driver does wrong")])`.
#[derive(Debug, Clone, Copy)]
pub struct Deviating<S>(pub S, pub &'static [(&'static str, &'static str)]);

impl<S: Subject> Subject for Deviating<S> {
    type Driver = S::Driver;

    fn driver(&mut self) -> S::Driver {
        self.0.driver()
    }

    fn config(&self) -> PairConfig {
        self.0.config()
    }

    fn verdict(&mut self) {
        self.0.verdict();
    }

    fn deviations(&self) -> &[(&'static str, &'static str)] {
        self.1
    }
}

/// Runs check `name` on `subject`, then asks for its verdict; for a known
/// deviation of the subject, checks that it still fails.
///
/// # Panics
/// If the check fails, or a known deviation passes.
pub fn run<S: Subject>(mut subject: S, name: &str, check: fn(&mut S)) {
    let known = subject
        .deviations()
        .iter()
        .find(|(n, _)| *n == name)
        .map(|&(_, why)| why);
    let Some(why) = known else {
        check(&mut subject);
        subject.verdict();
        return;
    };
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        check(&mut subject);
        subject.verdict();
    }));
    assert!(
        outcome.is_err(),
        "`{name}` passes now, but is listed as a known deviation ({why}): take it off the list"
    );
    eprintln!("known deviation, failed as listed: {name}: {why}");
}

/// Defines one `#[test]` per conformance check, each running it on a
/// fresh subject made by the expression given (see the module docs).
#[macro_export]
macro_rules! conformance_suite {
    ($subject:expr) => {
        $crate::conformance_suite!(@each $subject;
            put_get_round_trip,
            lengths_at_the_limits,
            every_atomic,
            notify_is_delivered_after_the_writes_before_it,
            flush_completes_after_the_writes_it_covers,
            fence_orders_writes_across_lanes,
            flushes_and_fences_with_nothing_outstanding_succeed,
            every_operation_of_a_mixed_load_completes_once,
            invalid_accesses_fail_alone,
            a_deregistered_window_refuses_access,
            local_memory_in_use_is_kept_until_released,
            graceful_close_comes_last,
            forced_close_completes_everything_in_flight,
            peer_death_completes_everything,
        );
    };
    (@each $subject:expr; $($check:ident),* $(,)?) => {
        $(
            #[test]
            fn $check() {
                $crate::conformance::run(
                    $subject,
                    stringify!($check),
                    $crate::conformance::checks::$check,
                );
            }
        )*
    };
}
