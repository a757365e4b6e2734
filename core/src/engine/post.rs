//! Starting admitted requests on their drivers.

use super::token::TokenTarget;
use super::{Engine, FlushCause, Started};
use crate::driver::{LaneMask, Op, OpKind, Posted, Token};
use crate::endpoint::{LaneGroup, MIXED, WEAK_FLAG_OWED};
use crate::request::{Request, RequestId, State};
use ringfence_ring::{AtomicOp, Opcode, Status};

impl Engine {
    /// Starts an admitted request.
    pub(super) fn start(&mut self, id: RequestId) -> Started {
        let request = *self.request(id);
        let e = request.endpoint as usize;
        let ep = &mut self.endpoints[e];
        let (driver, driver_ep) = (ep.driver as usize, crate::driver::DriverEp(ep.driver_ep));
        let mixed = ep.has(MIXED);
        let posted = match request.opcode() {
            Opcode::FENCE => {
                // The boundary has been crossed: the fence is done.
                self.complete(id, Ok(0));
                return Started::Handed;
            }
            Opcode::FLUSH | Opcode::CLOSE => {
                // Everything submitted before this flush has been started
                // (FIFO); the lanes it wrote are dirty or being flushed
                // (R21, R23). A graceful CLOSE ends with the same flush (R41).
                let cleans = ep.dirty;
                let mask = ep.dirty | ep.flushing | self.cold[e].covered;
                if mask == 0 {
                    // Nothing to flush, but it still succeeds only if the
                    // peer is alive.
                    let alive = self.check_alive(e);
                    if request.opcode() == Opcode::CLOSE {
                        let status = self.close_status(e, alive);
                        self.close_now(e);
                        self.complete(id, status);
                        return Started::Handed;
                    }
                    self.finish(id, e, alive);
                    return Started::Handed;
                }
                let mask = self.normalize(e, mask);
                self.count_flush(e, FlushCause::User);
                // Its completion cleans what was dirty now (W2): `finish`
                // finds the lanes in the request.
                self.cover(e, cleans);
                self.request_mut(id).operand = cleans;
                let token = self.new_flush_token(id);
                let posted = if mixed {
                    self.start_user_parts(e, id, mask, token)
                } else {
                    self.drivers[driver].flush(driver_ep, mask, token)
                };
                if posted == Posted::NoResource {
                    // Not started: the lanes are dirty as before.
                    self.flush_ended(e, cleans, Err(Status::NoResource));
                    self.request_mut(id).operand = 0;
                }
                posted
            }
            _ => {
                let mut op = match self.lane_op(&request) {
                    Ok(op) => op,
                    Err(status) => {
                        self.finish(id, e, Err(status));
                        return Started::Handed;
                    }
                };
                let posted = self.post_lane_op(e, &mut op, id);
                if op.fence && matches!(posted, Posted::NoResource) {
                    // Nothing was posted: the fence flag is still owed (R19).
                    self.endpoints[e].weak_lane |= WEAK_FLAG_OWED;
                }
                posted
            }
        };
        match posted {
            Posted::InFlight => {
                self.request_mut(id).set_state(State::Posted);
                self.endpoints[e].inflight += 1;
                Started::Handed
            }
            Posted::Done(result) => {
                self.finish(id, e, result);
                Started::Handed
            }
            Posted::NoResource => Started::Blocked,
        }
    }

    /// Whether endpoint `e`'s peer is alive as far as its drivers know
    /// ([`Driver::check_alive`], each lane group's): for a flush that has
    /// nothing to flush.
    fn check_alive(&mut self, e: usize) -> Result<u32, Status> {
        let ep = &self.endpoints[e];
        if !ep.has(MIXED) {
            let driver_ep = crate::driver::DriverEp(ep.driver_ep);
            return self.drivers[ep.driver as usize]
                .check_alive(driver_ep)
                .map(|()| 0);
        }
        for g in 0..self.cold[e].groups.len() {
            let LaneGroup {
                driver, driver_ep, ..
            } = self.cold[e].groups[g];
            let driver_ep = crate::driver::DriverEp(driver_ep);
            self.drivers[driver as usize].check_alive(driver_ep)?;
        }
        Ok(0)
    }

    /// A user FLUSH or CLOSE of endpoint `e` (one with lanes on several
    /// drivers) over endpoint lanes `mask`: one part per group with lanes
    /// in it. What the request's start reports: done if every part
    /// finished inside its driver's call, no room if no driver took its
    /// part (the request goes back to the head of its queue), else in
    /// flight (parts without room are retried from dispatch).
    fn start_user_parts(
        &mut self,
        e: usize,
        id: RequestId,
        mask: LaneMask,
        token: Token,
    ) -> Posted {
        let (posted, parts) = self.start_split(e, mask, token);
        if posted == Posted::InFlight {
            // Bounded by the requests in flight; reserved at connect, so it
            // grows only past eight concurrent flushes on one endpoint.
            self.cold[e].user_flushes.push((id.0, parts));
        }
        posted
    }

    /// The token of user FLUSH or CLOSE `id`, whose flush starts now: it
    /// names this flush (a new serial, kept in the request's otherwise
    /// unused `remote_addr`), so that a late or duplicated completion of
    /// an earlier flush in the same slot is stray (R25).
    fn new_flush_token(&mut self, id: RequestId) -> Token {
        let serial = self.serials.next_flush();
        self.request_mut(id).remote_addr = u64::from(serial);
        TokenTarget::Flush { id, serial }.token()
    }

    /// The token user FLUSH or CLOSE `id` started its flush with.
    pub(super) fn flush_token(&self, id: RequestId) -> Token {
        let serial = self.request(id).remote_addr as u32;
        TokenTarget::Flush { id, serial }.token()
    }

    /// The operation a queued PUT, GET, ATOMIC or NOTIFY request asks for,
    /// with its driver's keys looked up again as it starts (its
    /// registration is held; remote keys live as long as the worker). On
    /// an endpoint with lanes on several drivers its lane is chosen here
    /// (`mixed_lane`), taking a bandwidth lane in turn.
    ///
    /// # Errors
    /// No group of a mixed endpoint can run it (validation checked that it
    /// could; kept as an error rather than a panic).
    pub(super) fn lane_op(&mut self, request: &Request) -> Result<Op, Status> {
        let e = request.endpoint as usize;
        let (lane, group, driver) = if self.endpoints[e].has(MIXED) {
            let (lane, gi) = self.mixed_lane(e, request)?;
            let g = self.cold[e].groups[gi];
            let data = matches!(request.opcode(), Opcode::PUT | Opcode::GET);
            if data && request.len >= self.config.bw_threshold && g.lanes > 1 {
                // A bandwidth lane: the next one is the next in turn.
                let ep = &mut self.endpoints[e];
                ep.next_bw = ep.next_bw.wrapping_add(1);
            }
            (lane, gi, g.driver as usize)
        } else {
            (0, 0, self.endpoints[e].driver as usize)
        };
        let local_key = if request.holds_mem() {
            self.mem.get(request.local_mem).and_then(|r| r.keys[driver])
        } else {
            None
        };
        let kind = match request.opcode() {
            Opcode::PUT => OpKind::Put,
            Opcode::GET => OpKind::Get,
            Opcode::ATOMIC => {
                OpKind::Atomic(AtomicOp::try_from(request.subop()).unwrap_or(AtomicOp::CSWAP))
            }
            _ => OpKind::Notify,
        };
        let remote = if kind == OpKind::Notify {
            None
        } else {
            self.rkeys
                .get(request.rkey, u32::from(request.endpoint))
                .and_then(|k| k.parts[group])
                .map(|k| (k, request.remote_addr))
        };
        Ok(Op {
            kind,
            lane,
            local_addr: request.local_addr,
            local_key,
            remote,
            len: request.len,
            operand: request.operand,
            operand2: request.operand2,
            fence: false,
        })
    }

    /// Hands `op` to endpoint `e`'s driver on the lane its kind and size
    /// call for, marking the lane dirty first (R14) and carrying a weak
    /// fence's owed transport fence flag (R8), which `op.fence` then shows.
    /// Returns what the driver said.
    #[inline]
    #[allow(unsafe_code)] // hands a validated operation to the unsafe `post`
    pub(super) fn post_lane_op(&mut self, e: usize, op: &mut Op, id: RequestId) -> Posted {
        let ep = &mut self.endpoints[e];
        let lane = if ep.has(MIXED) {
            op.lane // chosen by `lane_op`
        } else {
            match op.kind {
                OpKind::Put | OpKind::Get => ep.data_lane(op.len, self.config.bw_threshold),
                OpKind::Atomic(_) => ep.atomic_lane(),
                OpKind::Notify => 0,
            }
        };
        let (driver, driver_ep, driver_lane) = self.lane_target(e, lane);
        // Dirty before posting (R14), with the lane's generation (R38).
        if self.endpoints[e].dirty & (1 << lane) == 0 {
            let generation = self.drivers[driver].lane_generation(driver_ep, driver_lane);
            self.newly_dirty(e, lane, generation);
        }
        let ep = &mut self.endpoints[e];
        op.fence = ep.weak_lane == lane | WEAK_FLAG_OWED;
        if op.fence {
            ep.weak_lane = lane;
        }
        op.lane = driver_lane;
        // SAFETY: `op` comes from a validated SQE: its local range was
        // checked against its registration (`Engine::validate`, or the
        // direct path's `check_rma`/`Resolved::covers`), and that
        // registration cannot go before the operation completes: a request
        // that holds it counts in its `inflight` (deregistration fails with
        // BUSY meanwhile), and the direct path takes its slot before the
        // engine lock is released. A NOTIFY's payload range is checked the
        // same way; a non-fetching ADD reads no local memory.
        unsafe { self.drivers[driver].post(driver_ep, op, Token(u64::from(id.0))) }
    }
}
