//! Registered memory (`Memory`) and a peer's memory reached through its
//! key (`RemoteMemory`).
//!
//! A `Memory` is either allocated by the worker (`Worker.alloc`: on shm a
//! sealed memfd a peer maps, so PUT, GET and atomics are plain copies and
//! CPU atomics) or a Python object registered where it lies
//! (`Worker.register`: any C- or Fortran-contiguous buffer). The object's
//! buffer is exported to the package for as long as the engine may touch
//! the memory, which pins it: a bytearray cannot be resized, a memoryview
//! not released, and the object not freed, until the registration is let
//! go (see `Core::deregister`).

use crate::core::{Backing, Core};
use crate::errors::{Fail, OrRaise, Res};
use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use ringfence::{EndpointId, MemHandle, MemKind, RegisteredBuf, RkeyId};
use ringfence_ring::Status;
use std::ffi::c_int;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// What a `Memory` object and the operations built on it share.
#[derive(Debug)]
pub(crate) struct MemInner {
    pub(crate) core: Arc<Core>,
    pub(crate) handle: MemHandle,
    pub(crate) addr: u64,
    pub(crate) len: usize,
    pub(crate) writable: bool,
    released: AtomicBool,
    /// Memory the worker allocated: kept mapped while Python views it,
    /// whatever happens to the registration.
    owned: Option<RegisteredBuf>,
    /// The registered object, for `Memory.obj` and for views of it.
    obj: Option<Py<PyAny>>,
}

impl MemInner {
    /// `Err` once released (or its worker closed).
    pub(crate) fn check_live(&self) -> Res<()> {
        // Acquire: pairs with the swap in `release`.
        if self.released.load(Ordering::Acquire) {
            return Err(Fail::new(
                Status::InvalidMemHandle,
                "this Memory was released: register the buffer again to use it",
            ));
        }
        self.core.check_fork()?;
        if self.core.is_closed() {
            return Err(Fail::closed());
        }
        Ok(())
    }

    /// Whether `[offset, offset + len)` lies inside; `len` of 0 is refused.
    pub(crate) fn check_range(&self, offset: u64, len: u64, what: &str) -> Res<()> {
        check_range(offset, len, self.len as u64, what)
    }

    /// Deregisters it; with `refuse`, `Busy` while operations use it.
    fn release(&self, refuse: bool) -> Res<Option<Backing>> {
        // AcqRel: see `check_live`.
        if self.released.swap(true, Ordering::AcqRel) {
            return Ok(None);
        }
        match self.core.deregister(self.handle, refuse) {
            Ok(backing) => Ok(backing),
            Err(f) => {
                self.released.store(false, Ordering::Release);
                Err(f)
            }
        }
    }
}

impl Drop for MemInner {
    fn drop(&mut self) {
        if self.core.check_fork().is_err() {
            return;
        }
        // Not refused: the memory stays (parked) until nothing uses it.
        // The backing is dropped here, with no lock held.
        let _ = self.release(false);
    }
}

/// `[offset, offset + len)` inside `size` bytes, `len` not zero.
pub(crate) fn check_range(offset: u64, len: u64, size: u64, what: &str) -> Res<()> {
    if len == 0 {
        return Err(Fail::new(
            Status::InvalidLength,
            format!("{what}: the length is zero"),
        ));
    }
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(Fail::new(
            Status::OutOfBounds,
            format!("{what}: bytes {offset}..{offset}+{len} lie outside its {size} bytes"),
        )),
    }
}

/// Memory registered with a worker, for the local side of operations and,
/// through its packed key, for peers.
///
/// From `Worker.alloc` (zeroed, the worker's; views of it through the
/// buffer protocol: `memoryview(mem)`, `numpy.frombuffer(mem, dtype)`) or
/// `Worker.register` (a Python object's memory, used where it lies).
/// `release()` (or the end of a `with` block) deregisters it; so does
/// dropping the last reference, once no operation uses it any more.
#[pyclass(frozen, module = "ringfence")]
#[derive(Debug)]
pub struct Memory {
    pub(crate) inner: Arc<MemInner>,
}

impl Memory {
    /// Memory the worker allocated: `len` zeroed bytes.
    pub(crate) fn alloc(core: &Arc<Core>, len: usize) -> Res<Memory> {
        if len == 0 {
            return Err(Fail::new(
                Status::InvalidLength,
                "alloc: the length is zero",
            ));
        }
        let buf = {
            let w = core.worker()?;
            w.as_ref()
                .expect("checked by worker()")
                .alloc_registered_kind(len, MemKind::Host)?
        };
        core.keep(buf.handle(), Backing::Owned(buf.clone()));
        Ok(Memory {
            inner: Arc::new(MemInner {
                core: core.clone(),
                handle: buf.handle(),
                addr: buf.addr(),
                len,
                writable: true,
                released: AtomicBool::new(false),
                owned: Some(buf),
                obj: None,
            }),
        })
    }

    /// `obj`'s memory, registered where it lies. `writable`: `None` takes
    /// what the object offers, `True` refuses a read-only object, `False`
    /// registers a writable object read-only.
    pub(crate) fn register(
        core: &Arc<Core>,
        obj: &Bound<'_, PyAny>,
        writable: Option<bool>,
    ) -> PyResult<Memory> {
        let py = obj.py();
        let buffer = PyUntypedBuffer::get(obj).map_err(|e| {
            Fail::new(
                Status::InvalidArgument,
                format!("register: the object does not export a buffer ({e})"),
            )
            .into_pyerr(py)
        })?;
        if !buffer.is_c_contiguous() && !buffer.is_fortran_contiguous() {
            return Err(Fail::invalid(
                "register: the buffer is not contiguous (a strided view): register the \
                 array it views, or a contiguous copy",
            )
            .into_pyerr(py));
        }
        let len = buffer.len_bytes();
        if len == 0 {
            return Err(
                Fail::new(Status::InvalidLength, "register: the buffer is empty").into_pyerr(py),
            );
        }
        let readonly = buffer.readonly();
        if readonly && writable == Some(true) {
            return Err(Fail::invalid(
                "register: writable=True, but the object's buffer is read-only",
            )
            .into_pyerr(py));
        }
        let writable = !readonly && writable != Some(false);
        let ptr = buffer.buf_ptr().cast::<u8>();
        let handle = {
            let w = core.worker().or_raise(py)?;
            let w = w.as_ref().expect("checked by worker()");
            // SAFETY: `[ptr, ptr + len)` is the object's buffer, exported to
            // us by `buffer`, which `core.keep` holds from here until the
            // engine has let go of the registration (`Core::deregister`
            // gives it back only once `Worker::deregister` says `Ok`, and
            // `Core::close` never gives back one a driver still holds): the
            // exporter keeps that memory valid and in place while it is
            // exported. Peers and the engine may write it at any time; the
            // package never reads it through a Rust reference, and Python
            // code reads it as it reads any buffer shared with a device.
            // Read-only memory is never written: it may not be a GET target
            // or an atomic result (refused when the operation is built), and
            // its key is never packed (`Memory.pack_key` refuses), so no
            // peer can reach it.
            unsafe { w.register(ptr, len, MemKind::Host) }
                .map_err(Fail::from)
                .or_raise(py)?
        };
        core.keep(handle, Backing::Object(buffer));
        Ok(Memory {
            inner: Arc::new(MemInner {
                core: core.clone(),
                handle,
                addr: ptr as u64,
                len,
                writable,
                released: AtomicBool::new(false),
                owned: None,
                obj: Some(obj.clone().unbind()),
            }),
        })
    }
}

#[pymethods]
impl Memory {
    /// The length in bytes.
    #[getter]
    fn length(&self) -> usize {
        self.inner.len
    }

    fn __len__(&self) -> usize {
        self.inner.len
    }

    /// The start address in this process.
    #[getter]
    fn address(&self) -> u64 {
        self.inner.addr
    }

    /// Whether it may only be read: a PUT source, never a GET target, an
    /// atomic's result or a peer's window.
    #[getter]
    fn readonly(&self) -> bool {
        !self.inner.writable
    }

    /// Whether it was released.
    #[getter]
    fn released(&self) -> bool {
        self.inner.released.load(Ordering::Acquire)
    }

    /// The registered object (`Worker.register`), or `None` for memory
    /// the worker allocated.
    #[getter]
    fn obj(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.inner.obj.as_ref().map(|o| o.clone_ref(py))
    }

    /// The key a peer unpacks (`Endpoint.unpack_key`) to reach this
    /// memory, as bytes to send it by the application's own means.
    fn pack_key<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        self.inner.check_live().or_raise(py)?;
        if !self.inner.writable {
            return Err(Fail::invalid(
                "pack_key: read-only memory cannot be shared: a peer could write it",
            )
            .into_pyerr(py));
        }
        let key = {
            let w = self.inner.core.worker().or_raise(py)?;
            w.as_ref()
                .expect("checked by worker()")
                .pack_rkey(self.inner.handle)
                .map_err(Fail::from)
                .or_raise(py)?
        };
        Ok(PyBytes::new(py, &key))
    }

    /// Deregisters it. Refused (`BusyError`, nothing changed) while
    /// operations in flight use it; a second call does nothing. A registered
    /// object is let go (it can be resized or freed again) once no driver
    /// holds its memory: at once, or after later progress.
    fn release(&self, py: Python<'_>) -> PyResult<()> {
        let backing = self.inner.release(true).or_raise(py)?;
        drop(backing);
        let freed = self.inner.core.retry_parked();
        drop(freed);
        Ok(())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<()> {
        self.release(py)
    }

    fn __repr__(&self) -> String {
        let what = if self.inner.owned.is_some() {
            "allocated"
        } else {
            "registered"
        };
        format!(
            "<ringfence.Memory {what} {} bytes at {:#x}{}{}>",
            self.inner.len,
            self.inner.addr,
            if self.inner.writable {
                ""
            } else {
                ", read-only"
            },
            if self.released() { ", released" } else { "" }
        )
    }

    /// The buffer protocol: memory the worker allocated is viewed in place
    /// (the view keeps it mapped); a registered object's view is the
    /// object's own.
    ///
    /// # Safety
    /// `view` points to a `Py_buffer` to fill (the interpreter's contract).
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let py = slf.py();
        let inner = slf.get().inner.clone();
        if inner.released.load(Ordering::Acquire) {
            return Err(PyBufferError::new_err(
                "this Memory was released: it has no buffer any more",
            ));
        }
        if let Some(obj) = &inner.obj {
            // SAFETY: `view` is the caller's to fill (contract); the
            // object fills it and takes a reference to itself in
            // `view.obj`, so its release goes to the object.
            let rc = unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), view, flags) };
            return if rc == 0 {
                Ok(())
            } else {
                Err(PyErr::fetch(py))
            };
        }
        let len = isize::try_from(inner.len)
            .map_err(|_| PyBufferError::new_err("longer than a buffer can be"))?;
        // SAFETY: `view` is the caller's to fill (contract). The memory is
        // `inner.owned`'s, `len` bytes at `inner.addr`, writable; the view
        // holds a reference to `slf` (FillInfo takes one), which holds
        // `inner` and so the `RegisteredBuf` that keeps the memory mapped
        // until the view is released.
        let rc = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                std::ptr::with_exposed_provenance_mut(inner.addr as usize),
                len,
                0,
                flags,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(PyErr::fetch(py))
        }
    }

    /// Nothing to free: `PyBuffer_FillInfo` allocates nothing.
    ///
    /// # Safety
    /// `_view` was filled by `__getbuffer__` (the interpreter's contract).
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {}
}

/// What a `RemoteMemory` object and the operations built on it share.
#[derive(Debug)]
pub(crate) struct RemoteInner {
    pub(crate) core: Arc<Core>,
    pub(crate) ep: EndpointId,
    pub(crate) rkey: RkeyId,
    pub(crate) base: u64,
    pub(crate) len: u64,
    released: AtomicBool,
}

impl RemoteInner {
    pub(crate) fn new(core: Arc<Core>, ep: EndpointId, rkey: RkeyId, base: u64, len: u64) -> Self {
        RemoteInner {
            core,
            ep,
            rkey,
            base,
            len,
            released: AtomicBool::new(false),
        }
    }

    /// `Err` once released (or its worker closed).
    pub(crate) fn check_live(&self) -> Res<()> {
        // Acquire: pairs with the swap in `release`.
        if self.released.load(Ordering::Acquire) {
            return Err(Fail::new(
                Status::InvalidRkey,
                "this RemoteMemory was released: unpack its key again to use it",
            ));
        }
        self.core.check_fork()?;
        if self.core.is_closed() {
            return Err(Fail::closed());
        }
        Ok(())
    }

    pub(crate) fn check_range(&self, offset: u64, len: u64, what: &str) -> Res<()> {
        check_range(offset, len, self.len, what)
    }

    fn release(&self) {
        // AcqRel: see `check_live`.
        if !self.released.swap(true, Ordering::AcqRel) {
            self.core.release_key(self.rkey);
        }
    }
}

impl Drop for RemoteInner {
    fn drop(&mut self) {
        if self.core.check_fork().is_ok() {
            self.release();
        }
    }
}

/// A peer's registered memory, reached through the key it sent
/// (`Endpoint.unpack_key`), for the remote side of operations on that
/// endpoint. Offsets in operations count from its start.
#[pyclass(frozen, module = "ringfence")]
#[derive(Debug)]
pub struct RemoteMemory {
    pub(crate) inner: Arc<RemoteInner>,
}

#[pymethods]
impl RemoteMemory {
    /// The length in bytes.
    #[getter]
    fn length(&self) -> u64 {
        self.inner.len
    }

    fn __len__(&self) -> usize {
        self.inner.len as usize
    }

    /// Its start address in the peer's process.
    #[getter]
    fn base(&self) -> u64 {
        self.inner.base
    }

    /// Whether it was released.
    #[getter]
    fn released(&self) -> bool {
        self.inner.released.load(Ordering::Acquire)
    }

    /// Releases the key: operations may not name it any more. The engine
    /// lets it go once its endpoint has no work left.
    fn release(&self) {
        self.inner.release();
        drop(self.inner.core.retry_parked());
    }

    fn __repr__(&self) -> String {
        format!(
            "<ringfence.RemoteMemory {} bytes at the peer's {:#x}{}>",
            self.inner.len,
            self.inner.base,
            if self.released() { ", released" } else { "" }
        )
    }
}
