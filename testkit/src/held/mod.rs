//! The held-operations core of the test kit's two driver wrappers,
//! [`FaultInjector`](crate::FaultInjector) and
//! [`SimDriver`](crate::SimDriver): both take what the engine posts and
//! flushes, hold it per lane, and hand it to their inner driver later, in
//! an order and at a time of their own. What they share is here:
//!
//! - [`HeldOp`] and [`HeldFlush`]: a held operation or flush, with its
//!   sequence number, when it is due, and what the wrapper adds of its own
//!   (`meta`: an injected failure, a timing);
//! - [`HeldLanes`]: the held operations of every endpoint, one queue per
//!   lane, with the release rule: on an ordered lane the head of a channel
//!   (a replaced lane's old channel and its new one are not ordered with
//!   each other), on an unordered lane any due operation before the next
//!   one that carries the transport fence flag, picked by a draw;
//! - [`HeldFlushes`]: the held flushes, each released only once it is due
//!   and every operation posted before it on its lanes has left
//!   ([`HeldLanes::holds_before`]);
//! - [`Due`] and [`Moment`]: due after a number of polls or at a time of
//!   `CLOCK_MONOTONIC`;
//! - [`Rng`]: the seeded xorshift64 both draw from;
//! - forwarding ([`forward`]): handing an operation or flush to the
//!   inner driver, the completions made outside `poll` returned before the
//!   inner driver's, and the [`Executed`] log record.
//!
//! Each wrapper keeps its own policy: when something is due (its timing
//! types), which lanes are visited in which order, what a refused
//! operation does, and everything beyond holding (faults, handshakes, the
//! wake descriptor).

pub(crate) mod forward;

mod due;
mod flushes;
mod lanes;
mod rng;

pub use forward::Executed;

pub(crate) use due::{Due, Moment, now_ns};
pub(crate) use flushes::HeldFlushes;
pub(crate) use lanes::HeldLanes;
pub(crate) use rng::Rng;

use ringfence::{DriverEp, LaneMask, Op, Quiesce, Token};

/// One held operation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeldOp<M> {
    /// The operation, as posted.
    pub(crate) op: Op,
    /// Its token.
    pub(crate) token: Token,
    /// Its place in posting order, over every lane ([`HeldLanes::next_seq`]).
    pub(crate) seq: u64,
    /// The lane's channel it was posted on: operations of one channel of
    /// a lane are ordered, those of two channels are not (the
    /// `FaultInjector`'s lane generations; 0 where lanes are never
    /// replaced).
    pub(crate) channel: u32,
    /// When it may be released; `None` until a commit covers it.
    pub(crate) due: Option<Due>,
    /// What the wrapper keeps with it.
    pub(crate) meta: M,
}

impl<M> HeldOp<M> {
    /// Whether its time has come at `at`.
    pub(crate) fn is_due(&self, at: Moment) -> bool {
        self.due.is_some_and(|d| d.passed(at))
    }
}

/// One held flush.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeldFlush<M> {
    /// The endpoint handle.
    pub(crate) ep: DriverEp,
    /// The lanes it covers.
    pub(crate) lanes: LaneMask,
    /// Its token.
    pub(crate) token: Token,
    /// Every operation on `lanes` with a sequence number up to this one was
    /// posted before it, and must have left first.
    pub(crate) seq: u64,
    /// When it may be released; `None` until a commit covers it.
    pub(crate) due: Option<Due>,
    /// What the wrapper keeps with it.
    pub(crate) meta: M,
}

impl<M> HeldFlush<M> {
    /// Whether its time has come at `at` (what it covers aside).
    pub(crate) fn is_due(&self, at: Moment) -> bool {
        self.due.is_some_and(|d| d.passed(at))
    }
}

/// Whether a quiesce of `scope` covers `op`: every operation, or those
/// whose local memory is that registration.
pub(crate) fn covers(scope: Quiesce, op: &Op) -> bool {
    match scope {
        Quiesce::All => true,
        Quiesce::Memory(key) => op.local_key == Some(key),
    }
}
