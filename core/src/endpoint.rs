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

/// Where an endpoint is in its life, as [`Worker::endpoint_state`]
/// reports it.
///
/// [`Worker::endpoint_state`]: crate::Worker::endpoint_state
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum EndpointState {
    /// The driver's handshake goes on; SQEs queue until it finishes.
    Connecting,
    /// Up: operations start.
    Connected,
    /// A graceful CLOSE is queued: what came before it drains; new
    /// submissions fail.
    Closing,
    /// Failed with this sticky first error: every operation on it
    /// completes with it.
    Failed(Status),
    /// Closed: every submission fails with `EndpointClosed`.
    Closed,
}

/// A snapshot of an endpoint's fence engine (docs/fence.md §3), as
/// [`Worker::fence_state`] reports it: read under the engine lock, so it
/// is consistent, but progress may change it right after.
///
/// [`Worker::fence_state`]: crate::Worker::fence_state
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct FenceState {
    /// W: the submission epoch, bumped by every FENCE and by the implicit
    /// fence before each NOTIFY (R12).
    pub submit_epoch: u64,
    /// C: the admitted epoch. Requests of epochs up to C may start (R14).
    pub admitted_epoch: u64,
    /// D: lanes written since the last flush of them started (R17).
    pub dirty_lanes: u64,
    /// Lanes whose earlier work user FLUSHes, CLOSEs or worker flushes in
    /// flight cover: clean once those complete (W2).
    pub covered_lanes: u64,
    /// The lanes of the strong fence flush in flight (F), with the epoch C
    /// moves to when it completes (R15c, R16); `None` when none is.
    pub fence_flush: Option<(u64, u64)>,
    /// The weak fence admission: the lane, and the epoch admitted on it
    /// only (R8); `None` when none holds.
    pub weak: Option<(u8, u64)>,
    /// Requests waiting in the endpoint's FIFO (R18).
    pub deferred: u32,
    /// Requests and flushes at the driver, not yet completed.
    pub in_flight: u32,
}

/// Where an endpoint is in its life (see also the [`CONNECTING`] flag).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum EpState {
    Connected,
    /// A graceful CLOSE is queued: new submissions fail (R43); what came
    /// before drains, then the final flush runs (R41).
    Closing,
    /// Failed with a sticky first error; every request completes with it.
    Failed,
    /// Closed: every submission fails with `EndpointClosed`.
    Closed,
}

/// The hot part of an endpoint: what every operation touches. One cache
/// line, pinned below (UCX's `ucp_ep_t` + `ucp_ep_ext_t` are 64 + 216
/// bytes; the budget set for it is 128).
///
/// Epochs (docs/fence.md §3): `submit_epoch` is W, bumped by every FENCE and by
/// the implicit fence before a NOTIFY; `admitted_epoch` is C. Both start at 1
/// (R12). A request captures W at submission (R13) and may start only when
/// its epoch is ≤ C and nothing is queued ahead of it (R14, R18).
#[derive(Debug)]
#[repr(C)]
pub(crate) struct Endpoint {
    /// Lanes written since the last fence flush started (D).
    pub dirty: LaneMask,
    /// Lanes the in-flight fence flush covers (F); 0 when none, so a fence
    /// flush is in flight exactly when this is non-zero.
    pub flushing: LaneMask,
    /// W.
    pub submit_epoch: u64,
    /// C.
    pub admitted_epoch: u64,
    /// Lanes the in-flight fence flush covers... see `flushing`; this is
    /// the exact epoch C moves to when it completes (R15c), as its low 32
    /// bits (valid while `flushing != 0`; R16: at most one in flight).
    pub fence_target: u32,
    /// The epoch admitted by a weak fence for `weak_lane` only (low 32
    /// bits; valid while `weak_lane != NO_LANE`).
    pub weak_epoch: u32,
    /// The FIFO of requests waiting to start (R18): first and last
    /// `RequestId`, linked through `Request::next`; [`NONE`] when empty.
    pub head: u32,
    pub tail: u32,
    /// Requests and user flushes handed to the driver, not yet completed.
    pub inflight: u32,
    /// The driver's handle of this connection.
    pub driver_ep: u32,
    /// The sticky first error as its raw value (statuses fit in an `i16`:
    /// errnos and library codes from -4097 down), valid when `state` is
    /// `Failed`; see [`Endpoint::error`].
    error: i16,
    /// Index of the driver in the worker.
    pub driver: u8,
    /// Lane count, `1..=64`.
    pub lanes: u8,
    /// Next bandwidth lane for round-robin.
    pub next_bw: u8,
    pub state: EpState,
    /// [`SCHEDULED`], [`STRONG_ARMED`], [`CONNECTING`], [`MIXED`],
    /// [`QUIET`].
    pub flags: EpFlags,
    /// The one lane a weak fence admitted `weak_epoch` on (R8), with
    /// [`WEAK_FLAG_OWED`] set until the first operation after the fence
    /// carried the transport fence flag; [`NO_LANE`] when none.
    pub weak_lane: u8,
}

/// A set of an endpoint's flags (`Endpoint::flags`): the constants below,
/// combined with [`EpFlags::union`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct EpFlags(u8);

impl EpFlags {
    /// No flag.
    pub(crate) const NONE: EpFlags = EpFlags(0);

    /// The flags of both sets.
    pub(crate) const fn union(self, other: EpFlags) -> EpFlags {
        EpFlags(self.0 | other.0)
    }
}

/// In `flags`: the endpoint is in the engine's dispatch list.
pub(crate) const SCHEDULED: EpFlags = EpFlags(1);
/// In `flags`: a strong FENCE was submitted since the last request, so the
/// next one is marked (`Request::strong_boundary`).
pub(crate) const STRONG_ARMED: EpFlags = EpFlags(1 << 1);
/// In `flags`: the driver's handshake has not finished. Requests queue in
/// FIFO order (R18) and nothing is started or flushed until it has; a
/// failed handshake fails the endpoint (R20, R32).
pub(crate) const CONNECTING: EpFlags = EpFlags(1 << 2);
/// In `flags`: the endpoint has lanes on several drivers (its lane groups
/// are in `EndpointCold::groups`); `driver` and `driver_ep` name the first
/// group's.
pub(crate) const MIXED: EpFlags = EpFlags(1 << 3);
/// In `flags`: worker flush parts wait on or run over this endpoint (they
/// are in `EndpointCold::quiet_parts`).
pub(crate) const QUIET: EpFlags = EpFlags(1 << 4);
/// `flags` that keep the direct path off: a boundary or a handshake is
/// pending, or lanes are on several drivers.
pub(crate) const NOT_DIRECT: EpFlags = STRONG_ARMED.union(CONNECTING).union(MIXED);

/// No weak admission.
pub(crate) const NO_LANE: u8 = 0xff;
/// In `weak_lane`: the transport fence flag is still owed.
pub(crate) const WEAK_FLAG_OWED: u8 = 0x80;

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
            weak_epoch: 0,
            head: NONE,
            tail: NONE,
            inflight: 0,
            driver_ep,
            error: Status::EndpointFailed.as_raw() as i16,
            driver,
            lanes,
            next_bw: 0,
            state: EpState::Connected,
            flags: EpFlags::NONE,
            weak_lane: NO_LANE,
        }
    }

    /// A full epoch from the low 32 bits of one captured from W (fewer than
    /// 2^31 epochs are ever outstanding).
    pub(crate) fn full_epoch(&self, low: u32) -> u64 {
        self.submit_epoch - u64::from((self.submit_epoch as u32).wrapping_sub(low))
    }

    /// Whether, as far as the epochs go, an operation on `lane` may start
    /// without the fence engine (the direct path): no boundary is pending
    /// (W = C), or the only one is a weak fence's, admitted on this very
    /// lane, whose transport fence flag an earlier operation already
    /// carried (R8: the lane orders what follows). The caller checks that
    /// the lane was not replaced since (`Engine::weak_lane_kept`).
    #[inline]
    pub(crate) fn epochs_admit(&self, lane: u8) -> bool {
        self.submit_epoch == self.admitted_epoch
            || (self.weak_lane == lane && self.weak_epoch == self.submit_epoch as u32)
    }

    /// The lane a weak fence admitted its epoch on, if any.
    pub(crate) fn weak(&self) -> Option<(u8, u32)> {
        (self.weak_lane != NO_LANE).then_some((self.weak_lane & !WEAK_FLAG_OWED, self.weak_epoch))
    }

    /// Whether a flag of `flags` is set.
    #[inline]
    pub(crate) fn has(&self, flags: EpFlags) -> bool {
        self.flags.0 & flags.0 != 0
    }

    /// Sets or clears `flags`.
    #[inline]
    pub(crate) fn set(&mut self, flags: EpFlags, on: bool) {
        if on {
            self.flags.0 |= flags.0;
        } else {
            self.flags.0 &= !flags.0;
        }
    }

    /// The public view of the state.
    pub(crate) fn public_state(&self) -> EndpointState {
        match self.state {
            EpState::Connected if self.is_connecting() => EndpointState::Connecting,
            EpState::Connected => EndpointState::Connected,
            EpState::Closing => EndpointState::Closing,
            EpState::Failed => EndpointState::Failed(self.error()),
            EpState::Closed => EndpointState::Closed,
        }
    }

    /// Whether the driver's handshake is still going on.
    #[inline]
    pub(crate) fn is_connecting(&self) -> bool {
        self.has(CONNECTING)
    }

    /// The sticky first error.
    pub(crate) fn error(&self) -> Status {
        Status::try_from(i32::from(self.error)).unwrap_or(Status::EndpointFailed)
    }

    /// Records the sticky first error.
    pub(crate) fn set_error(&mut self, status: Status) {
        // Every status value fits (the test below checks them all).
        self.error =
            i16::try_from(status.as_raw()).unwrap_or(Status::EndpointFailed.as_raw() as i16);
    }

    /// The atomic lane: the last lane (lane 0 when there is one).
    pub(crate) fn atomic_lane(&self) -> u8 {
        self.lanes - 1
    }

    /// A lane for a PUT or GET of `len` bytes: lane 0 below `threshold`,
    /// else the bandwidth lanes 1.. in turn.
    pub(crate) fn data_lane(&mut self, len: u32, threshold: u32) -> u8 {
        let lane = self.peek_data_lane(len, threshold);
        if lane != 0 {
            self.next_bw = self.next_bw.wrapping_add(1);
        }
        lane
    }

    /// The lane `data_lane` will return next, without taking it.
    pub(crate) fn peek_data_lane(&self, len: u32, threshold: u32) -> u8 {
        if self.lanes == 1 || len < threshold {
            0
        } else {
            1 + self.next_bw % (self.lanes - 1)
        }
    }

    /// Every lane of the endpoint.
    pub(crate) fn all_lanes(&self) -> LaneMask {
        if self.lanes >= 64 {
            u64::MAX
        } else {
            (1u64 << self.lanes) - 1
        }
    }
}

/// Consecutive lanes of an endpoint on one driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LaneGroup {
    /// Index of the driver in the worker.
    pub driver: u8,
    /// The driver's handle of this connection.
    pub driver_ep: u32,
    /// The endpoint's lane number of the group's lane 0.
    pub first: u8,
    /// Lanes in the group, `1..=64`.
    pub lanes: u8,
}

impl LaneGroup {
    /// The endpoint lanes of this group.
    pub(crate) fn mask(&self) -> LaneMask {
        let ones = if self.lanes >= 64 {
            u64::MAX
        } else {
            (1u64 << self.lanes) - 1
        };
        ones << self.first
    }
}

/// A flush that an endpoint with lanes on several drivers splits into one
/// driver flush per group: it completes when every part has.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct FlushParts {
    /// Endpoint lanes whose driver has not accepted its part yet (it had
    /// no room): retried from dispatch.
    pub remaining: LaneMask,
    /// The groups (bit `i`: `EndpointCold::groups[i]`) whose part is in
    /// flight at their driver. A group's part completes once: a second
    /// completion from the same driver finds its bit clear and is stray.
    pub pending: u8,
    /// The first part's failure.
    pub error: Option<Status>,
}

impl FlushParts {
    /// Whether every part has been accepted and has completed.
    pub(crate) fn is_done(&self) -> bool {
        self.remaining == 0 && self.pending == 0
    }

    /// The flush's result once done.
    pub(crate) fn result(&self) -> Result<u32, Status> {
        self.error.map_or(Ok(0), Err)
    }
}

/// The cold part of an endpoint: touched on fence boundaries, not per
/// operation.
#[derive(Debug, Default, Clone)]
pub(crate) struct EndpointCold {
    pub stats: Stats,
    /// The lane groups: one per driver the endpoint has lanes on, in lane
    /// order (one group covering every lane for most endpoints).
    pub groups: Vec<LaneGroup>,
    /// The groups whose driver handshake has not finished yet (bit `i`:
    /// `groups[i]`; the endpoint is `CONNECTING` while this is non-zero).
    pub pending_connects: u8,
    /// The longest NOTIFY payload the endpoint sends: the engine's limit,
    /// on one driver that driver's largest message (a mixed endpoint
    /// checks its groups' in `mixed_lane`), and the smallest of the peer's
    /// [`PeerLimits`](crate::driver::PeerLimits), narrowed as each
    /// connection comes up.
    pub notify_max: u32,
    /// On an endpoint with lanes on several drivers: the atomic domain of
    /// its atomic lane group (the last group whose driver executes
    /// atomics), the only one its ATOMICs may use; `None` if no group's
    /// does.
    pub atomic_domain: Option<crate::driver::AtomicDomain>,
    /// Which connect attempt made this endpoint: its handshakes' tokens
    /// carry it (an attempt refused at once gives its endpoint index to
    /// the next one).
    pub connect_attempt: u32,
    /// The parts of the in-flight fence flush (endpoints with several lane
    /// groups only; valid while `Endpoint::flushing != 0`).
    pub fence_parts: FlushParts,
    /// The parts of in-flight user FLUSHes and CLOSEs, by request id
    /// (endpoints with several lane groups only).
    pub user_flushes: Vec<(u32, FlushParts)>,
    /// Per lane: the generation it had when it became dirty (R38).
    pub dirty_generation: Vec<u32>,
    /// Per lane: the generation it had when the in-flight fence flush
    /// started (R39).
    pub flush_generation: Vec<u32>,
    /// The generation of the weak lane when the weak fence admitted its
    /// epoch on it (valid while `Endpoint::weak_lane != NO_LANE`): a lane
    /// replaced since then voids the admission (R8, R38).
    pub weak_generation: u32,
    /// Which fence flush of this endpoint is in flight (valid while
    /// `Endpoint::flushing != 0`): its token carries it, so a late or
    /// duplicated completion of an earlier one is stray (docs/fence.md R25).
    pub fence_serial: u32,
    /// Lanes that user FLUSHes (and CLOSEs and worker flushes) in flight
    /// took out of D when they started: their work is outstanding until
    /// those flushes complete, which cleans them for good (W2). A fence
    /// counts them as dirty.
    pub covered: LaneMask,
    /// Per lane: how many flushes in flight took it out of D (`covered`
    /// holds the lanes whose count is non-zero).
    pub covering: Vec<u16>,
    /// This endpoint's parts of worker flushes in flight.
    pub quiet_parts: Vec<QuietPart>,
}

impl EndpointCold {
    pub(crate) fn new(
        groups: Vec<LaneGroup>,
        pending_connects: u8,
        connect_attempt: u32,
    ) -> EndpointCold {
        let lanes = groups.iter().map(|g| g.lanes).sum::<u8>();
        EndpointCold {
            stats: Stats::default(),
            user_flushes: Vec::with_capacity(if groups.len() > 1 { 8 } else { 0 }),
            groups,
            pending_connects,
            connect_attempt,
            notify_max: u32::MAX,
            atomic_domain: None,
            fence_parts: FlushParts::default(),
            dirty_generation: vec![0; lanes as usize],
            flush_generation: vec![0; lanes as usize],
            weak_generation: 0,
            fence_serial: 0,
            covered: 0,
            covering: vec![0; lanes as usize],
            // Reserved here, at connect: a worker flush adds a part without
            // allocating (more than one at a time grows it once).
            quiet_parts: Vec::with_capacity(1),
        }
    }

    /// The index of the group on driver `driver` (an endpoint has at most
    /// one group per driver).
    pub(crate) fn group_on(&self, driver: usize) -> Option<usize> {
        self.groups
            .iter()
            .position(|g| usize::from(g.driver) == driver)
    }

    /// The group that holds endpoint lane `lane`, and its index.
    pub(crate) fn group_of(&self, lane: u8) -> Option<(usize, &LaneGroup)> {
        self.groups
            .iter()
            .enumerate()
            .find(|(_, g)| lane >= g.first && lane - g.first < g.lanes)
    }
}

/// One endpoint's part of a worker flush.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QuietPart {
    /// The worker flush's request.
    pub flush: u32,
    pub state: PartState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PartState {
    /// Waits for request `.0`, the endpoint's last queued one when the
    /// worker flush was taken, to leave the queue.
    After(u32),
    /// To start at the next dispatch (the driver had no room).
    Ready,
    /// The driver flush is in flight; it took these lanes out of D.
    Started(LaneMask),
    /// Waits for the endpoint's close.
    UntilClosed,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/fence.md W6: the fence state (epochs, masks, the in-flight target,
    /// the deferred FIFO, the weak admission) fits the hot endpoint line
    /// (UCX's ucp_ep_ext_t grew 216 -> 256 B with its fence).
    #[test]
    fn w6_the_hot_endpoint_state_is_one_cache_line() {
        assert_eq!(core::mem::size_of::<Endpoint>(), 64);
    }

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
