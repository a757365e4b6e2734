//! What driver calls answer: the [`Token`] an in-flight request carries,
//! [`Posted`] and [`Connect`] at once, [`Completion`]s (with their
//! failure events, [`Fails`]) through `poll`, and [`Quiesced`] for a
//! [`Quiesce`] scope.

use super::DriverEp;
#[cfg(doc)]
use super::{DirectPath, Driver};
use crate::driver::DriverMemKey;
use ringfence_ring::Status;

/// Identifies one posted operation or flush in the driver's completions.
/// Opaque to the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Token(pub u64);

impl Token {
    /// Names nothing in flight: a completion that carries it is counted as
    /// stray. For drivers that run an operation through their own `post`
    /// from [`DirectPath::execute`].
    pub const NONE: Token = Token(u64::MAX);
}

/// What [`Driver::connect`] started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Connect {
    /// The connection is up already (no handshake, or it finished inside
    /// the call). No completion follows.
    Done(DriverEp),
    /// The handshake goes on: its outcome comes out of [`Driver::poll`]
    /// exactly once, as a [`Completion`] with the token given to
    /// `connect` (`Ok(_)`: up; `Err(status)`: failed, and the handle is
    /// dead). Until then the handle is valid for `unpack_rkey` and
    /// `disconnect`, never for `post` or `flush`.
    InFlight(DriverEp),
}

/// What [`Driver::quiesce`] must make safe to free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quiesce {
    /// One registration, already withdrawn with [`Driver::deregister`].
    Memory(DriverMemKey),
    /// Everything: the worker is going away and every connection was
    /// released with [`Driver::disconnect`].
    All,
}

/// A driver's answer to [`Driver::quiesce`]: whether the memory of the
/// scope may be freed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Quiesced {
    /// Nothing this driver started can read or write the memory any more:
    /// the engine may free it. Final for this scope: the engine does not
    /// ask again.
    Done,
    /// Not yet: something the driver started may still access the memory
    /// (a canceled receive whose completion has not come back, a send that
    /// still reads the window, a peer's PUT still arriving into it). The
    /// engine keeps the memory and asks again, with the same scope, from
    /// later progress rounds, after polling the driver; the driver makes
    /// progress on it in [`Driver::poll`] (and may in `quiesce`), without
    /// waiting for anything.
    Pending,
    /// The driver cannot promise that it ever will be safe (a receive into
    /// the window that the kernel still holds after its connection was
    /// closed and its cancellation never came back): the engine must never
    /// free or reuse the memory, and leaks it on purpose (a warning says
    /// so, with its size). Final for this scope.
    Leak,
}

/// The outcome of a post or a flush.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Posted {
    /// Finished already: `Ok(bytes)` or the failure. No completion follows.
    Done(Result<u32, Status>),
    /// Its completion will be returned by [`Driver::poll`], exactly once.
    InFlight,
    /// Nothing was done: the lane or the peer has no room. Post it again
    /// later; no completion follows.
    NoResource,
}

/// A finished operation or flush, returned by [`Driver::poll`].
///
/// # What the engine tolerates
/// A completion whose token names nothing in flight now (a second copy
/// of one already returned, one for an operation or flush the engine has
/// given up on, a pending connect's after [`Driver::disconnect`]) is
/// stray: the engine counts it and changes nothing. Tokens carry serials,
/// so a late completion is never taken for a later request that reuses
/// its slot. A driver must still return each completion once; the
/// tolerance is for transports that cannot help it (a replaced lane that
/// delivers a flush twice).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The token given to `post`, `flush` or `connect`.
    pub token: Token,
    /// `Ok(bytes)` or the failure.
    pub result: Result<u32, Status>,
    /// What a failure means beyond this operation ([`Fails`]); ignored
    /// on success and for connects (a failed handshake fails its endpoint
    /// with its own status).
    pub fails: Fails,
}

impl Completion {
    /// A completion judged by its status ([`Fails::ByStatus`]).
    pub const fn new(token: Token, result: Result<u32, Status>) -> Completion {
        Completion {
            token,
            result,
            fails: Fails::ByStatus,
        }
    }

    /// The same completion, with what its failure means.
    pub const fn failing(self, fails: Fails) -> Completion {
        Completion { fails, ..self }
    }
}

/// What a failed [`Completion`] means for its endpoint, beyond its own
/// operation: the driver says so, because the status alone cannot. An RC
/// queue pair that sees a remote access error moves to the error state and
/// flushes every later work request with `IBV_WC_WR_FLUSH_ERR`: the first
/// completion is the real cause and kills the endpoint though its status
/// (`AccessDenied`) would not, and the flushed ones are consequences that
/// must not become the endpoint's error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fails {
    /// The engine decides from the status: one that
    /// [`fails_endpoint`] names fails the endpoint (its sticky error, if
    /// it is the first), any other only the operation. The default, right
    /// where each status says what happened to the connection.
    #[default]
    ByStatus,
    /// Only this operation failed, whatever the status: the endpoint goes
    /// on (the target refused this one access).
    Operation,
    /// The endpoint is dead, and this status is why: it fails with it as
    /// its sticky error (unless it failed already: the first cause stays).
    /// The operation completes with its own `result`. A lane that fails
    /// and is not replaced is its endpoint failing: the engine cannot move
    /// a lane's work elsewhere.
    Endpoint(Status),
    /// Lost to an earlier failure rather than failed for a cause of its
    /// own: flushed by the transport after its endpoint failed, or dropped
    /// with a lane the driver replaced by a new generation
    /// ([`Driver::lane_generation`] already answers the new one). On an
    /// endpoint that failed it completes with the endpoint's sticky error;
    /// on one that is still up (the lane was replaced), the operation
    /// completes with its own `result` and the endpoint goes on, and a
    /// fence flush lost that way is started again over every lane (R38).
    /// Never fails the endpoint, never becomes its error.
    Lost,
}

/// Whether a failure with `status`, judged by its status alone
/// ([`Fails::ByStatus`], and every [`Posted::Done`] error), fails the
/// whole endpoint rather than only the operation: the connection is gone
/// ([`Status::Transport`], [`Status::PeerUnreachable`],
/// [`Status::Timeout`], [`Status::EndpointClosed`]), or the operation was
/// canceled under it ([`Status::Canceled`]). A failed fence flush fails
/// its endpoint whatever its status (its epoch cannot advance).
pub const fn fails_endpoint(status: Status) -> bool {
    matches!(
        status,
        Status::Transport
            | Status::PeerUnreachable
            | Status::Timeout
            | Status::EndpointClosed
            | Status::Canceled
    )
}

/// Moves completions from `queue` into `out`; returns how many. For
/// drivers that keep completions produced outside `poll` (disconnect).
pub fn drain_completions(
    queue: &mut std::collections::VecDeque<Completion>,
    out: &mut [Completion],
) -> usize {
    let n = queue.len().min(out.len());
    for (slot, c) in out.iter_mut().zip(queue.drain(..n)) {
        *slot = c;
    }
    n
}

impl Default for Completion {
    fn default() -> Self {
        Completion::new(Token(0), Ok(0))
    }
}
