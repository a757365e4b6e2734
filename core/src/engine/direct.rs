//! The direct path: admitted PUTs and GETs that start straight from their
//! SQEs, and runs of them executed by drivers that finish operations
//! inside the call.

use super::Engine;
use super::intake::rma_shape;
use crate::driver::{DriverMemKey, DriverRkey, Op, OpKind, Posted, fails_endpoint};
use crate::endpoint::{EpState, NOT_DIRECT};
use crate::memory::within;
use crate::request::{NONE, Request, RequestId, State};
use ringfence_ring::{Opcode, Sqe, SqeFlags, Status};

/// A PUT or GET: an SQE the direct path may take.
#[inline]
pub(super) fn is_rma(sqe: &Sqe) -> bool {
    sqe.opcode == Opcode::PUT.as_raw() || sqe.opcode == Opcode::GET.as_raw()
}

/// The opcode of a PUT or GET; `None` for any other SQE.
#[inline]
pub(super) fn rma_opcode(sqe: &Sqe) -> Option<Opcode> {
    match sqe.opcode {
        op if op == Opcode::PUT.as_raw() => Some(Opcode::PUT),
        op if op == Opcode::GET.as_raw() => Some(Opcode::GET),
        _ => None,
    }
}

/// What the direct path needs of an SQE it admits.
#[derive(Debug, Clone, Copy)]
pub(super) struct Direct {
    pub(super) opcode: Opcode,
    pub(super) skip_success: bool,
    pub(super) keys: OpKeys,
}

/// The lookups of the last PUT or GET the direct path took, reused for the
/// following SQEs (of this intake batch or a later one) that name the same endpoint,
/// registration and remote key (the common case: a stream of PUTs from one
/// buffer into one window, or a ping-pong). Remote keys are never removed,
/// a driver's capabilities never change, and registrations change only
/// outside intake: the lookups stay valid until a registration is removed
/// (`MemRegistry::removals` moves), which intake checks first.
#[derive(Debug, Clone, Copy)]
pub(super) struct Resolved {
    pub(super) endpoint: u32,
    pub(super) local_mem: u32,
    pub(super) rkey: u32,
    pub(super) max_len: u32,
    pub(super) get: bool,
    /// The endpoint's driver offers the direct path (`Driver::direct`).
    pub(super) execute: bool,
    /// `MemRegistry::removals` when resolved.
    pub(super) removals: u64,
    /// Base and length of the registration, and of the remote key.
    pub(super) local: (u64, u64),
    pub(super) remote: (u64, u64),
    pub(super) keys: OpKeys,
}

impl Resolved {
    /// Matches no SQE: remote key 0 is never valid.
    pub(super) const NONE: Resolved = Resolved {
        endpoint: 0,
        local_mem: 0,
        rkey: 0,
        max_len: 0,
        get: false,
        execute: false,
        removals: 0,
        local: (0, 0),
        remote: (0, 0),
        keys: OpKeys {
            local: None,
            remote: None,
        },
    };

    /// The keys of `sqe` if it names what was resolved and passes every
    /// check `Engine::check_rma` makes; `None` sends it to the full checks.
    #[inline]
    pub(super) fn admits(&self, sqe: &Sqe, opcode: Opcode) -> Option<OpKeys> {
        self.covers(sqe, opcode).then(|| OpKeys {
            local: self.keys.local,
            remote: self.keys.remote.map(|(key, _)| (key, sqe.remote_addr)),
        })
    }

    /// Whether `sqe` names what was resolved and passes every check
    /// `Engine::check_rma` makes (the fields a PUT or GET does not use are
    /// zero among them: `rma_shape`).
    #[inline]
    pub(super) fn covers(&self, sqe: &Sqe, opcode: Opcode) -> bool {
        let len = u64::from(sqe.len);
        sqe.rkey == self.rkey
            && sqe.endpoint == self.endpoint
            && sqe.local_mem == self.local_mem
            && rma_shape(sqe, opcode, self.get, self.max_len).is_ok()
            && within(self.local.0, self.local.1, sqe.local_addr, len)
            && within(self.remote.0, self.remote.1, sqe.remote_addr, len)
    }
}

/// The driver's keys an operation names: its local registration's and its
/// remote key's (with the remote address).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct OpKeys {
    pub(super) local: Option<DriverMemKey>,
    pub(super) remote: Option<(DriverRkey, u64)>,
}
/// The direct path's state: its cached lookups and one run's buffers.
#[derive(Debug)]
pub(super) struct DirectRun {
    /// The direct path's lookups, valid until a registration is removed.
    pub(super) resolved: Resolved,
    /// A run's operations for `DirectPath::execute`, and their results
    /// (both allocated once, for a whole intake batch).
    ops: Vec<Op>,
    results: Box<[Result<u32, Status>]>,
}

impl DirectRun {
    /// Buffers for runs of up to `batch` operations.
    pub(super) fn new(batch: usize) -> DirectRun {
        DirectRun {
            resolved: Resolved::NONE,
            ops: Vec::with_capacity(batch),
            results: vec![Ok(0); batch].into_boxed_slice(),
        }
    }
}

impl Engine {
    /// Whether `sqe` may take the direct path: a valid PUT or GET on an
    /// endpoint that is connected with nothing queued (R18) and no boundary
    /// pending (W = C, so its epoch is admitted, R14), or only a weak
    /// fence's, on the lane it takes, already flagged (R8; the lane was not
    /// replaced since, R38). Returns what
    /// the path needs, from the lookups of the previous SQE when it names
    /// the same endpoint, registration and remote key. `None` for anything
    /// else, which takes the general path: that one validates again and
    /// reports any error.
    #[inline]
    pub(super) fn direct(&mut self, sqe: &Sqe) -> Option<Direct> {
        let opcode = rma_opcode(sqe)?;
        let flags = sqe.flags().ok()?;
        let ep = self.endpoints.get(sqe.endpoint as usize)?;
        let lane = ep.peek_data_lane(sqe.len, self.config.bw_threshold);
        let ready = ep.head == NONE
            && ep.epochs_admit(lane)
            && !ep.has(NOT_DIRECT)
            && ep.state == EpState::Connected;
        // The fields a PUT or GET does not use: `check_rma` or `covers`
        // (`rma_shape`, below).
        if !ready {
            return None;
        }
        if ep.submit_epoch != ep.admitted_epoch && !self.weak_lane_kept(sqe.endpoint as usize, lane)
        {
            return None;
        }
        let keys = match self.run.resolved.admits(sqe, opcode) {
            Some(keys) => keys,
            None => {
                let mut keys = OpKeys::default();
                self.check_rma(sqe, opcode, ep.driver, &mut keys).ok()?;
                self.run.resolved = self.resolve(sqe, ep.driver, keys);
                keys
            }
        };
        Some(Direct {
            opcode,
            skip_success: flags.contains(SqeFlags::SKIP_SUCCESS),
            keys,
        })
    }

    /// Whether the run of SQEs that ends before `sqe` (`run` of them, all
    /// on endpoint `run_ep`) may take it too: the direct path admits it, on
    /// the same endpoint, on lane 0, with the same keys, and its driver
    /// executes runs.
    #[inline]
    pub(super) fn extends_run(&mut self, sqe: &Sqe, run: usize, run_ep: u32) -> bool {
        let Some(opcode) = rma_opcode(sqe) else {
            return false;
        };
        let threshold = self.config.bw_threshold;
        if run == 0 && self.starts_as_run(sqe, opcode) {
            return true;
        }
        if run == 0 {
            // The first of a run: every check of the direct path, and the
            // lookups the rest of the run reuses.
            let Some(ep) = self.endpoints.get(sqe.endpoint as usize) else {
                return false;
            };
            return self.drivers.has_direct(ep.driver as usize)
                && ep.peek_data_lane(sqe.len, threshold) == 0
                && self.direct(sqe).is_some();
        }
        // The rest: the endpoint's state cannot change before the run
        // executes, and the keys are the first one's.
        sqe.endpoint == run_ep
            && sqe.flags().is_ok()
            && self.endpoints[run_ep as usize].peek_data_lane(sqe.len, threshold) == 0
            && self.run.resolved.covers(sqe, opcode)
    }

    /// `extends_run` for the first SQE of a run, from the kept lookups
    /// alone: `sqe` names what `resolved` holds and passes the direct
    /// path's every check (see `direct`). `false` may still start a run
    /// after the full lookups.
    #[inline]
    pub(super) fn starts_as_run(&self, sqe: &Sqe, opcode: Opcode) -> bool {
        let Some(ep) = self.endpoints.get(sqe.endpoint as usize) else {
            return false;
        };
        self.run.resolved.execute
            && self.run.resolved.covers(sqe, opcode)
            && sqe.flags().is_ok()
            && ep.head == NONE
            && ep.epochs_admit(0)
            && !ep.has(NOT_DIRECT)
            && ep.state == EpState::Connected
            && ep.peek_data_lane(sqe.len, self.config.bw_threshold) == 0
            && (ep.submit_epoch == ep.admitted_epoch
                || self.weak_lane_kept(sqe.endpoint as usize, 0))
    }

    /// Runs `sqes` (a run that `extends_run` admitted, all on one endpoint
    /// and lane 0) through its driver's `execute`: one call for the run
    /// instead of one `post` each. What the driver did not run goes through
    /// the general path, in order.
    pub(super) fn execute_run(&mut self, qi: usize, sqes: &[Sqe]) {
        let e = sqes[0].endpoint as usize;
        let ran = self.execute_ops(e, sqes);
        let (mut bytes, mut errors) = (0u64, 0u64);
        for (sqe, &result) in sqes[..ran].iter().zip(&self.run.results[..ran]) {
            let skip = sqe.flags & SqeFlags::SKIP_SUCCESS.bits() != 0;
            match result {
                Ok(n) => bytes += u64::from(n),
                Err(_) => errors += 1,
            }
            self.queues[qi].finish(sqe.user_data, result, skip, &mut self.stats);
        }
        self.count(e, ran as u64, bytes, errors);
        if let Some(&Err(status)) = self.run.results[..ran].last()
            && fails_endpoint(status)
        {
            self.fail_endpoint(e, status);
        }
        for sqe in &sqes[ran..] {
            if self.shut_down || !self.try_direct(qi, sqe) {
                self.accept(qi, sqe);
            }
        }
    }

    /// Hands `sqes` (PUTs and GETs of endpoint `e` on lane 0, with the keys
    /// in `resolved`) to the driver's `execute`; returns how many it ran,
    /// their results in `run.results`. Marks lane 0 dirty first (R14), with
    /// its generation (R38).
    #[inline]
    #[allow(unsafe_code)] // hands admitted operations to the unsafe `execute`
    pub(super) fn execute_ops(&mut self, e: usize, sqes: &[Sqe]) -> usize {
        let ep = &mut self.endpoints[e];
        let (driver, driver_ep) = (ep.driver as usize, crate::driver::DriverEp(ep.driver_ep));
        if ep.dirty & 1 == 0 {
            let generation = self.drivers[driver].lane_generation(driver_ep, 0);
            self.newly_dirty(e, 0, generation);
        }
        let keys = self.run.resolved.keys;
        let op = |sqe: &Sqe| Op {
            kind: if sqe.opcode == Opcode::PUT.as_raw() {
                OpKind::Put
            } else {
                OpKind::Get
            },
            lane: 0,
            local_addr: sqe.local_addr,
            local_key: keys.local,
            remote: keys.remote.map(|(key, _)| (key, sqe.remote_addr)),
            len: sqe.len,
            operand: 0,
            operand2: 0,
            fence: false,
        };
        let Some(driver) = self.drivers[driver].direct() else {
            return 0; // not offered: the engine posts them one by one
        };
        if let [sqe] = sqes {
            // A run of one (a ping-pong): the driver's single-operation path.
            // SAFETY: the direct path admitted `sqe`: its local range lies
            // inside the registration whose key `resolved` holds (checked by
            // `check_rma` or `Resolved::covers`), and that registration
            // cannot be removed during the call (the engine lock is held).
            return match unsafe { driver.execute_one(driver_ep, &op(sqe)) } {
                Some(result) => {
                    self.run.results[0] = result;
                    1
                }
                None => 0,
            };
        }
        self.run.ops.clear();
        self.run.ops.extend(sqes.iter().map(op));
        // SAFETY: as for a run of one: every SQE of the run was admitted
        // against the same registration, which stays for the call.
        let ran = unsafe {
            driver.execute(
                driver_ep,
                &self.run.ops,
                &mut self.run.results[..sqes.len()],
            )
        };
        ran.min(sqes.len())
    }

    /// Runs `sqe` now, on the caller's thread, if the direct path would
    /// start it as a run of one: a valid PUT or GET, on lane 0 of a
    /// connected endpoint with nothing queued and no boundary pending (R14,
    /// R18), through a driver that finishes operations inside `execute`;
    /// and only if queue pair `qi` holds no SQE the engine has not taken
    /// (an earlier one could be a FENCE that must go first, R12). Returns
    /// its result, which is its one completion (R31): no CQE follows.
    /// `None`: nothing was done, and nothing was counted.
    pub(crate) fn run_now(&mut self, qi: usize, sqe: &Sqe) -> Option<Result<u32, Status>> {
        rma_opcode(sqe)?;
        if self.run.resolved.removals != self.mem.removals() {
            self.run.resolved = Resolved::NONE;
        }
        self.prefetch(sqe);
        // `extends_run` tries the kept lookups first (`starts_as_run`).
        let admitted = self.extends_run(sqe, 0, sqe.endpoint) && self.run.resolved.execute;
        let q = &mut self.queues[qi];
        if self.shut_down || q.broken || !matches!(q.sq.ready(), Ok(0)) {
            return None;
        }
        if !admitted {
            // On a failed endpoint (a dead peer, say) intake's checks fail
            // it with exactly the status its CQE would carry (its sticky
            // first error, or what is wrong with the SQE): its one
            // completion (R31, R32).
            return match self.endpoints.get(sqe.endpoint as usize) {
                Some(ep) if ep.state == EpState::Failed => self.validate(sqe).err().map(Err),
                _ => None,
            };
        }
        let e = sqe.endpoint as usize;
        if self.execute_ops(e, std::slice::from_ref(sqe)) == 0 {
            return None;
        }
        let result = self.run.results[0];
        match result {
            Ok(n) => self.count(e, 1, u64::from(n), 0),
            Err(status) => self.ran_now_failed(e, status),
        }
        Some(result)
    }

    /// Hands the driver a prefetch hint for `sqe` if it names the kept
    /// lookups' endpoint and remote key (a ping-pong: the next PUT goes to
    /// the same line): the peer's line starts moving here while `run_now`
    /// checks the SQE. Only a hint: nothing is accessed before the checks.
    #[inline]
    pub(super) fn prefetch(&mut self, sqe: &Sqe) {
        let r = &self.run.resolved;
        let Some((rkey, _)) = r.keys.remote else {
            return;
        };
        if sqe.rkey != r.rkey || sqe.endpoint != r.endpoint {
            return;
        }
        // No driver after shutdown: nothing to hint.
        let Some(ep) = self.endpoints.get(sqe.endpoint as usize) else {
            return;
        };
        if let Some(driver) = self
            .drivers
            .get_mut(ep.driver as usize)
            .and_then(|d| d.direct())
        {
            let write = sqe.opcode == Opcode::PUT.as_raw();
            driver.prefetch(
                crate::driver::DriverEp(ep.driver_ep),
                rkey,
                sqe.remote_addr,
                write,
            );
        }
    }

    /// Counts an operation `run_now` ran that failed with `status`, and
    /// fails its endpoint if the error is fatal: its other requests
    /// complete now, with CQEs.
    #[cold]
    #[inline(never)]
    pub(super) fn ran_now_failed(&mut self, e: usize, status: Status) {
        self.count(e, 1, 0, 1);
        if fails_endpoint(status) {
            self.fail_endpoint(e, status);
            for q in &mut self.queues {
                q.publish();
            }
        }
    }

    /// The direct path for one SQE: it starts from the SQE without a
    /// request slot, which is all it needs on drivers that finish
    /// operations inside `post` (shm, loopback). Its token names the slot
    /// the pool hands out next: if the driver keeps the operation in flight
    /// (or has no room for it), it takes exactly that slot, as if it had
    /// gone through `submit`. Returns `false` (nothing done) if the SQE
    /// does not qualify (see `direct`). Not inlined: intake's loop, which
    /// every SQE passes, stays small for the others (NOPs above all).
    #[inline(never)]
    pub(super) fn try_direct(&mut self, qi: usize, sqe: &Sqe) -> bool {
        let Some(Direct {
            opcode,
            skip_success,
            keys,
        }) = self.direct(sqe)
        else {
            return false;
        };
        let e = sqe.endpoint as usize;
        let kind = if opcode == Opcode::PUT {
            OpKind::Put
        } else {
            OpKind::Get
        };
        let slot = self.queues[qi]
            .pool
            .next_free()
            .expect("intake never takes more SQEs than free requests");
        let id = RequestId::new(qi as u32, slot);
        let mut op = Op {
            kind,
            lane: 0,
            local_addr: sqe.local_addr,
            local_key: keys.local,
            remote: keys.remote,
            len: sqe.len,
            operand: 0,
            operand2: 0,
            fence: false,
        };
        match self.post_lane_op(e, &mut op, id) {
            Posted::Done(result) => {
                let (bytes, error) = match result {
                    Ok(n) => (u64::from(n), 0),
                    Err(_) => (0, 1),
                };
                self.count(e, 1, bytes, error);
                self.queues[qi].finish(sqe.user_data, result, skip_success, &mut self.stats);
                if let Err(status) = result
                    && fails_endpoint(status)
                {
                    self.fail_endpoint(e, status);
                }
            }
            posted => {
                let flags = if skip_success {
                    SqeFlags::SKIP_SUCCESS
                } else {
                    SqeFlags::EMPTY
                };
                let mut request = Request::from_sqe(sqe, opcode, e as u16, flags);
                request.set_holds_mem();
                request.epoch = self.endpoints[e].submit_epoch as u32;
                let taken = self.take_slot(qi, request);
                debug_assert_eq!(taken, id, "the token named the next free slot");
                if posted == Posted::InFlight {
                    self.request_mut(id).set_state(State::Posted);
                    self.endpoints[e].inflight += 1;
                } else {
                    // No room in the driver: first in line (the queue was
                    // empty), it starts again from dispatch, ahead of
                    // anything submitted after it.
                    self.push_head(e, id);
                    self.schedule(e);
                }
            }
        }
        true
    }

    /// What the direct path may reuse for the next SQE that names the same
    /// endpoint, registration and remote key as `sqe`, which passed
    /// `check_rma` with `keys`.
    pub(super) fn resolve(&self, sqe: &Sqe, driver: u8, keys: OpKeys) -> Resolved {
        let caps = self.drivers.caps(driver as usize);
        match (
            self.mem.get(sqe.local_mem),
            self.rkeys.get(sqe.rkey, sqe.endpoint),
        ) {
            (Some(local), Some(remote)) => Resolved {
                endpoint: sqe.endpoint,
                local_mem: sqe.local_mem,
                rkey: sqe.rkey,
                max_len: caps.max_len,
                get: caps.get,
                execute: self.drivers.has_direct(driver as usize),
                removals: self.mem.removals(),
                local: (local.base, local.len),
                remote: (remote.base, remote.len),
                keys,
            },
            _ => Resolved::NONE,
        }
    }
}
