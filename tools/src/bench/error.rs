//! What can go wrong in `rfbench`.

/// An `rfbench` failure. `Usage` maps to exit status 2, everything else
/// to 1.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// A bad option or combination of options.
    #[error("{0}")]
    Usage(String),
    /// The engine refused a control call (worker, connect, register, keys).
    #[error("{op}: {source}")]
    Engine {
        /// What was being done.
        op: &'static str,
        /// The engine's error.
        #[source]
        source: ringfence::Error,
    },
    /// The shm driver could not be created.
    #[error("creating the shm driver: {0}")]
    Shm(#[from] ringfence_shm::ShmError),
    /// The tcp driver could not be created.
    #[error("creating the tcp driver")]
    Tcp(#[source] ringfence::DriverError),
    /// The other side of the `--listen` / `--connect` bootstrap socket
    /// sent something that is not the protocol, or broke it off.
    #[error("bootstrap: {0}")]
    Bootstrap(String),
    /// An operation completed with an error status.
    #[error("{op} completed with {status}")]
    Completion {
        /// The operation.
        op: &'static str,
        /// `strerror` of its result.
        status: String,
    },
    /// The consistency check found other bytes than were sent.
    #[error("consistency check failed: {0}")]
    Inconsistent(String),
    /// The target process or the connection to it failed.
    #[error("target: {0}")]
    Target(String),
    /// Nothing happened for too long.
    #[error("timed out: {0}")]
    Hang(String),
    /// Writing output or a file failed.
    #[error("{op}: {source}")]
    Io {
        /// What was being done.
        op: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The plot could not be drawn.
    #[error("plot: {0}")]
    Plot(String),
}

impl BenchError {
    /// The process exit status for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            BenchError::Usage(_) => 2,
            _ => 1,
        }
    }

    /// A closure mapping an engine error for `op`.
    pub(crate) fn engine(op: &'static str) -> impl FnOnce(ringfence::Error) -> BenchError {
        move |source| BenchError::Engine { op, source }
    }

    /// A closure mapping an I/O error for `op`.
    pub(crate) fn io(op: impl Into<String>) -> impl FnOnce(std::io::Error) -> BenchError {
        let op = op.into();
        move |source| BenchError::Io { op, source }
    }
}
