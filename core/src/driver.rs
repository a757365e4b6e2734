//! The boundary between the engine and the transports.
//!
//! A driver moves bytes; the engine decides what, when, and in which order.
//! Drivers never call back into the engine: [`Driver::post`] and
//! [`Driver::flush`] return [`Posted::Done`] (finished, with its result),
//! [`Posted::InFlight`] (its completion will come out of [`Driver::poll`]
//! as a [`Completion`] carrying the same [`Token`]), or
//! [`Posted::NoResource`] (nothing was done; try again later). That
//! tri-state is what keeps a synchronously completing flush from re-entering
//! the engine (FENCE.md R25, W1).

use crate::NotifyPool;
use crate::memory::MemKind;
use ringfence_ring::{AtomicOp, Status};
use std::fmt;
use std::sync::Arc;

/// A set of lanes of one endpoint: bit `i` is lane `i`.
pub type LaneMask = u64;

/// The most lanes an endpoint can have (one bit of a [`LaneMask`] each).
pub const MAX_LANES: u8 = 64;

/// What a driver can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Operations posted on one lane take effect at the target in posting
    /// order (RC QP, TCP stream, shm FIFO, one CUDA stream).
    pub ordered_lanes: bool,
    /// The driver executes ATOMIC operations.
    pub atomics: bool,
    /// The driver executes GET.
    pub get: bool,
    /// The driver delivers NOTIFY payloads.
    pub notify: bool,
    /// Memory kinds it can register.
    pub mem_kinds: &'static [MemKind],
    /// Most lanes per endpoint, `1..=64`.
    pub max_lanes: u8,
    /// Largest single PUT/GET/NOTIFY in bytes.
    pub max_len: u32,
    /// The driver runs runs of PUTs and GETs to completion inside one call
    /// ([`Driver::execute`]), which the engine then prefers to one `post`
    /// per operation.
    pub execute: bool,
}

impl Capabilities {
    /// Capabilities with every operation supported on host memory.
    pub const fn new(max_lanes: u8, max_len: u32) -> Self {
        Capabilities {
            ordered_lanes: true,
            atomics: true,
            get: true,
            notify: true,
            mem_kinds: &[MemKind::Host],
            max_lanes,
            max_len,
            execute: false,
        }
    }

    /// Whether memory of `kind` can be registered.
    pub fn supports_mem_kind(&self, kind: MemKind) -> bool {
        self.mem_kinds.contains(&kind)
    }
}

/// Identifies one posted operation or flush in the driver's completions.
/// Opaque to the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Token(pub u64);

impl Token {
    /// Names nothing in flight: a completion that carries it is counted as
    /// stray. For drivers that run an operation through their own `post`
    /// from [`Driver::execute`].
    pub const NONE: Token = Token(u64::MAX);
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The token given to `post` or `flush`.
    pub token: Token,
    /// `Ok(bytes)` or the failure.
    pub result: Result<u32, Status>,
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
        Completion {
            token: Token(0),
            result: Ok(0),
        }
    }
}

/// A driver's handle for a connection to one peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DriverEp(pub u32);

/// A driver's handle for a local registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DriverMemKey(pub u64);

/// A driver's handle for an unpacked remote key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DriverRkey(pub u32);

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
/// key blob came from the wire.
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
    /// buffer it claims from this pool.
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
/// - `[addr(), addr() + len())` is mapped, readable and writable memory of
///   this process, and neither value ever changes;
/// - `addr()` is 64-byte aligned and `len()` is at least the length asked
///   for in `alloc_memory`;
/// - the bytes were zero when the object was handed out.
#[allow(unsafe_code)]
pub unsafe trait DriverMemory: Send + Sync + fmt::Debug {
    /// The start address.
    fn addr(&self) -> u64;
    /// The length in bytes.
    fn len(&self) -> usize;
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
/// network. Data-path methods (`post`, `flush`, `poll`) must not allocate.
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

    /// Connects to a peer from its address part, with `lanes` lanes.
    ///
    /// # Errors
    /// The address is malformed or the peer unreachable.
    fn connect(&mut self, peer: &[u8], lanes: u8) -> Result<DriverEp, DriverError>;

    /// Releases a connection. Operations still in flight on it complete
    /// (with an error if they cannot finish) through `poll`.
    fn disconnect(&mut self, ep: DriverEp);

    /// Registers memory for local use and remote access.
    ///
    /// # Errors
    /// The memory kind is unsupported or a resource ran out.
    fn register(&mut self, mem: &MemDesc) -> Result<DriverMemKey, DriverError>;

    /// Withdraws a registration: no remote access succeeds after this
    /// returns.
    fn deregister(&mut self, key: DriverMemKey);

    /// The blob a peer needs to access a registration remotely.
    ///
    /// # Errors
    /// The key is unknown.
    fn pack_rkey(&self, key: DriverMemKey) -> Result<Vec<u8>, DriverError>;

    /// Turns a peer's blob into a handle usable on `ep`.
    ///
    /// # Errors
    /// The blob is malformed, or names another peer.
    fn unpack_rkey(&mut self, ep: DriverEp, blob: &[u8]) -> Result<DriverRkey, DriverError>;

    /// Starts one operation on `ep`. Must not allocate or block.
    fn post(&mut self, ep: DriverEp, op: &Op, token: Token) -> Posted;

    /// Runs `ops` (PUTs and GETs of one endpoint, in order, all on one lane)
    /// to completion inside the call, each exactly as `post` would run it,
    /// and writes the result of each one run to `results` (as long as
    /// `ops`). Returns how many ran, in order from the first; it may stop
    /// early (after one that failed, or before one it cannot finish inside
    /// the call), and the engine posts the rest one by one. Called only if
    /// [`Capabilities::execute`] is set; the default runs none. Must not
    /// allocate or block.
    fn execute(&mut self, ep: DriverEp, ops: &[Op], results: &mut [Result<u32, Status>]) -> usize {
        let _ = (ep, ops, results);
        0
    }

    /// A hint that an operation through remote key `rkey` of `ep` will
    /// soon access `addr` (a PUT if `write`): a driver that maps the peer's
    /// memory can start moving that cache line to this CPU while the
    /// engine validates the operation, so the line transfer overlaps the
    /// checks instead of following them. Called before anything about the
    /// operation is checked: it must not fault, block, allocate or change
    /// memory. The default does nothing.
    fn prefetch(&self, ep: DriverEp, rkey: DriverRkey, addr: u64, write: bool) {
        let _ = (ep, rkey, addr, write);
    }

    /// `execute` for a run of one (a ping-pong's PUT): its result, or
    /// `None` if it did not run. Drivers with a shorter path for a single
    /// operation override it; the default calls `execute`.
    fn execute_one(&mut self, ep: DriverEp, op: &Op) -> Option<Result<u32, Status>> {
        let mut result = [Ok(0)];
        (self.execute(ep, std::slice::from_ref(op), &mut result) > 0).then_some(result[0])
    }

    /// Starts a flush of `lanes` of `ep`: it completes when every operation
    /// posted on those lanes before it is remotely complete. An empty mask
    /// completes at once. Must not allocate or block.
    fn flush(&mut self, ep: DriverEp, lanes: LaneMask, token: Token) -> Posted;

    /// Fills `out` with finished operations and flushes; returns how many.
    /// Never blocks.
    fn poll(&mut self, out: &mut [Completion]) -> usize;

    /// Allocates `len` bytes of memory that this driver can register
    /// without copying (for example a sealed memfd that a peer maps), for
    /// [`Worker::alloc_registered`](crate::Worker::alloc_registered). The
    /// worker asks its drivers in order and uses the first `Some`; `None`
    /// (the default) means "no preference": the worker allocates from the
    /// heap. Control path: may allocate and make system calls.
    ///
    /// # Errors
    /// `Some(Err(..))` when this driver wants to provide the memory but
    /// cannot (out of memory, a failed system call); the worker reports it.
    fn alloc_memory(&mut self, len: usize) -> Option<Result<Arc<dyn DriverMemory>, DriverError>> {
        let _ = len;
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
