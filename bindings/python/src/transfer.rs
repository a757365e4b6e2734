//! Endpoints, prepared batches, transfers (a posted batch's completions)
//! and notifications.

use crate::book::{PENDING, TransferId};
use crate::core::Core;
use crate::errors::{Fail, OrRaise, Res, status_name};
use crate::memory::{RemoteInner, RemoteMemory};
use crate::ops::{Op, Prepared};
use pyo3::buffer::PyUntypedBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use ringfence::{Cqe, EndpointId, EndpointState};
use ringfence_ring::{CloseMode, Sqe, Status};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// How long a blocking wait sleeps without the GIL before it looks for
/// signals (Ctrl-C): a bound on how late `KeyboardInterrupt` is raised,
/// not a synchronization.
const SIGNAL_SLICE: Duration = Duration::from_millis(100);

/// A timeout in seconds, checked: `None` waits without limit.
pub(crate) fn timeout_of(timeout: Option<f64>) -> Res<Option<Duration>> {
    match timeout {
        None => Ok(None),
        Some(t) if t.is_finite() && t >= 0.0 => Ok(Some(Duration::from_secs_f64(t))),
        Some(t) => Err(Fail::invalid(format!(
            "timeout is a number of seconds, 0 or more, or None; not {t}"
        ))),
    }
}

/// Waits without the GIL until `cond` holds, in slices between which it
/// looks for signals; `TimeoutError` once `timeout` passed.
pub(crate) fn wait_blocking<R: Send>(
    py: Python<'_>,
    core: &Core,
    timeout: Option<f64>,
    mut cond: impl FnMut(&mut crate::book::Book) -> Option<R> + Send,
) -> PyResult<R> {
    let timeout = timeout_of(timeout).or_raise(py)?;
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        let slice = match deadline {
            None => SIGNAL_SLICE,
            Some(d) => d
                .saturating_duration_since(Instant::now())
                .min(SIGNAL_SLICE),
        };
        let result = py.detach(|| core.wait_until(Some(slice), &mut cond));
        drop(core.retry_parked());
        match result {
            Ok(r) => return Ok(r),
            Err(f) if f.status == Status::Timeout => {
                py.check_signals()?;
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    let t = timeout.unwrap_or_default().as_secs_f64();
                    return Err(
                        Fail::new(Status::Timeout, format!("timed out after {t} s")).into_pyerr(py)
                    );
                }
            }
            Err(f) => return Err(f.into_pyerr(py)),
        }
    }
}

/// What an `Endpoint` and its keys share.
#[derive(Debug)]
pub(crate) struct EpInner {
    pub(crate) core: Arc<Core>,
    pub(crate) id: EndpointId,
    closed: AtomicBool,
}

impl EpInner {
    fn check_open(&self) -> Res<()> {
        // Acquire: pairs with the store in `close`.
        if self.closed.load(Ordering::Acquire) {
            return Err(Fail::new(
                Status::EndpointClosed,
                "the endpoint is closed: connect again",
            ));
        }
        Ok(())
    }
}

/// A connection to one peer worker (`Worker.connect`): post batches on it,
/// unpack the peer's keys for it.
#[pyclass(frozen, module = "ringfence")]
#[derive(Debug)]
pub struct Endpoint {
    pub(crate) inner: Arc<EpInner>,
}

impl Endpoint {
    pub(crate) fn new(core: Arc<Core>, id: EndpointId) -> Endpoint {
        core.add_endpoint(id);
        Endpoint {
            inner: Arc::new(EpInner {
                core,
                id,
                closed: AtomicBool::new(false),
            }),
        }
    }

    fn prepared(&self, ops: &Bound<'_, PyAny>) -> PyResult<Prepared> {
        let py = ops.py();
        let mut refs: Vec<PyRef<'_, Op>> = Vec::new();
        for item in ops.try_iter()? {
            let item = item?;
            let op = item.cast::<Op>().map_err(|_| {
                Fail::invalid(format!(
                    "a batch holds ringfence operations (put(), get(), ...), not {}",
                    item.get_type()
                        .name()
                        .map(|n| n.to_string())
                        .unwrap_or_default()
                ))
                .into_pyerr(py)
            })?;
            refs.push(op.borrow());
        }
        let ops: Vec<&Op> = refs.iter().map(|r| &**r).collect();
        Prepared::build(&self.inner.core, self.inner.id, &ops).or_raise(py)
    }
}

/// Posts `prepared` on `ep` (the GIL released meanwhile).
fn post(py: Python<'_>, ep: &Arc<EpInner>, prepared: &Prepared) -> PyResult<Transfer> {
    ep.check_open().or_raise(py)?;
    prepared.check_live().or_raise(py)?;
    let core = &ep.core;
    let keep = Some(prepared.keep.clone());
    let id = py
        .detach(|| core.post(&prepared.sqes, &prepared.payloads, keep))
        .or_raise(py)?;
    drop(core.retry_parked());
    Ok(Transfer::new(core.clone(), id, prepared.sqes.len()))
}

#[pymethods]
impl Endpoint {
    /// Posts a batch of operations (an iterable of `Op`) in one call, in
    /// order, and returns its `Transfer`. The whole batch is checked
    /// first: nothing is posted if any operation is bad.
    fn post(&self, py: Python<'_>, ops: &Bound<'_, PyAny>) -> PyResult<Transfer> {
        let prepared = self.prepared(ops)?;
        post(py, &self.inner, &prepared)
    }

    /// Checks and encodes a batch once, to post it many times
    /// (`Batch.post`).
    fn prepare(&self, ops: &Bound<'_, PyAny>) -> PyResult<Batch> {
        let prepared = self.prepared(ops)?;
        Ok(Batch {
            ep: self.inner.clone(),
            prepared,
        })
    }

    /// The peer's key (`Memory.pack_key` there) as a `RemoteMemory` on this
    /// endpoint.
    fn unpack_key(&self, py: Python<'_>, key: &[u8]) -> PyResult<RemoteMemory> {
        self.inner.check_open().or_raise(py)?;
        let core = &self.inner.core;
        let (rkey, base, len) = {
            let w = core.worker().or_raise(py)?;
            let w = w.as_ref().expect("checked by worker()");
            let rkey = w
                .unpack_rkey(self.inner.id, key)
                .map_err(Fail::from)
                .or_raise(py)?;
            let (base, len) = w
                .rkey_bounds(self.inner.id, rkey)
                .map_err(Fail::from)
                .or_raise(py)?;
            (rkey, base, len)
        };
        Ok(RemoteMemory {
            inner: Arc::new(RemoteInner::new(
                core.clone(),
                self.inner.id,
                rkey,
                base,
                len,
            )),
        })
    }

    /// Where the endpoint is: "connecting", "connected", "closing",
    /// "failed" or "closed".
    #[getter]
    fn state(&self, py: Python<'_>) -> PyResult<&'static str> {
        Ok(match self.state_of(py)? {
            EndpointState::Connecting => "connecting",
            EndpointState::Connected => "connected",
            EndpointState::Closing => "closing",
            EndpointState::Failed(_) => "failed",
            _ => "closed",
        })
    }

    /// The status name of a failed endpoint's first error, else `None`.
    #[getter]
    fn error(&self, py: Python<'_>) -> PyResult<Option<String>> {
        Ok(match self.state_of(py)? {
            EndpointState::Failed(status) => Some(status_name(status)),
            _ => None,
        })
    }

    /// Closes the endpoint and waits for it: gracefully (after everything
    /// posted before is remotely complete) or, with `force`, at once
    /// (queued operations complete with `Canceled`). Later posts raise
    /// `EndpointError`. Closing a closed endpoint does nothing; closing one
    /// whose peer died raises `EndpointError` (`PeerUnreachable`), and the
    /// endpoint is closed all the same.
    #[pyo3(signature = (force=false, timeout=None))]
    fn close(&self, py: Python<'_>, force: bool, timeout: Option<f64>) -> PyResult<()> {
        timeout_of(timeout).or_raise(py)?;
        // AcqRel: see `check_open`.
        if self.inner.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let core = &self.inner.core;
        core.remove_endpoint(self.inner.id);
        let mode = if force {
            CloseMode::FORCE
        } else {
            CloseMode::GRACEFUL
        };
        let sqe = Sqe::close(self.inner.id.as_raw(), mode);
        let id = py.detach(|| core.post(&[sqe], &[], None)).or_raise(py)?;
        let transfer = Transfer::new(core.clone(), id, 1);
        transfer.wait(py, timeout)
    }

    fn __repr__(&self) -> String {
        format!("<ringfence.Endpoint {}>", self.inner.id.as_raw())
    }
}

impl Endpoint {
    fn state_of(&self, py: Python<'_>) -> PyResult<EndpointState> {
        let w = self.inner.core.worker().or_raise(py)?;
        w.as_ref()
            .expect("checked by worker()")
            .endpoint_state(self.inner.id)
            .map_err(Fail::from)
            .or_raise(py)
    }
}

/// A batch checked and encoded once (`Endpoint.prepare`), posted as often
/// as wanted: the way to post the same transfer again and again with the
/// least work per post. What it uses must stay live (not released).
#[pyclass(frozen, module = "ringfence")]
#[derive(Debug)]
pub struct Batch {
    ep: Arc<EpInner>,
    prepared: Prepared,
}

#[pymethods]
impl Batch {
    /// Posts the batch; returns its `Transfer`.
    fn post(&self, py: Python<'_>) -> PyResult<Transfer> {
        post(py, &self.ep, &self.prepared)
    }

    fn __len__(&self) -> usize {
        self.prepared.sqes.len()
    }

    fn __repr__(&self) -> String {
        format!(
            "<ringfence.Batch of {} operations>",
            self.prepared.sqes.len()
        )
    }
}

/// A posted batch: each operation's completion, exactly one each.
///
/// `done()` polls, `wait(timeout)` blocks (without the GIL), `await
/// transfer` waits in asyncio. `results` holds each operation's result:
/// bytes moved (or 0), a negative status, or `None` while pending. `wait`
/// and `check` raise the first failed operation's error.
#[pyclass(frozen, module = "ringfence")]
#[derive(Debug)]
pub struct Transfer {
    core: Arc<Core>,
    id: TransferId,
    ops: usize,
    /// The results, once every one came.
    results: OnceLock<Vec<i32>>,
}

impl Transfer {
    pub(crate) fn new(core: Arc<Core>, id: TransferId, ops: usize) -> Transfer {
        Transfer {
            core,
            id,
            ops,
            results: OnceLock::new(),
        }
    }

    /// The results if every one came (without progress).
    fn settled(&self) -> Option<&Vec<i32>> {
        if let Some(r) = self.results.get() {
            return Some(r);
        }
        let book = &self.core.queue().book;
        if book.is_done(self.id) {
            let _ = self.results.set(book.results(self.id));
            return self.results.get();
        }
        None
    }

    fn raise_first(&self, py: Python<'_>, results: &[i32]) -> PyResult<()> {
        if let Some((i, &res)) = results.iter().enumerate().find(|(_, r)| **r < 0) {
            let status = Status::try_from(res).unwrap_or(Status::Io);
            let err =
                Fail::op(status, &format!("operation {i} of the transfer failed")).into_pyerr(py);
            err.value(py).setattr("op_index", i)?;
            return Err(err);
        }
        Ok(())
    }
}

#[pymethods]
impl Transfer {
    /// Whether every operation completed (runs a progress round first
    /// when the worker has no core thread).
    fn done(&self, py: Python<'_>) -> PyResult<bool> {
        if self.results.get().is_some() {
            return Ok(true);
        }
        match self.core.poll() {
            Ok(_) => {}
            // A closed worker settled everything.
            Err(_) if self.core.is_closed() => {}
            Err(f) => return Err(f.into_pyerr(py)),
        }
        drop(self.core.retry_parked());
        Ok(self.settled().is_some())
    }

    /// Waits until every operation completed, at most `timeout` seconds
    /// (`None`: no limit), the GIL released. Raises `TimeoutError` if the
    /// time ran out (the transfer goes on), or the first failed
    /// operation's error (with its index in `op_index`).
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        timeout_of(timeout).or_raise(py)?;
        // One round first, as `done` does: over shm most transfers are done
        // by then, and a wait that does not sleep need not let the GIL go.
        if self.results.get().is_none() && !self.done(py)? {
            let id = self.id;
            let results = wait_blocking(py, &self.core, timeout, move |book| {
                book.is_done(id).then(|| book.results(id))
            })?;
            let _ = self.results.set(results);
        }
        let results = self.results.get().expect("set above");
        self.raise_first(py, results)
    }

    /// Raises the first failed operation's error, if any failed; `None`
    /// while pending and when all succeeded.
    fn check(&self, py: Python<'_>) -> PyResult<()> {
        match self.settled() {
            Some(results) => self.raise_first(py, &results.clone()),
            None => Ok(()),
        }
    }

    /// Each operation's result: bytes moved (0 for fences, flushes and
    /// atomics), a negative ringfence status, or `None` while pending.
    #[getter]
    fn results<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let results = match self.settled() {
            Some(r) => r.clone(),
            None => self.core.queue().book.results(self.id),
        };
        let items: Vec<Option<i32>> = results
            .into_iter()
            .map(|r| (r != PENDING).then_some(r))
            .collect();
        PyList::new(py, items)
    }

    /// "pending", "done" (every operation succeeded) or "failed".
    #[getter]
    fn status(&self) -> &'static str {
        match self.settled() {
            None => "pending",
            Some(r) if r.iter().any(|&x| x < 0) => "failed",
            Some(_) => "done",
        }
    }

    /// Whether every result is in, without progress (for the asyncio
    /// helpers, which progress themselves).
    fn _settled(&self) -> bool {
        self.settled().is_some()
    }

    /// The waiting port of `ringfence._aio`.
    fn _port(&self) -> crate::worker::Port {
        crate::worker::Port {
            core: self.core.clone(),
        }
    }

    /// A coroutine that waits for the transfer in asyncio (see `wait`).
    #[pyo3(signature = (timeout=None))]
    fn wait_async<'py>(
        slf: &Bound<'py, Self>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        py.import("ringfence._aio")?
            .getattr("wait_transfer")?
            .call1((slf, timeout))
    }

    fn __await__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        Self::wait_async(slf, None)?.call_method0("__await__")
    }

    fn __len__(&self) -> usize {
        self.ops
    }

    fn __repr__(&self) -> String {
        format!(
            "<ringfence.Transfer of {} operations, {}>",
            self.ops,
            self.status()
        )
    }
}

impl Drop for Transfer {
    fn drop(&mut self) {
        if self.core.check_fork().is_ok() {
            self.core.queue().book.drop_transfer(self.id);
        }
    }
}

/// An incoming notification: its tag and payload. Read the payload once,
/// as bytes (`read()`) or into a writable buffer (`read_into(buf)`);
/// until then it holds one of the worker's notification buffers (a
/// notification dropped unread gives it back).
#[pyclass(frozen, module = "ringfence")]
#[derive(Debug)]
pub struct Notification {
    core: Arc<Core>,
    cqe: Cqe,
    taken: AtomicBool,
}

impl Notification {
    pub(crate) fn new(core: Arc<Core>, cqe: Cqe) -> Notification {
        Notification {
            core,
            cqe,
            taken: AtomicBool::new(false),
        }
    }

    fn len(&self) -> usize {
        usize::try_from(self.cqe.res).unwrap_or(0)
    }

    /// Copies the payload out with `f` and gives the buffer back.
    fn take(&self, f: impl FnOnce(&[u8]) -> Res<()>) -> Res<()> {
        self.core.check_fork()?;
        let guard = self.core.queue();
        let qp = guard.qp.as_ref().ok_or_else(Fail::closed)?;
        // AcqRel: one read per notification, whichever thread.
        if self.taken.swap(true, Ordering::AcqRel) {
            return Err(Fail::new(
                Status::StaleHandle,
                "this notification was read already",
            ));
        }
        let payload = qp
            .notification(&self.cqe)
            .ok_or_else(|| Fail::new(Status::StaleHandle, "this notification was read already"))?;
        f(&payload)
    }
}

#[pymethods]
impl Notification {
    /// The sender's tag (the `tag` of its `notify`).
    #[getter]
    fn tag(&self) -> u64 {
        self.cqe.user_data
    }

    /// The payload's length in bytes.
    #[getter]
    fn length(&self) -> usize {
        self.len()
    }

    fn __len__(&self) -> usize {
        self.len()
    }

    /// Whether the payload was read.
    #[getter]
    fn read_already(&self) -> bool {
        self.taken.load(Ordering::Acquire)
    }

    /// The payload as bytes; gives the buffer back.
    fn read<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let mut out = Vec::new();
        self.take(|p| {
            out.extend_from_slice(p);
            Ok(())
        })
        .or_raise(py)?;
        Ok(PyBytes::new(py, &out))
    }

    /// Copies the payload into the writable, contiguous buffer `buf` (at
    /// least `length` bytes: else `InvalidArgumentError`, status
    /// `Truncated`, and nothing is read); returns its length.
    fn read_into(&self, py: Python<'_>, buf: &Bound<'_, PyAny>) -> PyResult<usize> {
        let target = PyUntypedBuffer::get(buf).map_err(|e| {
            Fail::invalid(format!(
                "read_into: the target does not export a buffer ({e})"
            ))
            .into_pyerr(py)
        })?;
        if target.readonly() {
            return Err(Fail::invalid("read_into: the target buffer is read-only").into_pyerr(py));
        }
        if !target.is_c_contiguous() {
            return Err(
                Fail::invalid("read_into: the target buffer is not contiguous").into_pyerr(py),
            );
        }
        let cap = target.len_bytes();
        if cap < self.len() {
            return Err(Fail::new(
                Status::Truncated,
                format!(
                    "read_into: the payload is {} bytes, the buffer {cap}: nothing was read",
                    self.len()
                ),
            )
            .into_pyerr(py));
        }
        let dst = target.buf_ptr().cast::<u8>();
        let mut n = 0;
        self.take(|p| {
            // SAFETY: `dst` is the start of `target`'s writable, contiguous
            // buffer of `cap >= p.len()` bytes, exported (so valid) while
            // `target` lives; the notification buffer `p` is the worker's,
            // not the caller's, so the two do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(p.as_ptr(), dst, p.len()) };
            n = p.len();
            Ok(())
        })
        .or_raise(py)?;
        Ok(n)
    }

    fn __bytes__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        self.read(py)
    }

    fn __repr__(&self) -> String {
        format!(
            "<ringfence.Notification tag={} {} bytes{}>",
            self.tag(),
            self.len(),
            if self.read_already() { ", read" } else { "" }
        )
    }
}

impl Drop for Notification {
    fn drop(&mut self) {
        if self.core.check_fork().is_ok() && !self.taken.load(Ordering::Acquire) {
            let _ = self.take(|_| Ok(()));
        }
    }
}
