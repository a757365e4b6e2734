//! Intake: SQEs taken from the SQs, validated, and handed to their
//! endpoints (or the direct path).

use super::direct::{OpKeys, Resolved, is_rma};
use super::{Engine, INTAKE_BATCH};
use crate::driver::DriverRkey;
use crate::endpoint::{EpState, MIXED};
use crate::memory::{Rkey, within};
use crate::request::{Request, RequestId};
use ringfence_ring::{AtomicOp, FlushScope, Opcode, Sqe, Status};

impl Engine {
    pub(super) fn intake(&mut self, qi: usize) -> usize {
        let q = &mut self.queues[qi];
        if q.broken || !q.overflow.is_empty() {
            return 0;
        }
        let room = (q.pool.available() as usize).min(INTAKE_BATCH);
        if room == 0 {
            return 0;
        }
        // A buffer kept across rounds: zeroing 4 KiB on every round costs
        // more than a small batch's processing.
        let mut sqes = std::mem::take(&mut self.sqe_scratch);
        if self.run.resolved.removals != self.mem.removals() {
            // A registration went away since the lookups were made.
            self.run.resolved = Resolved::NONE;
        }
        let q = &mut self.queues[qi];
        // An SQ that looks empty also has its shared head checked (only
        // the engine writes it; garbage there is what the application
        // reads as free space): one load of the engine's own line, on the
        // idle path only.
        let popped = match q.sq.pop_batch(&mut sqes[..room]) {
            Ok(0) => q.sq.check_shared_head().map(|()| 0),
            popped => popped,
        };
        let n = match popped {
            Ok(n) => n,
            Err(c) => {
                tracing::error!(queue = qi, "SQ indices corrupt");
                q.fail(&c);
                self.sqe_scratch = sqes;
                return 0;
            }
        };
        if n > 0 && is_rma(&sqes[0]) {
            self.prefetch(&sqes[0]);
        }
        // Runs of direct PUTs and GETs to one endpoint go to its driver in
        // one call; anything else first ends the run (order is kept).
        let (mut i, mut start) = (0, 0);
        while i < n {
            let sqe = &sqes[i];
            let rma = is_rma(sqe) && !self.shut_down;
            if rma && self.extends_run(sqe, i - start, sqes[start].endpoint) {
                i += 1;
                continue;
            }
            if i > start {
                self.execute_run(qi, &sqes[start..i]);
                start = i;
                continue; // `sqe` may start the next run
            }
            if !(rma && self.try_direct(qi, sqe)) {
                self.accept(qi, sqe);
            }
            i += 1;
            start = i;
        }
        if i > start {
            self.execute_run(qi, &sqes[start..i]);
        }
        self.sqe_scratch = sqes;
        n
    }

    /// Takes one SQE. Every path ends in exactly one completion (R31): an
    /// invalid SQE or a NOP completes here, without a request slot (its CQE
    /// is all there is to it); anything else gets a slot and goes to its
    /// endpoint.
    #[inline]
    pub(super) fn accept(&mut self, qi: usize, sqe: &Sqe) {
        let validated = if self.shut_down {
            Err(Status::Canceled)
        } else {
            self.validate(sqe)
        };
        match validated {
            Err(status) => self.complete_now(qi, sqe.user_data, Err(status), false),
            Ok(request) if request.opcode() == Opcode::NOP => {
                self.complete_now(qi, sqe.user_data, Ok(0), request.skip_success());
            }
            Ok(request) => {
                let id = self.take_slot(qi, request);
                self.submit(id);
            }
        }
    }

    /// Gives a validated request a slot of queue `qi`, with its reference
    /// on its local registration.
    pub(super) fn take_slot(&mut self, qi: usize, request: Request) -> RequestId {
        let slot = self.queues[qi]
            .pool
            .alloc(request)
            .expect("intake never takes more SQEs than free requests");
        if request.holds_mem()
            && let Some(r) = self.mem.get_mut(request.local_mem)
        {
            r.inflight += 1;
        }
        RequestId::new(qi as u32, slot)
    }

    /// Checks every field of an SQE, as the application wrote it, and
    /// copies what the engine needs. Every field the opcode does not use
    /// must be zero (`Sqe::unused_bits`, `InvalidArgument`), so that the
    /// ABI can give it a meaning later; the table on `Sqe` says which
    /// status each broken rule gets.
    pub(super) fn validate(&self, sqe: &Sqe) -> Result<Request, Status> {
        let opcode = sqe.opcode().map_err(|e| e.status())?;
        let flags = sqe.flags().map_err(|e| e.status())?;
        if sqe.unused_bits() != 0 {
            return Err(Status::InvalidArgument);
        }
        if opcode == Opcode::NOP {
            if sqe.subop != 0 {
                return Err(Status::InvalidSubop);
            }
            return Ok(Request::from_sqe(sqe, opcode, 0, flags));
        }
        if opcode == Opcode::FLUSH && sqe.subop == FlushScope::WORKER.as_raw() {
            // A worker flush names no endpoint: the field must be 0.
            if sqe.endpoint != 0 {
                return Err(Status::InvalidEndpoint);
            }
            return Ok(Request::from_sqe(sqe, opcode, 0, flags));
        }
        let ep_index = sqe.endpoint as usize;
        let ep = self
            .endpoints
            .get(ep_index)
            .ok_or(Status::InvalidEndpoint)?;
        match (ep.state, opcode) {
            (EpState::Connected, _) => {}
            // R34: a fence and a close on a failed endpoint are accepted.
            (EpState::Failed, Opcode::FENCE | Opcode::CLOSE) => {}
            (EpState::Failed, _) => return Err(ep.error()),
            // R43: nothing is queued behind a close.
            (EpState::Closing | EpState::Closed, _) => return Err(Status::EndpointClosed),
        }
        // On an endpoint with lanes on several drivers, what the drivers
        // support is checked per lane group at the end (`mixed_lane`).
        let mixed = ep.has(MIXED);
        let caps = self.drivers.caps(ep.driver as usize);
        let mut request = Request::from_sqe(sqe, opcode, ep_index as u16, flags);
        let len = u64::from(sqe.len);
        match opcode {
            Opcode::PUT | Opcode::GET if mixed => {
                rma_shape(sqe, opcode, true, u32::MAX)?;
                self.mem.check(sqe.local_mem, sqe.local_addr, len)?;
                self.check_remote_bounds(sqe, len)?;
                request.set_holds_mem();
            }
            Opcode::PUT | Opcode::GET => {
                self.check_rma(sqe, opcode, ep.driver, &mut OpKeys::default())?;
                request.set_holds_mem();
            }
            Opcode::ATOMIC => {
                let op = sqe.atomic_op().map_err(|e| e.status())?;
                if !caps.atomic_ops.contains(op) && !mixed {
                    return Err(Status::Unsupported);
                }
                if sqe.len != 8 {
                    return Err(Status::InvalidLength);
                }
                if !sqe.remote_addr.is_multiple_of(8) {
                    return Err(Status::Misaligned);
                }
                self.check_remote_bounds(sqe, 8)?;
                if op != AtomicOp::ADD {
                    if !sqe.local_addr.is_multiple_of(8) {
                        return Err(Status::Misaligned);
                    }
                    self.mem.check(sqe.local_mem, sqe.local_addr, 8)?;
                    request.set_holds_mem();
                }
            }
            Opcode::FENCE => {
                sqe.fence_mode().map_err(|e| e.status())?;
            }
            Opcode::FLUSH => {
                // ENDPOINT; WORKER was taken above.
                sqe.flush_scope().map_err(|e| e.status())?;
            }
            Opcode::CLOSE => {
                sqe.close_mode().map_err(|e| e.status())?;
            }
            Opcode::NOTIFY => {
                if sqe.subop != 0 {
                    return Err(Status::InvalidSubop);
                }
                if !caps.notify && !mixed {
                    return Err(Status::Unsupported);
                }
                if sqe.len > self.cold[ep_index].notify_max {
                    return Err(Status::InvalidLength);
                }
                if sqe.len > 0 {
                    self.mem.check(sqe.local_mem, sqe.local_addr, len)?;
                    request.set_holds_mem();
                }
            }
            _ => return Err(Status::InvalidOpcode),
        }
        if mixed
            && matches!(
                opcode,
                Opcode::PUT | Opcode::GET | Opcode::ATOMIC | Opcode::NOTIFY
            )
        {
            // Some lane group's driver runs it: supports it and its length,
            // registered its local memory, has a part in its remote key.
            self.mixed_lane(ep_index, &request)?;
        } else if opcode == Opcode::ATOMIC {
            // The endpoint's one driver: its part of the remote key.
            self.check_remote(sqe, 8)?;
            if request.holds_mem() {
                let local = self.mem.check(sqe.local_mem, sqe.local_addr, 8)?;
                local.keys[ep.driver as usize].ok_or(Status::Unsupported)?;
            }
        } else if opcode == Opcode::NOTIFY && request.holds_mem() {
            let local = self.mem.check(sqe.local_mem, sqe.local_addr, len)?;
            local.keys[ep.driver as usize].ok_or(Status::Unsupported)?;
        }
        Ok(request)
    }

    /// The checks of a PUT or GET beyond its opcode, flags and endpoint;
    /// puts the driver's keys of both ranges in `keys`.
    #[inline]
    pub(super) fn check_rma(
        &self,
        sqe: &Sqe,
        opcode: Opcode,
        driver: u8,
        keys: &mut OpKeys,
    ) -> Result<(), Status> {
        let caps = self.drivers.caps(driver as usize);
        rma_shape(sqe, opcode, caps.get, caps.max_len)?;
        let len = u64::from(sqe.len);
        let local = self.mem.check(sqe.local_mem, sqe.local_addr, len)?;
        // `None`: the endpoint's driver does not register this memory's
        // kind (device memory on a host-only driver).
        keys.local = Some(local.keys[driver as usize].ok_or(Status::Unsupported)?);
        keys.remote = Some(self.check_remote(sqe, len)?);
        Ok(())
    }

    /// The driver's key and the address of an SQE's remote range, after
    /// checking that it lies inside a key unpacked for its endpoint, which
    /// has one lane group.
    pub(super) fn check_remote(&self, sqe: &Sqe, len: u64) -> Result<(DriverRkey, u64), Status> {
        let key = self.check_remote_bounds(sqe, len)?;
        Ok((key.parts[0].ok_or(Status::InvalidRkey)?, sqe.remote_addr))
    }

    /// The key an SQE's remote range lies in: one unpacked for its
    /// endpoint, whose bounds hold the range.
    pub(super) fn check_remote_bounds(&self, sqe: &Sqe, len: u64) -> Result<&Rkey, Status> {
        let key = self
            .rkeys
            .get(sqe.rkey, sqe.endpoint)
            .ok_or(Status::InvalidRkey)?;
        if within(key.base, key.len, sqe.remote_addr, len) {
            Ok(key)
        } else {
            Err(Status::OutOfBounds)
        }
    }
}

/// The rules of a PUT or GET besides its endpoint and bounds, shared by
/// the full checks (`Engine::check_rma`) and the direct path's kept lookups
/// (`Resolved::covers`), so the two cannot drift apart: the fields a PUT or
/// GET does not use are zero (the sub-opcode: `InvalidSubop`; the reserved
/// fields and the operands: `InvalidArgument`, as `Engine::validate`
/// says), GET only where the driver supports it, a length in
/// `1..=max_len`. The unused fields cost one OR and one branch.
#[inline]
pub(super) fn rma_shape(sqe: &Sqe, opcode: Opcode, get: bool, max_len: u32) -> Result<(), Status> {
    let unused = sqe.rma_unused_bits();
    if unused | u64::from(sqe.subop) != 0 {
        return Err(if unused != 0 {
            Status::InvalidArgument
        } else {
            Status::InvalidSubop
        });
    }
    if opcode == Opcode::GET && !get {
        return Err(Status::Unsupported);
    }
    if sqe.len == 0 || sqe.len > max_len {
        return Err(Status::InvalidLength);
    }
    Ok(())
}
