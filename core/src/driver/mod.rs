//! The boundary between the engine and the transports.
//!
//! A driver moves bytes; the engine decides what, when, and in which order.
//! Drivers never call back into the engine (a driver method that calls the
//! `Worker`, a `QueuePair` or a buffer of the worker that drives it panics
//! with a message naming this rule, rather than deadlock): [`Driver::post`] and
//! [`Driver::flush`] return [`Posted::Done`] (finished, with its result),
//! [`Posted::InFlight`] (its completion will come out of [`Driver::poll`]
//! as a [`Completion`] carrying the same [`Token`]), or
//! [`Posted::NoResource`] (nothing was done; try again later). That
//! tri-state is what keeps a synchronously completing flush from re-entering
//! the engine (FENCE.md R25, W1).
//!
//! The seam is shaped for asynchronous drivers (a NIC that writes memory
//! long after `post` returned, a TCP acknowledgement, a CUDA event);
//! synchronous ones (loopback, shm) are the special case:
//!
//! - **One doorbell per round.** The engine calls [`Driver::commit`] once
//!   at the end of every progress round, after that round's posts and
//!   flushes; a driver may hold them back until then and submit them
//!   together (one `io_uring_enter`, one chained `ibv_post_send`, one batch
//!   of stream launches).
//! - **Sleep is a conversation.** [`Driver::wake_fds`] are descriptors that
//!   become readable when the driver has completions or incoming work; the
//!   core thread sleeps on them and on the SQ doorbell at once. Before it
//!   sleeps it asks every driver to [`prepare_sleep`](Driver::prepare_sleep)
//!   (arm a one-shot CQ notification, enqueue what will signal it, or
//!   answer [`Sleep::NotNow`]), and tells it when it [`woke`](Driver::woke).
//!   A busy-polling core thread never asks for an interrupt.
//! - **Asynchronous connect.** [`Driver::connect`] returns at once; a
//!   connection that needs a handshake completes through [`Driver::poll`]
//!   with the token it was given.
//! - **Quiesce before free.** The engine calls [`Driver::quiesce`] before
//!   memory is freed (deregistration, teardown), and frees nothing until
//!   the driver answers [`Quiesced::Done`]: nothing it started can access
//!   that memory any more.
//! - **Teardown may take time.** A quiesce that cannot finish now answers
//!   [`Quiesced::Pending`] and the engine asks again from its later
//!   rounds, the driver progressing it in [`Driver::poll`]; one that may
//!   never finish answers [`Quiesced::Leak`], and the memory is leaked
//!   rather than freed.
//! - **Memory kinds.** A driver registers only the [`MemKind`]s its
//!   [`Capabilities::mem_kinds`] lists, and unpacks only key parts of
//!   memory its [`Capabilities::remote_kinds`] reaches; device memory
//!   never reaches a host-only driver. Each registration may be
//!   [declined](Registered::Declined) or kept for [local
//!   use](Registered::Local), and each key part found
//!   [unreachable](Unpacked::Unreachable): an operation goes to a driver
//!   that holds both its local memory and its remote part, or fails with
//!   [`Status::Unsupported`].
//! - **Slow registration runs unlocked.** What takes long (pinning a
//!   large region, opening an IPC handle) runs in a [`Prepare`] phase
//!   without the engine lock, while other endpoints progress; the short
//!   second phase (`register`, `unpack_rkey`) takes its result.
//! - **The direct path is an extension.** A driver that finishes
//!   operations inside the call may offer [`DirectPath`] through
//!   [`Driver::direct`]; the engine uses it only when offered.

// The trait declares the unsafe data-path contract (`post`); no unsafe
// code runs here.
#![allow(unsafe_code)]

mod direct;

pub use direct::{DirectPath, execute_by_post};

use crate::NotifyPool;
use crate::memory::{MemKind, MemKinds};
use ringfence_ring::{AtomicOp, Status};
use std::fmt;
use std::os::fd::BorrowedFd;
use std::sync::Arc;

/// A driver's answer when the core thread is about to sleep
/// ([`Driver::prepare_sleep`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum Sleep {
    /// Armed: from now until [`Driver::woke`], anything that arrives for
    /// [`Driver::poll`] (a completion, a finished handshake, a peer's
    /// operation to execute) makes one of [`Driver::wake_fds`] readable.
    /// Also the answer of a driver with nothing that can arrive on its own
    /// (everything it does finishes inside a call).
    Ready,
    /// Sleep only while no endpoint with lanes on this driver has work at
    /// it (operations or flushes in flight, a handshake): the driver's
    /// work completes only when it is polled, and nothing would wake the
    /// core thread for it. The default of a driver without descriptors.
    WhenIdle,
    /// Armed as [`Ready`](Sleep::Ready), but poll the driver again after
    /// at most this long even if nothing became readable (a driver that
    /// must look at something no descriptor signals, such as a peer's
    /// memory).
    Within(std::time::Duration),
    /// Stay up: something has arrived already (found while arming), or the
    /// driver holds work back that only another round sends (an
    /// acknowledgement held for batching). The core thread runs another
    /// round instead of sleeping.
    NotNow,
}

/// A set of lanes of one endpoint: bit `i` is lane `i`.
pub type LaneMask = u64;

/// The most lanes an endpoint can have (one bit of a [`LaneMask`] each).
pub const MAX_LANES: u8 = 64;

/// What a driver can do. [`Capabilities::new`] claims nothing beyond the
/// limits it is given: a driver sets each field it supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Operations posted on one lane take effect at the target in posting
    /// order (RC QP, TCP stream, shm FIFO, one CUDA stream).
    pub ordered_lanes: bool,
    /// The ATOMIC operations the driver executes (verbs has no SWAP).
    pub atomic_ops: AtomicOps,
    /// What executes them, and so which other atomics on the same word
    /// they are atomic with ([`AtomicDomain`]).
    pub atomic_domain: AtomicDomain,
    /// The driver executes GET.
    pub get: bool,
    /// The driver delivers NOTIFY payloads.
    pub notify: bool,
    /// A NOTIFY posted on a lane is delivered after every write posted
    /// before it on that lane has taken effect (an RC QP's write with
    /// immediate after writes, a TCP stream, a CUDA stream): the engine
    /// then orders a NOTIFY by the weak path when its own lane is the only
    /// dirty one (a transport fence flag, no flush), and by a flush
    /// otherwise (FENCE.md R8, R9).
    pub notify_ordered: bool,
    /// Memory kinds it registers (for local use, remote access or both:
    /// [`Registered`]).
    pub mem_kinds: MemKinds,
    /// Memory kinds at a peer it reaches: a part of a peer's key for
    /// memory of another kind is never unpacked by it, and operations on
    /// that key take another driver's lanes (or fail with
    /// [`Status::Unsupported`]). A CUDA driver that copies between host
    /// and device memory registers both kinds but reaches only a peer's
    /// device memory (IPC maps nothing else): host-to-host PUTs then go to
    /// shm or tcp.
    pub remote_kinds: MemKinds,
    /// Most lanes per endpoint, `1..=64`.
    pub max_lanes: u8,
    /// Largest single PUT/GET/NOTIFY in bytes, at least 1.
    pub max_len: u32,
}

impl Capabilities {
    /// `max_lanes` lanes per endpoint and operations of up to `max_len`
    /// bytes, and nothing else: lanes unordered, no atomics, GET or NOTIFY,
    /// no memory kind. The driver sets what it supports.
    pub const fn new(max_lanes: u8, max_len: u32) -> Self {
        Capabilities {
            ordered_lanes: false,
            atomic_ops: AtomicOps::NONE,
            atomic_domain: AtomicDomain::Host,
            get: false,
            notify: false,
            notify_ordered: false,
            mem_kinds: MemKinds::NONE,
            remote_kinds: MemKinds::NONE,
            max_lanes,
            max_len,
        }
    }

    /// Every operation (GET, every atomic, NOTIFY ordered after the writes
    /// before it on its lane) on ordered lanes over host memory, atomics
    /// executed by a CPU: what a complete host transport claims.
    pub const fn host_rma(max_lanes: u8, max_len: u32) -> Self {
        Capabilities {
            ordered_lanes: true,
            atomic_ops: AtomicOps::ALL,
            atomic_domain: AtomicDomain::Host,
            get: true,
            notify: true,
            notify_ordered: true,
            mem_kinds: MemKinds::HOST,
            remote_kinds: MemKinds::HOST,
            max_lanes,
            max_len,
        }
    }

    /// Why these capabilities cannot be used, if they cannot: lanes
    /// outside `1..=64` or a zero `max_len`.
    pub fn invalid(&self) -> Option<&'static str> {
        if self.max_lanes == 0 || self.max_lanes > MAX_LANES {
            Some("max_lanes must be 1..=64")
        } else if self.max_len == 0 {
            Some("max_len must be at least 1")
        } else {
            None
        }
    }

    /// Whether memory of `kind` can be registered.
    pub fn supports_mem_kind(&self, kind: MemKind) -> bool {
        self.mem_kinds.contains(kind)
    }

    /// Whether a peer's memory of `kind` can be reached.
    pub fn reaches(&self, kind: MemKind) -> bool {
        self.remote_kinds.contains(kind)
    }
}

/// A set of [`AtomicOp`]s: the atomics a driver executes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomicOps(u8);

impl AtomicOps {
    /// No atomic.
    pub const NONE: AtomicOps = AtomicOps(0);
    /// ADD, FADD, SWAP and CSWAP.
    pub const ALL: AtomicOps = AtomicOps::NONE
        .with(AtomicOp::ADD)
        .with(AtomicOp::FADD)
        .with(AtomicOp::SWAP)
        .with(AtomicOp::CSWAP);

    /// This set with `op` added.
    pub const fn with(self, op: AtomicOp) -> AtomicOps {
        AtomicOps(self.0 | 1 << (op.as_raw() & 7))
    }

    /// This set without `op`.
    pub const fn without(self, op: AtomicOp) -> AtomicOps {
        AtomicOps(self.0 & !(1 << (op.as_raw() & 7)))
    }

    /// Whether `op` is in the set.
    pub const fn contains(self, op: AtomicOp) -> bool {
        self.0 & 1 << (op.as_raw() & 7) != 0
    }

    /// Whether the set is empty (the driver executes no ATOMIC).
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

/// What executes a driver's atomics, which decides what they are atomic
/// with. Two atomics on one word are atomic with each other only if the
/// same kind of agent executes both:
///
/// - [`Host`](AtomicDomain::Host): a CPU's locked instructions on host
///   memory (loopback, shm, and the tcp target, which executes them in its
///   progress). Coherent with each other across host drivers, and with
///   the application's own CPU atomics on that word.
/// - [`Nic`](AtomicDomain::Nic): an RDMA NIC. Atomic with other NIC
///   atomics through the same device only; not with CPU atomics on the
///   same word, nor with another driver's.
/// - [`Device`](AtomicDomain::Device): a GPU kernel on device memory.
///   Atomic with the device's own atomics only.
///
/// On an endpoint with lanes on several drivers, every ATOMIC goes to the
/// atomic lane group (the last group whose driver executes atomics) or to
/// another group of the same domain; one that only a driver of another
/// domain could run fails with [`Status::Unsupported`] instead, so that
/// atomics on one word never mix domains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AtomicDomain {
    /// A CPU.
    Host,
    /// An RDMA NIC.
    Nic,
    /// A GPU.
    Device,
}

/// What the peer of one connection accepts, learnt at connect
/// ([`Driver::peer_limits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PeerLimits {
    /// The largest NOTIFY payload the peer's notification buffers hold.
    pub max_notify_len: u32,
}

impl PeerLimits {
    /// A peer that takes NOTIFY payloads of up to `max_notify_len` bytes.
    pub const fn new(max_notify_len: u32) -> PeerLimits {
        PeerLimits { max_notify_len }
    }
}

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

/// A driver's handle for a connection to one peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DriverEp(pub u32);

/// A driver's handle for a local registration. Registration with a driver
/// that does not support the memory's kind yields none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DriverMemKey(pub u64);

/// A driver's handle for an unpacked remote key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DriverRkey(pub u32);

/// What [`Driver::register`] did with memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registered {
    /// Registered for local use and remote access: packed keys carry this
    /// driver's part ([`Driver::pack_rkey`]).
    Shared(DriverMemKey),
    /// Registered for local use only: the driver runs operations whose
    /// local side is this memory, but peers never reach it through this
    /// driver (packed keys carry no part of it). A CUDA driver's pinned
    /// host memory for host-device copies.
    Local(DriverMemKey),
    /// Not this driver's: it keeps nothing, the engine never names this
    /// memory to it again (no `deregister`, no `quiesce` of it), and its
    /// operations never use it. Other drivers may still register it; if
    /// none does, registration fails with [`Status::Unsupported`].
    Declined,
}

impl Registered {
    /// The key, unless declined.
    pub fn key(self) -> Option<DriverMemKey> {
        match self {
            Registered::Shared(key) | Registered::Local(key) => Some(key),
            Registered::Declined => None,
        }
    }
}

/// What [`Driver::unpack_rkey`] made of a peer's key part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unpacked {
    /// A handle for operations on the endpoint.
    Key(DriverRkey),
    /// The part is well formed, but names memory this driver cannot reach
    /// from here (device memory of another host, an IPC handle this
    /// process cannot open): the engine skips it, and operations on the
    /// key take another driver's lanes. The driver keeps nothing
    /// (no [`Driver::release_rkey`] follows). If no part of a key is
    /// usable, unpacking fails with [`Status::Unsupported`].
    Unreachable,
}

/// One driver's part of a peer's packed key, as the engine decoded and
/// checked it (the packed key's integrity check passed, and the part
/// names this driver): the region it covers at the peer, and the blob the
/// peer's driver of the same name packed. The blob is still the peer's
/// word: the driver validates it.
#[derive(Debug, Clone, Copy)]
pub struct KeyPart<'a> {
    /// What memory the region is at the peer (one of this driver's
    /// [`Capabilities::remote_kinds`]).
    pub kind: MemKind,
    /// The region's address, in the peer's address space.
    pub base: u64,
    /// The region's length in bytes, at least 1.
    pub len: u64,
    /// The peer driver's own part.
    pub blob: &'a [u8],
}

/// The slow first phase of registering memory and unpacking keys, run
/// without the engine lock (see [`Driver::prepare`]).
///
/// Registering a large region (`ibv_reg_mr` pins every page) or unpacking
/// an IPC key (`cuIpcOpenMemHandle` maps device memory) can take
/// milliseconds; under the engine lock that would stall every endpoint of
/// the worker. A driver that has such work does it here, on the
/// application thread that registers or unpacks, while the engine keeps
/// progressing, and hands the result to the second phase
/// ([`Driver::register`], [`Driver::unpack_rkey`]) as a [`Prepared`],
/// which takes only the lock's short while (a table entry).
///
/// Both methods may run on several threads at once, and at the same time
/// as any method of the driver: whatever they touch is theirs or
/// thread-safe (a protection domain, a CUDA context). If the second phase
/// never comes (another driver failed, the worker refused the
/// registration), the [`Prepared`] is dropped: its value's `Drop` undoes
/// the first phase (deregisters, closes the handle).
pub trait Prepare: Send + Sync + fmt::Debug {
    /// The slow part of registering `mem` (only of a kind in
    /// [`Capabilities::mem_kinds`]). The default does nothing.
    ///
    /// # Errors
    /// As [`Driver::register`]: the registration fails.
    fn register(&self, mem: &MemDesc) -> Result<Prepared, DriverError> {
        let _ = mem;
        Ok(Prepared::none())
    }

    /// The slow part of unpacking `part` for endpoint `ep` (only of a
    /// kind in [`Capabilities::remote_kinds`]; a request to the peer, an
    /// IPC handle to open). The default does nothing.
    ///
    /// # Errors
    /// As [`Driver::unpack_rkey`]: the unpack fails.
    fn unpack(&self, ep: DriverEp, part: &KeyPart<'_>) -> Result<Prepared, DriverError> {
        let _ = (ep, part);
        Ok(Prepared::none())
    }
}

/// What a [`Prepare`] phase made, for the second phase to take
/// ([`Prepared::take`]); empty for a driver without one.
#[derive(Default)]
pub struct Prepared(Option<Box<dyn std::any::Any + Send>>);

impl Prepared {
    /// Nothing prepared.
    pub fn none() -> Prepared {
        Prepared(None)
    }

    /// `value` for the second phase; dropped (undoing the first phase in
    /// its `Drop`) if that never comes.
    pub fn new<T: std::any::Any + Send>(value: T) -> Prepared {
        Prepared(Some(Box::new(value)))
    }

    /// The value, if one of type `T` was prepared.
    pub fn take<T: std::any::Any>(self) -> Option<T> {
        self.0?.downcast().ok().map(|b| *b)
    }

    /// Whether nothing was prepared.
    pub fn is_none(&self) -> bool {
        self.0.is_none()
    }
}

impl fmt::Debug for Prepared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "Prepared(..)"
        } else {
            "Prepared(none)"
        })
    }
}

/// Memory to register with a driver.
#[derive(Debug, Clone, Copy)]
pub struct MemDesc {
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// What memory it is.
    pub kind: MemKind,
    /// The random secret a remote access must present.
    pub secret: u64,
}

/// What an operation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// Local to remote.
    Put,
    /// Remote to local.
    Get,
    /// An 8-byte atomic on remote memory.
    Atomic(AtomicOp),
    /// A payload for the peer's notification buffers; `operand` is its tag.
    Notify,
}

/// One validated operation, as handed to [`Driver::post`].
///
/// The engine has checked the local range against the local registration and
/// the remote range against the bounds in the remote key; the driver's
/// target side still checks the key's secret and bounds itself, because the
/// key blob came from the wire. Whoever posts an `Op` vouches for its local
/// range (see the `# Safety` of [`Driver::post`]).
#[derive(Debug, Clone, Copy)]
pub struct Op {
    /// What to do.
    pub kind: OpKind,
    /// The lane to use, below the endpoint's lane count.
    pub lane: u8,
    /// Local address (PUT source, GET destination, fetched value, NOTIFY
    /// payload); unused by a non-fetching atomic.
    pub local_addr: u64,
    /// The driver's key for the local registration, if any.
    pub local_key: Option<DriverMemKey>,
    /// Remote key and address (PUT, GET, ATOMIC).
    pub remote: Option<(DriverRkey, u64)>,
    /// Bytes (8 for atomics).
    pub len: u32,
    /// Atomic operand, or the NOTIFY tag.
    pub operand: u64,
    /// Second atomic operand (CSWAP's swap value).
    pub operand2: u64,
    /// A transport fence: this operation must take effect after everything
    /// posted earlier on its lane (a weak fence, FENCE.md R8; the fence
    /// indicator of an RC work request).
    pub fence: bool,
}

/// What the engine gives a driver when the worker is built.
#[derive(Debug, Clone)]
pub struct DriverContext {
    /// Where incoming notifications go: the driver copies each payload into a
    /// buffer it claims from this pool ([`NotifyPool::deliver`]). When every
    /// buffer is taken, the release of the next one rings the worker's SQ
    /// doorbell: a driver that keeps the payload and retries from `poll`
    /// need not stop the core thread from sleeping.
    pub notify: Arc<NotifyPool>,
}

/// Memory a driver allocated for [`Worker::alloc_registered`](crate::Worker::alloc_registered)
/// (see [`Driver::alloc_memory`]): for example a sealed memfd mapping that
/// peers can map too. The worker keeps it alive while the registration or
/// any [`RegisteredBuf`](crate::RegisteredBuf) handle to it lives, and reads
/// and writes it only through raw copies and atomics.
///
/// # Safety
/// Implementors guarantee, for as long as the object lives:
/// - for host memory ([`MemKind::Host`]), `[addr(), addr() + len())` is
///   mapped, readable and writable memory of this process; for a device
///   kind it is the device's range (the worker never dereferences it);
///   neither value ever changes;
/// - `addr()` is 64-byte aligned and `len()` is at least the length asked
///   for in `alloc_memory`;
/// - the bytes were zero when the object was handed out;
/// - [`kind`](DriverMemory::kind) is the kind `alloc_memory` was asked for.
#[allow(unsafe_code)]
pub unsafe trait DriverMemory: Send + Sync + fmt::Debug {
    /// The start address.
    fn addr(&self) -> u64;
    /// The length in bytes.
    fn len(&self) -> usize;
    /// What memory it is.
    fn kind(&self) -> MemKind {
        MemKind::Host
    }
    /// Whether the length is zero (never, for memory handed to a worker).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A driver failure outside the data path (connect, register, keys).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverError {
    /// The status a caller sees.
    pub status: Status,
    /// What went wrong, for people.
    pub detail: String,
}

impl DriverError {
    /// A failure with `status` and a description.
    pub fn new(status: Status, detail: impl Into<String>) -> Self {
        DriverError {
            status,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for DriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.detail, self.status)
    }
}

impl std::error::Error for DriverError {}

/// A transport: shared memory, TCP, RDMA verbs, CUDA, or the built-in
/// loopback.
///
/// Every method runs on the thread that runs the worker's progress (or that
/// builds, connects or registers, under the same lock); none blocks on the
/// network or waits for a peer (`quiesce` answers [`Quiesced::Pending`]
/// instead).
/// Data-path methods (`post`, `flush`, `commit`, `poll`) must not allocate.
///
/// Wrappers (the test kit's `FaultInjector`) forward every method: a test
/// checks that each one overrides them all.
pub trait Driver: Send + fmt::Debug + 'static {
    /// A short, unique name (`"loopback"`, `"shm"`, …); it tags this
    /// driver's part of a worker address.
    fn name(&self) -> &'static str;

    /// What the driver can do.
    fn capabilities(&self) -> Capabilities;

    /// Called once when the worker is built, before anything else.
    fn attach(&mut self, ctx: DriverContext);

    /// This driver's part of the worker address: what a peer's driver of the
    /// same name needs to connect.
    fn address(&self) -> Vec<u8>;

    /// Starts connecting to a peer from its address part, with `lanes`
    /// lanes, and returns at once: [`Connect::Done`] if the connection is
    /// up, [`Connect::InFlight`] if a handshake goes on, whose outcome
    /// [`poll`](Driver::poll) reports with `token`. Must not wait for the
    /// peer (the engine lock is held); it may make system calls.
    ///
    /// # Errors
    /// The address is malformed, or the peer is known unreachable at once.
    fn connect(&mut self, peer: &[u8], lanes: u8, token: Token) -> Result<Connect, DriverError>;

    /// Releases a connection (up or still connecting). Operations and
    /// flushes still in flight on it complete (with an error if they cannot
    /// finish, [`Status::Canceled`] if never started) through `poll`; so
    /// does a pending connect, with [`Status::Canceled`]. The engine has
    /// given up on that connect attempt (its completion is stray: see
    /// [`Completion`]), but each operation's completion still completes its
    /// request: on an endpoint that failed, report them as [`Fails::Lost`]
    /// so that they carry its first cause.
    fn disconnect(&mut self, ep: DriverEp);

    /// Registers memory for local use and remote access
    /// ([`Registered::Shared`]), for local use only
    /// ([`Registered::Local`]), or not at all ([`Registered::Declined`]:
    /// not this driver's memory). Called only for kinds in
    /// [`Capabilities::mem_kinds`], under the engine lock, after
    /// [`Prepare::register`] (if the driver has a [`prepare`](Driver::prepare)
    /// phase) with what it made; `prepared` is empty otherwise. Must be
    /// quick: slow work belongs in the first phase.
    ///
    /// # Errors
    /// A resource ran out, or the driver would serve this memory but
    /// cannot: the whole registration fails (the other drivers' keys are
    /// withdrawn), so a driver answers `Err` only where the application
    /// must hear of it, and `Declined` for memory it does not serve.
    fn register(&mut self, mem: &MemDesc, prepared: Prepared) -> Result<Registered, DriverError>;

    /// Withdraws a registration: no remote access that starts after this
    /// returns succeeds, and the engine names the key again only in
    /// `quiesce(Quiesce::Memory(key))`. Accesses already started may still
    /// run until [`quiesce`](Driver::quiesce) answers [`Quiesced::Done`].
    ///
    /// It has no outcome of its own: withdrawing is immediate (a table
    /// entry, a revoked key), and whatever can outlast it is an access
    /// already started, which is exactly what the `quiesce` that follows
    /// answers for, as often as the engine asks. A driver whose withdrawal
    /// itself finishes later (a deregistration the device completes
    /// asynchronously) starts it here and answers `Pending` from `quiesce`
    /// until it is over.
    fn deregister(&mut self, key: DriverMemKey);

    /// The blob a peer needs to access a registration remotely. Asked
    /// only for keys registered [`Registered::Shared`].
    ///
    /// # Errors
    /// The key is unknown.
    fn pack_rkey(&self, key: DriverMemKey) -> Result<Vec<u8>, DriverError>;

    /// Turns a peer's key part into a handle usable on `ep`
    /// ([`Unpacked::Key`]), or says that this driver cannot reach the
    /// memory it names from here ([`Unpacked::Unreachable`]). Called only
    /// for parts of a kind in [`Capabilities::remote_kinds`], under the
    /// engine lock, after [`Prepare::unpack`] (if the driver has a
    /// [`prepare`](Driver::prepare) phase) with what it made.
    ///
    /// # Errors
    /// The blob is malformed, or names another peer: the whole unpack
    /// fails (parts other drivers unpacked are released).
    fn unpack_rkey(
        &mut self,
        ep: DriverEp,
        part: &KeyPart<'_>,
        prepared: Prepared,
    ) -> Result<Unpacked, DriverError>;

    /// The slow first phase of [`register`](Driver::register) and
    /// [`unpack_rkey`](Driver::unpack_rkey), run without the engine lock
    /// ([`Prepare`]). Asked once, when the worker is built. `None` (the
    /// default): the driver does everything in the second phase, which
    /// suits work that takes a table entry's time.
    fn prepare(&self) -> Option<Arc<dyn Prepare>> {
        None
    }

    /// Frees what [`unpack_rkey`](Driver::unpack_rkey) made for `rkey` on
    /// `ep` (a table entry, an IPC mapping, an imported handle); the
    /// engine never names it again. Called once per unpacked key, and only
    /// when no operation posted on `ep` is in flight (so none still uses
    /// it): when the application releases it, for keys still unpacked when
    /// `ep` was closed (after [`disconnect`](Driver::disconnect), with the
    /// handle it had, once what the driver still ran on it completed), and
    /// at teardown, after [`quiesce`](Driver::quiesce). Control path. The
    /// default does nothing: right for drivers whose key is a plain
    /// value.
    fn release_rkey(&mut self, ep: DriverEp, rkey: DriverRkey) {
        let _ = (ep, rkey);
    }

    /// Starts one operation on `ep` (a connection that is up). Returns
    /// [`Posted::Done`] if it finished inside the call, [`Posted::InFlight`]
    /// if its completion will come out of `poll` with `token`, or
    /// [`Posted::NoResource`] if nothing was done. The driver may hold an
    /// in-flight operation back until [`commit`](Driver::commit). Must not
    /// allocate or block.
    ///
    /// # Safety
    /// The caller (the engine) guarantees, for an operation that reads or
    /// writes local memory (a PUT's source, a GET's destination, a fetching
    /// atomic's result word, a NOTIFY's payload):
    /// - `[op.local_addr, op.local_addr + op.len)` lies inside memory
    ///   registered with this driver (as `op.local_key`, when the driver
    ///   registered it) or, for a NOTIFY, inside memory the caller owns;
    /// - that memory stays allocated and registered until this operation's
    ///   completion is returned (by this call or by `poll`), or until
    ///   [`quiesce`](Driver::quiesce) of a scope that covers it answers
    ///   [`Quiesced::Done`], whichever comes first (after
    ///   [`Quiesced::Leak`], for ever).
    unsafe fn post(&mut self, ep: DriverEp, op: &Op, token: Token) -> Posted;

    /// Starts a flush of `lanes` of `ep`: it completes when every operation
    /// posted on those lanes before it is remotely complete. An empty mask
    /// completes at once. It may be held back until
    /// [`commit`](Driver::commit), behind the posts it covers. Must not
    /// allocate or block.
    fn flush(&mut self, ep: DriverEp, lanes: LaneMask, token: Token) -> Posted;

    /// Whether the peer of `ep` is known gone: `Err` (e.g.
    /// [`Status::PeerUnreachable`]) if it is. The engine asks where a
    /// FLUSH or a graceful CLOSE completes without reaching the driver
    /// (nothing was written since the last flush): a flush succeeds only
    /// if the peer was alive when it completed, whether or not it had
    /// anything to flush. Must be cheap (no allocation, no blocking; the
    /// shm driver reads the peer's liveness word). The default knows
    /// nothing, so says alive.
    fn check_alive(&mut self, ep: DriverEp) -> Result<(), Status> {
        let _ = ep;
        Ok(())
    }

    /// The end of a progress round: everything posted and flushed since the
    /// last call goes to the transport now, together (one `io_uring_enter`,
    /// one chained `ibv_post_send`, one batch of stream launches). Called
    /// once per round, also when nothing was posted (then it should cost
    /// nothing). What a driver may hold back until here: the submission of
    /// in-flight posts and flushes. What it may not: completions (a
    /// `Posted::Done` operation is finished when `post` returns), and
    /// control calls (connect, register), which act at once. The default
    /// does nothing: drivers that start work inside `post` need no
    /// doorbell.
    fn commit(&mut self) {}

    /// Fills `out` with finished operations, flushes and connects; returns
    /// how many. Never blocks. The engine may stop calling it for a round
    /// while it keeps returning full batches; what is left comes next
    /// round.
    fn poll(&mut self, out: &mut [Completion]) -> usize;

    /// The descriptors that wake a sleeping core thread for this driver:
    /// an io_uring CQ eventfd, an `ibv_comp_channel` per device, an eventfd
    /// a CUDA host function signals. The core thread sleeps on all of them
    /// and the SQ doorbell at once (epoll, level-triggered). Asked once,
    /// when the core thread starts: they stay open, and the same, while the
    /// driver lives. Control path (it may allocate). Empty (the default):
    /// nothing of the driver's arrives on its own, or it is looked at on a
    /// timer ([`Sleep::Within`]).
    ///
    /// A descriptor needs to become readable only after
    /// [`prepare_sleep`](Driver::prepare_sleep) answered [`Sleep::Ready`]
    /// or [`Sleep::Within`], and only until [`woke`](Driver::woke): while
    /// the core thread busy-polls, a driver need not arm anything, and
    /// should not (no interrupt, no completion-channel read, no host
    /// function per round).
    fn wake_fds(&self) -> Vec<BorrowedFd<'_>> {
        Vec::new()
    }

    /// The core thread is about to sleep: arm what will wake it, and say
    /// whether it may ([`Sleep`]). Called under the engine lock, after a
    /// last progress round that found nothing to do, once per attempt to
    /// sleep; [`woke`](Driver::woke) follows every call, whatever any
    /// driver answered.
    ///
    /// The race to close is the one of a one-shot notification
    /// (`ibv_req_notify_cq`): arm first, then look once more (poll the CQ,
    /// read the stream's events) and answer [`Sleep::NotNow`] if anything
    /// is there; what the look found stays for the next `poll`, nothing is
    /// dropped. A driver that holds work back for a later round (an
    /// acknowledgement held to batch it, a busy receive) answers
    /// `NotNow` too, instead of writing its own descriptor. May make
    /// system calls; must not block or allocate.
    ///
    /// The default: [`Sleep::Ready`] for a driver with wake descriptors
    /// (level-triggered ones that are readable whenever the driver has
    /// something, which need no arming), [`Sleep::WhenIdle`] for one
    /// without.
    fn prepare_sleep(&mut self) -> Sleep {
        if self.wake_fds().is_empty() {
            Sleep::WhenIdle
        } else {
            Sleep::Ready
        }
    }

    /// The core thread is up again after [`prepare_sleep`](Driver::prepare_sleep)
    /// (it slept and something woke it, or some driver answered
    /// [`Sleep::NotNow`]): acknowledge what the sleep armed (a batch of
    /// completion-channel events), and stop asking for wake-ups. The next
    /// calls are progress rounds. The default does nothing.
    fn woke(&mut self) {}

    /// Makes the memory of `scope` safe to free, and says whether it is.
    ///
    /// # When the engine calls it
    /// - [`Quiesce::Memory`]: after [`deregister`](Driver::deregister) of
    ///   that key, before the registration's memory is freed (for memory
    ///   the application owns: before `Worker::deregister` tells the
    ///   application that it may free it).
    /// - [`Quiesce::All`]: at teardown, after every connection was released
    ///   with [`disconnect`](Driver::disconnect) and the engine polled what
    ///   they handed back, before any memory is freed.
    /// - Again, with the same scope, after each answer
    ///   [`Quiesced::Pending`]: once per later progress round, after that
    ///   round polled this driver (at teardown: rounds that only poll, for
    ///   a bounded time). Never again after `Done` or `Leak`. Scopes are
    ///   independent: several keys may be pending at once, and `All` may be
    ///   asked while some `Memory` scopes are pending (it covers them).
    ///
    /// # What each answer obliges
    /// - [`Quiesced::Done`]: nothing this driver started can read or write
    ///   that memory any more: in-flight operations that use it are
    ///   finished or canceled, incoming operations that target it are
    ///   finished or refused, and device or kernel work that touches it is
    ///   over (an io_uring receive into it has posted its CQE). The engine
    ///   frees it.
    /// - [`Quiesced::Pending`]: not yet. The driver has started what ends
    ///   the accesses (a cancel, a close, a timeout it keeps itself) and
    ///   makes progress on it from `poll` (or from the next `quiesce`).
    ///   The engine keeps the memory alive meanwhile, and the core thread
    ///   does not sleep while a quiesce is pending.
    /// - [`Quiesced::Leak`]: the driver cannot promise that the accesses
    ///   ever end (its connection is closed, but the kernel may still write
    ///   into the window). The engine never frees or reuses the memory.
    ///
    /// # Rules
    /// - Never wait for a peer, nor for long for the local device: answer
    ///   `Pending` and progress in `poll`. A peer that stops reading or
    ///   sending is the driver's to time out (closing its connection)
    ///   while it answers `Pending`.
    /// - Operations it cancels still complete exactly once, through `poll`
    ///   (with [`Status::Canceled`] or their real outcome), whatever it
    ///   answers.
    /// - Control path: it may allocate and make system calls.
    ///
    /// The default answers `Done`: right for drivers that finish every
    /// access inside the call that started it.
    fn quiesce(&mut self, scope: Quiesce) -> Quiesced {
        let _ = scope;
        Quiesced::Done
    }

    /// The synchronous fast path, if this driver offers it: runs of PUTs
    /// and GETs finished inside one call, and a prefetch hint. The engine
    /// asks once, when the worker is built, and uses it only if offered.
    /// `None` (the default) for drivers whose operations complete later.
    fn direct(&mut self) -> Option<&mut dyn DirectPath> {
        None
    }

    /// Allocates `len` bytes of memory of `kind` that this driver can register
    /// without copying (for example a sealed memfd that a peer maps), for
    /// [`Worker::alloc_registered`](crate::Worker::alloc_registered). The
    /// worker asks its drivers in order and uses the first `Some`; `None`
    /// (the default) means "no preference": the worker allocates from the
    /// heap. Control path: may allocate and make system calls.
    ///
    /// # Errors
    /// `Some(Err(..))` when this driver wants to provide the memory but
    /// cannot (out of memory, a failed system call); the worker reports it.
    fn alloc_memory(
        &mut self,
        len: usize,
        kind: MemKind,
    ) -> Option<Result<Arc<dyn DriverMemory>, DriverError>> {
        let _ = (len, kind);
        None
    }

    /// What the peer of `ep` accepts, once the connection is up (its
    /// handshake, or the peer's address, said so): the engine refuses a
    /// NOTIFY longer than the peer's buffers hold at submission, with
    /// [`Status::InvalidLength`], instead of sending it. `None` (the
    /// default): no limit beyond [`Capabilities::max_len`] and the
    /// engine's own. Control path.
    fn peer_limits(&self, ep: DriverEp) -> Option<PeerLimits> {
        let _ = ep;
        None
    }

    /// Whether `lane` of `ep` orders operations once fenced (an [`Op::fence`]
    /// flag suffices), so a weak fence may use it (FENCE.md R8, R9).
    fn lane_ordered(&self, ep: DriverEp, lane: u8) -> bool {
        let _ = (ep, lane);
        self.capabilities().ordered_lanes
    }

    /// The generation of `lane` of `ep`: bumped whenever the transport
    /// channel behind it is replaced (FENCE.md R38). Operations in flight on
    /// an old generation complete through `poll` (with an error if they
    /// were lost).
    fn lane_generation(&self, ep: DriverEp, lane: u8) -> u32 {
        let _ = (ep, lane);
        0
    }
}
