//! The direct path: an optional extension for drivers that finish
//! operations inside the call that starts them (shm, loopback).
//!
//! Such a driver may offer [`DirectPath`] through
//! [`Driver::direct`](super::Driver::direct). The engine then hands it runs
//! of admitted PUTs and GETs in one call instead of one `post` each, starts
//! a ping-pong's PUT from the SQE on the caller's thread
//! ([`QueuePair::try_now`](crate::QueuePair::try_now)), and gives it a
//! prefetch hint before checking an operation. Asynchronous drivers (tcp,
//! verbs, CUDA) do not offer it: everything they do goes through `post`,
//! `flush`, `commit` and `poll`.

#![allow(unsafe_code)] // declares the unsafe `execute` contract

use super::{Driver, DriverEp, DriverRkey, Op, Posted, Token};
use ringfence_ring::Status;

/// Runs of operations finished inside the call, for drivers that can.
pub trait DirectPath {
    /// Runs `ops` (PUTs and GETs of one endpoint, in order, all on one
    /// lane) to completion inside the call, each exactly as `post` would
    /// run it, and writes the result of each one run to `results` (as long
    /// as `ops`). Returns how many ran, in order from the first; it may
    /// stop early (after one that failed, or before one it cannot finish
    /// inside the call), and the engine posts the rest one by one. Must not
    /// allocate or block.
    ///
    /// # Safety
    /// As [`Driver::post`](super::Driver::post), for every operation of
    /// `ops`: its local range lies inside memory registered with this
    /// driver, which stays allocated and registered for the call.
    unsafe fn execute(
        &mut self,
        ep: DriverEp,
        ops: &[Op],
        results: &mut [Result<u32, Status>],
    ) -> usize;

    /// `execute` for a run of one (a ping-pong's PUT): its result, or
    /// `None` if it did not run. Drivers with a shorter path for a single
    /// operation override it; the default calls `execute`.
    ///
    /// # Safety
    /// As [`execute`](DirectPath::execute).
    unsafe fn execute_one(&mut self, ep: DriverEp, op: &Op) -> Option<Result<u32, Status>> {
        let mut result = [Ok(0)];
        // SAFETY: the caller vouches for `op` as `execute` requires.
        let ran = unsafe { self.execute(ep, std::slice::from_ref(op), &mut result) };
        (ran > 0).then_some(result[0])
    }

    /// A hint that an operation through remote key `rkey` of `ep` will
    /// soon access `addr` (a PUT if `write`): a driver that maps the peer's
    /// memory can start moving that cache line to this CPU while the
    /// engine validates the operation, so the line transfer overlaps the
    /// checks instead of following them. Called before anything about the
    /// operation is checked: it must not fault, block, allocate or change
    /// memory. The default does nothing.
    fn prefetch(&mut self, ep: DriverEp, rkey: DriverRkey, addr: u64, write: bool) {
        let _ = (ep, rkey, addr, write);
    }
}

/// The body of [`DirectPath::execute`] for a driver whose `post` finishes
/// what it takes inside the call (loopback, and wrappers over such a
/// driver): runs `ops` one by one through `driver`'s `post`, as long as
/// `go(driver)` says so before each. Stops after one that failed, and
/// before one `post` had no room for (the engine posts the rest itself).
/// An operation that `post` keeps in flight breaks the driver's promise:
/// it is reported failed with [`Status::Transport`] (its completion would
/// name no request).
///
/// # Safety
/// As [`DirectPath::execute`]: the caller vouches for every operation of
/// `ops` as [`Driver::post`] requires.
pub unsafe fn execute_by_post<D: Driver + ?Sized>(
    driver: &mut D,
    ep: DriverEp,
    ops: &[Op],
    results: &mut [Result<u32, Status>],
    mut go: impl FnMut(&D) -> bool,
) -> usize {
    for (i, (op, result)) in ops.iter().zip(results.iter_mut()).enumerate() {
        if !go(driver) {
            return i;
        }
        // SAFETY: the caller vouches for `op` as `post` requires.
        match unsafe { driver.post(ep, op, Token::NONE) } {
            Posted::Done(r) => {
                *result = r;
                if r.is_err() {
                    return i + 1;
                }
            }
            Posted::NoResource => return i,
            Posted::InFlight => {
                *result = Err(Status::Transport);
                return i + 1;
            }
        }
    }
    ops.len().min(results.len())
}
