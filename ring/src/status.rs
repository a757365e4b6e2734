//! Completion status codes: the `res` of a [`Cqe`](crate::Cqe) when it is
//! negative, and the return value of every C function.
//!
//! The values are ABI: stable, negative, and never reused. New codes are only
//! ever appended. A `res` that is zero or positive is a success (for data
//! operations, the number of bytes moved).

use core::fmt;

/// Why an operation or a call failed.
///
/// `Status` is the decoded form of a negative `res`; decode with
/// [`Status::try_from`], which refuses values this version does not know
/// (they may come from a newer peer or from corrupt memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[repr(i32)]
pub enum Status {
    /// The operation was canceled before it ran (worker or endpoint shut down).
    Canceled = -1,
    /// The SQE's opcode is not one this version knows.
    InvalidOpcode = -2,
    /// The SQE sets a flag this version does not know, or a reserved field is
    /// not zero.
    InvalidFlags = -3,
    /// The SQE names an endpoint that does not exist.
    InvalidEndpoint = -4,
    /// The SQE names a local memory handle that is not registered.
    InvalidMemHandle = -5,
    /// The SQE names a remote key id that was never unpacked.
    InvalidRkey = -6,
    /// The local or remote range lies outside its registered region.
    OutOfBounds = -7,
    /// An atomic's address is not aligned to its 8-byte word.
    Misaligned = -8,
    /// The length is zero where data is required, or larger than allowed.
    InvalidLength = -9,
    /// The target refused the access: wrong key secret or missing permission.
    AccessDenied = -10,
    /// The endpoint failed earlier; this operation was not executed.
    EndpointFailed = -11,
    /// The endpoint was closed; this operation was not executed.
    EndpointClosed = -12,
    /// A resource ran out (request pool, transport queue); try again later.
    NoResource = -13,
    /// The transport reported an error.
    Transport = -14,
    /// The operation did not complete in time.
    Timeout = -15,
    /// The driver or the build does not support this operation.
    Unsupported = -16,
    /// A ring's shared indices or header are inconsistent (corrupt memory).
    RingCorrupt = -17,
    /// The peer process or host is gone.
    PeerUnreachable = -18,
    /// An argument is invalid (a NULL pointer, an out-of-range value).
    InvalidArgument = -19,
    /// A handle refers to an object that was destroyed.
    StaleHandle = -20,
    /// Memory could not be allocated or mapped.
    NoMemory = -21,
    /// The object is in use (e.g. memory with operations in flight).
    Busy = -22,
    /// A notification payload did not fit the buffer the target provided.
    Truncated = -23,
    /// The atomic sub-operation or fence mode is not one this version knows.
    InvalidSubop = -24,
    /// An I/O error from the operating system.
    Io = -25,
}

impl Status {
    /// Every status, in value order; handy for tables and tests.
    pub const ALL: [Status; 25] = [
        Status::Canceled,
        Status::InvalidOpcode,
        Status::InvalidFlags,
        Status::InvalidEndpoint,
        Status::InvalidMemHandle,
        Status::InvalidRkey,
        Status::OutOfBounds,
        Status::Misaligned,
        Status::InvalidLength,
        Status::AccessDenied,
        Status::EndpointFailed,
        Status::EndpointClosed,
        Status::NoResource,
        Status::Transport,
        Status::Timeout,
        Status::Unsupported,
        Status::RingCorrupt,
        Status::PeerUnreachable,
        Status::InvalidArgument,
        Status::StaleHandle,
        Status::NoMemory,
        Status::Busy,
        Status::Truncated,
        Status::InvalidSubop,
        Status::Io,
    ];

    /// The stable negative value, as stored in `Cqe::res`.
    #[inline]
    pub const fn as_raw(self) -> i32 {
        self as i32
    }

    /// A short, stable, human-readable description.
    pub const fn message(self) -> &'static str {
        match self {
            Status::Canceled => "operation canceled",
            Status::InvalidOpcode => "unknown opcode",
            Status::InvalidFlags => "unknown flag or non-zero reserved field",
            Status::InvalidEndpoint => "no such endpoint",
            Status::InvalidMemHandle => "no such local memory handle",
            Status::InvalidRkey => "no such remote key",
            Status::OutOfBounds => "range outside the registered region",
            Status::Misaligned => "atomic address not 8-byte aligned",
            Status::InvalidLength => "zero or oversize length",
            Status::AccessDenied => "access denied by the target",
            Status::EndpointFailed => "endpoint failed",
            Status::EndpointClosed => "endpoint closed",
            Status::NoResource => "out of resources, try again",
            Status::Transport => "transport error",
            Status::Timeout => "timed out",
            Status::Unsupported => "operation not supported",
            Status::RingCorrupt => "ring memory is corrupt",
            Status::PeerUnreachable => "peer unreachable",
            Status::InvalidArgument => "invalid argument",
            Status::StaleHandle => "stale handle",
            Status::NoMemory => "out of memory",
            Status::Busy => "resource busy",
            Status::Truncated => "payload truncated",
            Status::InvalidSubop => "unknown atomic operation or fence mode",
            Status::Io => "I/O error",
        }
    }
}

/// A value that is not a status this version knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnknownStatus(pub i32);

impl fmt::Display for UnknownStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown status {}", self.0)
    }
}

impl std::error::Error for UnknownStatus {}

impl TryFrom<i32> for Status {
    type Error = UnknownStatus;

    fn try_from(raw: i32) -> Result<Self, Self::Error> {
        // Values are dense from -1 downwards, so the table index is `-raw - 1`.
        let index = raw
            .checked_neg()
            .and_then(|n| usize::try_from(n).ok())
            .and_then(|n| n.checked_sub(1));
        match index.and_then(|i| Status::ALL.get(i)) {
            Some(&status) => Ok(status),
            None => Err(UnknownStatus(raw)),
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for Status {}

/// Describes any `res` value: "success" for zero or positive, the status's
/// message for a known negative one, and "unknown status" otherwise.
///
/// # Examples
/// ```
/// use ringfence_ring::{Status, strerror};
/// assert_eq!(strerror(Status::OutOfBounds.as_raw()), "range outside the registered region");
/// assert_eq!(strerror(4096), "success");
/// assert_eq!(strerror(-9999), "unknown status");
/// ```
pub fn strerror(res: i32) -> &'static str {
    if res >= 0 {
        return "success";
    }
    match Status::try_from(res) {
        Ok(status) => status.message(),
        Err(_) => "unknown status",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_dense_stable_and_round_trip() {
        for (i, status) in Status::ALL.iter().enumerate() {
            assert_eq!(status.as_raw(), -(i as i32) - 1, "{status:?} moved");
            assert_eq!(Status::try_from(status.as_raw()), Ok(*status));
        }
        // Pin a few by value: these are ABI.
        assert_eq!(Status::Canceled.as_raw(), -1);
        assert_eq!(Status::RingCorrupt.as_raw(), -17);
        assert_eq!(Status::Io.as_raw(), -25);
    }

    #[test]
    fn unknown_values_are_refused() {
        for raw in [0, 1, -26, -1000, i32::MIN, i32::MAX] {
            assert_eq!(Status::try_from(raw), Err(UnknownStatus(raw)));
        }
    }

    #[test]
    fn messages_are_distinct_and_strerror_covers_everything() {
        let mut seen = std::collections::HashSet::new();
        for status in Status::ALL {
            assert!(
                seen.insert(status.message()),
                "duplicate message for {status:?}"
            );
            assert_eq!(strerror(status.as_raw()), status.message());
            assert_eq!(status.to_string(), status.message());
        }
        assert_eq!(strerror(0), "success");
        assert_eq!(strerror(i32::MIN), "unknown status");
        assert_eq!(UnknownStatus(-77).to_string(), "unknown status -77");
    }
}
