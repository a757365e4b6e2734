//! `Worker`: the drivers, the memory, the endpoints, and the completions
//! and notifications of one ringfence worker.

use crate::core::{Core, arm};
use crate::errors::{Fail, OrRaise, Res};
use crate::memory::Memory;
use crate::transfer::{Endpoint, Notification, Transfer, timeout_of, wait_blocking};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};
use ringfence::Worker as RfWorker;
use ringfence_ring::{Sqe, Status};
use std::sync::Arc;

/// The driver names `drivers` takes, in this build.
const DRIVERS: &[&str] = &[
    #[cfg(feature = "shm")]
    "shm",
    #[cfg(feature = "tcp")]
    "tcp",
    "loopback",
];

/// The drivers this build has, for `ringfence.DRIVERS`.
pub(crate) fn drivers_in_build() -> Vec<&'static str> {
    DRIVERS.to_vec()
}

/// Driver names from a string ("shm" or "shm,tcp") or a sequence of them.
fn driver_names(drivers: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<String>> {
    let Some(d) = drivers else {
        return Ok(vec![DRIVERS[0].to_string()]);
    };
    if let Ok(s) = d.cast::<PyString>() {
        return Ok(s
            .to_str()?
            .split(',')
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .collect());
    }
    let mut names = Vec::new();
    for item in d.try_iter()? {
        names.push(item?.extract::<String>()?);
    }
    Ok(names)
}

/// The options of `Worker(...)`.
#[derive(Debug, Default)]
struct Options {
    sq_entries: Option<u32>,
    cq_entries: Option<u32>,
    requests: Option<u32>,
    lanes: Option<u8>,
    notify_buffers: Option<u32>,
    notify_size: Option<u32>,
    ignore_env: bool,
}

fn build(names: &[String], o: &Options) -> Res<RfWorker> {
    if names.is_empty() {
        return Err(Fail::invalid(format!(
            "a worker needs at least one driver (this build has {DRIVERS:?})"
        )));
    }
    let mut builder = RfWorker::builder();
    let mut seen: Vec<&str> = Vec::new();
    for name in names {
        if seen.contains(&name.as_str()) {
            continue;
        }
        seen.push(name);
        match name.as_str() {
            "loopback" => {
                builder.driver(ringfence::Loopback::new());
            }
            #[cfg(feature = "shm")]
            "shm" => {
                let shm = ringfence_shm::Shm::new().map_err(|e| {
                    let status = match e {
                        ringfence_shm::ShmError::InvalidConfig(_) => Status::InvalidArgument,
                        _ => Status::Io,
                    };
                    Fail::new(status, format!("the shm driver: {e}"))
                })?;
                builder.driver(shm);
            }
            #[cfg(feature = "tcp")]
            "tcp" => {
                let tcp = if o.ignore_env {
                    ringfence_tcp::Tcp::builder().ignore_env().build()
                } else {
                    ringfence_tcp::Tcp::new()
                }
                .map_err(|e| Fail::new(e.status, format!("the tcp driver: {e}")))?;
                builder.driver(tcp);
            }
            other => {
                return Err(Fail::invalid(format!(
                    "unknown driver {other:?}: this build has {DRIVERS:?}"
                )));
            }
        }
    }
    let defaults = ringfence::Config::default();
    match (o.sq_entries, o.cq_entries) {
        (None, None) => {}
        (sq, cq) => {
            let sq = sq.unwrap_or(defaults.sq_entries);
            builder.ring_entries(sq, cq.unwrap_or(sq.saturating_mul(2).min(1 << 16)));
        }
    }
    if let Some(r) = o.requests {
        builder.requests(r);
    }
    if let Some(l) = o.lanes {
        builder.lanes(l);
    }
    if o.notify_buffers.is_some() || o.notify_size.is_some() {
        builder.notify_buffers(
            o.notify_buffers.unwrap_or(defaults.notify_buffers),
            o.notify_size.unwrap_or(defaults.notify_size),
        );
    }
    if o.ignore_env {
        builder.ignore_env();
    }
    Ok(builder.build()?)
}

/// A ringfence worker: drivers, registered memory, endpoints to peers,
/// and the queue its transfers complete on.
///
/// `drivers` names the drivers, in order of preference ("shm", "tcp",
/// "loopback"; a comma-separated string or a sequence). With
/// `core_thread=True` a thread of the worker's own runs the engine (and
/// sleeps when idle); without one, progress runs in the calls that wait or
/// poll. The other options size the rings and pools (see the ringfence
/// docs); `RINGFENCE_*` environment variables override them unless
/// `ignore_env`. Use it as a context manager, or call `close()`.
#[pyclass(frozen, module = "ringfence")]
#[derive(Debug)]
pub struct Worker {
    pub(crate) core: Arc<Core>,
    drivers: Vec<String>,
}

#[pymethods]
impl Worker {
    #[new]
    #[pyo3(signature = (
        drivers=None, *, core_thread=false, core_cpu=None, sq_entries=None, cq_entries=None,
        requests=None, lanes=None, notify_buffers=None, notify_size=None, ignore_env=false
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        drivers: Option<&Bound<'_, PyAny>>,
        core_thread: bool,
        core_cpu: Option<usize>,
        sq_entries: Option<u32>,
        cq_entries: Option<u32>,
        requests: Option<u32>,
        lanes: Option<u8>,
        notify_buffers: Option<u32>,
        notify_size: Option<u32>,
        ignore_env: bool,
    ) -> PyResult<Worker> {
        crate::core::watch_fork();
        let names = driver_names(drivers)?;
        let options = Options {
            sq_entries,
            cq_entries,
            requests,
            lanes,
            notify_buffers,
            notify_size,
            ignore_env,
        };
        let core = py
            .detach(|| -> Res<Core> {
                let mut w = build(&names, &options)?;
                if core_thread {
                    w.start_core_thread(core_cpu)?;
                }
                Core::new(w, core_thread)
            })
            .or_raise(py)?;
        Ok(Worker {
            core: Arc::new(core),
            drivers: names,
        })
    }

    /// This worker's address, for peers' `connect` (send it by the
    /// application's own means).
    #[getter]
    fn address<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.core.address)
    }

    /// The driver names it was built with.
    #[getter]
    fn drivers(&self) -> Vec<String> {
        self.drivers.clone()
    }

    /// Whether a core thread runs the engine.
    #[getter]
    fn core_thread(&self) -> bool {
        self.core.core_thread()
    }

    /// Whether it is closed.
    #[getter]
    fn closed(&self) -> bool {
        self.core.is_closed()
    }

    /// Operations posted whose completion has not come yet.
    #[getter]
    fn outstanding(&self) -> usize {
        self.core.queue().book.outstanding()
    }

    /// `length` zeroed bytes of registered memory the worker allocates (on
    /// shm a memfd a peer maps: the memory for windows peers PUT into,
    /// GET from, and run atomics on). A buffer: view it with
    /// `memoryview(mem)` or `numpy.frombuffer(mem, dtype)`.
    fn alloc(&self, py: Python<'_>, length: usize) -> PyResult<Memory> {
        py.detach(|| Memory::alloc(&self.core, length)).or_raise(py)
    }

    /// Registers `obj`'s memory where it lies, without copying: any
    /// contiguous buffer-protocol object (bytearray, numpy array,
    /// memoryview, mmap, ...). The object stays exported (a bytearray
    /// cannot be resized) until the registration is let go. A read-only
    /// buffer (bytes, a read-only array) registers read-only: a PUT source
    /// only. `writable=True` refuses a read-only object; `False` registers
    /// a writable one read-only.
    #[pyo3(signature = (obj, *, writable=None))]
    fn register(&self, obj: &Bound<'_, PyAny>, writable: Option<bool>) -> PyResult<Memory> {
        Memory::register(&self.core, obj, writable)
    }

    /// Registers device memory by pointer and length. No driver of this
    /// build registers device memory (ringfence's CUDA driver is not
    /// built), so this raises `UnsupportedError`, having touched nothing.
    #[pyo3(signature = (ptr, length, device=0))]
    fn register_device(
        &self,
        py: Python<'_>,
        ptr: u64,
        length: u64,
        device: u16,
    ) -> PyResult<Memory> {
        drop(self.core.worker().or_raise(py)?);
        if ptr == 0 {
            return Err(Fail::invalid("register_device: the pointer is 0").into_pyerr(py));
        }
        if length == 0 {
            return Err(
                Fail::new(Status::InvalidLength, "register_device: the length is zero")
                    .into_pyerr(py),
            );
        }
        Err(Fail::new(
            Status::Unsupported,
            format!(
                "register_device: no driver of this build registers CUDA memory (device \
                 {device}): ringfence's CUDA driver is not built, and this worker's drivers \
                 ({:?}) register host memory only",
                self.drivers
            ),
        )
        .into_pyerr(py))
    }

    /// Connects to the peer whose address (its `Worker.address`) is
    /// `address`; returns at once (a driver that needs a handshake
    /// finishes it through progress; operations posted meanwhile wait).
    fn connect(&self, py: Python<'_>, address: &[u8]) -> PyResult<Endpoint> {
        let id = {
            let w = self.core.worker().or_raise(py)?;
            w.as_ref()
                .expect("checked by worker()")
                .connect(address)
                .map_err(Fail::from)
                .or_raise(py)?
        };
        Ok(Endpoint::new(self.core.clone(), id))
    }

    /// Runs one progress round (without a core thread) and collects the
    /// completions and notifications that came; returns the work done
    /// (0: nothing happened).
    fn poll(&self, py: Python<'_>) -> PyResult<usize> {
        let work = self.core.poll().or_raise(py)?;
        drop(self.core.retry_parked());
        Ok(work)
    }

    /// The notifications that came (after one `poll`), oldest first.
    fn notifications<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        self.core.poll().or_raise(py)?;
        let cqes: Vec<_> = self.core.queue().book.notifications.drain(..).collect();
        let items: Vec<Notification> = cqes
            .into_iter()
            .map(|c| Notification::new(self.core.clone(), c))
            .collect();
        PyList::new(py, items)
    }

    /// The next notification, waiting at most `timeout` seconds (`None`:
    /// no limit) without the GIL; `TimeoutError` if none came.
    #[pyo3(signature = (timeout=None))]
    fn wait_notification(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Notification> {
        let cqe = wait_blocking(py, &self.core, timeout, |book| {
            book.notifications.pop_front()
        })?;
        Ok(Notification::new(self.core.clone(), cqe))
    }

    /// A coroutine that waits for the next notification in asyncio (see
    /// `wait_notification`).
    #[pyo3(signature = (timeout=None))]
    fn wait_notification_async<'py>(
        slf: &Bound<'py, Self>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        timeout_of(timeout).or_raise(py)?;
        py.import("ringfence._aio")?
            .getattr("wait_notification")?
            .call1((slf, timeout))
    }

    /// Flushes every endpoint (a quiet): the returned transfer completes
    /// when everything posted before it, on any endpoint, is remotely
    /// complete.
    fn flush(&self, py: Python<'_>) -> PyResult<Transfer> {
        let core = &self.core;
        let id = py
            .detach(|| core.post(&[Sqe::flush_worker()], &[], None))
            .or_raise(py)?;
        Ok(Transfer::new(core.clone(), id, 1))
    }

    /// Closes the worker: its endpoints are closed at once (what is queued
    /// is canceled), what is in flight gets up to 10 s to finish, every
    /// registration is let go, and every operation still pending completes
    /// with `Canceled`. A second call does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.core.check_fork().or_raise(py)?;
        let core = &self.core;
        let (freed, stuck) = py.detach(|| core.close());
        drop(freed);
        if stuck > 0 {
            let warnings = py.import("warnings")?;
            warnings.call_method1(
                "warn",
                (
                    format!(
                        "ringfence: {stuck} registered buffer(s) are still held by a driver \
                         after close(); they stay exported (never resized or freed)"
                    ),
                    py.get_type::<pyo3::exceptions::PyResourceWarning>(),
                ),
            )?;
        }
        Ok(())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, PyTuple>) -> PyResult<()> {
        self.close(py)
    }

    fn __repr__(&self) -> String {
        format!(
            "<ringfence.Worker drivers={:?}{}{}>",
            self.drivers,
            if self.core.core_thread() {
                ", core thread"
            } else {
                ""
            },
            if self.core.is_closed() {
                ", closed"
            } else {
                ""
            }
        )
    }

    /// The waiting port of `ringfence._aio`.
    fn _port(&self) -> Port {
        Port {
            core: self.core.clone(),
        }
    }
}

/// What `ringfence._aio` waits through: one worker's eventfds, lead and
/// collected completions.
#[pyclass(frozen, module = "ringfence", name = "_Port")]
#[derive(Debug)]
pub struct Port {
    pub(crate) core: Arc<Core>,
}

#[pymethods]
impl Port {
    /// Names the worker: equal for every port of one worker.
    #[getter]
    fn key(&self) -> usize {
        Arc::as_ptr(&self.core) as usize
    }

    /// The CQ's eventfd and the relay eventfd.
    fn fds(&self) -> (i32, i32) {
        self.core.async_fds()
    }

    /// A waiter of event loop `loop_id` begins.
    fn begin(&self, py: Python<'_>, loop_id: u64) -> PyResult<()> {
        self.core.async_begin(loop_id).or_raise(py)
    }

    /// A waiter is done.
    fn end(&self) {
        self.core.async_end();
    }

    /// 0: look again; 1: watch the CQ fd and the relay; 2: watch the
    /// relay; 3: no core thread, yield and look again.
    fn arm(&self, py: Python<'_>) -> PyResult<u8> {
        let state = self.core.async_arm().or_raise(py)?;
        drop(self.core.retry_parked());
        debug_assert!(state <= arm::POLL);
        Ok(state)
    }

    /// The CQ's eventfd woke the loop (also when the worker closed: the
    /// waiters then find it closed themselves).
    fn wake(&self, py: Python<'_>) -> PyResult<()> {
        match self.core.async_wake() {
            Ok(()) => {}
            Err(_) if self.core.is_closed() => return Ok(()),
            Err(f) => return Err(f.into_pyerr(py)),
        }
        drop(self.core.retry_parked());
        Ok(())
    }

    /// The relay woke the loop.
    fn relay_clear(&self) {
        self.core.async_relay_clear();
    }

    /// The next notification already collected, if any (no progress).
    fn take_notification(&self) -> Option<Notification> {
        let cqe = self.core.queue().book.notifications.pop_front()?;
        Some(Notification::new(self.core.clone(), cqe))
    }
}
