//! When something held may be released: after a number of polls, or at a
//! moment of `CLOCK_MONOTONIC` (the clock of `SimDriver`'s timerfd).

use std::time::Duration;

/// When something held becomes eligible.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Due {
    /// At this poll count.
    Poll(u64),
    /// At this `CLOCK_MONOTONIC` time, in nanoseconds.
    Time(u64),
}

/// Where a wrapper is when it looks at what it holds: its poll count and
/// the time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Moment {
    /// Polls so far (the current one included, inside `poll`).
    pub(crate) polls: u64,
    /// `CLOCK_MONOTONIC`, in nanoseconds ([`now_ns`]).
    pub(crate) ns: u64,
}

impl Due {
    /// `polls` polls after poll `now` (at least one: the next poll).
    pub(crate) fn after_polls(now: u64, polls: u64) -> Due {
        Due::Poll(now + polls.max(1))
    }

    /// `delay` after the time `now` (nanoseconds).
    pub(crate) fn after_time(now: u64, delay: Duration) -> Due {
        Due::Time(now.saturating_add(u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX)))
    }

    /// Whether it has passed at `at`.
    pub(crate) fn passed(self, at: Moment) -> bool {
        match self {
            Due::Poll(p) => p <= at.polls,
            Due::Time(t) => t <= at.ns,
        }
    }

    /// The time it is due at, if it is a time (what a wake descriptor is
    /// armed for).
    pub(crate) fn time(self) -> Option<u64> {
        match self {
            Due::Time(t) => Some(t),
            Due::Poll(_) => None,
        }
    }
}

/// Nanoseconds of `CLOCK_MONOTONIC`.
pub(crate) fn now_ns() -> u64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC is always readable");
    (ts.tv_sec() as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec() as u64)
}
