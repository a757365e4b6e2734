//! What a [`FaultHandle`] programs: the program the injector follows, and
//! what it logs.

use ringfence::{Completion, DriverEp, LaneMask, MAX_LANES, Token};
use ringfence_ring::Status;
use std::sync::MutexGuard;
use std::sync::atomic::Ordering;

use super::*;
#[cfg(doc)]
use ringfence::Fails;

impl Program {
    /// The timing of a post on `lane`: its override, else the global one.
    /// The generation of `lane` of `ep` (0 until it is first bumped).
    pub(super) fn generation(&self, ep: DriverEp, lane: u8) -> u32 {
        if self.generations.is_empty() {
            return 0; // no lane replaced yet: skip the lookup on every post
        }
        self.generations.get(&(ep.0, lane)).copied().unwrap_or(0)
    }

    pub(super) fn lane_timing(&self, lane: u8) -> Timing {
        self.lane_timing
            .get(usize::from(lane))
            .copied()
            .flatten()
            .unwrap_or(self.timing)
    }

    /// The failure of post number `n`, on `lane`: by number, else the
    /// lane's next one (consumed), else the lane's standing one.
    pub(super) fn take_post_failure(&mut self, n: u64, lane: u8) -> Option<Status> {
        take_failure(&mut self.fail_posts, |k| k == n)
            .or_else(|| take_failure(&mut self.next_lane_failures, |l| l == lane))
            .or_else(|| self.lane_failures.get(usize::from(lane)).copied().flatten())
    }
}

impl FaultHandle {
    fn program(&self) -> MutexGuard<'_, Program> {
        self.program.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the completion timing (applies to what is posted from now on).
    pub fn set_timing(&self, timing: Timing) {
        self.program().timing = timing;
    }

    /// Marks lanes (by index, on every endpoint) unordered: the injector
    /// reorders what they hold, and claims unordered lanes in its
    /// capabilities (so the engine never takes a weak fence over it).
    ///
    /// # Panics
    /// Once the worker is built: the engine read the capabilities then.
    pub fn set_unordered(&self, lanes: LaneMask) {
        let mut p = self.program();
        assert!(
            !p.attached,
            "set_unordered before the worker is built: the engine reads whether lanes are \
             ordered once, from the capabilities"
        );
        p.unordered = lanes;
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
