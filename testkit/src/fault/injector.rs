//! The injector's machinery over the held core (`crate::held`): what it
//! holds per lane and per flush is there; here is when each is released,
//! and what it loses or kills.

use crate::held::forward::Forwarded;
use crate::held::{self, Moment};
use ringfence::{Completion, Driver, DriverEp, Fails, LaneMask, MAX_LANES, Op, Token};
use ringfence_ring::Status;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::*;

impl<D: Driver> FaultInjector<D> {
    /// Wraps `inner`; the handle programs it.
    pub fn new(inner: D) -> (FaultInjector<D>, FaultHandle) {
        let program = Arc::new(Mutex::new(Program {
            timing: Timing::NextPoll,
            unordered: 0,
            attached: false,
            fail_posts: Vec::new(),
            fail_flushes: Vec::new(),
            no_resource: 0,
            generations: HashMap::new(),
            log: Vec::new(),
            flush_log: Vec::new(),
            seed: 0x9e37_79b9_7f4a_7c15,
            lane_timing: [None; MAX_LANES as usize],
            lane_failures: [None; MAX_LANES as usize],
            next_lane_failures: Vec::new(),
            flushes_blocked: false,
            duplicate_flushes: 0,
            strays: Vec::new(),
            kills: Vec::new(),
            flush_kills: Vec::new(),
            lost_lanes: Vec::new(),
            lost_flushes: Vec::new(),
        }));
        let injector = FaultInjector {
            inner,
            program: program.clone(),
            held_count: Arc::new(AtomicUsize::new(0)),
            held: HeldLanes::new(),
            flushes: HeldFlushes::new(),
            ready: VecDeque::new(),
            dead: Vec::new(),
            late: VecDeque::new(),
            posts: 0,
            flush_count: 0,
            polls: 0,
            now: now_ns(),
            rng: Rng::unseeded(),
        };
        let held = injector.held_count.clone();
        (injector, FaultHandle { program, held })
    }

    pub(super) fn program(&self) -> MutexGuard<'_, Program> {
        lock(&self.program)
    }

    /// The next draw, seeding the sequence from the program at the first.
    pub(super) fn next_random(&mut self) -> u64 {
        let program = &self.program;
        self.rng.next_seeded(|| lock(program).seed)
    }

    /// Where this poll is, for what is due.
    pub(super) fn moment(&self) -> Moment {
        Moment {
            polls: self.polls,
            ns: self.now,
        }
    }

    /// Whether `post` would finish `op` on `ep` inside the call.
    pub(super) fn posts_inline(&self, ep: DriverEp, op: &Op) -> bool {
        let p = self.program();
        p.no_resource == 0
            && p.lane_timing(op.lane) == Timing::Synchronous
            && self.held.is_idle(ep, op.lane)
    }

    /// Whether a flush of `lanes` of `ep` holds no operation posted before
    /// it (sequence number up to `seq`) behind it.
    pub(super) fn flush_clear(&self, ep: DriverEp, lanes: LaneMask, seq: u64) -> bool {
        !self.held.holds_before(ep, lanes, seq)
    }

    /// A flush completion the injector produced: schedules its copy if it
    /// is to be duplicated.
    pub(super) fn flush_completed(&mut self, c: Completion) {
        let duplicate = {
            let mut p = self.program();
            let duplicate = p.duplicate_flushes > 0;
            if duplicate {
                p.duplicate_flushes -= 1;
            }
            duplicate
        };
        if duplicate {
            self.late.push_back((self.polls + DUPLICATE_AFTER, c));
        }
    }

    /// Moves injected strays and the duplicates due at this poll to
    /// `ready`.
    pub(super) fn inject(&mut self, strays: Vec<Completion>) {
        self.ready.extend(strays);
        while let Some(&(at, c)) = self.late.front() {
            if at > self.polls {
                break;
            }
            self.late.pop_front();
            self.ready.push_back(c);
        }
    }

    /// Publishes how much is held to the handle.
    pub(super) fn count_held(&self) {
        // Relaxed: see `FaultHandle::held`.
        self.held_count
            .store(self.held.len() + self.flushes.len(), Ordering::Relaxed);
    }

    /// Releases the held flushes whose time came and whose lanes hold
    /// nothing older, into `out`.
    pub(super) fn release_flushes(&mut self, out: &mut [Completion], n: &mut usize) {
        let mut i = 0;
        while *n < out.len() {
            let Some(next) = self.flushes.next_ready(i, &self.held, self.moment()) else {
                break;
            };
            i = next;
            let f = self.flushes.remove(i);
            let result = match f.meta.fail {
                Some(status) => Err(status),
                None => match held::forward::flush(&mut self.inner, f.ep, f.lanes, f.token) {
                    Forwarded::Done(c) => c.result,
                    // The inner driver completes it later, through poll.
                    Forwarded::Later => continue,
                    Forwarded::Full => Err(Status::NoResource),
                },
            };
            let mut c = Completion::new(f.token, result);
            if let Some(cause) = f.meta.kill {
                self.dead.push(f.ep.0);
                c = c.failing(Fails::Endpoint(cause));
            }
            self.flush_completed(c);
            out[*n] = c;
            *n += 1;
        }
    }

    /// Executes one held operation at the inner driver; logs it on
    /// success. `None`: the inner driver completes it later. A refusal
    /// (`NoResource`) comes back as a completion with that status.
    pub(super) fn execute(&mut self, ep: DriverEp, held: Held) -> Option<Completion> {
        if let Some(status) = held.meta.fail {
            let c = Completion::new(held.token, Err(status));
            return Some(match held.meta.kill {
                Some(cause) => {
                    self.dead.push(ep.0);
                    c.failing(Fails::Endpoint(cause))
                }
                None => c,
            });
        }
        // SAFETY: `held.op` came through `post`, whose caller keeps its
        // memory valid until its completion, which has not been returned.
        let forwarded = unsafe { held::forward::post(&mut self.inner, ep, &held.op, held.token) };
        if forwarded.succeeded() {
            self.log(ep, &held.op);
        }
        match forwarded {
            Forwarded::Done(c) => Some(c),
            Forwarded::Later => None,
            Forwarded::Full => Some(Completion::new(held.token, Err(Status::NoResource))),
        }
    }

    /// On an endpoint killed by `kill_endpoint_on_post`, a post or flush
    /// with `token` is lost: it completes at the next poll. Whether it was.
    pub(super) fn lost_to_dead(&mut self, ep: DriverEp, token: Token) -> bool {
        if self.dead.is_empty() || !self.dead.contains(&ep.0) {
            return false;
        }
        self.ready.push_back(held::forward::lost(token));
        true
    }

    /// Loses everything held on killed endpoints: it completes, lost, at
    /// the next poll.
    pub(super) fn lose_dead(&mut self) {
        for i in 0..self.dead.len() {
            let ep = DriverEp(self.dead[i]);
            let gone = self.held.drain_ep(ep);
            self.ready
                .extend(gone.iter().map(|h| held::forward::lost(h.token)));
        }
        let dead = &self.dead;
        let gone = self.flushes.take_where(|f| dead.contains(&f.ep.0));
        self.ready
            .extend(gone.iter().map(|f| held::forward::lost(f.token)));
    }

    /// Loses what the old channels of replaced lanes hold
    /// (`replace_lane_losing`) and the flushes of `lose_held_flushes`: it
    /// completes, lost, at this poll.
    pub(super) fn lose_lanes(
        &mut self,
        (lanes, flushes): (Vec<(DriverEp, u8, u32)>, Vec<DriverEp>),
    ) {
        for ep in flushes {
            let gone = self.flushes.take_ep(ep);
            self.ready
                .extend(gone.iter().map(|f| held::forward::lost(f.token)));
        }
        for (ep, lane, old) in lanes {
            let gone = self
                .held
                .take_where(|e, l, h| e == ep && l == lane && h.channel <= old);
            self.ready
                .extend(gone.iter().map(|h| held::forward::lost(h.token)));
        }
    }

    pub(super) fn log(&self, ep: DriverEp, op: &Op) {
        self.program().log.push(Executed::of(ep, op));
    }

    /// Releases what is due from one lane into `out`: on an ordered lane
    /// the head of each channel in turn, on an unordered one any eligible
    /// operation, drawn.
    pub(super) fn release_lane(
        &mut self,
        ep: DriverEp,
        lane: u8,
        unordered: bool,
        out: &mut [Completion],
        n: &mut usize,
    ) {
        while *n < out.len() {
            if !self.dead.is_empty() && self.dead.contains(&ep.0) {
                // Killed: what it holds is lost (`lose_dead`), not run.
                break;
            }
            let at = self.moment();
            let (program, rng) = (&self.program, &mut self.rng);
            let draw = |k: usize| (rng.next_seeded(|| lock(program).seed) % k as u64) as usize;
            let Some(pick) = self.held.pick(ep, lane, !unordered, at, draw) else {
                break;
            };
            let held = self.held.take(ep, lane, pick);
            if let Some(c) = self.execute(ep, held) {
                if c.result == Err(Status::NoResource) {
                    // The inner driver is full: keep it, in place, for later.
                    self.held.put_back(ep, lane, pick, held);
                    break;
                }
                out[*n] = c;
                *n += 1;
            }
        }
    }
}

pub(super) fn lock(program: &Mutex<Program>) -> MutexGuard<'_, Program> {
    program.lock().unwrap_or_else(|e| e.into_inner())
}
