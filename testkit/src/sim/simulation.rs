//! The simulation: held operations, flushes and handshakes per lane, when
//! each is due, and their execution at the inner driver.

use crate::held::forward::{self, Forwarded};
use crate::held::{Due, Executed, HeldFlushes, HeldLanes, Moment, Rng};
use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{self, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
#[cfg(doc)]
use ringfence::Capabilities;
use ringfence::MemKinds;
use ringfence::{Completion, Driver, DriverEp, Prepared, Token};
use ringfence_ring::Status;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::*;

impl SimTiming {
    /// When something under this timing committed (or started) at poll
    /// `polls` and time `now` is due; `random` draws within
    /// `PollsBetween`.
    pub(super) fn due(self, polls: u64, now: u64, random: u64) -> Due {
        match self {
            SimTiming::Polls(n) => Due::after_polls(polls, u64::from(n)),
            SimTiming::PollsBetween(lo, hi) => {
                let (lo, hi) = (u64::from(lo.max(1)), u64::from(hi.max(lo).max(1)));
                Due::after_polls(polls, lo + random % (hi - lo + 1))
            }
            SimTiming::Delay(d) => Due::after_time(now, d),
        }
    }
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
            held: HeldLanes::new(),
            flushes: HeldFlushes::new(),
            handshakes: Vec::new(),
            ready: VecDeque::new(),
            flushes_touched: false,
            touched: Vec::new(),
            polls: 0,
            rng: Rng::new(1),
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

    pub(super) fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// What the inner driver's second phase gets of `prepared`: with a
    /// slow first phase, the inner driver's own result inside it (a
    /// violation if the first phase did not run).
    pub(super) fn second_phase(&self, prepared: Prepared, what: &str) -> Prepared {
        match prepared.take::<SlowDone>() {
            Some(SlowDone(inner)) => inner,
            None => {
                self.state()
                    .violation(format!("{what} without its first phase"));
                Prepared::none()
            }
        }
    }

    pub(super) fn next_random(&mut self) -> u64 {
        self.rng.next()
    }

    /// Where this poll is (at `now`), for what is due.
    pub(super) fn moment(&self, now: u64) -> Moment {
        Moment {
            polls: self.polls,
            ns: now,
        }
    }

    pub(super) fn conn(&self, ep: DriverEp) -> Option<&Conn> {
        self.conns.get(ep.0 as usize)?.as_ref()
    }

    pub(super) fn conn_mut(&mut self, ep: DriverEp) -> Option<&mut Conn> {
        self.conns.get_mut(ep.0 as usize)?.as_mut()
    }

    /// Sets the timer to expire at `at` (absolute), or disarms it. Setting
    /// it resets its expiration count: only `poll` calls this with a time
    /// that is not earlier than the armed one.
    pub(super) fn set_timer(&mut self, at: Option<u64>) {
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
    pub(super) fn arm_by(&mut self, at: u64) {
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
    pub(super) fn cancel(&mut self, token: Token) {
        self.ready.push_back(forward::canceled(token));
        self.state().stats.canceled += 1;
    }

    /// Cancels everything connection `ep` holds, and its flushes and
    /// handshake.
    pub(super) fn cancel_conn(&mut self, ep: DriverEp) {
        let mut tokens = Vec::new();
        if self.conn(ep).is_some() {
            tokens.extend(self.held.drain_ep(ep).iter().map(|h| h.token));
        }
        tokens.extend(self.flushes.take_ep(ep).iter().map(|f| f.token));
        let (gone, kept): (Vec<_>, Vec<_>) = self.handshakes.drain(..).partition(|h| h.ep == ep);
        self.handshakes = kept;
        tokens.extend(gone.iter().map(|h| h.token));
        for token in tokens {
            self.cancel(token);
        }
    }

    /// Releases the inner connection of a connection that drained.
    pub(super) fn release_drained(&mut self) {
        for index in 0..self.conns.len() {
            let ep = DriverEp(index as u32);
            let drained = self.conn(ep).is_some_and(|c| c.closing)
                && self.held.ep_is_idle(ep)
                && !self.flushes.any_on(ep);
            if drained {
                let conn = self.conns[index].take().expect("checked above");
                if !conn.dead {
                    self.inner.disconnect(ep);
                }
            }
        }
    }

    /// How many operations at the front of `lane` of `ep` may execute
    /// now: for a lane the inner driver orders the head alone; for an
    /// unordered one everything due before the first later operation that
    /// carries the transport fence flag.
    pub(super) fn eligible(&self, ep: DriverEp, lane: u8, now: u64) -> usize {
        if self.conn(ep).is_none() {
            return 0;
        }
        let ordered = self.inner.capabilities().ordered_lanes;
        self.held.eligible(ep, lane, ordered, self.moment(now))
    }

    /// Checks an operation about to execute against what quiesce and
    /// frees covered, and counts it. Returns whether it may touch memory.
    pub(super) fn check_execution(&self, ep: DriverEp, held: &Held) -> bool {
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

    /// Executes one held operation at the inner driver: its completion,
    /// `Later` if the inner driver completes it later, `Full` if it had no
    /// room (the caller puts the operation back).
    /// An execution the contract forbids (see `check_execution`) is
    /// recorded and refused: it completes with `AccessDenied` without
    /// touching memory, so a misbehaving engine cannot make a test use
    /// freed memory.
    #[allow(unsafe_code)] // forwards the unsafe `post`
    pub(super) fn execute(&mut self, ep: DriverEp, held: &Held) -> Forwarded {
        if !self.check_execution(ep, held) {
            return Forwarded::Done(Completion::new(held.token, Err(Status::AccessDenied)));
        }
        // SAFETY: `held.op` came through our `post`, whose caller keeps its
        // local memory allocated and registered until its completion is
        // returned or `quiesce` returns; neither has happened (a quiesce
        // that covered it removed it from the lanes, and `check_execution`
        // refuses anything after one).
        let forwarded = unsafe { forward::post(&mut self.inner, ep, &held.op, held.token) };
        if forwarded.succeeded() {
            self.state().log.push(Executed::of(ep, &held.op));
        }
        if let Forwarded::Full = forwarded {
            let mut s = self.state();
            s.stats.inner_no_resource += 1;
            s.stats.executed -= 1;
        }
        forwarded
    }

    /// Executes due operations, lanes visited in a random order, into
    /// `out[*n..]`.
    pub(super) fn run_lanes(&mut self, now: u64, out: &mut [Completion], n: &mut usize) {
        let mut candidates = std::mem::take(&mut self.candidates);
        while *n < out.len() {
            candidates.clear();
            for (index, slot) in self.conns.iter().enumerate() {
                let Some(conn) = slot else { continue };
                if conn.connecting || conn.dead {
                    continue;
                }
                let ep = DriverEp(index as u32);
                for (l, lane) in conn.lanes.iter().enumerate() {
                    if !self.held.is_idle(ep, l as u8)
                        && lane.blocked_at != self.polls
                        && self.eligible(ep, l as u8, now) > 0
                    {
                        candidates.push((index as u32, l as u8));
                    }
                }
            }
            if candidates.is_empty() {
                break;
            }
            let k = self.rng.below(candidates.len());
            let (e, l) = candidates[k];
            let ep = DriverEp(e);
            // The head of an ordered lane; on an unordered one, any due
            // operation before the next fence-flagged one, drawn.
            let ordered = self.inner.capabilities().ordered_lanes;
            let at = self.moment(now);
            let rng = &mut self.rng;
            let draw = |eligible: usize| {
                if eligible > 1 { rng.below(eligible) } else { 0 }
            };
            let pick = self.held.pick(ep, l, ordered, at, draw).unwrap_or(0);
            let held = self.held.take(ep, l, pick);
            match self.execute(ep, &held) {
                Forwarded::Done(c) => {
                    out[*n] = c;
                    *n += 1;
                }
                Forwarded::Later => {}
                Forwarded::Full => {
                    // The inner driver is full: keep it in place, try later.
                    self.held.put_back(ep, l, pick, held);
                    let polls = self.polls;
                    self.conns[e as usize].as_mut().expect("candidate").lanes[l as usize]
                        .blocked_at = polls;
                    self.retry_at = Some(now + 1_000_000);
                }
            }
        }
        self.candidates = candidates;
    }

    /// Completes due flushes whose lanes hold nothing older, into
    /// `out[*n..]`.
    pub(super) fn run_flushes(&mut self, now: u64, out: &mut [Completion], n: &mut usize) {
        let at = self.moment(now);
        let mut i = 0;
        while *n < out.len() {
            let Some(next) = self.flushes.next_ready(i, &self.held, at) else {
                break;
            };
            i = next;
            let f = self.flushes.get(i);
            self.state().flush_log.push((f.ep, f.lanes));
            match forward::flush(&mut self.inner, f.ep, f.lanes, f.token) {
                Forwarded::Done(c) => {
                    self.flushes.remove(i);
                    out[*n] = c;
                    *n += 1;
                }
                // The inner driver completes it through its own poll.
                Forwarded::Later => {
                    self.flushes.remove(i);
                }
                Forwarded::Full => {
                    self.state().flush_log.pop();
                    self.retry_at = Some(now + 1_000_000);
                    i += 1;
                }
            }
        }
    }

    /// Completes due handshakes into `out[*n..]`.
    pub(super) fn run_handshakes(&mut self, now: u64, out: &mut [Completion], n: &mut usize) {
        let mut i = 0;
        while i < self.handshakes.len() && *n < out.len() {
            let h = self.handshakes[i];
            if !h.due.passed(self.moment(now)) {
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
    pub(super) fn next_due(&self, now: u64) -> Option<u64> {
        let at = self.moment(now);
        let mut earliest = self.retry_at;
        let mut consider = |due: Option<Due>| {
            let when = match due {
                Some(d) if d.passed(at) => Some(now),
                Some(d) => d.time(),
                None => None,
            };
            if let Some(when) = when {
                earliest = Some(earliest.map_or(when, |e: u64| e.min(when)));
            }
        };
        if !self.ready.is_empty() {
            consider(Some(Due::Time(now)));
        }
        for (index, conn) in self.conns.iter().enumerate() {
            let Some(conn) = conn else { continue };
            if conn.connecting || conn.dead {
                continue;
            }
            // Operations behind a lane's head wait for it; the head (or
            // any, on an unordered lane) decides. Considering them all only
            // risks an early, harmless wake-up.
            for h in self.held.ops(DriverEp(index as u32)) {
                consider(h.due);
            }
        }
        for f in self.flushes.iter() {
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
    pub(super) fn waits_for_polls(&self) -> bool {
        let polls = self.polls;
        let unpassed = |due: Option<Due>| matches!(due, Some(Due::Poll(p)) if p > polls);
        self.conns
            .iter()
            .enumerate()
            .filter(|(_, c)| c.as_ref().is_some_and(|c| !c.connecting && !c.dead))
            .any(|(index, _)| {
                self.held
                    .ops(DriverEp(index as u32))
                    .any(|h| unpassed(h.due))
            })
            || self.flushes.iter().any(|f| unpassed(f.due))
            || self.handshakes.iter().any(|h| unpassed(Some(h.due)))
    }
}
