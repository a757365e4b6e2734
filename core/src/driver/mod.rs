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
//! the engine (docs/fence.md R25, W1).
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

mod capabilities;
mod completion;
mod direct;
mod kind;
mod memory;

pub use capabilities::{AtomicDomain, AtomicOps, Capabilities, PeerLimits};
pub use completion::{
    Completion, Connect, Fails, Posted, Quiesce, Quiesced, Token, drain_completions, fails_endpoint,
};
pub use direct::{DirectPath, execute_by_post};
pub use kind::{MemKind, MemKinds};
pub use memory::{
    DriverMemKey, DriverMemory, DriverRkey, KeyPart, MemDesc, Prepare, Prepared, Registered,
    Unpacked,
};

use crate::NotifyPool;
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

/// A driver's handle for a connection to one peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DriverEp(pub u32);

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
    /// posted earlier on its lane (a weak fence, docs/fence.md R8; the fence
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
///
/// # The hooks at a glance
/// Thirteen are required (**bold**); the rest have defaults that suit a
/// driver without the feature.
///
/// | concern | hooks |
/// |---|---|
/// | identity | **`name`**, **`capabilities`**, **`attach`**, **`address`** |
/// | connections | **`connect`**, **`disconnect`**, `check_alive`, `peer_limits`, `lane_generation` |
/// | memory and keys | **`register`**, **`deregister`**, **`pack_rkey`**, **`unpack_rkey`**, `release_rkey`, `prepare`, `quiesce`, `alloc_memory` |
/// | data path | **`post`**, **`flush`**, **`poll`**, `commit`, `direct` |
/// | sleep | `wake_fds`, `prepare_sleep`, `woke` |
#[allow(unsafe_code)] // declares the unsafe data-path contract (`post`)
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

    /// The generation of `lane` of `ep`: bumped whenever the transport
    /// channel behind it is replaced (docs/fence.md R38). Operations in flight on
    /// an old generation complete through `poll` (with an error if they
    /// were lost).
    fn lane_generation(&self, ep: DriverEp, lane: u8) -> u32 {
        let _ = (ep, lane);
        0
    }
}
