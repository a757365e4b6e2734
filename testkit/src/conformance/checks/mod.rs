//! The conformance checks. Each builds a [`Pair`] with the subject's
//! driver and checks one promise of the seam, as the application sees it
//! (docs/drivers.md, docs/fence.md): every SQE it submits gets exactly one
//! CQE ([`Pair::complete`] checks it for every batch), and the bytes land
//! where and when the promise says. `data`: moving bytes, atomics,
//! notifications, flushes and fences; `lifecycle`: refused accesses,
//! memory, close and the peer's death.

mod data;
mod lifecycle;

pub use data::*;
pub use lifecycle::*;

use super::Subject;
use crate::rig::Pair;
use ringfence::{EndpointState, Status};

/// The pair of a check.
pub(super) fn pair<S: Subject>(s: &mut S) -> Pair {
    let config = s.config();
    Pair::connect(|| s.driver(), config)
}

/// `len` bytes that differ with `seed` (and none is zero at `seed` > 0,
/// so a PUT that did not land shows).
pub(super) fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x as u8) | 1
        })
        .collect()
}

pub(super) fn status(s: Status) -> i32 {
    s.as_raw()
}

pub(super) fn read(buf: &ringfence::RegisteredBuf, offset: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0; len];
    buf.read(offset as usize, &mut out);
    out
}

#[track_caller]
pub(super) fn assert_connected(p: &Pair) {
    assert_eq!(
        p.initiator.endpoint_state(p.ep).expect("the endpoint"),
        EndpointState::Connected,
        "the endpoint is no longer up"
    );
}

/// The largest PUT or GET the checks move: the driver's `max_len`, at most
/// 1 MiB (the window's half).
pub(super) fn large(p: &Pair) -> u32 {
    p.caps.max_len.min(1 << 20)
}
