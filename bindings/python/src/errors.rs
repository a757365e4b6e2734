//! Errors: a ringfence [`Status`] and a message, raised in Python as one
//! of the classes of `ringfence/_errors.py` (chosen by the status), with
//! the status on the exception.
//!
//! Code that runs without the GIL returns [`Fail`]; the conversion to a
//! Python exception happens at the boundary, where the GIL is held (it
//! imports the class).

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyModule;
use ringfence_ring::Status;

/// A failed call: the status a C caller would see, and what went wrong.
#[derive(Debug, Clone)]
pub(crate) struct Fail {
    pub(crate) status: Status,
    pub(crate) message: String,
}

/// A `Result` whose error is a [`Fail`].
pub(crate) type Res<T> = Result<T, Fail>;

impl Fail {
    pub(crate) fn new(status: Status, message: impl Into<String>) -> Fail {
        Fail {
            status,
            message: message.into(),
        }
    }

    /// `InvalidArgument` with `message`.
    pub(crate) fn invalid(message: impl Into<String>) -> Fail {
        Fail::new(Status::InvalidArgument, message)
    }

    /// The error of a call on a closed worker.
    pub(crate) fn closed() -> Fail {
        Fail::new(Status::StaleHandle, "the worker is closed")
    }

    /// The error of a call in a forked child on its parent's worker.
    pub(crate) fn forked() -> Fail {
        Fail::new(
            Status::StaleHandle,
            "this worker was created before fork(): a child process may not use its \
             parent's workers (create a new one in the child)",
        )
    }

    /// The error of an operation that failed with `status` (a CQE's).
    pub(crate) fn op(status: Status, what: &str) -> Fail {
        Fail::new(status, format!("{what}: {}", status.message()))
    }
}

impl From<ringfence::Error> for Fail {
    fn from(e: ringfence::Error) -> Fail {
        let status = e.status();
        Fail::new(status, e.to_string())
    }
}

impl From<Fail> for PyErr {
    fn from(f: Fail) -> PyErr {
        // Every `Fail` becomes a `PyErr` at the boundary of a Python call,
        // with the GIL held: attaching is then only a check.
        Python::attach(|py| f.into_pyerr(py))
    }
}

/// The Python class for `status`, by name in `ringfence._errors`.
fn class_name(status: Status) -> &'static str {
    match status {
        Status::InvalidArgument
        | Status::InvalidLength
        | Status::OutOfBounds
        | Status::Misaligned
        | Status::InvalidOpcode
        | Status::InvalidFlags
        | Status::InvalidSubop
        | Status::Truncated => "InvalidArgumentError",
        Status::InvalidEndpoint
        | Status::InvalidMemHandle
        | Status::InvalidRkey
        | Status::StaleHandle => "InvalidHandleError",
        Status::AccessDenied => "AccessDeniedError",
        Status::EndpointFailed
        | Status::EndpointClosed
        | Status::PeerUnreachable
        | Status::Transport
        | Status::Canceled => "EndpointError",
        Status::Timeout => "TimeoutError",
        Status::Busy | Status::NoResource | Status::Again => "BusyError",
        Status::NoMemory => "OutOfMemoryError",
        Status::Unsupported => "UnsupportedError",
        _ => "RingfenceError",
    }
}

/// The name Python code sees in `status_name` (the Rust variant's).
pub(crate) fn status_name(status: Status) -> String {
    format!("{status:?}")
}

static ERRORS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// The module that defines the exception classes.
pub(crate) fn errors_module(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    ERRORS
        .get_or_try_init(py, || {
            Ok::<_, PyErr>(py.import("ringfence._errors")?.unbind())
        })
        .map(|m| m.bind(py))
}

impl Fail {
    /// The Python exception: built with the message alone (several bases
    /// are `OSError`s, which read more arguments as an errno), then given
    /// `status` (the negative value) and `status_name`.
    pub(crate) fn into_pyerr(self, py: Python<'_>) -> PyErr {
        let build = || -> PyResult<PyErr> {
            let class = errors_module(py)?.getattr(class_name(self.status))?;
            let exc = class.call1((self.message.clone(),))?;
            exc.setattr("status", self.status.as_raw())?;
            exc.setattr("status_name", status_name(self.status))?;
            Ok(PyErr::from_value(exc))
        };
        build().unwrap_or_else(|e| e)
    }
}

/// Raises `Fail` as a Python exception.
pub(crate) trait OrRaise<T> {
    /// The value, or the Python exception for the failure.
    fn or_raise(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> OrRaise<T> for Res<T> {
    fn or_raise(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|f| f.into_pyerr(py))
    }
}
