//! Connecting endpoints: the drivers run their handshakes; the engine
//! queues what is submitted meanwhile and starts it once the endpoint is up.

use super::token::TokenTarget;
use super::{Engine, MAX_NOTIFY_LEN};
use crate::driver::DriverEp;
use crate::driver::{Connect, DriverError};
use crate::endpoint::{CONNECTING, Endpoint, EndpointCold, EpState, LaneGroup, MIXED};
use crate::request::{NONE, RequestId};
use ringfence_ring::Status;

impl Engine {
    /// Starts connecting to one peer over `groups`, each `(driver index,
    /// the peer's address part for it, lanes)`, and adds the endpoint at
    /// once, its lanes numbered in group order. It is up if every driver
    /// finished inside the call, else connecting until every pending
    /// handshake completes through `poll` (`connect_done`). Nothing here
    /// waits for the peer.
    ///
    /// # Errors
    /// A driver refused at once (a malformed address, a peer known
    /// unreachable): the groups already started are disconnected and no
    /// endpoint is added. The caller checks the group count and the lane
    /// total (at most [`MAX_GROUPS`](crate::memory::MAX_GROUPS) and 64).
    pub(crate) fn connect(
        &mut self,
        groups: &[(usize, &[u8], u8)],
    ) -> Result<u32, (usize, DriverError)> {
        debug_assert!(!groups.is_empty() && groups.len() <= crate::memory::MAX_GROUPS);
        // The endpoint's index is known before it exists: the engine lock
        // is held, and endpoints are only ever appended. The attempt's
        // serial tells this attempt from an earlier one refused at once,
        // which had the same index (its handshakes come back canceled).
        let attempt = self.serials.next_connect();
        let token = TokenTarget::Connect {
            endpoint: self.endpoints.len(),
            attempt,
        }
        .token();
        let mut started: Vec<LaneGroup> = Vec::with_capacity(groups.len());
        let mut pending = 0u8;
        let mut first = 0u8;
        for (g, &(d, part, lanes)) in groups.iter().enumerate() {
            let driver_ep = match self.drivers[d].connect(part, lanes, token) {
                Ok(Connect::Done(ep)) => ep,
                Ok(Connect::InFlight(ep)) => {
                    pending |= 1 << g;
                    ep
                }
                Err(error) => {
                    for group in &started {
                        self.drivers[group.driver as usize]
                            .disconnect(crate::driver::DriverEp(group.driver_ep));
                    }
                    return Err((g, error));
                }
            };
            started.push(LaneGroup {
                driver: d as u8,
                driver_ep: driver_ep.0,
                first,
                lanes,
            });
            first += lanes;
        }
        let mut ep = Endpoint::new(started[0].driver, started[0].driver_ep, first);
        ep.set(CONNECTING, pending > 0);
        ep.set(MIXED, started.len() > 1);
        let mut cold = EndpointCold::new(started, pending, attempt);
        cold.atomic_domain = cold
            .groups
            .iter()
            .rev()
            .map(|g| self.drivers.caps(g.driver as usize))
            .find(|caps| !caps.atomic_ops.is_empty())
            .map(|caps| caps.atomic_domain);
        cold.notify_max = match cold.groups[..] {
            [one] => MAX_NOTIFY_LEN.min(self.drivers.caps(one.driver as usize).max_len),
            _ => MAX_NOTIFY_LEN,
        };
        let e = self.add_endpoint(ep, cold);
        for g in 0..self.cold[e as usize].groups.len() {
            if pending & 1 << g == 0 {
                self.learn_peer_limits(e as usize, g);
            }
        }
        Ok(e)
    }

    /// The handshake that driver `d` ran for attempt `attempt` of endpoint
    /// `e` finished with `result`. Once every group is up, what queued
    /// meanwhile is dispatched (scheduled, never run from here, R19). A
    /// failed one fails the endpoint, and everything queued completes in
    /// FIFO order with the error, a graceful CLOSE with `close_status`
    /// (R20, R32, R34); FENCEs were never queued (R5). An endpoint closed
    /// or failed meanwhile ignores it: its driver reports the pending
    /// connect after `disconnect` too. A completion of another attempt
    /// (one refused at once, whose index this endpoint took), or a second
    /// one from the same driver, is stray.
    pub(super) fn connect_done(
        &mut self,
        d: usize,
        e: usize,
        attempt: u32,
        result: Result<u32, Status>,
    ) {
        let live = self
            .cold
            .get(e)
            .is_some_and(|c| TokenTarget::same_serial(c.connect_attempt, attempt));
        if !live {
            self.stray_completions += 1;
            return;
        }
        let ep = &self.endpoints[e];
        if !ep.is_connecting() {
            if !matches!(ep.state, EpState::Failed | EpState::Closed) {
                self.stray_completions += 1;
            }
            return;
        }
        let cold = &mut self.cold[e];
        let Some(bit) = cold
            .group_on(d)
            .map(|g| 1u8 << g)
            .filter(|bit| cold.pending_connects & bit != 0)
        else {
            self.stray_completions += 1;
            return;
        };
        if let Err(status) = result {
            tracing::debug!(endpoint = e, %status, "connect failed");
            return self.fail_endpoint(e, status);
        }
        cold.pending_connects &= !bit;
        let group = bit.trailing_zeros() as usize;
        self.learn_peer_limits(e, group);
        let cold = &mut self.cold[e];
        if cold.pending_connects == 0 {
            self.endpoints[e].set(CONNECTING, false);
            tracing::debug!(endpoint = e, "connected");
            self.schedule(e);
        }
    }

    /// Group `g` of endpoint `e` is up: what its driver learnt of the peer
    /// narrows what the endpoint sends ([`Driver::peer_limits`]).
    fn learn_peer_limits(&mut self, e: usize, g: usize) {
        let group = self.cold[e].groups[g];
        let limits = self.drivers[group.driver as usize].peer_limits(DriverEp(group.driver_ep));
        if let Some(limits) = limits {
            let cold = &mut self.cold[e];
            cold.notify_max = cold.notify_max.min(limits.max_notify_len);
        }
    }

    /// A snapshot of endpoint `e`'s fence engine, if it exists.
    pub(crate) fn fence_state(&self, e: usize) -> Option<crate::FenceState> {
        let ep = self.endpoints.get(e)?;
        let mut deferred = 0u32;
        let mut next = ep.head;
        while next != NONE {
            deferred += 1;
            next = self.request(RequestId(next)).next;
        }
        Some(crate::FenceState {
            submit_epoch: ep.submit_epoch,
            admitted_epoch: ep.admitted_epoch,
            dirty_lanes: ep.dirty,
            covered_lanes: self.cold[e].covered,
            fence_flush: (ep.flushing != 0).then(|| (ep.flushing, ep.full_epoch(ep.fence_target))),
            weak: ep.weak().map(|(lane, low)| (lane, ep.full_epoch(low))),
            deferred,
            in_flight: ep.inflight,
        })
    }

    /// The public state of endpoint `e`, if it exists.
    pub(crate) fn endpoint_state(&self, e: usize) -> Option<crate::EndpointState> {
        self.endpoints.get(e).map(Endpoint::public_state)
    }
}
