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
//!   ([`Driver::lane_ordered`]), else in any order that keeps an operation
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

use crate::fault::Executed;
use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{self, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use ringfence::DriverMemory;
use ringfence::{
    Capabilities, Completion, Connect, DirectPath, Driver, DriverContext, DriverEp, DriverError,
    DriverMemKey, DriverRkey, KeyPart, LaneMask, MemDesc, Op, PeerLimits, Posted, Prepare,
    Prepared, Quiesce, Quiesced, Registered, Sleep, Token, Unpacked,
};
use ringfence::{MemKind, MemKinds};
use ringfence_ring::Status;
use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::collections::{HashMap, HashSet, VecDeque};
use std::os::fd::{AsFd, BorrowedFd};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

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

impl State {
    fn violation(&mut self, what: String) {
        tracing::error!(violation = %what, "simulated driver");
        self.violations.push(what);
    }
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

impl SimHandle {
    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Sets when operations and flushes complete; applies to those posted
    /// from now on. The default is `SimTiming::Polls(1)`.
    pub fn set_timing(&self, timing: SimTiming) {
        self.state().timing = timing;
    }

    /// Sets when handshakes complete; applies to connects started from now
    /// on. The default is `SimTiming::Polls(1)`.
    pub fn connect_timing(&self, timing: SimTiming) {
        self.state().connect_timing = timing;
    }

    /// Handshakes complete in the `m`-th poll after `connect`
    /// (`connect_timing(SimTiming::Polls(m))`).
    pub fn connect_polls(&self, m: u32) {
        self.connect_timing(SimTiming::Polls(m));
    }

    /// The next handshake to start fails with `status` (each call programs
    /// one more, in order).
    pub fn fail_connect(&self, status: Status) {
        self.state().connect_failures.push_back(status);
    }

    /// The next `connect` call returns `Err` with `status` at once, as a
    /// driver does for a malformed address or a peer it knows is gone
    /// (each call programs one more, in order).
    pub fn refuse_connect(&self, status: Status) {
        self.state().connect_refusals.push_back(status);
    }

    /// The next `unpack_rkey` call fails with `status`, as a driver does
    /// for a part that names another peer (each call programs one more,
    /// in order).
    pub fn refuse_unpack(&self, status: Status) {
        self.state().unpack_refusals.push_back(status);
    }

    /// The first phase ([`Driver::prepare`]) of every register and unpack
    /// from now on lasts until the engine has polled the driver `polls`
    /// more times (0, the default: no wait), or a minute has passed: it
    /// then fails with [`Status::Timeout`], as it does if the engine lock
    /// is held meanwhile, so that no poll can run. The second phase checks
    /// that it got the first phase's result (a violation otherwise).
    pub fn slow_registration(&self, polls: u64) {
        self.state().slow_polls = polls;
    }

    /// Whether the wake descriptor is one-shot, as a verbs completion
    /// channel is (`ibv_req_notify_cq`): `true` arms the timer only in
    /// `prepare_sleep` (for the earliest due moment; `NotNow` if something
    /// is due already) and disarms it in `woke`, so a busy-polling engine
    /// makes no timer call at all; `false` (the default) keeps it
    /// level-triggered, re-armed at every poll. Set it before the driver
    /// has work.
    pub fn arm_on_sleep(&self, on: bool) {
        self.state().arm_on_sleep = on;
    }

    /// Operations one lane holds before `post` answers `NoResource`
    /// (default 4096; at least 1).
    pub fn lane_depth(&self, depth: usize) {
        self.state().lane_depth = depth.max(1);
    }

    /// Seeds the lane visiting order (and the pick within unordered lanes).
    pub fn seed(&self, seed: u64) {
        let mut s = self.state();
        s.seed = seed | 1;
        s.reseed = true;
    }

    /// What `disconnect` does with what a connection still holds: `false`
    /// (the default) completes it at once with `Canceled`, unexecuted, as
    /// a destroyed queue pair flushes its work in error; `true` lets it
    /// run to completion, as a send queue drains, and releases the inner
    /// connection after it (a later `quiesce(All)` cancels what is left).
    pub fn drain_on_disconnect(&self, drain: bool) {
        self.state().drain_on_disconnect = drain;
    }

    /// Every quiesce scope first asked from now on (each key, and
    /// `Quiesce::All`) answers [`Quiesced::Pending`] for its first `asks`
    /// asks, then `Done` (or `Leak`, see
    /// [`leak_quiesce`](SimHandle::leak_quiesce)); `u32::MAX` never
    /// finishes. What it holds is canceled at the first ask all the same.
    /// The default is 0: `Done` at once.
    pub fn delay_quiesce(&self, asks: u32) {
        self.state().quiesce_delay = asks;
    }

    /// Whether quiesce answers [`Quiesced::Leak`] instead of `Done` (after
    /// its delay): the memory must never be freed. Default `false`.
    pub fn leak_quiesce(&self, leak: bool) {
        self.state().quiesce_leak = leak;
    }

    /// The counters.
    pub fn stats(&self) -> SimStats {
        self.state().stats
    }

    /// `commit` calls so far.
    pub fn commits(&self) -> u64 {
        self.state().stats.commits
    }

    /// The operations that took effect at the inner driver (it returned
    /// success), in execution order.
    pub fn log(&self) -> Vec<Executed> {
        self.state().log.clone()
    }

    /// Every flush handed to the inner driver: endpoint handle and lanes,
    /// in order.
    pub fn flushes(&self) -> Vec<(DriverEp, LaneMask)> {
        self.state().flush_log.clone()
    }

    /// The control events so far, in order.
    pub fn events(&self) -> Vec<SimEvent> {
        self.state().events.clone()
    }

    /// Every breach of the driver contract seen so far: an execution that
    /// would have touched memory after a quiesce covering it returned, or
    /// after that memory was freed (refused, see the module docs); a post
    /// or flush on a connection that is not up; completions left unpolled
    /// when the driver was dropped. Empty when the engine behaved.
    pub fn violations(&self) -> Vec<String> {
        self.state().violations.clone()
    }
}

/// When something held becomes eligible.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Due {
    /// At this poll count.
    Poll(u64),
    /// At this `CLOCK_MONOTONIC` time, in nanoseconds.
    Time(u64),
}

impl Due {
    /// When something under `timing` committed (or started) at poll `polls`
    /// and time `now` is due; `random` draws within `PollsBetween`.
    fn new(timing: SimTiming, polls: u64, now: u64, random: u64) -> Due {
        match timing {
            SimTiming::Polls(n) => Due::Poll(polls + u64::from(n.max(1))),
            SimTiming::PollsBetween(lo, hi) => {
                let (lo, hi) = (u64::from(lo.max(1)), u64::from(hi.max(lo).max(1)));
                Due::Poll(polls + lo + random % (hi - lo + 1))
            }
            SimTiming::Delay(d) => {
                Due::Time(now.saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)))
            }
        }
    }

    fn passed(self, polls: u64, now: u64) -> bool {
        match self {
            Due::Poll(p) => p <= polls,
            Due::Time(t) => t <= now,
        }
    }

    /// The time it arms the wake descriptor for, if any.
    fn time(self) -> Option<u64> {
        match self {
            Due::Time(t) => Some(t),
            Due::Poll(_) => None,
        }
    }
}

/// The next number of a xorshift64 sequence (`state` is never zero).
fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Nanoseconds of `CLOCK_MONOTONIC`, the timerfd's clock.
fn now_ns() -> u64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC is always readable");
    (ts.tv_sec() as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec() as u64)
}

#[derive(Debug, Clone, Copy)]
struct Held {
    op: Op,
    token: Token,
    seq: u64,
    timing: SimTiming,
    /// `None` until a commit covers it.
    due: Option<Due>,
}

#[derive(Debug, Default)]
struct Lane {
    queue: VecDeque<Held>,
    /// Posted to since the last commit.
    touched: bool,
    /// The inner driver had no room at this poll: skip the lane for it.
    blocked_at: u64,
}

#[derive(Debug)]
struct Conn {
    lanes: Vec<Lane>,
    /// The handshake has not completed.
    connecting: bool,
    /// The handshake failed: the inner connection is released.
    dead: bool,
    /// Disconnected while draining: the inner connection goes once empty.
    closing: bool,
}

impl Conn {
    fn is_empty(&self) -> bool {
        self.lanes.iter().all(|l| l.queue.is_empty())
    }
}

#[derive(Debug, Clone, Copy)]
struct HeldFlush {
    ep: DriverEp,
    lanes: LaneMask,
    token: Token,
    /// Every operation with a sequence number up to this one, on `lanes`,
    /// must have executed.
    seq: u64,
    timing: SimTiming,
    due: Option<Due>,
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
    flushes: VecDeque<HeldFlush>,
    handshakes: Vec<Handshake>,
    /// Completions made outside `poll` (disconnect, quiesce), returned
    /// first.
    ready: VecDeque<Completion>,
    /// Flushes posted since the last commit.
    flushes_touched: bool,
    /// Lanes posted to since the last commit.
    touched: Vec<(u32, u8)>,
    polls: u64,
    seq: u64,
    rng: u64,
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

impl<D: Driver> SimDriver<D> {
    /// Wraps `inner`, under the inner driver's name (see the module docs,
    /// "Names"); the handle programs it.
    ///
    /// # Panics
    /// If no timerfd can be created (the process is out of descriptors).
    pub fn new(inner: D) -> (SimDriver<D>, SimHandle) {
        let name = inner.name();
        SimDriver::named(inner, name)
    }

    /// Wraps `inner` under `name`, for a worker that has this driver and
    /// its inner kind side by side; a peer connects to it through a driver
    /// of the same name.
    ///
    /// # Panics
    /// As [`new`](SimDriver::new).
    pub fn named(inner: D, name: &'static str) -> (SimDriver<D>, SimHandle) {
        let state = Arc::new(Mutex::new(State {
            timing: SimTiming::Polls(1),
            connect_timing: SimTiming::Polls(1),
            connect_failures: VecDeque::new(),
            connect_refusals: VecDeque::new(),
            unpack_refusals: VecDeque::new(),
            slow_polls: 0,
            arm_on_sleep: false,
            lane_depth: 4096,
            seed: 0x2545_f491_4f6c_dd1d,
            reseed: true,
            drain_on_disconnect: false,
            stats: SimStats::default(),
            log: Vec::new(),
            flush_log: Vec::new(),
            events: Vec::new(),
            violations: Vec::new(),
            quiesced_all: false,
            quiesced_keys: HashSet::new(),
            freed: Vec::new(),
            quiesce_delay: 0,
            quiesce_leak: false,
            quiesce_asks: HashMap::new(),
        }));
        let timer = TimerFd::new(
            timerfd::ClockId::CLOCK_MONOTONIC,
            TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
        )
        .expect("a timerfd for the simulated driver's wake descriptor");
        let driver = SimDriver {
            inner,
            name,
            mem_kinds: None,
            remote_kinds: None,
            declined: MemKinds::NONE,
            local_only: MemKinds::NONE,
            unreachable: MemKinds::NONE,
            state: state.clone(),
            conns: Vec::new(),
            flushes: VecDeque::new(),
            handshakes: Vec::new(),
            ready: VecDeque::new(),
            flushes_touched: false,
            touched: Vec::new(),
            polls: 0,
            seq: 0,
            rng: 1,
            candidates: Vec::new(),
            timer,
            armed: None,
            one_shot: false,
            asleep: false,
            retry_at: None,
        };
        (driver, SimHandle { state })
    }

    /// Claims `kinds` as the memory kinds it registers, allocates and
    /// reaches at a peer, instead of the inner driver's. Memory of a kind
    /// the inner driver does not register is registered with it as host
    /// memory (and a peer's part of such a kind unpacked as host memory),
    /// and `alloc_memory` backs every kind with host memory: a stand-in
    /// for a device driver (say [`MemKind::Cuda`]) in tests of mixed
    /// endpoints.
    pub fn with_mem_kinds(mut self, kinds: MemKinds) -> SimDriver<D> {
        self.mem_kinds = Some(kinds);
        self.remote_kinds = Some(kinds);
        self
    }

    /// Claims to reach only `kinds` of memory at a peer
    /// ([`Capabilities::remote_kinds`]), as a CUDA driver reaches only a
    /// peer's device memory.
    pub fn with_remote_kinds(mut self, kinds: MemKinds) -> SimDriver<D> {
        self.remote_kinds = Some(kinds);
        self
    }

    /// Answers [`Registered::Declined`] for memory of `kinds`, without
    /// registering it with the inner driver.
    pub fn declining(mut self, kinds: MemKinds) -> SimDriver<D> {
        self.declined = kinds;
        self
    }

    /// Answers [`Registered::Local`] for memory of `kinds`: registered,
    /// but for local use only (no part in packed keys).
    pub fn local_only(mut self, kinds: MemKinds) -> SimDriver<D> {
        self.local_only = kinds;
        self
    }

    /// Answers [`Unpacked::Unreachable`] for a peer's parts of `kinds`.
    pub fn unreachable(mut self, kinds: MemKinds) -> SimDriver<D> {
        self.unreachable = kinds;
        self
    }

    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// What the inner driver's second phase gets of `prepared`: with a
    /// slow first phase, the inner driver's own result inside it (a
    /// violation if the first phase did not run).
    fn second_phase(&self, prepared: Prepared, what: &str) -> Prepared {
        match prepared.take::<SlowDone>() {
            Some(SlowDone(inner)) => inner,
            None => {
                self.state()
                    .violation(format!("{what} without its first phase"));
                Prepared::none()
            }
        }
    }

    fn next_random(&mut self) -> u64 {
        xorshift(&mut self.rng)
    }

    fn conn(&self, ep: DriverEp) -> Option<&Conn> {
        self.conns.get(ep.0 as usize)?.as_ref()
    }

    fn conn_mut(&mut self, ep: DriverEp) -> Option<&mut Conn> {
        self.conns.get_mut(ep.0 as usize)?.as_mut()
    }

    /// Sets the timer to expire at `at` (absolute), or disarms it. Setting
    /// it resets its expiration count: only `poll` calls this with a time
    /// that is not earlier than the armed one.
    fn set_timer(&mut self, at: Option<u64>) {
        self.state().stats.timer_sets += 1;
        let result = match at {
            Some(t) => self.timer.set(
                Expiration::OneShot(TimeSpec::from(Duration::from_nanos(t.max(1)))),
                TimerSetTimeFlags::TFD_TIMER_ABSTIME,
            ),
            None => self.timer.unset(),
        };
        if let Err(e) = result {
            tracing::error!(error = %e, "simulated driver: timerfd_settime failed");
        }
        self.armed = at;
    }

    /// Makes sure the timer expires no later than `at`. An earlier expiry
    /// never clears readability: if the armed one has passed, so has `at`.
    fn arm_by(&mut self, at: u64) {
        // One-shot: armed by `prepare_sleep` only, and only while asleep.
        let one_shot = self.state().arm_on_sleep;
        self.one_shot = one_shot;
        if one_shot && !self.asleep {
            return;
        }
        if self.armed.is_none_or(|armed| at < armed) {
            self.set_timer(Some(at));
        }
    }

    /// Completes `token` with `Canceled` from the next poll.
    fn cancel(&mut self, token: Token) {
        self.ready
            .push_back(Completion::new(token, Err(Status::Canceled)));
        self.state().stats.canceled += 1;
    }

    /// Cancels everything connection `ep` holds, and its flushes and
    /// handshake.
    fn cancel_conn(&mut self, ep: DriverEp) {
        let mut tokens = Vec::new();
        if let Some(conn) = self.conn_mut(ep) {
            for lane in &mut conn.lanes {
                tokens.extend(lane.queue.drain(..).map(|h| h.token));
            }
        }
        let (gone, kept): (Vec<_>, Vec<_>) = self.flushes.drain(..).partition(|f| f.ep == ep);
        self.flushes = kept.into();
        tokens.extend(gone.iter().map(|f| f.token));
        let (gone, kept): (Vec<_>, Vec<_>) = self.handshakes.drain(..).partition(|h| h.ep == ep);
        self.handshakes = kept;
        tokens.extend(gone.iter().map(|h| h.token));
        for token in tokens {
            self.cancel(token);
        }
    }

    /// Releases the inner connection of a connection that drained.
    fn release_drained(&mut self) {
        for index in 0..self.conns.len() {
            let ep = DriverEp(index as u32);
            let drained = self.conn(ep).is_some_and(|c| c.closing && c.is_empty())
                && !self.flushes.iter().any(|f| f.ep == ep);
            if drained {
                let conn = self.conns[index].take().expect("checked above");
                if !conn.dead {
                    self.inner.disconnect(ep);
                }
            }
        }
    }

    /// Whether lane `lane` of `ep` still holds an operation at or before
    /// sequence number `seq`.
    fn holds_before(&self, ep: DriverEp, lanes: LaneMask, seq: u64) -> bool {
        self.conn(ep).is_some_and(|conn| {
            conn.lanes
                .iter()
                .enumerate()
                .any(|(l, lane)| lanes & (1 << l) != 0 && lane.queue.iter().any(|h| h.seq <= seq))
        })
    }

    /// How many operations at the front of `lane` may execute now, and of
    /// those which are due: for an ordered lane the head alone; for an
    /// unordered one everything before the first later operation that
    /// carries the transport fence flag.
    fn eligible(&self, ep: DriverEp, lane: u8, now: u64) -> usize {
        let Some(conn) = self.conn(ep) else { return 0 };
        let queue = &conn.lanes[lane as usize].queue;
        let due = |h: &Held| h.due.is_some_and(|d| d.passed(self.polls, now));
        if self.inner.lane_ordered(ep, lane) {
            return usize::from(queue.front().is_some_and(due));
        }
        let fence_at = queue
            .iter()
            .skip(1)
            .position(|h| h.op.fence)
            .map_or(queue.len(), |i| i + 1);
        queue.iter().take(fence_at).filter(|h| due(h)).count()
    }

    /// Checks an operation about to execute against what quiesce and
    /// frees covered, and counts it. Returns whether it may touch memory.
    fn check_execution(&self, ep: DriverEp, held: &Held) -> bool {
        let mut s = self.state();
        s.stats.executed += 1;
        let before = s.violations.len();
        if held.due.is_none() {
            s.stats.executed_uncommitted += 1;
            s.violation(format!("{:?} executed before a commit covered it", held.op));
        }
        if s.quiesced_all {
            s.violation(format!(
                "{:?} on {ep:?} executed after quiesce(All) returned",
                held.op
            ));
        }
        if let Some(key) = held.op.local_key {
            if s.quiesced_keys.contains(&key.0) {
                s.violation(format!(
                    "{:?} executed after quiesce(Memory({key:?})) returned",
                    held.op
                ));
            }
            let (start, len) = (held.op.local_addr, u64::from(held.op.len));
            if s.freed
                .iter()
                .any(|&(addr, size)| start < addr + size && addr < start + len)
            {
                s.violation(format!("{:?} executed on freed memory", held.op));
            }
        }
        s.violations.len() == before
    }

    /// Executes one held operation at the inner driver: `Ok(Some(..))`
    /// its completion, `Ok(None)` the inner driver completes it later,
    /// `Err(held)` the inner driver had no room (the caller puts it back).
    /// An execution the contract forbids (see `check_execution`) is
    /// recorded and refused: it completes with `AccessDenied` without
    /// touching memory, so a misbehaving engine cannot make a test use
    /// freed memory.
    #[allow(unsafe_code)] // forwards the unsafe `post`
    fn execute(&mut self, ep: DriverEp, held: Held) -> Result<Option<Completion>, Held> {
        if !self.check_execution(ep, &held) {
            return Ok(Some(Completion::new(held.token, Err(Status::AccessDenied))));
        }
        // SAFETY: `held.op` came through our `post`, whose caller keeps its
        // local memory allocated and registered until its completion is
        // returned or `quiesce` returns; neither has happened (a quiesce
        // that covered it removed it from the lanes, and `check_execution`
        // refuses anything after one).
        match unsafe { self.inner.post(ep, &held.op, held.token) } {
            Posted::Done(result) => {
                if result.is_ok() {
                    let remote_addr = held.op.remote.map_or(0, |(_, addr)| addr);
                    self.state().log.push(Executed {
                        ep,
                        lane: held.op.lane,
                        kind: held.op.kind,
                        remote_addr,
                        operand: held.op.operand,
                        fence: held.op.fence,
                    });
                }
                Ok(Some(Completion::new(held.token, result)))
            }
            Posted::InFlight => Ok(None),
            Posted::NoResource => {
                let mut s = self.state();
                s.stats.inner_no_resource += 1;
                s.stats.executed -= 1;
                Err(held)
            }
        }
    }

    /// Executes due operations, lanes visited in a random order, into
    /// `out[*n..]`.
    fn run_lanes(&mut self, now: u64, out: &mut [Completion], n: &mut usize) {
        let mut candidates = std::mem::take(&mut self.candidates);
        while *n < out.len() {
            candidates.clear();
            for (index, slot) in self.conns.iter().enumerate() {
                let Some(conn) = slot else { continue };
                if conn.connecting || conn.dead {
                    continue;
                }
                for (l, lane) in conn.lanes.iter().enumerate() {
                    if !lane.queue.is_empty()
                        && lane.blocked_at != self.polls
                        && self.eligible(DriverEp(index as u32), l as u8, now) > 0
                    {
                        candidates.push((index as u32, l as u8));
                    }
                }
            }
            if candidates.is_empty() {
                break;
            }
            let k = (self.next_random() % candidates.len() as u64) as usize;
            let (e, l) = candidates[k];
            let ep = DriverEp(e);
            // The head of an ordered lane; on an unordered one, any due
            // operation before the next fence-flagged one (the eligible
            // ones are the first due ones).
            let eligible = self.eligible(ep, l, now) as u64;
            let nth = if eligible > 1 {
                (self.next_random() % eligible) as usize
            } else {
                0
            };
            let polls = self.polls;
            let lane = &mut self.conns[e as usize].as_mut().expect("candidate").lanes[l as usize];
            let pick = lane
                .queue
                .iter()
                .enumerate()
                .filter(|(_, h)| h.due.is_some_and(|d| d.passed(polls, now)))
                .nth(nth)
                .map_or(0, |(i, _)| i);
            let held = lane.queue.remove(pick).expect("picked index exists");
            match self.execute(ep, held) {
                Ok(Some(c)) => {
                    out[*n] = c;
                    *n += 1;
                }
                Ok(None) => {}
                Err(held) => {
                    // The inner driver is full: keep it in place, try later.
                    let lane =
                        &mut self.conns[e as usize].as_mut().expect("candidate").lanes[l as usize];
                    lane.queue.insert(pick, held);
                    lane.blocked_at = polls;
                    self.retry_at = Some(now + 1_000_000);
                }
            }
        }
        self.candidates = candidates;
    }

    /// Completes due flushes whose lanes hold nothing older, into
    /// `out[*n..]`.
    fn run_flushes(&mut self, now: u64, out: &mut [Completion], n: &mut usize) {
        let mut i = 0;
        while i < self.flushes.len() && *n < out.len() {
            let f = self.flushes[i];
            let due = f.due.is_some_and(|d| d.passed(self.polls, now));
            if !due || self.holds_before(f.ep, f.lanes, f.seq) {
                i += 1;
                continue;
            }
            self.state().flush_log.push((f.ep, f.lanes));
            match self.inner.flush(f.ep, f.lanes, f.token) {
                Posted::Done(result) => {
                    self.flushes.remove(i);
                    out[*n] = Completion::new(f.token, result);
                    *n += 1;
                }
                // The inner driver completes it through its own poll.
                Posted::InFlight => {
                    self.flushes.remove(i);
                }
                Posted::NoResource => {
                    self.state().flush_log.pop();
                    self.retry_at = Some(now + 1_000_000);
                    i += 1;
                }
            }
        }
    }

    /// Completes due handshakes into `out[*n..]`.
    fn run_handshakes(&mut self, now: u64, out: &mut [Completion], n: &mut usize) {
        let mut i = 0;
        while i < self.handshakes.len() && *n < out.len() {
            let h = self.handshakes[i];
            if !h.due.passed(self.polls, now) {
                i += 1;
                continue;
            }
            self.handshakes.remove(i);
            let result = match h.fail {
                Some(status) => Err(status),
                None => Ok(0),
            };
            if let Some(conn) = self.conn_mut(h.ep) {
                conn.connecting = false;
                conn.dead = result.is_err();
            }
            if result.is_err() {
                // The handle is dead: release the inner connection now.
                self.inner.disconnect(h.ep);
            }
            self.state().events.push(SimEvent::Connected(h.ep, result));
            out[*n] = Completion::new(h.token, result);
            *n += 1;
        }
    }

    /// The earliest moment something held becomes due, or is due already
    /// (`now`), for the wake descriptor.
    fn next_due(&self, now: u64) -> Option<u64> {
        let polls = self.polls;
        let mut earliest = self.retry_at;
        let mut consider = |due: Option<Due>| {
            let at = match due {
                Some(d) if d.passed(polls, now) => Some(now),
                Some(d) => d.time(),
                None => None,
            };
            if let Some(at) = at {
                earliest = Some(earliest.map_or(at, |e: u64| e.min(at)));
            }
        };
        if !self.ready.is_empty() {
            consider(Some(Due::Time(now)));
        }
        for conn in self.conns.iter().flatten() {
            if conn.connecting || conn.dead {
                continue;
            }
            for lane in &conn.lanes {
                // Operations behind the head wait for it; the head (or any,
                // on an unordered lane) decides. Considering them all only
                // risks an early, harmless wake-up.
                for h in &lane.queue {
                    consider(h.due);
                }
            }
        }
        for f in &self.flushes {
            consider(f.due);
        }
        for h in &self.handshakes {
            consider(Some(h.due));
        }
        earliest
    }

    /// Whether something held becomes due only after more polls (the
    /// poll-counted timings): no descriptor can signal it, so a sleeping
    /// core thread would never see it.
    fn waits_for_polls(&self) -> bool {
        let polls = self.polls;
        let unpassed = |due: Option<Due>| matches!(due, Some(Due::Poll(p)) if p > polls);
        self.conns
            .iter()
            .flatten()
            .filter(|c| !c.connecting && !c.dead)
            .any(|c| {
                c.lanes
                    .iter()
                    .any(|l| l.queue.iter().any(|h| unpassed(h.due)))
            })
            || self.flushes.iter().any(|f| unpassed(f.due))
            || self.handshakes.iter().any(|h| unpassed(Some(h.due)))
    }
}

impl<D: Driver> Driver for SimDriver<D> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn capabilities(&self) -> Capabilities {
        let mut caps = self.inner.capabilities();
        if let Some(kinds) = self.mem_kinds {
            caps.mem_kinds = kinds;
        }
        if let Some(kinds) = self.remote_kinds {
            caps.remote_kinds = kinds;
        }
        caps
    }

    fn attach(&mut self, ctx: DriverContext) {
        self.inner.attach(ctx);
    }

    fn address(&self) -> Vec<u8> {
        self.inner.address()
    }

    fn connect(&mut self, peer: &[u8], lanes: u8, token: Token) -> Result<Connect, DriverError> {
        if let Some(status) = self.state().connect_refusals.pop_front() {
            return Err(DriverError::new(status, "connect refused (programmed)"));
        }
        let (ep, handshake) = match self.inner.connect(peer, lanes, token)? {
            Connect::Done(ep) => (ep, true),
            // The inner driver runs a handshake of its own: its completion
            // comes through its poll, passed through.
            Connect::InFlight(ep) => (ep, false),
        };
        let index = ep.0 as usize;
        if self.conns.len() <= index {
            self.conns.resize_with(index + 1, || None);
        }
        self.conns[index] = Some(Conn {
            lanes: (0..lanes).map(|_| Lane::default()).collect(),
            connecting: handshake,
            dead: false,
            closing: false,
        });
        if handshake {
            let (timing, fail) = {
                let mut s = self.state();
                s.events.push(SimEvent::Connect(ep));
                (s.connect_timing, s.connect_failures.pop_front())
            };
            let now = now_ns();
            let random = self.next_random();
            let due = Due::new(timing, self.polls, now, random);
            self.handshakes.push(Handshake {
                ep,
                token,
                due,
                fail,
            });
            if let Some(at) = due.time() {
                self.arm_by(at);
            }
        } else {
            self.state().events.push(SimEvent::Connect(ep));
        }
        Ok(Connect::InFlight(ep))
    }

    fn disconnect(&mut self, ep: DriverEp) {
        let drain = {
            let mut s = self.state();
            s.events.push(SimEvent::Disconnect(ep));
            s.drain_on_disconnect
        };
        let Some(conn) = self.conn(ep) else {
            return;
        };
        let (dead, conn_connecting) = (conn.dead, conn.connecting);
        // A pending handshake completes now, canceled.
        let (gone, kept): (Vec<_>, Vec<_>) = self.handshakes.drain(..).partition(|h| h.ep == ep);
        self.handshakes = kept;
        for h in gone {
            self.cancel(h.token);
        }
        if drain && !dead && !conn_connecting {
            self.conn_mut(ep).expect("checked above").closing = true;
            self.release_drained();
        } else {
            self.cancel_conn(ep);
            self.conns[ep.0 as usize] = None;
            if !dead {
                self.inner.disconnect(ep);
            }
        }
        if !self.ready.is_empty() {
            self.arm_by(now_ns());
        }
    }

    fn register(&mut self, mem: &MemDesc, prepared: Prepared) -> Result<Registered, DriverError> {
        let prepared = self.second_phase(prepared, "register");
        let answer = if self.declined.contains(mem.kind) {
            Registered::Declined
        } else {
            let mut desc = *mem;
            if !self.inner.capabilities().supports_mem_kind(mem.kind) {
                // A claimed kind (`with_mem_kinds`): host memory underneath.
                desc.kind = MemKind::Host;
            }
            let registered = self.inner.register(&desc, prepared)?;
            match registered.key() {
                Some(key) => {
                    let mut s = self.state();
                    s.quiesced_keys.remove(&key.0);
                    s.events.push(SimEvent::Register(key));
                    if self.local_only.contains(mem.kind) {
                        Registered::Local(key)
                    } else {
                        registered
                    }
                }
                None => registered,
            }
        };
        self.state()
            .events
            .push(SimEvent::Registered(mem.kind, answer));
        Ok(answer)
    }

    fn deregister(&mut self, key: DriverMemKey) {
        self.inner.deregister(key);
        self.state().events.push(SimEvent::Deregister(key));
    }

    fn pack_rkey(&self, key: DriverMemKey) -> Result<Vec<u8>, DriverError> {
        self.inner.pack_rkey(key)
    }

    fn unpack_rkey(
        &mut self,
        ep: DriverEp,
        part: &KeyPart<'_>,
        prepared: Prepared,
    ) -> Result<Unpacked, DriverError> {
        let prepared = self.second_phase(prepared, "unpack");
        if !self.capabilities().reaches(part.kind) {
            self.state().violation(format!(
                "asked to unpack a part of {:?} memory, which it does not reach",
                part.kind
            ));
        }
        if let Some(status) = self.state().unpack_refusals.pop_front() {
            return Err(DriverError::new(status, "unpack refused (programmed)"));
        }
        let answer = if self.unreachable.contains(part.kind) {
            Unpacked::Unreachable
        } else {
            let mut inner_part = *part;
            if !self.inner.capabilities().reaches(part.kind) {
                // A claimed kind: host memory underneath.
                inner_part.kind = MemKind::Host;
            }
            self.inner.unpack_rkey(ep, &inner_part, prepared)?
        };
        self.state()
            .events
            .push(SimEvent::Unpacked(ep, part.kind, answer));
        Ok(answer)
    }

    fn prepare(&self) -> Option<Arc<dyn Prepare>> {
        Some(Arc::new(SlowPrepare {
            state: self.state.clone(),
            inner: self.inner.prepare(),
        }))
    }

    fn release_rkey(&mut self, ep: DriverEp, rkey: DriverRkey) {
        self.state().events.push(SimEvent::ReleaseRkey(ep, rkey));
        self.inner.release_rkey(ep, rkey);
    }

    #[allow(unsafe_code)] // the trait's unsafe data-path contract
    unsafe fn post(&mut self, ep: DriverEp, op: &Op, token: Token) -> Posted {
        let (timing, depth) = {
            let s = self.state();
            (s.timing, s.lane_depth)
        };
        let problem = match self.conn(ep) {
            None => Some(Status::EndpointClosed),
            Some(c) if c.dead || c.closing => Some(Status::EndpointClosed),
            Some(c) if c.connecting => {
                self.state()
                    .violation(format!("post on {ep:?} before its handshake completed"));
                Some(Status::InvalidEndpoint)
            }
            Some(c) if op.lane as usize >= c.lanes.len() => Some(Status::InvalidArgument),
            Some(_) => None,
        };
        if let Some(status) = problem {
            return Posted::Done(Err(status));
        }
        if self.state().quiesced_all {
            self.state()
                .violation(format!("post on {ep:?} after quiesce(All)"));
        }
        self.seq += 1;
        let seq = self.seq;
        let lane = &mut self.conn_mut(ep).expect("checked above").lanes[op.lane as usize];
        if lane.queue.len() >= depth {
            return Posted::NoResource;
        }
        lane.queue.push_back(Held {
            op: *op,
            token,
            seq,
            timing,
            due: None,
        });
        if !lane.touched {
            lane.touched = true;
            self.touched.push((ep.0, op.lane));
        }
        self.state().stats.posted += 1;
        Posted::InFlight
    }

    fn flush(&mut self, ep: DriverEp, lanes: LaneMask, token: Token) -> Posted {
        let problem = match self.conn(ep) {
            None => Some(Status::EndpointClosed),
            Some(c) if c.dead || c.closing => Some(Status::EndpointClosed),
            Some(c) if c.connecting => {
                self.state()
                    .violation(format!("flush on {ep:?} before its handshake completed"));
                Some(Status::InvalidEndpoint)
            }
            Some(_) => None,
        };
        if let Some(status) = problem {
            return Posted::Done(Err(status));
        }
        if lanes == 0 {
            return Posted::Done(Ok(0));
        }
        let timing = {
            let mut s = self.state();
            s.stats.flushes += 1;
            s.timing
        };
        self.flushes.push_back(HeldFlush {
            ep,
            lanes,
            token,
            seq: self.seq,
            timing,
            due: None,
        });
        self.flushes_touched = true;
        Posted::InFlight
    }

    fn check_alive(&mut self, ep: DriverEp) -> Result<(), Status> {
        match self.conn(ep) {
            None => Err(Status::EndpointClosed),
            Some(c) if c.dead || c.closing || c.connecting => Err(Status::EndpointClosed),
            Some(_) => self.inner.check_alive(ep),
        }
    }

    fn commit(&mut self) {
        {
            let mut s = lock(&self.state);
            s.stats.commits += 1;
            if s.reseed {
                s.reseed = false;
                self.rng = s.seed;
            }
        }
        self.inner.commit();
        if self.touched.is_empty() && !self.flushes_touched {
            return;
        }
        let (polls, now) = (self.polls, now_ns());
        let mut earliest: Option<u64> = None;
        let rng = &mut self.rng;
        let mut cover = |held_due: &mut Option<Due>, timing: SimTiming| -> bool {
            if held_due.is_some() {
                return false; // committed earlier: the rest is too
            }
            let due = Due::new(timing, polls, now, xorshift(rng));
            *held_due = Some(due);
            if let Some(at) = due.time() {
                earliest = Some(earliest.map_or(at, |e| e.min(at)));
            }
            true
        };
        for (e, l) in std::mem::take(&mut self.touched) {
            let Some(conn) = self.conns.get_mut(e as usize).and_then(Option::as_mut) else {
                continue;
            };
            let lane = &mut conn.lanes[l as usize];
            lane.touched = false;
            // What was posted since the last commit is the tail of the lane.
            for h in lane.queue.iter_mut().rev() {
                if !cover(&mut h.due, h.timing) {
                    break;
                }
            }
        }
        if std::mem::take(&mut self.flushes_touched) {
            for f in self.flushes.iter_mut().rev() {
                if !cover(&mut f.due, f.timing) {
                    break;
                }
            }
        }
        if let Some(at) = earliest {
            self.arm_by(at);
        }
    }

    fn poll(&mut self, out: &mut [Completion]) -> usize {
        self.polls += 1;
        {
            let mut s = lock(&self.state);
            s.stats.polls += 1;
            self.one_shot = s.arm_on_sleep;
            if s.reseed {
                s.reseed = false;
                self.rng = s.seed;
            }
        }
        let now = now_ns();
        self.retry_at = None;
        let mut n = ringfence::drain_completions(&mut self.ready, out);
        n += self.inner.poll(&mut out[n..]);
        self.run_handshakes(now, out, &mut n);
        self.run_lanes(now, out, &mut n);
        self.run_flushes(now, out, &mut n);
        self.release_drained();
        // Cleared here, and only here: re-armed for whatever is pending (at
        // once if something is due already and did not fit in `out`). A
        // one-shot timer is left alone: `prepare_sleep` arms it.
        if !self.one_shot {
            let next = self.next_due(now);
            if next.is_some() || self.armed.is_some() {
                self.set_timer(next);
            }
        }
        n
    }

    fn wake_fds(&self) -> Vec<BorrowedFd<'_>> {
        vec![self.timer.as_fd()]
    }

    /// `NotNow` while something held becomes due only after more polls
    /// (nothing signals it). Level-triggered, `Ready`: the timer is armed
    /// already. One-shot ([`SimHandle::arm_on_sleep`]): armed now for the
    /// earliest due moment, `NotNow` if that has come already.
    fn prepare_sleep(&mut self) -> Sleep {
        let one_shot = {
            let mut s = self.state();
            s.stats.sleeps_prepared += 1;
            s.arm_on_sleep
        };
        self.one_shot = one_shot;
        if self.waits_for_polls() {
            return Sleep::NotNow;
        }
        if !self.one_shot {
            return Sleep::Ready;
        }
        let now = now_ns();
        let next = self.next_due(now);
        if next.is_some_and(|at| at <= now) {
            return Sleep::NotNow;
        }
        self.asleep = true;
        self.set_timer(next);
        Sleep::Ready
    }

    fn woke(&mut self) {
        if std::mem::take(&mut self.asleep) && self.armed.is_some() {
            self.set_timer(None);
        }
    }

    fn quiesce(&mut self, scope: Quiesce) -> Quiesced {
        self.state().events.push(SimEvent::QuiesceCalled(scope));
        match scope {
            Quiesce::All => {
                for index in 0..self.conns.len() {
                    let ep = DriverEp(index as u32);
                    if self.conn(ep).is_some() {
                        self.cancel_conn(ep);
                    }
                }
                let tokens: Vec<Token> = self.flushes.drain(..).map(|f| f.token).collect();
                for token in tokens {
                    self.cancel(token);
                }
                let tokens: Vec<Token> = self.handshakes.drain(..).map(|h| h.token).collect();
                for token in tokens {
                    self.cancel(token);
                }
                self.release_drained();
            }
            Quiesce::Memory(key) => {
                let mut tokens = Vec::new();
                for conn in self.conns.iter_mut().flatten() {
                    for lane in &mut conn.lanes {
                        lane.queue.retain(|h| {
                            let uses = h.op.local_key == Some(key);
                            if uses {
                                tokens.push(h.token);
                            }
                            !uses
                        });
                    }
                }
                for token in tokens {
                    self.cancel(token);
                }
            }
        }
        let inner = self.inner.quiesce(scope);
        if !self.ready.is_empty() {
            self.arm_by(now_ns());
        }
        let mut s = self.state();
        let id = match scope {
            Quiesce::All => None,
            Quiesce::Memory(key) => Some(key.0),
        };
        let delay = s.quiesce_delay;
        let asks = s.quiesce_asks.entry(id).or_insert(0);
        *asks = asks.saturating_add(1);
        let answer = if *asks <= delay || inner == Quiesced::Pending {
            Quiesced::Pending
        } else if s.quiesce_leak || inner == Quiesced::Leak {
            Quiesced::Leak
        } else {
            Quiesced::Done
        };
        if answer != Quiesced::Pending {
            s.quiesce_asks.remove(&id);
        }
        match answer {
            Quiesced::Done => {
                match scope {
                    Quiesce::All => s.quiesced_all = true,
                    Quiesce::Memory(key) => {
                        s.quiesced_keys.insert(key.0);
                    }
                }
                s.events.push(SimEvent::QuiesceReturned(scope));
            }
            Quiesced::Pending => s.events.push(SimEvent::QuiescePending(scope)),
            Quiesced::Leak => s.events.push(SimEvent::QuiesceLeaked(scope)),
        }
        answer
    }

    fn direct(&mut self) -> Option<&mut dyn DirectPath> {
        // Nothing finishes inside a call.
        None
    }

    fn alloc_memory(
        &mut self,
        len: usize,
        kind: MemKind,
    ) -> Option<Result<Arc<dyn DriverMemory>, DriverError>> {
        if !self.capabilities().supports_mem_kind(kind) {
            return None;
        }
        Some(match SimMemory::new(len, kind, self.state.clone()) {
            Some(mem) => {
                let (addr, len) = (mem.addr(), mem.len());
                let mut s = self.state();
                // A new allocation may reuse freed addresses.
                s.freed
                    .retain(|&(a, size)| !(a < addr + len as u64 && addr < a + size));
                s.events.push(SimEvent::Allocated { addr, len });
                Ok(Arc::new(mem) as Arc<dyn DriverMemory>)
            }
            None => Err(DriverError::new(
                Status::NoMemory,
                "simulated driver: allocation failed",
            )),
        })
    }

    fn lane_ordered(&self, ep: DriverEp, lane: u8) -> bool {
        self.inner.lane_ordered(ep, lane)
    }

    fn lane_generation(&self, ep: DriverEp, lane: u8) -> u32 {
        self.inner.lane_generation(ep, lane)
    }

    fn peer_limits(&self, ep: DriverEp) -> Option<PeerLimits> {
        self.inner.peer_limits(ep)
    }
}

impl<D: Driver> Drop for SimDriver<D> {
    /// Records completions the engine never polled: everything a driver
    /// completes must be taken through `poll` before it is dropped.
    fn drop(&mut self) {
        if !self.ready.is_empty() {
            let n = self.ready.len();
            self.state().violation(format!(
                "dropped with {n} completions never polled (after disconnect or quiesce)"
            ));
        }
    }
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

// SAFETY: `SimMemory` owns its allocation and hands out only its address;
// the bytes are accessed through raw copies and atomics by whoever
// registered them, never through this object.
#[allow(unsafe_code)]
unsafe impl Send for SimMemory {}
// SAFETY: as above; `&SimMemory` gives out only the address and length.
#[allow(unsafe_code)]
unsafe impl Sync for SimMemory {}

impl SimMemory {
    /// `len` zeroed bytes (at least one), 64-byte aligned; `None` if the
    /// allocation fails.
    #[allow(unsafe_code)]
    fn new(len: usize, kind: MemKind, state: Arc<Mutex<State>>) -> Option<SimMemory> {
        let layout = Layout::from_size_align(len.max(1), 64).ok()?;
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) })?;
        Some(SimMemory {
            ptr,
            layout,
            len: len.max(1),
            kind,
            state,
        })
    }
}

// SAFETY: the allocation is `len` bytes from `alloc_zeroed` (zeroed, mapped,
// readable and writable host memory), 64-byte aligned by its layout, and
// lives, unmoved, until this object drops; `kind` is the kind asked for.
// For a claimed device kind the bytes are host memory all the same.
#[allow(unsafe_code)]
unsafe impl DriverMemory for SimMemory {
    fn addr(&self) -> u64 {
        self.ptr.as_ptr() as usize as u64
    }

    fn len(&self) -> usize {
        self.len
    }

    fn kind(&self) -> MemKind {
        self.kind
    }
}

impl Drop for SimMemory {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        let (addr, len) = (self.addr(), self.len);
        // SAFETY: allocated in `new` with exactly this layout, freed once.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) };
        let mut s = lock(&self.state);
        s.freed.push((addr, len as u64));
        s.events.push(SimEvent::Freed { addr, len });
    }
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

impl SlowPrepare {
    /// Waits until the engine has polled the driver as many more times
    /// as programmed.
    fn wait(&self, register: bool) -> Result<(), DriverError> {
        let (start, wanted) = {
            let s = lock(&self.state);
            (s.stats.polls, s.slow_polls)
        };
        if wanted == 0 {
            return Ok(());
        }
        let polls = || lock(&self.state).stats.polls;
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while polls() - start < wanted {
            if std::time::Instant::now() > deadline {
                return Err(DriverError::new(
                    Status::Timeout,
                    "the engine did not poll while a registration's first phase ran",
                ));
            }
            std::thread::yield_now();
        }
        let polls = polls() - start;
        lock(&self.state)
            .events
            .push(SimEvent::Prepared { register, polls });
        Ok(())
    }
}

impl Prepare for SlowPrepare {
    fn register(&self, mem: &MemDesc) -> Result<Prepared, DriverError> {
        let inner = match &self.inner {
            Some(p) => p.register(mem)?,
            None => Prepared::none(),
        };
        self.wait(true)?;
        Ok(Prepared::new(SlowDone(inner)))
    }

    fn unpack(&self, ep: DriverEp, part: &KeyPart<'_>) -> Result<Prepared, DriverError> {
        let inner = match &self.inner {
            Some(p) => p.unpack(ep, part)?,
            None => Prepared::none(),
        };
        self.wait(false)?;
        Ok(Prepared::new(SlowDone(inner)))
    }
}
