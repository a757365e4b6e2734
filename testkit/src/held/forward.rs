//! Forwarding to the inner driver: an operation or flush handed on, what
//! the inner driver answered, the completions a wrapper made outside
//! `poll` returned ahead of the inner driver's, and the log record of what
//! took effect.

#![allow(unsafe_code)] // forwards the unsafe `post`

use ringfence::{Completion, Driver, DriverEp, Fails, LaneMask, Op, OpKind, Posted, Token};
use ringfence_ring::Status;
use std::collections::VecDeque;

/// One operation as it took effect at the inner driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Executed {
    /// The engine endpoint's driver handle.
    pub ep: DriverEp,
    /// The lane.
    pub lane: u8,
    /// What it was.
    pub kind: OpKind,
    /// Its remote address (0 for NOTIFY).
    pub remote_addr: u64,
    /// Its operand (the tag, for NOTIFY).
    pub operand: u64,
    /// Whether it carried the transport fence flag.
    pub fence: bool,
}

impl Executed {
    /// The record of `op`, posted on `ep`.
    pub(crate) fn of(ep: DriverEp, op: &Op) -> Executed {
        Executed {
            ep,
            lane: op.lane,
            kind: op.kind,
            remote_addr: op.remote.map_or(0, |(_, addr)| addr),
            operand: op.operand,
            fence: op.fence,
        }
    }
}

/// What the inner driver made of a forwarded operation or flush.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Forwarded {
    /// Finished inside the call: its completion.
    Done(Completion),
    /// In flight: its completion comes out of the inner driver's `poll`.
    Later,
    /// Refused for now ([`Posted::NoResource`]): nothing was done.
    Full,
}

impl Forwarded {
    fn from(posted: Posted, token: Token) -> Forwarded {
        match posted {
            Posted::Done(result) => Forwarded::Done(Completion::new(token, result)),
            Posted::InFlight => Forwarded::Later,
            Posted::NoResource => Forwarded::Full,
        }
    }

    /// Whether it took effect: finished, and succeeded.
    pub(crate) fn succeeded(&self) -> bool {
        matches!(self, Forwarded::Done(c) if c.result.is_ok())
    }
}

/// Hands `op` to `inner`'s `post`.
///
/// # Safety
/// As [`Driver::post`]: the wrapper got `op` through its own `post`, and
/// its caller's guarantee for the local memory still holds (the operation's
/// completion has not been returned, and no quiesce covering it returned).
pub(crate) unsafe fn post<D: Driver>(
    inner: &mut D,
    ep: DriverEp,
    op: &Op,
    token: Token,
) -> Forwarded {
    // SAFETY: the caller's guarantee, passed on.
    Forwarded::from(unsafe { inner.post(ep, op, token) }, token)
}

/// Hands a flush of `lanes` of `ep` to `inner`.
pub(crate) fn flush<D: Driver>(
    inner: &mut D,
    ep: DriverEp,
    lanes: LaneMask,
    token: Token,
) -> Forwarded {
    Forwarded::from(inner.flush(ep, lanes, token), token)
}

/// The start of a wrapper's `poll`: the completions it made outside `poll`
/// (`ready`), then the inner driver's. Returns how many it put in `out`.
pub(crate) fn poll<D: Driver>(
    ready: &mut VecDeque<Completion>,
    inner: &mut D,
    out: &mut [Completion],
) -> usize {
    let n = ringfence::drain_completions(ready, out);
    n + inner.poll(&mut out[n..])
}

/// The completion of something held and never started: canceled.
pub(crate) fn canceled(token: Token) -> Completion {
    Completion::new(token, Err(Status::Canceled))
}

/// The completion of something held and lost with its endpoint or
/// channel: canceled, as [`Fails::Lost`].
pub(crate) fn lost(token: Token) -> Completion {
    canceled(token).failing(Fails::Lost)
}
