//! What a [`SimHandle`] programs and reads: the state the driver and its
//! handle share.

use crate::fault::Executed;
#[cfg(doc)]
use ringfence::Quiesced;
use ringfence::{DriverEp, LaneMask};
use ringfence_ring::Status;
use std::sync::MutexGuard;

use super::*;

impl State {
    pub(super) fn violation(&mut self, what: String) {
        tracing::error!(violation = %what, "simulated driver");
        self.violations.push(what);
    }
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
