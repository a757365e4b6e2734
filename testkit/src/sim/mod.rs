//! `SimDriver`: a driver wrapper that is asynchronous in every way the tcp,
//! verbs and CUDA drivers are, so the engine's suites can run over the
//! whole asynchronous seam without hardware (feature `testkit`).
//!
//! It wraps a synchronous driver (normally
//! [`Loopback`](ringfence::Loopback) in
//! [`CompletionMode::Immediate`](ringfence::CompletionMode::Immediate), which
//! executes an operation against the target's memory inside its `post`)
//! and defers everything that driver does:
//!
//! - **Nothing executes in `post`.** [`Driver::post`] and
//!   [`Driver::flush`] only hold the operation ([`Posted::InFlight`]), or
//!   answer [`Posted::NoResource`] once a lane holds
//!   [`SimHandle::lane_depth`] operations. What is posted is not eligible
//!   to execute before the next [`Driver::commit`] (the doorbell): the
//!   handle counts commits and every operation that executed uncommitted
//!   (which must stay zero).
//! - **Late effects.** A committed operation completes after
//!   [`SimTiming::Polls`] polls (or a seeded number of them,
//!   [`SimTiming::PollsBetween`]) or a [`SimTiming::Delay`], and only then
//!   is it executed: the inner driver's `post` runs at completion time (so
//!   a PUT lands late, as a NIC's write does) and its result is the
//!   completion's. Lanes are visited in a seeded pseudo-random order, so
//!   operations complete out of order across lanes; within a lane they
//!   complete in posting order when the inner driver orders that lane
//!   ([`Capabilities::ordered_lanes`](ringfence::Capabilities::ordered_lanes)), else in any order that keeps an operation
//!   carrying the transport fence flag behind everything before it. A
//!   flush completes only after every operation posted before it on its
//!   lanes has executed, plus its own timing, and then asks the inner
//!   driver's flush.
//! - **Asynchronous connect.** [`Driver::connect`] always returns
//!   [`Connect::InFlight`]; the handshake completes through `poll` with
//!   its token after [`SimHandle::connect_timing`], with `Ok(0)` or the
//!   status programmed with [`SimHandle::fail_connect`].
//! - **A real wake descriptor.** [`Driver::wake_fds`] is a timerfd
//!   (`CLOCK_MONOTONIC`, absolute expiry) armed for the earliest moment
//!   something held becomes due: it becomes readable then, stays readable
//!   (level-triggered) until a `poll`, and is re-armed at the end of every
//!   `poll` for whatever is still pending, at once if something is due
//!   already (a poll whose batch was full). It is only meaningful with
//!   [`SimTiming::Delay`]: under the poll-counted timings nothing becomes
//!   due without polls, so nothing arms it (except completions made outside
//!   `poll`, by `disconnect` or `quiesce`, which are due at once), and
//!   [`Driver::prepare_sleep`] answers [`Sleep::NotNow`] while such work
//!   is held. With [`SimHandle::arm_on_sleep`] the timer is one-shot, as a
//!   verbs completion channel is: armed only when the core thread is about
//!   to sleep, disarmed in [`Driver::woke`].
//! - **Quiesce.** [`Quiesce::All`] completes everything held (operations,
//!   flushes, handshakes) with [`Status::Canceled`] without executing it;
//!   [`Quiesce::Memory`] does that for the operations whose `local_key` is
//!   that key. The completions come out of the next polls. A quiesce may
//!   be programmed to take time ([`SimHandle::delay_quiesce`]: it answers
//!   [`Quiesced::Pending`] for a number of asks, then `Done`) or to leak
//!   ([`SimHandle::leak_quiesce`]). The handle's event log
//!   ([`SimHandle::events`]) records each quiesce called and its answer,
//!   and [`SimHandle::violations`] any execution that would
//!   touch memory a returned quiesce covered, or memory already freed
//!   (refused: it completes with [`Status::AccessDenied`] instead), any
//!   post to a connection that is not up, and completions still unpolled
//!   when the driver is dropped.
//! - **Memory.** [`Driver::alloc_memory`] hands out zeroed, 64-byte
//!   aligned host memory whose drop logs [`SimEvent::Freed`], so a test can
//!   check that a quiesce returned before the memory went. With
//!   [`SimDriver::with_mem_kinds`] the driver claims more memory kinds
//!   than its inner driver (say [`MemKind::Cuda`], backed by host memory)
//!   to stand in for a device driver.
//! - **Registration by kind.** [`SimDriver::declining`],
//!   [`SimDriver::local_only`], [`SimDriver::with_remote_kinds`] and
//!   [`SimDriver::unreachable`] make it decline memory, keep it for local
//!   use, not reach a peer's kind, or find a peer's part unreachable;
//!   [`SimHandle::refuse_unpack`] fails the next unpacks.
//!   Every register and unpack has a first phase ([`Driver::prepare`]),
//!   which [`SimHandle::slow_registration`] makes last until the engine
//!   has polled the driver a number of times: it finishes only if the
//!   engine lock is free while it runs. [`SimEvent::Registered`], [`SimEvent::Unpacked`] and
//!   [`SimEvent::Prepared`] record what it answered.
//! - [`Driver::direct`] is `None`: nothing finishes inside a call.
//!
//! What it holds and the release rule within a lane are the test kit's
//! held core (`crate::held`), shared with
//! [`FaultInjector`](crate::FaultInjector); the commit, the timings, the
//! lane visiting order, handshakes, quiesce and the wake descriptor are
//! this module's.
//!
//! # Names
//! A worker address tags each driver's part with the driver's name, and a
//! packed remote key tags each part the same way; a peer connects through
//! its driver of the same name. By default a `SimDriver` takes its inner
//! driver's name, so an initiator over `SimDriver<Loopback>` connects to a
//! target built with a plain [`Loopback`](ringfence::Loopback) (named
//! `"loopback"`) and unpacks that target's keys. [`SimDriver::named`]
//! gives it a name of its own, for a worker that has the simulated driver
//! and its inner kind side by side (the peer then needs a driver of that
//! name too).
//!
//! # Limits
//! The inner driver should complete synchronously: completions it returns
//! later from its own `poll` are passed through, but its `wake_fd` is not
//! merged into this one, and operations it keeps in flight are not in the
//! execution log. The driver allocates on its data path (its queues and
//! logs grow): it is a test kit, not a transport.

use crate::held::{Due, Executed, HeldFlushes, HeldLanes, HeldOp, Rng};
use nix::sys::timerfd::TimerFd;
#[cfg(doc)]
use ringfence::Quiesced;
use ringfence::{
    Completion, Driver, DriverEp, DriverMemKey, DriverRkey, LaneMask, Prepare, Prepared, Quiesce,
    Registered, Token, Unpacked,
};
use ringfence::{MemKind, MemKinds};
use ringfence_ring::Status;
use std::alloc::Layout;
use std::collections::{HashMap, HashSet, VecDeque};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

mod handle;
mod memory;
mod seam;
mod simulation;

/// When a committed operation, flush or handshake completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimTiming {
    /// In the `n`-th poll after its commit (a handshake: after `connect`);
    /// 0 counts as 1, the next poll.
    Polls(u32),
    /// In a poll drawn (seeded) from the `lo`-th to the `hi`-th after its
    /// commit, each operation and flush on its own: lanes drift apart, and
    /// a flush may come due before what it covers (it still waits for it).
    PollsBetween(u32, u32),
    /// In the first poll at least this long after its commit (a
    /// handshake: after `connect`), as a network round trip takes. The
    /// wake descriptor becomes readable at that moment.
    Delay(Duration),
}

/// What happened at the driver's control surface, in order
/// ([`SimHandle::events`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimEvent {
    /// A connect started (the inner driver's handle).
    Connect(DriverEp),
    /// Its handshake completed, as `poll` reported it.
    Connected(DriverEp, Result<u32, Status>),
    /// The engine released a connection.
    Disconnect(DriverEp),
    /// A registration was made (by the inner driver).
    Register(DriverMemKey),
    /// What `register` answered for memory of a kind.
    Registered(MemKind, Registered),
    /// What `unpack_rkey` answered on an endpoint for a part of a kind.
    Unpacked(DriverEp, MemKind, Unpacked),
    /// The first phase ([`SimHandle::slow_registration`]) of a register
    /// (`true`) or an unpack (`false`) ended: the engine polled the
    /// driver `polls` times while it ran.
    Prepared {
        /// A register's, not an unpack's.
        register: bool,
        /// Polls that ran meanwhile.
        polls: u64,
    },
    /// A registration was withdrawn.
    Deregister(DriverMemKey),
    /// An unpacked remote key was released.
    ReleaseRkey(DriverEp, DriverRkey),
    /// `quiesce` was called.
    QuiesceCalled(Quiesce),
    /// `quiesce` answered [`Quiesced::Done`]: nothing may touch the memory
    /// any more.
    QuiesceReturned(Quiesce),
    /// `quiesce` answered [`Quiesced::Pending`].
    QuiescePending(Quiesce),
    /// `quiesce` answered [`Quiesced::Leak`].
    QuiesceLeaked(Quiesce),
    /// `alloc_memory` handed out memory.
    Allocated {
        /// Its start.
        addr: u64,
        /// Its length.
        len: usize,
    },
    /// Memory from `alloc_memory` was freed (its last handle dropped).
    Freed {
        /// Its start.
        addr: u64,
        /// Its length.
        len: usize,
    },
}

/// Counters of a [`SimDriver`] ([`SimHandle::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SimStats {
    /// `commit` calls (one per engine round).
    pub commits: u64,
    /// `poll` calls.
    pub polls: u64,
    /// Operations held by `post`.
    pub posted: u64,
    /// Flushes held by `flush`.
    pub flushes: u64,
    /// Operations handed to the inner driver (executed).
    pub executed: u64,
    /// Operations executed although no commit had covered them: always 0
    /// unless the simulation itself is broken.
    pub executed_uncommitted: u64,
    /// Operations, flushes and handshakes completed with `Canceled`
    /// (disconnect, quiesce) without executing.
    pub canceled: u64,
    /// Times the inner driver had no room at execution (retried later).
    pub inner_no_resource: u64,
    /// `prepare_sleep` calls.
    pub sleeps_prepared: u64,
    /// Times the wake timer was set or disarmed (a system call each).
    pub timer_sets: u64,
}

/// What the handle programs and what the driver records.
#[derive(Debug)]
struct State {
    timing: SimTiming,
    connect_timing: SimTiming,
    /// Statuses for the next handshakes to fail with, in order.
    connect_failures: VecDeque<Status>,
    /// Statuses for the next `connect` calls to refuse with at once.
    connect_refusals: VecDeque<Status>,
    /// Statuses for the next `unpack_rkey` calls to refuse with.
    unpack_refusals: VecDeque<Status>,
    /// Polls the first phase of each register and unpack lasts.
    slow_polls: u64,
    /// The wake timer is armed only in `prepare_sleep` (see
    /// `SimHandle::arm_on_sleep`).
    arm_on_sleep: bool,
    lane_depth: usize,
    seed: u64,
    reseed: bool,
    drain_on_disconnect: bool,
    stats: SimStats,
    log: Vec<Executed>,
    flush_log: Vec<(DriverEp, LaneMask)>,
    events: Vec<SimEvent>,
    violations: Vec<String>,
    /// A `quiesce(All)` has returned: nothing may execute any more.
    quiesced_all: bool,
    /// Keys whose `quiesce(Memory(key))` has returned (until re-used).
    quiesced_keys: HashSet<u64>,
    /// Memory from `alloc_memory` that has been freed: start and length.
    freed: Vec<(u64, u64)>,
    /// Asks each quiesce scope answers `Pending` before `Done`.
    quiesce_delay: u32,
    /// Quiesce answers `Leak` (after its delay).
    quiesce_leak: bool,
    /// Asks so far of each scope not answered yet (`None`: `All`).
    quiesce_asks: HashMap<Option<u64>, u32>,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

/// Programs a [`SimDriver`] after it moved into a worker, and reads what
/// it recorded. Clones share the driver.
#[derive(Debug, Clone)]
pub struct SimHandle {
    state: Arc<Mutex<State>>,
}

/// A held operation: its timing applies from the commit that covers it.
type Held = HeldOp<SimTiming>;

/// What the simulation keeps per lane, beside what it holds there.
#[derive(Debug, Default, Clone, Copy)]
struct LaneState {
    /// Posted to since the last commit.
    touched: bool,
    /// The inner driver had no room at this poll: skip the lane for it.
    blocked_at: u64,
}

#[derive(Debug)]
struct Conn {
    /// Its lanes' state (what they hold is in `SimDriver::held`).
    lanes: Vec<LaneState>,
    /// The handshake has not completed.
    connecting: bool,
    /// The handshake failed: the inner connection is released.
    dead: bool,
    /// Disconnected while draining: the inner connection goes once empty.
    closing: bool,
}

#[derive(Debug, Clone, Copy)]
struct Handshake {
    ep: DriverEp,
    token: Token,
    due: Due,
    fail: Option<Status>,
}

/// The asynchronous simulated driver; see the module docs.
#[derive(Debug)]
pub struct SimDriver<D: Driver> {
    inner: D,
    name: &'static str,
    mem_kinds: Option<MemKinds>,
    remote_kinds: Option<MemKinds>,
    /// Kinds `register` declines, keeps for local use, and kinds of a
    /// peer's part `unpack_rkey` finds unreachable.
    declined: MemKinds,
    local_only: MemKinds,
    unreachable: MemKinds,
    state: Arc<Mutex<State>>,
    /// By the inner driver's endpoint handle.
    conns: Vec<Option<Conn>>,
    /// What the connections' lanes hold, by the same handle.
    held: HeldLanes<SimTiming>,
    flushes: HeldFlushes<SimTiming>,
    handshakes: Vec<Handshake>,
    /// Completions made outside `poll` (disconnect, quiesce), returned
    /// first.
    ready: VecDeque<Completion>,
    /// Flushes posted since the last commit.
    flushes_touched: bool,
    /// Lanes posted to since the last commit.
    touched: Vec<(u32, u8)>,
    polls: u64,
    rng: Rng,
    /// Lanes with an eligible operation, rebuilt during a poll.
    candidates: Vec<(u32, u8)>,
    timer: TimerFd,
    /// The expiry the timer is set to, if armed.
    armed: Option<u64>,
    /// The timer is one-shot ([`SimHandle::arm_on_sleep`], as last read
    /// from the handle's state).
    one_shot: bool,
    /// Between a one-shot `prepare_sleep` and its `woke`.
    asleep: bool,
    /// When a lane the inner driver refused is tried again (for the timer).
    retry_at: Option<u64>,
}

/// Host memory from [`SimDriver`]'s `alloc_memory`; its drop logs
/// [`SimEvent::Freed`].
#[derive(Debug)]
struct SimMemory {
    ptr: NonNull<u8>,
    layout: Layout,
    len: usize,
    kind: MemKind,
    state: Arc<Mutex<State>>,
}

/// The first phase of a [`SimDriver`]'s registrations and unpacks
/// ([`SimHandle::slow_registration`]).
#[derive(Debug)]
struct SlowPrepare {
    state: Arc<Mutex<State>>,
    /// The inner driver's own first phase, run first.
    inner: Option<Arc<dyn Prepare>>,
}

/// A slow first phase's result: the inner driver's.
struct SlowDone(Prepared);
