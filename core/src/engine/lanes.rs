//! Lane routing: which driver, connection and lane an operation takes, and
//! flushes split over the drivers of an endpoint with lanes on several
//! (docs/fence.md R24, R28).
//!
//! Most endpoints have all their lanes on one driver; the engine then uses
//! the endpoint's `driver` and `driver_ep` and the lane as it is. An
//! endpoint with lanes on several drivers (`MIXED`; say lanes 0–1 over shm
//! and 2–5 over CUDA) keeps its lane groups in its cold part, and:
//! - an operation goes to a group whose driver can run it: one that
//!   supports the operation and its length, registered its local memory
//!   (so device memory goes only to a driver of its kind) and has a part in
//!   its remote key. Small PUTs and GETs and NOTIFYs take the first such
//!   group's first lane; large ones the last such group's bandwidth lanes
//!   in turn; atomics the last such group's last lane;
//! - every lane is one fence domain: the epochs, the dirty mask and the
//!   rules are the endpoint's, whatever driver a lane is on;
//! - a flush of a lane set becomes one driver flush per group with dirty
//!   lanes, each of exactly that group's lanes, and completes when all of
//!   them have (`FlushParts`).

use super::Engine;
use crate::driver::DriverEp;
use crate::driver::{Fails, LaneMask, Posted, Token};
use crate::endpoint::{FlushParts, LaneGroup, MIXED};
use crate::request::{Request, RequestId};
use ringfence_ring::{AtomicOp, Opcode, Status};

/// What a flush part's completion meant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Part {
    /// No flush waits for it (a driver bug, or a flush already failed).
    Stray,
    /// Counted; other parts are still out.
    Waiting,
    /// The last part: the whole flush's result.
    Done(Result<u32, Status>),
}

impl Engine {
    /// Where endpoint lane `lane` of endpoint `e` goes: the driver's index,
    /// its connection, and the lane within it.
    #[inline]
    pub(super) fn lane_target(&self, e: usize, lane: u8) -> (usize, DriverEp, u8) {
        let ep = &self.endpoints[e];
        if !ep.has(MIXED) {
            return (ep.driver as usize, DriverEp(ep.driver_ep), lane);
        }
        match self.cold[e].group_of(lane) {
            Some((_, g)) => (g.driver as usize, DriverEp(g.driver_ep), lane - g.first),
            // Lanes are numbered inside the groups: not reached.
            None => (ep.driver as usize, DriverEp(ep.driver_ep), lane),
        }
    }

    /// The generation of endpoint lane `lane` of endpoint `e` (R38).
    pub(super) fn lane_generation(&self, e: usize, lane: u8) -> u32 {
        let (driver, driver_ep, lane) = self.lane_target(e, lane);
        self.drivers[driver].lane_generation(driver_ep, lane)
    }

    /// Whether endpoint lane `lane` of endpoint `e` orders operations once
    /// fenced (R8).
    pub(super) fn lane_ordered(&self, e: usize, lane: u8) -> bool {
        let (driver, _, _) = self.lane_target(e, lane);
        self.drivers.caps(driver).ordered_lanes
    }

    /// For an endpoint with lanes on several drivers: the endpoint lane the
    /// lane operation `r` takes next (without taking a bandwidth lane), and
    /// the index of its group.
    ///
    /// # Errors
    /// [`Status::Unsupported`] if no group's driver can run it.
    pub(super) fn mixed_lane(&self, e: usize, r: &Request) -> Result<(u8, usize), Status> {
        let cold = &self.cold[e];
        let opcode = r.opcode();
        let local = if r.holds_mem() {
            Some(self.mem.get(r.local_mem).ok_or(Status::InvalidMemHandle)?)
        } else {
            None
        };
        let rkey = match opcode {
            Opcode::PUT | Opcode::GET | Opcode::ATOMIC => Some(
                self.rkeys
                    .get(r.rkey, u32::from(r.endpoint))
                    .ok_or(Status::InvalidRkey)?,
            ),
            _ => None,
        };
        let eligible = |gi: usize, g: &LaneGroup| {
            let caps = self.drivers.caps(g.driver as usize);
            let runs = match opcode {
                Opcode::PUT => r.len <= caps.max_len,
                Opcode::GET => caps.get && r.len <= caps.max_len,
                // Only the endpoint's atomic domain: atomics on one word
                // never mix agents that are not atomic with each other.
                Opcode::ATOMIC => {
                    AtomicOp::try_from(r.subop()).is_ok_and(|op| caps.atomic_ops.contains(op))
                        && cold.atomic_domain == Some(caps.atomic_domain)
                }
                Opcode::NOTIFY => caps.notify && r.len <= caps.max_len,
                _ => true,
            };
            runs && local.is_none_or(|m| m.keys[g.driver as usize].is_some())
                && rkey.is_none_or(|k| k.parts[gi].is_some())
        };
        let mut groups = cold
            .groups
            .iter()
            .enumerate()
            .filter(|(gi, g)| eligible(*gi, g));
        let large =
            matches!(opcode, Opcode::PUT | Opcode::GET) && r.len >= self.config.bw_threshold;
        let (gi, g) = if large || opcode == Opcode::ATOMIC {
            groups.next_back()
        } else {
            groups.next()
        }
        .ok_or(Status::Unsupported)?;
        let lane = if opcode == Opcode::ATOMIC {
            g.first + g.lanes - 1
        } else if large && g.lanes > 1 {
            g.first + 1 + self.endpoints[e].next_bw % (g.lanes - 1)
        } else {
            g.first
        };
        Ok((lane, gi))
    }

    /// Hands the parts of a flush of endpoint lanes `parts.remaining` of
    /// endpoint `e` (one with lanes on several drivers) to their drivers,
    /// each one flush of exactly its group's lanes, with `token`. A part a
    /// driver has no room for stays in `remaining`, for dispatch to retry.
    pub(super) fn start_parts(&mut self, e: usize, parts: &mut FlushParts, token: Token) {
        for gi in 0..self.cold[e].groups.len() {
            let g = self.cold[e].groups[gi];
            let lanes = parts.remaining & g.mask();
            if lanes == 0 {
                continue;
            }
            let driver = &mut self.drivers[g.driver as usize];
            match driver.flush(DriverEp(g.driver_ep), lanes >> g.first, token) {
                Posted::Done(result) => {
                    parts.remaining &= !lanes;
                    if let Err(status) = result {
                        parts.error.get_or_insert(status);
                    }
                }
                Posted::InFlight => {
                    parts.remaining &= !lanes;
                    parts.pending |= 1 << gi;
                }
                Posted::NoResource => {}
            }
        }
    }

    /// Starts the flush parts that found no room earlier, for endpoint `e`
    /// (one with lanes on several drivers): its fence flush's and its user
    /// flushes'. Runs from dispatch; completes what this finishes.
    pub(super) fn retry_parts(&mut self, e: usize) {
        if self.endpoints[e].flushing != 0 && self.cold[e].fence_parts.remaining != 0 {
            let mut parts = self.cold[e].fence_parts;
            let token = self.fence_token(e);
            self.start_parts(e, &mut parts, token);
            self.cold[e].fence_parts = parts;
            if parts.is_done() {
                self.fence_flush_done(e, parts.result());
            } else if parts.remaining != 0 {
                self.schedule(e);
            }
        }
        let mut i = 0;
        while i < self.cold[e].user_flushes.len() {
            let (id, mut parts) = self.cold[e].user_flushes[i];
            if parts.remaining == 0 {
                i += 1;
                continue;
            }
            let worker = self.is_worker_part(e, id);
            let token = if worker {
                self.worker_part_token(e, RequestId(id))
            } else {
                self.flush_token(RequestId(id))
            };
            self.start_parts(e, &mut parts, token);
            if parts.is_done() {
                self.cold[e].user_flushes.swap_remove(i);
                if worker {
                    self.split_worker_part_finished(e, id, parts.result());
                } else {
                    self.endpoints[e].inflight -= 1;
                    self.finish(RequestId(id), e, parts.result());
                }
            } else {
                self.cold[e].user_flushes[i].1 = parts;
                if parts.remaining != 0 {
                    self.schedule(e);
                }
                i += 1;
            }
        }
    }

    /// Starts a flush of endpoint lanes `mask` of endpoint `e` (one with
    /// lanes on several drivers) as one part per group, with `token`.
    /// Returns what the start amounts to as a whole, with the parts: done
    /// if every part finished inside its driver's call, no room if no
    /// driver took its part, else in flight (dispatch is scheduled to
    /// retry the parts that found no room).
    pub(super) fn start_split(
        &mut self,
        e: usize,
        mask: LaneMask,
        token: Token,
    ) -> (Posted, FlushParts) {
        let mut parts = FlushParts {
            remaining: mask,
            ..FlushParts::default()
        };
        self.start_parts(e, &mut parts, token);
        let posted = if parts.is_done() {
            Posted::Done(parts.result())
        } else if parts.remaining == mask && parts.pending == 0 {
            Posted::NoResource
        } else {
            if parts.remaining != 0 {
                self.schedule(e); // dispatch retries the refused parts
            }
            Posted::InFlight
        };
        (posted, parts)
    }

    /// [`part_done`](Engine::part_done) with a stray counted: the whole
    /// flush's result when this was its last part; `None` while other
    /// parts are out, or if the completion was stray.
    pub(super) fn split_part_done(
        &mut self,
        d: usize,
        e: usize,
        request: Option<u32>,
        result: Result<u32, Status>,
    ) -> Option<Result<u32, Status>> {
        match self.part_done(d, e, request, result) {
            Part::Done(result) => Some(result),
            Part::Waiting => {
                // A part that names its endpoint dead fails it now, not
                // when the other drivers' parts come back: they may be
                // behind a peer that will never answer.
                if let Fails::Endpoint(cause) = self.verdict {
                    self.fail_endpoint(e, cause);
                }
                None
            }
            Part::Stray => {
                self.stray_completions += 1;
                None
            }
        }
    }

    /// Driver `d`'s part of a flush of endpoint `e` (one with lanes on
    /// several drivers) completed with `result`: the fence flush's if
    /// `request` is `None`, else that user flush's. Each group's part
    /// counts once: a driver that returns its part twice cannot complete
    /// the flush ahead of another driver's part.
    pub(super) fn part_done(
        &mut self,
        d: usize,
        e: usize,
        request: Option<u32>,
        result: Result<u32, Status>,
    ) -> Part {
        let cold = &mut self.cold[e];
        let Some(group) = cold.group_on(d) else {
            return Part::Stray;
        };
        let (parts, at) = match request {
            None => (&mut cold.fence_parts, None),
            Some(id) => match cold.user_flushes.iter().position(|(r, _)| *r == id) {
                Some(i) => (&mut cold.user_flushes[i].1, Some(i)),
                None => return Part::Stray,
            },
        };
        if parts.pending & 1 << group == 0 {
            return Part::Stray;
        }
        parts.pending &= !(1 << group);
        if let Err(status) = result {
            parts.error.get_or_insert(status);
        }
        if !parts.is_done() {
            return Part::Waiting;
        }
        let result = parts.result();
        if let Some(i) = at {
            cold.user_flushes.swap_remove(i);
        }
        Part::Done(result)
    }
}
