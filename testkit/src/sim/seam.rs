//! The [`Driver`] trait's methods of [`SimDriver`], and its drop.

use ringfence::DriverMemory;
use ringfence::MemKind;
use ringfence::{
    Capabilities, Completion, Connect, DirectPath, Driver, DriverContext, DriverEp, DriverError,
    DriverMemKey, DriverRkey, KeyPart, LaneMask, MemDesc, Op, PeerLimits, Posted, Prepare,
    Prepared, Quiesce, Quiesced, Registered, Sleep, Token, Unpacked,
};
use ringfence_ring::Status;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;

use super::*;
use crate::held::{self, HeldFlush, now_ns};

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
        self.held.open(ep, lanes, 0);
        self.conns[index] = Some(Conn {
            lanes: vec![LaneState::default(); usize::from(lanes)],
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
            let due = timing.due(self.polls, now, random);
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
        let seq = self.held.next_seq();
        if self.held.lane(ep, op.lane).map_or(0, |q| q.len()) >= depth {
            return Posted::NoResource;
        }
        let held = Held {
            op: *op,
            token,
            seq,
            channel: 0,
            due: None,
            meta: timing,
        };
        self.held
            .push(ep, held)
            .expect("the connection has the lane (checked above)");
        let lane = &mut self.conn_mut(ep).expect("checked above").lanes[op.lane as usize];
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
        self.flushes.push(HeldFlush {
            ep,
            lanes,
            token,
            seq: self.held.seq(),
            due: None,
            meta: timing,
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
                self.rng = Rng::new(s.seed);
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
            let due = timing.due(polls, now, rng.next());
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
            conn.lanes[l as usize].touched = false;
            // What was posted since the last commit is the tail of the lane.
            self.held
                .commit_tail(DriverEp(e), l, |h| cover(&mut h.due, h.meta));
        }
        if std::mem::take(&mut self.flushes_touched) {
            self.flushes.commit_tail(|f| cover(&mut f.due, f.meta));
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
                self.rng = Rng::new(s.seed);
            }
        }
        let now = now_ns();
        self.retry_at = None;
        let mut n = held::forward::poll(&mut self.ready, &mut self.inner, out);
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
                let tokens: Vec<Token> = self.flushes.take_all().iter().map(|f| f.token).collect();
                for token in tokens {
                    self.cancel(token);
                }
                let tokens: Vec<Token> = self.handshakes.drain(..).map(|h| h.token).collect();
                for token in tokens {
                    self.cancel(token);
                }
                self.release_drained();
            }
            Quiesce::Memory(_) => {
                let gone = self.held.take_where(|_, _, h| held::covers(scope, &h.op));
                for h in gone {
                    self.cancel(h.token);
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
