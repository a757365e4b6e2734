//! Helpers shared by ringfence's integration tests: running a role of the
//! same test binary in a child process, passing descriptors between
//! processes, bounding waits so a bug shows up as a failure, not a hang,
//! and replaying fuzz corpora on stable.
//!
//! Unsafe code is confined to [`fdpass`] (adopting descriptors received with
//! `SCM_RIGHTS`) and [`scribble`] (writing garbage into shared memory on
//! purpose).
#![deny(unsafe_code, missing_docs)]

pub mod child;
pub mod corpus;
pub mod fdpass;
pub mod scribble;
pub mod shm;

use std::time::{Duration, Instant};

/// A limit that only catches hangs: generous, never a performance claim.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    end: Instant,
    what: &'static str,
}

impl Deadline {
    /// A deadline `limit` from now for `what`.
    pub fn after(limit: Duration, what: &'static str) -> Deadline {
        Deadline {
            end: Instant::now() + limit,
            what,
        }
    }

    /// Panics with `detail` if the deadline has passed.
    ///
    /// # Panics
    /// When the deadline has passed: the test is hung.
    #[track_caller]
    pub fn check(&self, detail: impl FnOnce() -> String) {
        if Instant::now() > self.end {
            panic!("{} did not finish in time (hang?): {}", self.what, detail());
        }
    }
}

/// A bounded spin: `spin` busy-waits a few rounds, then yields the CPU, so
/// two busy-polling processes make progress on two shared cores.
#[derive(Debug, Default)]
pub struct Backoff {
    idle: u32,
}

impl Backoff {
    /// After this many idle rounds, callers that can sleep should.
    pub const SLEEP_AFTER: u32 = 256;

    /// One idle round; returns whether the caller has been idle long enough
    /// to go to sleep on a doorbell.
    pub fn idle(&mut self) -> bool {
        self.idle = self.idle.saturating_add(1);
        if self.idle < 16 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
        self.idle >= Self::SLEEP_AFTER
    }

    /// Progress was made: start over.
    pub fn reset(&mut self) {
        self.idle = 0;
    }
}
