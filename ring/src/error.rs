//! Hot-path ring errors: plain values, no allocation.

use crate::Status;
use core::fmt;

/// The shared indices of a ring contradict each other: the producer's tail
/// is more than `capacity` entries ahead of the consumer's head (or behind
/// it). Only corrupt shared memory, or a peer that broke the protocol, can
/// cause this; the ring is left as it was and nothing was read or written.
///
/// The same error reports a ring that the other side gave up (its
/// `FAILED` flag: [`ProducerLine::FAILED`](crate::ProducerLine::FAILED),
/// [`ConsumerLine::FAILED`](crate::ConsumerLine::FAILED)) because it found
/// the memory corrupt: then the indices as seen may be consistent
/// ([`marked_failed`](Corrupt::marked_failed)). Either way the ring is
/// unusable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Corrupt {
    /// The consumer's head, as seen.
    pub head: u32,
    /// The producer's tail, as seen.
    pub tail: u32,
    /// The ring's capacity.
    pub capacity: u32,
}

impl Corrupt {
    /// Whether the indices as seen are consistent: the error is the other
    /// side's `FAILED` flag (it found the ring memory corrupt), not these
    /// indices.
    pub const fn marked_failed(&self) -> bool {
        self.tail.wrapping_sub(self.head) <= self.capacity
    }
}

impl fmt::Display for Corrupt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.marked_failed() {
            return write!(
                f,
                "ring failed: the other side found its memory corrupt (tail {}, head {}, capacity {})",
                self.tail, self.head, self.capacity
            );
        }
        write!(
            f,
            "corrupt ring indices: tail {} - head {} exceeds capacity {}",
            self.tail, self.head, self.capacity
        )
    }
}

impl std::error::Error for Corrupt {}

/// Why an entry could not be pushed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingError {
    /// The ring is full: the consumer has not caught up. Retry later.
    Full,
    /// The shared indices are corrupt.
    Corrupt(Corrupt),
}

impl RingError {
    /// The status a C caller would see.
    pub const fn status(self) -> Status {
        match self {
            RingError::Full => Status::NoResource,
            RingError::Corrupt(_) => Status::RingCorrupt,
        }
    }
}

impl From<Corrupt> for RingError {
    fn from(c: Corrupt) -> Self {
        RingError::Corrupt(c)
    }
}

impl fmt::Display for RingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RingError::Full => f.write_str("ring is full"),
            RingError::Corrupt(c) => c.fmt(f),
        }
    }
}

impl std::error::Error for RingError {}
