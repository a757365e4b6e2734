//! The [`Driver`] and [`DirectPath`] methods of [`FaultInjector`]: each
//! forwards to the inner driver through the program.

use ringfence::DriverMemory;
use ringfence::MemKind;
use ringfence::{
    Capabilities, Completion, Connect, DirectPath, Driver, DriverContext, DriverEp, DriverError,
    DriverMemKey, DriverRkey, KeyPart, LaneMask, MemDesc, Op, PeerLimits, Posted, Prepare,
    Prepared, Quiesce, Quiesced, Registered, Sleep, Token, Unpacked,
};
use ringfence_ring::Status;
use std::os::fd::BorrowedFd;
use std::sync::Arc;

use super::*;
use crate::held;

impl<D: Driver> Driver for FaultInjector<D> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn capabilities(&self) -> Capabilities {
        let mut caps = self.inner.capabilities();
        caps.ordered_lanes = caps.ordered_lanes && self.program().unordered == 0;
        caps
    }

    fn attach(&mut self, ctx: DriverContext) {
        // From now on the engine knows whether the lanes are ordered.
        self.program().attached = true;
        self.inner.attach(ctx);
    }

    fn address(&self) -> Vec<u8> {
        self.inner.address()
    }

    fn connect(&mut self, peer: &[u8], lanes: u8, token: Token) -> Result<Connect, DriverError> {
        let connect = self.inner.connect(peer, lanes, token)?;
        let (Connect::Done(ep) | Connect::InFlight(ep)) = connect;
        self.held.open(ep, lanes, 1024);
        Ok(connect)
    }

    fn disconnect(&mut self, ep: DriverEp) {
        self.dead.retain(|&d| d != ep.0);
        let gone = self.held.drain_ep(ep);
        self.ready
            .extend(gone.iter().map(|h| held::forward::canceled(h.token)));
        let gone = self.flushes.take_ep(ep);
        self.ready
            .extend(gone.iter().map(|f| held::forward::canceled(f.token)));
        self.count_held();
        self.inner.disconnect(ep);
    }

    fn register(&mut self, mem: &MemDesc, prepared: Prepared) -> Result<Registered, DriverError> {
        self.inner.register(mem, prepared)
    }

    fn deregister(&mut self, key: DriverMemKey) {
        self.inner.deregister(key);
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
        self.inner.unpack_rkey(ep, part, prepared)
    }

    fn prepare(&self) -> Option<Arc<dyn Prepare>> {
        self.inner.prepare()
    }

    fn release_rkey(&mut self, ep: DriverEp, rkey: DriverRkey) {
        self.inner.release_rkey(ep, rkey);
    }

    unsafe fn post(&mut self, ep: DriverEp, op: &Op, token: Token) -> Posted {
        if self.lost_to_dead(ep, token) {
            return Posted::InFlight;
        }
        let (timing, fail, kill, generation) = {
            let mut p = self.program();
            if p.no_resource > 0 {
                p.no_resource -= 1;
                return Posted::NoResource;
            }
            let n = self.posts;
            let (fail, kill) = match p.kills.iter().position(|k| k.0 == n) {
                Some(i) => {
                    let (_, status, cause) = p.kills.remove(i);
                    (Some(status), Some(cause))
                }
                None => (p.take_post_failure(n, op.lane), None),
            };
            (
                p.lane_timing(op.lane),
                fail,
                kill,
                p.generation(ep, op.lane),
            )
        };
        self.posts += 1;
        if timing == Timing::Synchronous && kill.is_none() && self.held.is_idle(ep, op.lane) {
            if let Some(status) = fail {
                return Posted::Done(Err(status));
            }
            // SAFETY: forwarded from our own `post`, under its caller's
            // guarantee.
            let posted = unsafe { self.inner.post(ep, op, token) };
            if matches!(posted, Posted::Done(Ok(_))) {
                self.log(ep, op);
            }
            return posted;
        }
        if !self.held.has_lane(ep, op.lane) {
            return Posted::Done(Err(Status::InvalidArgument));
        }
        let held = Held {
            op: *op,
            token,
            seq: self.held.next_seq(),
            channel: generation,
            due: Some(due(timing, self.polls)),
            meta: Fault { fail, kill },
        };
        self.held
            .push(ep, held)
            .expect("the lane was checked above");
        self.count_held();
        Posted::InFlight
    }

    fn flush(&mut self, ep: DriverEp, lanes: LaneMask, token: Token) -> Posted {
        if self.lost_to_dead(ep, token) {
            return Posted::InFlight;
        }
        let (timing, fail, kill, blocked) = {
            let mut p = self.program();
            p.flush_log.push((ep, lanes));
            let n = self.flush_count;
            let (fail, kill) = match p.flush_kills.iter().position(|k| k.0 == n) {
                Some(i) => {
                    let (_, status, cause) = p.flush_kills.remove(i);
                    (Some(status), Some(cause))
                }
                None => (take_failure(&mut p.fail_flushes, |k| k == n), None),
            };
            (p.timing, fail, kill, p.flushes_blocked)
        };
        self.flush_count += 1;
        if timing == Timing::Synchronous
            && kill.is_none()
            && !blocked
            && self.flush_clear(ep, lanes, self.held.seq())
        {
            // Everything posted on these lanes has executed.
            let posted = match fail {
                Some(status) => Posted::Done(Err(status)),
                None => self.inner.flush(ep, lanes, token),
            };
            if let Posted::Done(result) = posted {
                self.flush_completed(Completion::new(token, result));
            }
            return posted;
        }
        self.flushes.push(HeldFlush {
            ep,
            lanes,
            token,
            seq: self.held.seq(),
            due: Some(due(timing, self.polls)),
            meta: Fault { fail, kill },
        });
        self.count_held();
        Posted::InFlight
    }

    fn poll(&mut self, out: &mut [Completion]) -> usize {
        self.polls += 1;
        self.now = held::now_ns();
        // One lock of the program per poll.
        let (timing, unordered, flushes_blocked, strays, lost_lanes) = {
            let mut p = self.program();
            let strays = if p.strays.is_empty() {
                Vec::new()
            } else {
                std::mem::take(&mut p.strays)
            };
            let lost = std::mem::take(&mut p.lost_lanes);
            let lost_flushes = std::mem::take(&mut p.lost_flushes);
            (
                p.timing,
                p.unordered,
                p.flushes_blocked,
                strays,
                (lost, lost_flushes),
            )
        };
        self.inject(strays);
        self.lose_lanes(lost_lanes);
        let mut n = held::forward::poll(&mut self.ready, &mut self.inner, out);
        let eps = self.held.endpoints();
        let start = if timing == Timing::Reordered {
            self.next_random() as usize
        } else {
            0
        };
        for k in 0..eps {
            let ep = (k + start) % eps.max(1);
            let lanes = self.held.lanes(ep);
            let lane_start = if timing == Timing::Reordered {
                self.next_random() as usize
            } else {
                0
            };
            for j in 0..lanes {
                let lane = (j + lane_start) % lanes;
                let unordered = unordered & (1 << lane) != 0;
                self.release_lane(DriverEp(ep as u32), lane as u8, unordered, out, &mut n);
            }
        }
        if !flushes_blocked {
            self.release_flushes(out, &mut n);
        }
        if !self.dead.is_empty() {
            self.lose_dead();
        }
        self.count_held();
        n
    }

    fn commit(&mut self) {
        self.inner.commit();
    }

    fn check_alive(&mut self, ep: DriverEp) -> Result<(), Status> {
        self.inner.check_alive(ep)
    }

    /// None, whatever the inner driver has: the injector holds operations
    /// and releases them only inside `poll`, where nothing makes a
    /// descriptor readable, so the core thread must keep polling while
    /// anything is in flight here (the inner driver's descriptor would let
    /// it sleep on held operations).
    fn wake_fds(&self) -> Vec<BorrowedFd<'_>> {
        Vec::new()
    }

    /// [`Sleep::WhenIdle`] (see `wake_fds`), or the inner driver's
    /// [`Sleep::NotNow`].
    fn prepare_sleep(&mut self) -> Sleep {
        match self.inner.prepare_sleep() {
            Sleep::NotNow => Sleep::NotNow,
            _ => Sleep::WhenIdle,
        }
    }

    fn woke(&mut self) {
        self.inner.woke();
    }

    fn quiesce(&mut self, scope: Quiesce) -> Quiesced {
        // What this wrapper still holds never reaches the inner driver
        // once its memory is quiesced: it completes canceled, unexecuted.
        let gone = self.held.take_where(|_, _, h| held::covers(scope, &h.op));
        self.ready
            .extend(gone.iter().map(|h| held::forward::canceled(h.token)));
        if scope == Quiesce::All {
            let gone = self.flushes.take_all();
            self.ready
                .extend(gone.iter().map(|f| held::forward::canceled(f.token)));
        }
        self.count_held();
        // Whatever the inner driver answers: this wrapper holds nothing
        // covered any more.
        self.inner.quiesce(scope)
    }

    fn direct(&mut self) -> Option<&mut dyn DirectPath> {
        // Runs go through this wrapper's `post`, where the faults are, and
        // only when the inner driver finishes operations inside the call.
        if self.inner.direct().is_some() {
            Some(self)
        } else {
            None
        }
    }

    fn alloc_memory(
        &mut self,
        len: usize,
        kind: MemKind,
    ) -> Option<Result<Arc<dyn DriverMemory>, DriverError>> {
        self.inner.alloc_memory(len, kind)
    }

    fn lane_generation(&self, ep: DriverEp, lane: u8) -> u32 {
        self.program().generation(ep, lane)
    }

    fn peer_limits(&self, ep: DriverEp) -> Option<PeerLimits> {
        self.inner.peer_limits(ep)
    }
}

impl<D: Driver> DirectPath for FaultInjector<D> {
    /// Runs `ops` one by one through `post` (so injected failures and
    /// NO_RESOURCE apply to each), and only while `post` would finish the
    /// next one inside the call (its lane's timing is synchronous and its
    /// lane holds nothing): an operation `post` would hold is left to the
    /// engine, which posts it itself. The inner driver finishes what it
    /// takes inside the call (it offers the direct path, or this driver
    /// would not offer it).
    unsafe fn execute(
        &mut self,
        ep: DriverEp,
        ops: &[Op],
        results: &mut [Result<u32, Status>],
    ) -> usize {
        // `execute_by_post` asks before each operation, in order.
        let mut next = ops.iter();
        let go = |d: &Self| next.next().is_some_and(|op| d.posts_inline(ep, op));
        // SAFETY: the caller vouches for `ops` as `execute` requires.
        unsafe { ringfence::execute_by_post(self, ep, ops, results, go) }
    }

    fn prefetch(&mut self, ep: DriverEp, rkey: DriverRkey, addr: u64, write: bool) {
        if let Some(inner) = self.inner.direct() {
            inner.prefetch(ep, rkey, addr, write);
        }
    }
}
