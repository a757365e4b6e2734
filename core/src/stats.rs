//! Counters, readable through the API. Plain integers updated by the
//! progress loop under the engine lock; read as a copy.

/// Counters of a worker or of one endpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Operations completed (any status), fences and flushes included.
    pub ops: u64,
    /// Bytes moved by successful PUT, GET, ATOMIC and NOTIFY.
    pub bytes: u64,
    /// FENCE operations submitted.
    pub fences: u64,
    /// Fence boundaries crossed with a transport fence flag on one ordered
    /// lane instead of a flush (docs/fence.md R8).
    pub weak_fences: u64,
    /// Driver flushes started, whatever started them: the sum of the four
    /// below.
    pub flushes: u64,
    /// Driver flushes started by strong fences (docs/fence.md R9): one flush of
    /// the dirty lanes per boundary.
    pub fence_flushes: u64,
    /// Driver flushes started by the implicit fence before a NOTIFY: a
    /// strong one, or, on a driver that delivers a NOTIFY after the writes
    /// before it on its lane (`Capabilities::notify_ordered`), a weak one
    /// behind writes on other lanes (behind its own lane alone it is a
    /// fence flag, counted in `weak_fences`).
    pub notify_flushes: u64,
    /// Driver flushes started by FLUSH SQEs and graceful CLOSEs (R21, R41).
    pub user_flushes: u64,
    /// Driver flushes started by worker flushes (R26): one per endpoint
    /// with something to flush.
    pub worker_flushes: u64,
    /// Requests that waited in an endpoint queue instead of starting at once.
    pub deferrals: u64,
    /// Operations completed with an error.
    pub errors: u64,
    /// Completions that went to the overflow list because the CQ was full.
    pub cq_overflows: u64,
    /// Notifications received (worker only).
    pub notifications: u64,
}
