//! `FaultInjector`: a driver wrapper that makes a well-behaved driver
//! misbehave on purpose, for tests of the fence engine.
//!
//! It holds every post and flush before handing it to the inner driver, and
//! lets it through according to a program set through its [`FaultHandle`]:
//!
//! - per-lane ordering: an ordered lane releases operations in posting
//!   order; an unordered lane releases any of its held operations, in a
//!   seeded pseudo-random order (an operation carrying the transport fence
//!   flag waits for everything before it on its lane);
//! - completion timing: synchronous (inside `post`), on the next poll, after
//!   N polls, or with lanes visited in a shuffled order; globally, or per
//!   lane index;
//! - injected errors on a chosen post or flush, on every or the next post
//!   of a lane, and `NoResource` back-pressure for the next N posts;
//! - lane generation bumps (the lane is "replaced"): what is held on the
//!   old channel is no longer ordered with what is posted on the new one,
//!   as with two connections, though a flush still waits for both; or
//!   what was held on the old channel is lost with it
//!   ([`Fails::Lost`]);
//! - an endpoint killed by one operation's error, as an RC queue pair's
//!   is: that completion names the endpoint's cause
//!   ([`Fails::Endpoint`]), and everything held or posted on it after
//!   is flushed as lost;
//! - blocked flushes (held until unblocked), duplicated flush completions
//!   and injected stray completions, as a network with lane replacement
//!   can produce.
//!
//! A flush is released only when every operation posted before it on its
//! lanes has been released and has completed at the inner driver, so it
//! means what a flush means. The order in which operations took effect at
//! the inner driver is recorded in an execution log, for tests to compare
//! with a model.
//!
//! The inner driver should complete synchronously (the loopback driver in
//! [`CompletionMode::Immediate`](ringfence::CompletionMode::Immediate)): the
//! injector owns all timing. Completions the inner driver returns later are
//! passed through.

#![allow(unsafe_code)] // forwards the unsafe `post` and `execute`

use ringfence::DriverMemory;
use ringfence::MemKind;
use ringfence::{
    Capabilities, Completion, Connect, DirectPath, Driver, DriverContext, DriverEp, DriverError,
    DriverMemKey, DriverRkey, Fails, KeyPart, LaneMask, MAX_LANES, MemDesc, Op, OpKind, PeerLimits,
    Posted, Prepare, Prepared, Quiesce, Quiesced, Registered, Sleep, Token, Unpacked,
};
use ringfence_ring::Status;
use std::collections::{HashMap, VecDeque};
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// When held operations and flushes are released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timing {
    /// Inside `post` and `flush`, unless something posted earlier under
    /// another timing is still held on the lane (on one of the flushed
    /// lanes, for a flush) or flushes are blocked: then held, and released
    /// at the next poll behind it, so lane order is kept.
    Synchronous,
    /// At the next `poll`.
    NextPoll,
    /// After this many polls.
    Delayed(u32),
    /// At the next poll, visiting lanes (and endpoints) in a shuffled order.
    /// As a lane's own timing it is `NextPoll`: the visiting order follows
    /// the global timing.
    Reordered,
    /// At the first poll at least this long after posting: a latency in
    /// wall-clock time, as a network round trip has.
    Latency(std::time::Duration),
}

/// One operation as it took effect at the inner driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Executed {
    /// The engine endpoint's driver handle.
    pub ep: DriverEp,
    /// The lane.
    pub lane: u8,
    /// What it was.
    pub kind: OpKind,
    /// Its remote address (0 for NOTIFY).
    pub remote_addr: u64,
    /// Its operand (the tag, for NOTIFY).
    pub operand: u64,
    /// Whether it carried the transport fence flag.
    pub fence: bool,
}

#[derive(Debug)]
struct Program {
    timing: Timing,
    unordered: LaneMask,
    /// Fail the post whose number (0-based, counted over all posts) is the
    /// key, with the status.
    fail_posts: Vec<(u64, Status)>,
    /// Fail the flush whose number is the key.
    fail_flushes: Vec<(u64, Status)>,
    no_resource: u32,
    /// Lane generations, by endpoint handle and lane.
    generations: HashMap<(u32, u8), u32>,
    log: Vec<Executed>,
    flush_log: Vec<(DriverEp, LaneMask)>,
    seed: u64,
    /// Timing overrides, by lane index.
    lane_timing: [Option<Timing>; MAX_LANES as usize],
    /// Every post on the lane (by index) fails with the status.
    lane_failures: [Option<Status>; MAX_LANES as usize],
    /// Fail the next post on the lane that is the key, oldest first.
    next_lane_failures: Vec<(u8, Status)>,
    flushes_blocked: bool,
    /// How many of the next flush completions are duplicated.
    duplicate_flushes: u32,
    /// Completions to return at the next poll.
    strays: Vec<Completion>,
    /// Kill the endpoint of the post whose number is the first field: it
    /// fails with the second status, the endpoint with the third.
    kills: Vec<(u64, Status, Status)>,
    /// The same for the flush whose number is the first field.
    flush_kills: Vec<(u64, Status, Status)>,
    /// Lanes replaced with their old channel lost, with the generation
    /// they had: what the injector holds there is lost at the next poll.
    lost_lanes: Vec<(DriverEp, u8, u32)>,
    /// Endpoints whose held flushes are lost at the next poll.
    lost_flushes: Vec<DriverEp>,
}

impl Program {
    /// The timing of a post on `lane`: its override, else the global one.
    /// The generation of `lane` of `ep` (0 until it is first bumped).
    fn generation(&self, ep: DriverEp, lane: u8) -> u32 {
        if self.generations.is_empty() {
            return 0; // no lane replaced yet: skip the lookup on every post
        }
        self.generations.get(&(ep.0, lane)).copied().unwrap_or(0)
    }

    fn lane_timing(&self, lane: u8) -> Timing {
        self.lane_timing
            .get(usize::from(lane))
            .copied()
            .flatten()
            .unwrap_or(self.timing)
    }

    /// The failure of post number `n`, on `lane`: by number, else the
    /// lane's next one (consumed), else the lane's standing one.
    fn take_post_failure(&mut self, n: u64, lane: u8) -> Option<Status> {
        take_failure(&mut self.fail_posts, |k| k == n)
            .or_else(|| take_failure(&mut self.next_lane_failures, |l| l == lane))
            .or_else(|| self.lane_failures.get(usize::from(lane)).copied().flatten())
    }
}

/// Removes the first failure of `list` whose key matches, and returns it.
fn take_failure<K: Copy>(list: &mut Vec<(K, Status)>, hit: impl Fn(K) -> bool) -> Option<Status> {
    let i = list.iter().position(|&(k, _)| hit(k))?;
    Some(list.remove(i).1)
}

/// Polls between a duplicated flush completion and its copy.
const DUPLICATE_AFTER: u64 = 2;

/// Programs a [`FaultInjector`] after it moved into a worker, and reads its
/// execution log.
#[derive(Debug, Clone)]
pub struct FaultHandle {
    program: Arc<Mutex<Program>>,
    held: Arc<AtomicUsize>,
}

impl FaultHandle {
    fn program(&self) -> MutexGuard<'_, Program> {
        self.program.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the completion timing (applies to what is posted from now on).
    pub fn set_timing(&self, timing: Timing) {
        self.program().timing = timing;
    }

    /// Marks lanes (by index, on every endpoint) unordered.
    pub fn set_unordered(&self, lanes: LaneMask) {
        self.program().unordered = lanes;
    }

    /// Fails post number `n` (0-based, over all posts) with `status`.
    pub fn fail_post(&self, n: u64, status: Status) {
        self.program().fail_posts.push((n, status));
    }

    /// Fails flush number `n` (0-based, over all flushes) with `status`.
    pub fn fail_flush(&self, n: u64, status: Status) {
        self.program().fail_flushes.push((n, status));
    }

    /// Answers `NoResource` to the next `n` posts.
    pub fn no_resource(&self, n: u32) {
        self.program().no_resource = n;
    }

    /// Replaces `lane` of `ep` (bumps its generation), at once.
    pub fn bump_generation(&self, ep: DriverEp, lane: u8) {
        *self.program().generations.entry((ep.0, lane)).or_insert(0) += 1;
    }

    /// Replaces `lane` of `ep` as [`bump_generation`](Self::bump_generation)
    /// does, and loses what its old channel holds: each held operation
    /// completes at the next poll with [`Status::Canceled`] as
    /// [`Fails::Lost`], unexecuted (held flushes still wait for the rest).
    pub fn replace_lane_losing(&self, ep: DriverEp, lane: u8) {
        let mut p = self.program();
        let generation = p.generations.entry((ep.0, lane)).or_insert(0);
        let old = *generation;
        *generation += 1;
        p.lost_lanes.push((ep, lane, old));
    }

    /// Loses the flushes held on `ep` now: each completes at the next poll
    /// with [`Status::Canceled`] as [`Fails::Lost`] (lost with a replaced
    /// lane, while the endpoint is up).
    pub fn lose_held_flushes(&self, ep: DriverEp) {
        self.program().lost_flushes.push(ep);
    }

    /// Post number `n` (0-based, over all posts) kills its endpoint, as an
    /// error kills an RC queue pair: it is held until the next poll (even
    /// under `Timing::Synchronous`) and completes with `status`, naming
    /// `cause` as the endpoint's ([`Fails::Endpoint`]); then everything
    /// held on that endpoint, and everything posted or flushed on it until
    /// it is disconnected, completes with [`Status::Canceled`] as
    /// [`Fails::Lost`], unexecuted.
    pub fn kill_endpoint_on_post(&self, n: u64, status: Status, cause: Status) {
        self.program().kills.push((n, status, cause));
    }

    /// As [`kill_endpoint_on_post`](FaultHandle::kill_endpoint_on_post),
    /// for flush number `n` (0-based, over all flushes): it is held until
    /// the operations it covers have run and the next poll, then completes
    /// with `status`, naming `cause` as its endpoint's
    /// ([`Fails::Endpoint`]); what is held on the endpoint after it is
    /// lost.
    pub fn kill_endpoint_on_flush(&self, n: u64, status: Status, cause: Status) {
        self.program().flush_kills.push((n, status, cause));
    }

    /// The operations that took effect so far, in order.
    pub fn log(&self) -> Vec<Executed> {
        self.program().log.clone()
    }

    /// Every flush started so far: endpoint handle and lane mask, in order.
    pub fn flushes(&self) -> Vec<(DriverEp, LaneMask)> {
        self.program().flush_log.clone()
    }

    /// Seeds the shuffles of unordered lanes and `Reordered` timing.
    pub fn seed(&self, seed: u64) {
        self.program().seed = seed | 1;
    }

    /// Sets the timing of posts on `lane` (by index, on every endpoint),
    /// over the global one, for what is posted from now on. Flushes keep
    /// the global timing, and still wait for every earlier post on their
    /// lanes. A lane index past the last possible lane has no effect.
    pub fn set_lane_timing(&self, lane: u8, timing: Timing) {
        if let Some(slot) = self.program().lane_timing.get_mut(usize::from(lane)) {
            *slot = Some(timing);
        }
    }

    /// Posts on `lane` follow the global timing again (from now on).
    pub fn clear_lane_timing(&self, lane: u8) {
        if let Some(slot) = self.program().lane_timing.get_mut(usize::from(lane)) {
            *slot = None;
        }
    }

    /// Fails every post on `lane` (by index, on every endpoint) from now
    /// on with `status`: it completes with the error, with its timing,
    /// never reaching the inner driver nor the log. A failure by number
    /// ([`fail_post`](Self::fail_post)) takes precedence.
    pub fn fail_lane(&self, lane: u8, status: Status) {
        if let Some(slot) = self.program().lane_failures.get_mut(usize::from(lane)) {
            *slot = Some(status);
        }
    }

    /// Fails the next post on `lane` (by index, on any endpoint) that no
    /// failure by number already fails, as [`fail_lane`](Self::fail_lane)
    /// does; calls add up (two calls fail the next two).
    pub fn fail_next_on_lane(&self, lane: u8, status: Status) {
        if lane < MAX_LANES {
            self.program().next_lane_failures.push((lane, status));
        }
    }

    /// Withdraws every lane failure, standing and next-post ones; posts
    /// already failed and held still complete with their error.
    pub fn clear_lane_failures(&self) {
        let mut p = self.program();
        p.lane_failures = [None; MAX_LANES as usize];
        p.next_lane_failures.clear();
    }

    /// While `on`, flushes are accepted and logged but not released, even
    /// under `Timing::Synchronous` (they are held then too); held ones
    /// already waiting are blocked as well. Once off, each goes at the next
    /// poll where its timing and the posts before it allow.
    /// `quiesce(Quiesce::All)` and `disconnect` still cancel them.
    pub fn block_flushes(&self, on: bool) {
        self.program().flushes_blocked = on;
    }

    /// Returns each of the next `n` flush completions the injector produces
    /// (released by `poll`, or finished inside `flush`) twice: at once, and
    /// the same completion (token and result) again at the second poll
    /// after, as a replaced lane can deliver it twice. Completions the inner
    /// driver returns through its own `poll` and cancellations are not
    /// duplicated.
    pub fn duplicate_flush_completions(&self, n: u32) {
        self.program().duplicate_flushes = n;
    }

    /// Returns a completion with `token` and `result` at the next poll,
    /// though nothing was posted with it (the engine should count it as
    /// stray).
    pub fn stray_flush_completion(&self, token: Token, result: Result<u32, Status>) {
        self.program().strays.push(Completion::new(token, result));
    }

    /// Posts and flushes held now: not yet handed to the inner driver nor
    /// completed by the injector. Exact between driver calls; duplicated
    /// and stray completions still to come are not counted.
    pub fn held(&self) -> usize {
        // Relaxed: a count read between driver calls, by the thread that
        // made them or after synchronizing with it through the worker.
        self.held.load(Ordering::Relaxed)
    }
}

#[derive(Debug, Clone, Copy)]
struct Held {
    op: Op,
    token: Token,
    seq: u64,
    release_at: u64,
    /// Not before this instant (`Timing::Latency`).
    due: Instant,
    /// An injected failure: completes with it instead of executing.
    fail: Option<Status>,
    /// With `fail`: the endpoint dies, with this cause.
    kill: Option<Status>,
    /// The lane's generation when it was posted: its channel. Channels of
    /// one lane are not ordered with each other.
    generation: u32,
}

#[derive(Debug, Clone, Copy)]
struct HeldFlush {
    ep: DriverEp,
    lanes: LaneMask,
    token: Token,
    /// Every operation with a smaller sequence number on `lanes` must be done.
    seq: u64,
    release_at: u64,
    due: Instant,
    fail: Option<Status>,
    /// Completing it kills its endpoint with this cause
    /// (`kill_endpoint_on_flush`).
    kill: Option<Status>,
}

/// The fault-injecting driver wrapper; see the module docs.
#[derive(Debug)]
pub struct FaultInjector<D: Driver> {
    inner: D,
    program: Arc<Mutex<Program>>,
    /// Posts and flushes held (kept up to date for `FaultHandle::held`).
    held_count: Arc<AtomicUsize>,
    /// Posts held: the sum of `held`'s queue lengths, kept as they change.
    held_posts: usize,
    /// Held operations per endpoint handle and lane.
    held: Vec<Vec<VecDeque<Held>>>,
    flushes: VecDeque<HeldFlush>,
    ready: VecDeque<Completion>,
    /// Endpoint handles killed (`kill_endpoint_on_post`), until
    /// disconnected.
    dead: Vec<u32>,
    /// Copies of duplicated flush completions, by the poll that returns
    /// them (in order).
    late: VecDeque<(u64, Completion)>,
    posts: u64,
    flush_count: u64,
    polls: u64,
    /// The time of the current poll (for `Timing::Latency`).
    now: Instant,
    seq: u64,
    rng: u64,
}

/// When something posted now under `timing` may be released.
fn due(timing: Timing) -> Instant {
    match timing {
        Timing::Latency(latency) => Instant::now() + latency,
        _ => Instant::now(),
    }
}

impl<D: Driver> FaultInjector<D> {
    /// Wraps `inner`; the handle programs it.
    pub fn new(inner: D) -> (FaultInjector<D>, FaultHandle) {
        let program = Arc::new(Mutex::new(Program {
            timing: Timing::NextPoll,
            unordered: 0,
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

    fn program(&self) -> MutexGuard<'_, Program> {
        self.program.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn next_random(&mut self) -> u64 {
        if self.rng == 0 {
            let seed = self.program().seed;
            self.rng = seed;
        }
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    fn delay(&self, timing: Timing) -> u64 {
        match timing {
            // Held only behind something else: at the next poll.
            Timing::Synchronous | Timing::NextPoll | Timing::Reordered | Timing::Latency(_) => 1,
            Timing::Delayed(n) => u64::from(n.max(1)),
        }
    }

    /// Whether nothing is held on `lane` of `ep` (or there is no such lane).
    fn lane_idle(&self, ep: DriverEp, lane: u8) -> bool {
        self.held
            .get(ep.0 as usize)
            .and_then(|lanes| lanes.get(usize::from(lane)))
            .is_none_or(VecDeque::is_empty)
    }

    /// Whether `post` would finish `op` on `ep` inside the call.
    fn posts_inline(&self, ep: DriverEp, op: &Op) -> bool {
        let p = self.program();
        p.no_resource == 0
            && p.lane_timing(op.lane) == Timing::Synchronous
            && self.lane_idle(ep, op.lane)
    }

    /// Whether a flush of `lanes` of `ep` holds no operation posted before
    /// it (sequence number up to `seq`) behind it.
    fn flush_clear(&self, ep: DriverEp, lanes: LaneMask, seq: u64) -> bool {
        self.held.get(ep.0 as usize).is_none_or(|queues| {
            queues
                .iter()
                .enumerate()
                .all(|(l, q)| lanes & (1 << l) == 0 || q.iter().all(|h| h.seq > seq))
        })
    }

    /// A flush completion the injector produced: schedules its copy if it
    /// is to be duplicated.
    fn flush_completed(&mut self, c: Completion) {
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
    fn inject(&mut self, strays: Vec<Completion>) {
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
    fn count_held(&self) {
        // Relaxed: see `FaultHandle::held`.
        self.held_count
            .store(self.held_posts + self.flushes.len(), Ordering::Relaxed);
    }

    /// Counts the held posts again, after queues were emptied or filtered
    /// wholesale (disconnect, quiesce), and publishes.
    fn recount_held(&mut self) {
        self.held_posts = self.held.iter().flatten().map(VecDeque::len).sum();
        self.count_held();
    }

    /// Releases the held flushes whose time came and whose lanes hold
    /// nothing older, into `out`.
    fn release_flushes(&mut self, out: &mut [Completion], n: &mut usize) {
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
    fn execute(&mut self, ep: DriverEp, held: Held) -> Option<Completion> {
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
    fn lost_to_dead(&mut self, ep: DriverEp, token: Token) -> bool {
        if self.dead.is_empty() || !self.dead.contains(&ep.0) {
            return false;
        }
        self.ready
            .push_back(Completion::new(token, Err(Status::Canceled)).failing(Fails::Lost));
        true
    }

    /// Loses everything held on killed endpoints: it completes, lost, at
    /// the next poll.
    fn lose_dead(&mut self) {
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
    fn lose_lanes(&mut self, (lanes, flushes): (Vec<(DriverEp, u8, u32)>, Vec<DriverEp>)) {
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

    fn log(&self, ep: DriverEp, op: &Op) {
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
    fn channel_head(&self, queue: &VecDeque<Held>) -> Option<usize> {
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

    fn release_lane(
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
        self.inner.attach(ctx);
    }

    fn address(&self) -> Vec<u8> {
        self.inner.address()
    }

    fn connect(&mut self, peer: &[u8], lanes: u8, token: Token) -> Result<Connect, DriverError> {
        let connect = self.inner.connect(peer, lanes, token)?;
        let (Connect::Done(ep) | Connect::InFlight(ep)) = connect;
        let index = ep.0 as usize;
        if self.held.len() <= index {
            self.held.resize_with(index + 1, Vec::new);
        }
        self.held[index] = (0..lanes).map(|_| VecDeque::with_capacity(1024)).collect();
        Ok(connect)
    }

    fn disconnect(&mut self, ep: DriverEp) {
        self.dead.retain(|&d| d != ep.0);
        if let Some(lanes) = self.held.get_mut(ep.0 as usize) {
            for queue in lanes.iter_mut() {
                self.ready.extend(
                    queue
                        .drain(..)
                        .map(|h| Completion::new(h.token, Err(Status::Canceled))),
                );
            }
        }
        let (gone, kept): (Vec<_>, Vec<_>) = self.flushes.drain(..).partition(|f| f.ep == ep);
        self.flushes = kept.into();
        self.ready.extend(
            gone.into_iter()
                .map(|f| Completion::new(f.token, Err(Status::Canceled))),
        );
        self.recount_held();
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
        if timing == Timing::Synchronous && kill.is_none() && self.lane_idle(ep, op.lane) {
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
        let release_at = self.polls + self.delay(timing);
        let due = due(timing);
        let Some(queue) = self
            .held
            .get_mut(ep.0 as usize)
            .and_then(|l| l.get_mut(op.lane as usize))
        else {
            return Posted::Done(Err(Status::InvalidArgument));
        };
        self.seq += 1;
        queue.push_back(Held {
            op: *op,
            token,
            seq: self.seq,
            release_at,
            due,
            fail,
            kill,
            generation,
        });
        self.held_posts += 1;
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
            && self.flush_clear(ep, lanes, self.seq)
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
        let release_at = self.polls + self.delay(timing);
        self.flushes.push_back(HeldFlush {
            ep,
            lanes,
            token,
            seq: self.seq,
            release_at,
            due: due(timing),
            fail,
            kill,
        });
        self.count_held();
        Posted::InFlight
    }

    fn poll(&mut self, out: &mut [Completion]) -> usize {
        self.polls += 1;
        self.now = Instant::now();
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
        let mut n = ringfence::drain_completions(&mut self.ready, out);
        n += self.inner.poll(&mut out[n..]);
        let eps = self.held.len();
        let start = if timing == Timing::Reordered {
            self.next_random() as usize
        } else {
            0
        };
        for k in 0..eps {
            let ep = (k + start) % eps.max(1);
            let lanes = self.held[ep].len();
            let lane_start = if timing == Timing::Reordered {
                self.next_random() as usize
            } else {
                0
            };
            for j in 0..lanes {
                let lane = (j + lane_start) % lanes;
                self.release_lane(ep, lane, unordered & (1 << lane) != 0, out, &mut n);
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
        let covered = |h: &Held| match scope {
            Quiesce::All => true,
            Quiesce::Memory(key) => h.op.local_key == Some(key),
        };
        for lanes in &mut self.held {
            for queue in lanes.iter_mut() {
                queue.retain(|h| {
                    if covered(h) {
                        self.ready
                            .push_back(Completion::new(h.token, Err(Status::Canceled)));
                    }
                    !covered(h)
                });
            }
        }
        if scope == Quiesce::All {
            self.ready.extend(
                self.flushes
                    .drain(..)
                    .map(|f| Completion::new(f.token, Err(Status::Canceled))),
            );
        }
        self.recount_held();
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

    fn lane_ordered(&self, ep: DriverEp, lane: u8) -> bool {
        self.program().unordered & (1 << lane) == 0 && self.inner.lane_ordered(ep, lane)
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
