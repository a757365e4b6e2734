//! Completion status codes: the `res` of a [`Cqe`](crate::Cqe) when it is
//! negative, and the return value of every C function.
//!
//! The values are ABI: negative, and never reused. A status that has an
//! errno counterpart is that errno, negated (`Status::InvalidArgument` is
//! `-EINVAL`, `Status::Again` is `-EAGAIN`), so `strerror(-res)` works as
//! liburing's users expect; the library's own codes lie outside the errno
//! range, at [`LIBRARY_BASE`] and below. A `res` that is zero or positive is
//! a success (for data operations, the number of bytes moved).

use core::fmt;

/// The library's own status codes are this value and below: outside the
/// range of errno values (Linux's are 1 to 4095, `MAX_ERRNO`).
pub const LIBRARY_BASE: i32 = -4096;

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
    Canceled = -125,
    /// The SQE's opcode is not one this version knows.
    InvalidOpcode = -4097,
    /// The SQE sets a flag this version does not know. (A non-zero reserved
    /// field, or any other field the opcode does not use, is
    /// [`Status::InvalidArgument`].)
    InvalidFlags = -4098,
    /// The SQE names an endpoint that does not exist.
    InvalidEndpoint = -4099,
    /// The SQE names a local memory handle that is not registered.
    InvalidMemHandle = -4100,
    /// The SQE names a remote key id that was never unpacked.
    InvalidRkey = -4101,
    /// The local or remote range lies outside its registered region.
    OutOfBounds = -14,
    /// An atomic's address is not aligned to its 8-byte word.
    Misaligned = -4102,
    /// The length is zero where data is required, or larger than allowed.
    InvalidLength = -4103,
    /// The target refused the access: wrong key secret or missing permission.
    AccessDenied = -13,
    /// The endpoint failed earlier; this operation was not executed.
    EndpointFailed = -4104,
    /// The endpoint was closed; this operation was not executed.
    EndpointClosed = -107,
    /// A resource ran out (request pool, transport queue); try again later.
    NoResource = -105,
    /// The transport reported an error.
    Transport = -70,
    /// The operation did not complete in time.
    Timeout = -62,
    /// The driver or the build does not support this operation.
    Unsupported = -95,
    /// A ring's shared indices or header are inconsistent (corrupt memory).
    RingCorrupt = -4105,
    /// The peer process or host is gone.
    PeerUnreachable = -113,
    /// An argument is invalid (a NULL pointer, an out-of-range value, a
    /// malformed or damaged blob), or an SQE field its opcode does not use
    /// (a reserved one among them) is not zero.
    InvalidArgument = -22,
    /// A handle refers to an object that was destroyed.
    StaleHandle = -116,
    /// Memory could not be allocated or mapped.
    NoMemory = -12,
    /// The object is in use (e.g. memory with operations in flight).
    Busy = -16,
    /// A notification payload did not fit the buffer the target provided.
    Truncated = -90,
    /// The atomic sub-operation or fence mode is not one this version knows.
    InvalidSubop = -4106,
    /// An I/O error from the operating system.
    Io = -5,
    /// Nothing there yet (an empty CQ): try again later. Not an error of
    /// any operation; `NoResource` is running out of something.
    Again = -11,
}

impl Status {
    /// Every status, in declaration order; handy for tables and tests.
    pub const ALL: [Status; 26] = [
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
        Status::Again,
    ];

    /// The negative value, as stored in `Cqe::res`: the negative errno
    /// the status corresponds to where one exists (`strerror(-res)` then
    /// names it), else a library code at or below [`LIBRARY_BASE`].
    #[inline]
    pub const fn as_raw(self) -> i32 {
        self as i32
    }

    /// A short, stable, human-readable description.
    pub const fn message(self) -> &'static str {
        match self {
            Status::Canceled => "operation canceled",
            Status::InvalidOpcode => "unknown opcode",
            Status::InvalidFlags => "unknown flag",
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
            Status::Again => "nothing ready yet, try again",
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
        Status::ALL
            .iter()
            .copied()
            .find(|s| s.as_raw() == raw)
            .ok_or(UnknownStatus(raw))
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
    fn values_are_errnos_or_library_codes_and_round_trip() {
        let mut seen = std::collections::HashSet::new();
        for status in Status::ALL {
            let raw = status.as_raw();
            assert!(seen.insert(raw), "{status:?} reuses {raw}");
            assert!(
                raw < 0 && (raw > -4096 || raw <= LIBRARY_BASE),
                "{status:?}"
            );
            assert_eq!(Status::try_from(raw), Ok(status));
        }
        // Pin the errno ones by value: these are ABI.
        let errnos = [
            (Status::Canceled, 125),
            (Status::OutOfBounds, 14),
            (Status::AccessDenied, 13),
            (Status::EndpointClosed, 107),
            (Status::NoResource, 105),
            (Status::Transport, 70),
            (Status::Timeout, 62),
            (Status::Unsupported, 95),
            (Status::PeerUnreachable, 113),
            (Status::InvalidArgument, 22),
            (Status::StaleHandle, 116),
            (Status::NoMemory, 12),
            (Status::Busy, 16),
            (Status::Truncated, 90),
            (Status::Io, 5),
            (Status::Again, 11),
        ];
        for (status, errno) in errnos {
            assert_eq!(status.as_raw(), -errno, "{status:?}");
        }
        assert_eq!(Status::InvalidOpcode.as_raw(), LIBRARY_BASE - 1);
        assert_eq!(Status::InvalidSubop.as_raw(), LIBRARY_BASE - 10);
    }

    #[test]
    fn unknown_values_are_refused() {
        for raw in [0, 1, -26, -1000, -4096, -4200, i32::MIN, i32::MAX] {
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
