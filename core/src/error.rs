//! The crate's error type for control-path calls (build, connect, register).
//! Data-path failures are [`Status`] values in CQEs.

use ringfence_ring::{RegionError, Status};

/// A failed control-path call.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An environment variable is malformed.
    #[error("environment variable {var}={value:?} is invalid: expected {expected}")]
    Config {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What it should be.
        expected: &'static str,
    },
    /// A builder value is invalid.
    #[error("invalid configuration: {0}")]
    InvalidConfig(&'static str),
    /// `RINGFENCE_DRIVERS` names a driver the program did not provide, no
    /// driver is left, or the drivers cannot make one worker (two share a
    /// name, a name is empty or too long for the worker address).
    #[error("driver selection: {0}")]
    Drivers(String),
    /// A driver refused.
    #[error("{driver}: {op} failed: {source}")]
    Driver {
        /// The driver's name.
        driver: &'static str,
        /// What was being done.
        op: &'static str,
        /// The driver's error.
        #[source]
        source: crate::driver::DriverError,
    },
    /// A blob from a peer (a worker address, a packed remote key) is
    /// malformed or damaged (it fails its integrity check): refused as it
    /// is decoded, before anything is sent to the peer. Its status is
    /// [`Status::InvalidArgument`].
    #[error("{op} failed: {what}")]
    Malformed {
        /// What was being done.
        op: &'static str,
        /// What is wrong with the blob.
        what: &'static str,
    },
    /// A call failed with a status.
    #[error("{op} failed: {status}")]
    Status {
        /// What was being done.
        op: &'static str,
        /// Why.
        status: Status,
    },
    /// An allocation beyond the memory this process can have (see
    /// [`limits`](crate::limits)); the C status is `RF_ENOMEM`.
    #[error("{op} failed: {source}")]
    MemoryLimit {
        /// What was being allocated.
        op: &'static str,
        /// The request and the limit.
        #[source]
        source: crate::limits::LimitExceeded,
    },
    /// No driver of the worker supports what was asked (a memory kind).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A ring could not be set up.
    #[error("ring setup failed")]
    Ring(#[from] RegionError),
    /// An OS call failed (thread spawn, eventfd, affinity).
    #[error("{op} failed")]
    Os {
        /// What was being done.
        op: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// The status a C caller would see.
    pub fn status(&self) -> Status {
        match self {
            Error::Config { .. }
            | Error::InvalidConfig(_)
            | Error::Drivers(_)
            | Error::Malformed { .. } => Status::InvalidArgument,
            Error::Driver { source, .. } => source.status,
            Error::Status { status, .. } => *status,
            Error::MemoryLimit { .. } => Status::NoMemory,
            Error::Unsupported(_) => Status::Unsupported,
            Error::Ring(_) => Status::NoMemory,
            Error::Os { .. } => Status::Io,
        }
    }

    pub(crate) fn status_of(op: &'static str) -> impl FnOnce(Status) -> Error {
        move |status| Error::Status { op, status }
    }
}
