//! The injector's machinery: what it holds per lane and per flush, when
//! each is released, and what it loses or kills.

use ringfence::{Completion, Driver, DriverEp, Fails, LaneMask, MAX_LANES, Op, Posted, Token};
use ringfence_ring::Status;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

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
            held_posts: 0,
            held: Vec::new(),
            flushes: VecDeque::new(),
            ready: VecDeque::new(),
            dead: Vec::new(),
            late: VecDeque::new(),
            posts: 0,
            flush_count: 0,
            polls: 0,
            now: Instant::now(),
            seq: 0,
            rng: 0,
        };
        let held = injector.held_count.clone();
        (injector, FaultHandle { program, held })
    }

    pub(super) fn program(&self) -> MutexGuard<'_, Program> {
        self.program.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn next_random(&mut self) -> u64 {
        if self.rng == 0 {
            let seed = self.program().seed;
            self.rng = seed;
        }
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    pub(super) fn delay(&self, timing: Timing) -> u64 {
        match timing {
            // Held only behind something else: at the next poll.
            Timing::Synchronous | Timing::NextPoll | Timing::Reordered | Timing::Latency(_) => 1,
            Timing::Delayed(n) => u64::from(n.max(1)),
        }
    }

    /// Whether nothing is held on `lane` of `ep` (or there is no such lane).
    pub(super) fn lane_idle(&self, ep: DriverEp, lane: u8) -> bool {
        self.held
            .get(ep.0 as usize)
            .and_then(|lanes| lanes.get(usize::from(lane)))
            .is_none_or(VecDeque::is_empty)
    }

    /// Whether `post` would finish `op` on `ep` inside the call.
    pub(super) fn posts_inline(&self, ep: DriverEp, op: &Op) -> bool {
        let p = self.program();
        p.no_resource == 0
            && p.lane_timing(op.lane) == Timing::Synchronous
            && self.lane_idle(ep, op.lane)
    }

    /// Whether a flush of `lanes` of `ep` holds no operation posted before
    /// it (sequence number up to `seq`) behind it.
    pub(super) fn flush_clear(&self, ep: DriverEp, lanes: LaneMask, seq: u64) -> bool {
        self.held.get(ep.0 as usize).is_none_or(|queues| {
            queues
                .iter()
                .enumerate()
                .all(|(l, q)| lanes & (1 << l) == 0 || q.iter().all(|h| h.seq > seq))
        })
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
            .store(self.held_posts + self.flushes.len(), Ordering::Relaxed);
    }

    /// Counts the held posts again, after queues were emptied or filtered
    /// wholesale (disconnect, quiesce), and publishes.
    pub(super) fn recount_held(&mut self) {
        self.held_posts = self.held.iter().flatten().map(VecDeque::len).sum();
        self.count_held();
    }

    /// Releases the held flushes whose time came and whose lanes hold
    /// nothing older, into `out`.
    pub(super) fn release_flushes(&mut self, out: &mut [Completion], n: &mut usize) {
        let mut i = 0;
        while i < self.flushes.len() && *n < out.len() {
            let f = self.flushes[i];
            if !(self.flush_clear(f.ep, f.lanes, f.seq)
                && f.release_at <= self.polls
                && f.due <= self.now)
            {
                i += 1;
                continue;
            }
            self.flushes.remove(i);
            let result = match f.fail {
                Some(status) => Err(status),
                None => match self.inner.flush(f.ep, f.lanes, f.token) {
                    Posted::Done(result) => result,
                    // The inner driver completes it later, through poll.
                    Posted::InFlight => continue,
                    Posted::NoResource => Err(Status::NoResource),
                },
            };
            let mut c = Completion::new(f.token, result);
            if let Some(cause) = f.kill {
                self.dead.push(f.ep.0);
                c = c.failing(Fails::Endpoint(cause));
            }
            self.flush_completed(c);
            out[*n] = c;
            *n += 1;
        }
    }

    /// Executes one held operation at the inner driver; logs it on success.
    pub(super) fn execute(&mut self, ep: DriverEp, held: Held) -> Option<Completion> {
        if let Some(status) = held.fail {
            let c = Completion::new(held.token, Err(status));
            return Some(match held.kill {
                Some(cause) => {
                    self.dead.push(ep.0);
                    c.failing(Fails::Endpoint(cause))
                }
                None => c,
            });
        }
        // SAFETY: `held.op` came through `post`, whose caller keeps its
        // memory valid until its completion, which has not been returned.
        match unsafe { self.inner.post(ep, &held.op, held.token) } {
            Posted::Done(result) => {
                if result.is_ok() {
                    self.log(ep, &held.op);
                }
                Some(Completion::new(held.token, result))
            }
            Posted::InFlight => None,
            Posted::NoResource => Some(Completion::new(held.token, Err(Status::NoResource))),
        }
    }

    /// On an endpoint killed by `kill_endpoint_on_post`, a post or flush
    /// with `token` is lost: it completes at the next poll. Whether it was.
    pub(super) fn lost_to_dead(&mut self, ep: DriverEp, token: Token) -> bool {
        if self.dead.is_empty() || !self.dead.contains(&ep.0) {
            return false;
        }
        self.ready
            .push_back(Completion::new(token, Err(Status::Canceled)).failing(Fails::Lost));
        true
    }

    /// Loses everything held on killed endpoints: it completes, lost, at
    /// the next poll.
    pub(super) fn lose_dead(&mut self) {
        let lost = |token| Completion::new(token, Err(Status::Canceled)).failing(Fails::Lost);
        for &ep in &self.dead {
            if let Some(lanes) = self.held.get_mut(ep as usize) {
                for queue in lanes.iter_mut() {
                    self.ready.extend(queue.drain(..).map(|h| lost(h.token)));
                }
            }
        }
        let dead = &self.dead;
        let (gone, kept): (Vec<_>, Vec<_>) =
            self.flushes.drain(..).partition(|f| dead.contains(&f.ep.0));
        self.flushes = kept.into();
        self.ready.extend(gone.into_iter().map(|f| lost(f.token)));
        self.recount_held();
    }

    /// Loses what the old channels of replaced lanes hold
    /// (`replace_lane_losing`): it completes, lost, at this poll.
    pub(super) fn lose_lanes(
        &mut self,
        (lanes, flushes): (Vec<(DriverEp, u8, u32)>, Vec<DriverEp>),
    ) {
        for ep in flushes {
            let (gone, kept): (Vec<_>, Vec<_>) = self.flushes.drain(..).partition(|f| f.ep == ep);
            self.flushes = kept.into();
            self.ready.extend(
                gone.into_iter()
                    .map(|f| Completion::new(f.token, Err(Status::Canceled)).failing(Fails::Lost)),
            );
        }
        for (ep, lane, old) in lanes {
            let Some(queue) = self
                .held
                .get_mut(ep.0 as usize)
                .and_then(|l| l.get_mut(usize::from(lane)))
            else {
                continue;
            };
            let ready = &mut self.ready;
            queue.retain(|h| {
                let on_old = h.generation <= old;
                if on_old {
                    ready.push_back(
                        Completion::new(h.token, Err(Status::Canceled)).failing(Fails::Lost),
                    );
                }
                !on_old
            });
        }
        self.recount_held();
    }

    pub(super) fn log(&self, ep: DriverEp, op: &Op) {
        let remote_addr = op.remote.map_or(0, |(_, addr)| addr);
        self.program().log.push(Executed {
            ep,
            lane: op.lane,
            kind: op.kind,
            remote_addr,
            operand: op.operand,
            fence: op.fence,
        });
    }

    /// Releases what is due from one lane into `out`.
    /// On an ordered lane: the oldest held operation that is due and first
    /// in its channel (a replaced lane's old channel and its new one
    /// release independently, as two connections would).
    pub(super) fn channel_head(&self, queue: &VecDeque<Held>) -> Option<usize> {
        let due = |h: &Held| h.release_at <= self.polls && h.due <= self.now;
        let first = queue.front()?;
        // Generations only grow, so a lane's queue is sorted by them and
        // each channel is one run of it. One channel (the usual case):
        // only the head may go.
        if queue.back().map(|h| h.generation) == Some(first.generation) {
            return due(first).then_some(0);
        }
        let mut channel = None;
        for (i, h) in queue.iter().enumerate() {
            if channel != Some(h.generation) {
                if due(h) {
                    return Some(i);
                }
                channel = Some(h.generation);
            }
        }
        None
    }

    pub(super) fn release_lane(
        &mut self,
        ep: usize,
        lane: usize,
        unordered: bool,
        out: &mut [Completion],
        n: &mut usize,
    ) {
        while *n < out.len() {
            if !self.dead.is_empty() && self.dead.contains(&(ep as u32)) {
                // Killed: what it holds is lost (`lose_dead`), not run.
                break;
            }
            let queue = &self.held[ep][lane];
            // Eligible: due, and not behind a fence-flagged op (unordered),
            // or simply the head (ordered).
            let head = if unordered {
                None
            } else {
                self.channel_head(queue)
            };
            let candidates = if unordered {
                let fence_at = queue
                    .iter()
                    .skip(1)
                    .position(|h| h.op.fence)
                    .map_or(queue.len(), |i| i + 1);
                queue
                    .iter()
                    .take(fence_at)
                    .filter(|h| h.release_at <= self.polls && h.due <= self.now)
                    .count()
            } else {
                usize::from(head.is_some())
            };
            if candidates == 0 {
                break;
            }
            let pick = if let Some(head) = head {
                head
            } else {
                let k = (self.next_random() % candidates as u64) as usize;
                let queue = &self.held[ep][lane];
                queue
                    .iter()
                    .enumerate()
                    .filter(|(_, h)| h.release_at <= self.polls && h.due <= self.now)
                    .nth(k)
                    .map(|(i, _)| i)
                    .unwrap_or(0)
            };
            let held = self.held[ep][lane]
                .remove(pick)
                .expect("picked index exists");
            self.held_posts -= 1;
            if let Some(c) = self.execute(DriverEp(ep as u32), held) {
                if c.result == Err(Status::NoResource) {
                    // The inner driver is full: keep it, in place, for later.
                    self.held[ep][lane].insert(pick, held);
                    self.held_posts += 1;
                    break;
                }
                out[*n] = c;
                *n += 1;
            }
        }
    }
}
