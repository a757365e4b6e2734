//! Endpoints: a connection to one peer worker over one driver, with up to
//! 64 lanes.

use crate::driver::LaneMask;
use crate::request::NONE;
use crate::stats::Stats;
use ringfence_ring::Status;
use static_assertions::const_assert;

/// An endpoint, as put in [`Sqe::endpoint`](ringfence_ring::Sqe).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EndpointId(pub(crate) u32);

impl EndpointId {
    /// The raw value for an SQE.
    pub const fn as_raw(self) -> u32 {
        self.0
    }
}

/// Where an endpoint is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum EpState {
    Connected,
    /// Failed with a sticky first error; every request completes with it.
    Failed,
}

/// The hot part of an endpoint: what every operation touches. One cache
/// line, pinned below (UCX's `ucp_ep_t` + `ucp_ep_ext_t` are 64 + 216
/// bytes; the budget DESIGN.md sets is 128).
///
/// Epochs (FENCE.md §3): `submit_epoch` is W, bumped by every FENCE and by
/// the implicit fence before a NOTIFY; `admitted_epoch` is C. Both start at 1
/// (R12). A request captures W at submission (R13) and may start only when
/// its epoch is ≤ C and nothing is queued ahead of it (R14, R18).
#[derive(Debug)]
#[repr(C)]
pub(crate) struct Endpoint {
    /// Lanes written since the last fence flush started (D).
    pub dirty: LaneMask,
    /// Lanes the in-flight fence flush covers (F); 0 when none.
    pub flushing: LaneMask,
    /// W.
    pub submit_epoch: u64,
    /// C.
    pub admitted_epoch: u64,
    /// The exact epoch C moves to when the in-flight fence flush completes
    /// (R15c); 0 when no fence flush is in flight (R16: at most one).
    pub fence_target: u64,
    /// The FIFO of requests waiting to start (R18): first and last
    /// `RequestId`, linked through `Request::next`; [`NONE`] when empty.
    pub head: u32,
    pub tail: u32,
    /// Requests and user flushes handed to the driver, not yet completed.
    pub inflight: u32,
    /// The driver's handle of this connection.
    pub driver_ep: u32,
    /// The sticky first error as its raw value (statuses fit in an `i8`),
    /// valid when `state` is `Failed`; see [`Endpoint::error`].
    error: i8,
    /// Index of the driver in the worker.
    pub driver: u8,
    /// Lane count, `1..=64`.
    pub lanes: u8,
    /// Next bandwidth lane for round-robin.
    pub next_bw: u8,
    pub state: EpState,
    /// In the engine's dispatch list.
    pub scheduled: bool,
}

// One cache line: every operation on an endpoint touches only this line.
const_assert!(core::mem::size_of::<Endpoint>() <= 64);

impl Endpoint {
    pub(crate) fn new(driver: u8, driver_ep: u32, lanes: u8) -> Endpoint {
        Endpoint {
            dirty: 0,
            flushing: 0,
            submit_epoch: 1,
            admitted_epoch: 1,
            fence_target: 0,
            head: NONE,
            tail: NONE,
            inflight: 0,
            driver_ep,
            error: Status::EndpointFailed.as_raw() as i8,
            driver,
            lanes,
            next_bw: 0,
            state: EpState::Connected,
            scheduled: false,
        }
    }

    /// The sticky first error.
    pub(crate) fn error(&self) -> Status {
        Status::try_from(i32::from(self.error)).unwrap_or(Status::EndpointFailed)
    }

    /// Records the sticky first error.
    pub(crate) fn set_error(&mut self, status: Status) {
        // Every status value is in -1..=-128.
        self.error = i8::try_from(status.as_raw()).unwrap_or(Status::EndpointFailed.as_raw() as i8);
    }

    /// The atomic lane: the last lane (lane 0 when there is one).
    pub(crate) fn atomic_lane(&self) -> u8 {
        self.lanes - 1
    }

    /// A lane for a PUT or GET of `len` bytes: lane 0 below `threshold`,
    /// else the bandwidth lanes 1.. in turn.
    pub(crate) fn data_lane(&mut self, len: u32, threshold: u32) -> u8 {
        if self.lanes == 1 || len < threshold {
            return 0;
        }
        let lane = 1 + self.next_bw % (self.lanes - 1);
        self.next_bw = self.next_bw.wrapping_add(1);
        lane
    }
}

/// The cold part of an endpoint.
#[derive(Debug, Default, Clone)]
pub(crate) struct EndpointCold {
    pub stats: Stats,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_by_operation_and_size() {
        let mut one = Endpoint::new(0, 0, 1);
        assert_eq!((one.atomic_lane(), one.data_lane(1 << 20, 8192)), (0, 0));
        let mut four = Endpoint::new(0, 0, 4);
        assert_eq!(four.atomic_lane(), 3);
        assert_eq!(four.data_lane(64, 8192), 0, "small: latency lane");
        let big: Vec<u8> = (0..6).map(|_| four.data_lane(1 << 20, 8192)).collect();
        assert_eq!(
            big,
            vec![1, 2, 3, 1, 2, 3],
            "large: bandwidth lanes in turn"
        );
        assert_eq!(core::mem::size_of::<Endpoint>(), 64);
        let mut ep = Endpoint::new(0, 0, 1);
        assert_eq!(ep.error(), Status::EndpointFailed);
        for status in Status::ALL {
            ep.set_error(status);
            assert_eq!(ep.error(), status);
        }
    }
}
