//! Operations (`Op`, built by `put`, `get`, `fetch_add`, ..., `notify`)
//! and prepared batches (`Batch`).
//!
//! An operation is checked when it is built (ranges inside their memory,
//! atomics' words aligned, a GET target or atomic result writable) and
//! again, for liveness and endpoint, when a batch is prepared or posted:
//! a bad batch raises before any of it is posted.

use crate::errors::{Fail, OrRaise, Res};
use crate::memory::{MemInner, Memory, RemoteInner, RemoteMemory};
use pyo3::buffer::PyUntypedBuffer;
use pyo3::prelude::*;
use ringfence::EndpointId;
use ringfence_ring::{AtomicOp, FenceMode, LocalBuf, RemoteBuf, Sqe, Status};
use std::sync::Arc;

/// A notification's payload.
#[derive(Debug, Clone)]
pub(crate) enum Payload {
    /// Copied into staging memory at each post.
    Bytes(Vec<u8>),
    /// Sent from registered memory, where it lies.
    Mem(Arc<MemInner>, u64, u32),
}

/// What an operation does.
#[derive(Debug, Clone)]
pub(crate) enum Spec {
    Rma {
        get: bool,
        local: Arc<MemInner>,
        local_offset: u64,
        remote: Arc<RemoteInner>,
        remote_offset: u64,
        len: u32,
    },
    Atomic {
        op: AtomicOp,
        result: Option<(Arc<MemInner>, u64)>,
        remote: Arc<RemoteInner>,
        remote_offset: u64,
        operand: u64,
        operand2: u64,
    },
    Fence(FenceMode),
    Flush,
    Notify {
        tag: u64,
        payload: Payload,
    },
}

/// One operation, to post in a batch on an endpoint (`Endpoint.post`,
/// `Endpoint.prepare`). Built by the module's functions: `put`, `get`,
/// `atomic_add`, `fetch_add`, `swap`, `compare_swap`, `fence`, `flush`,
/// `notify`.
#[pyclass(frozen, module = "ringfence")]
#[derive(Debug)]
pub struct Op {
    pub(crate) spec: Spec,
}

#[pymethods]
impl Op {
    /// What it is: "put", "get", "atomic_add", "fetch_add", "swap",
    /// "compare_swap", "fence", "flush" or "notify".
    #[getter]
    fn kind(&self) -> &'static str {
        match &self.spec {
            Spec::Rma { get: false, .. } => "put",
            Spec::Rma { get: true, .. } => "get",
            Spec::Atomic { op, .. } => match *op {
                AtomicOp::ADD => "atomic_add",
                AtomicOp::FADD => "fetch_add",
                AtomicOp::SWAP => "swap",
                _ => "compare_swap",
            },
            Spec::Fence(_) => "fence",
            Spec::Flush => "flush",
            Spec::Notify { .. } => "notify",
        }
    }

    fn __repr__(&self) -> String {
        format!("<ringfence.Op {}>", self.kind())
    }
}

fn length_u32(len: u64, what: &str) -> Res<u32> {
    u32::try_from(len).map_err(|_| {
        Fail::new(
            Status::InvalidLength,
            format!("{what}: {len} bytes is more than one operation moves (4 GiB - 1)"),
        )
    })
}

fn rma(
    get: bool,
    local: &Memory,
    remote: &RemoteMemory,
    length: Option<u64>,
    local_offset: u64,
    remote_offset: u64,
) -> Res<Op> {
    let what = if get { "get" } else { "put" };
    let local = local.inner.clone();
    let remote = remote.inner.clone();
    local.check_live()?;
    remote.check_live()?;
    let len = match length {
        Some(n) => n,
        None => (local.len as u64).saturating_sub(local_offset),
    };
    local.check_range(local_offset, len, &format!("{what}: the local Memory"))?;
    remote.check_range(remote_offset, len, &format!("{what}: the RemoteMemory"))?;
    if get && !local.writable {
        return Err(Fail::invalid(
            "get: the local Memory is read-only: a GET writes it",
        ));
    }
    Ok(Op {
        spec: Spec::Rma {
            get,
            local,
            local_offset,
            remote,
            remote_offset,
            len: length_u32(len, what)?,
        },
    })
}

/// PUT `length` bytes (default: the rest of `local` from `local_offset`)
/// from `local` into `remote`.
#[pyfunction]
#[pyo3(signature = (local, remote, length=None, *, local_offset=0, remote_offset=0))]
pub(crate) fn put(
    py: Python<'_>,
    local: PyRef<'_, Memory>,
    remote: PyRef<'_, RemoteMemory>,
    length: Option<u64>,
    local_offset: u64,
    remote_offset: u64,
) -> PyResult<Op> {
    rma(false, &local, &remote, length, local_offset, remote_offset).or_raise(py)
}

/// GET `length` bytes (default: the rest of `local` from `local_offset`)
/// from `remote` into `local`, which must be writable.
#[pyfunction]
#[pyo3(signature = (local, remote, length=None, *, local_offset=0, remote_offset=0))]
pub(crate) fn get(
    py: Python<'_>,
    local: PyRef<'_, Memory>,
    remote: PyRef<'_, RemoteMemory>,
    length: Option<u64>,
    local_offset: u64,
    remote_offset: u64,
) -> PyResult<Op> {
    rma(true, &local, &remote, length, local_offset, remote_offset).or_raise(py)
}

fn atomic(
    op: AtomicOp,
    result: Option<(&Memory, u64)>,
    remote: &RemoteMemory,
    remote_offset: u64,
    operand: u64,
    operand2: u64,
) -> Res<Op> {
    let what = match op {
        AtomicOp::ADD => "atomic_add",
        AtomicOp::FADD => "fetch_add",
        AtomicOp::SWAP => "swap",
        _ => "compare_swap",
    };
    let remote = remote.inner.clone();
    remote.check_live()?;
    remote.check_range(remote_offset, 8, &format!("{what}: the RemoteMemory"))?;
    if !remote.base.wrapping_add(remote_offset).is_multiple_of(8) {
        return Err(Fail::new(
            Status::Misaligned,
            format!("{what}: the remote word is not 8-byte aligned"),
        ));
    }
    let result = match result {
        None => None,
        Some((mem, offset)) => {
            let mem = mem.inner.clone();
            mem.check_live()?;
            mem.check_range(offset, 8, &format!("{what}: the result Memory"))?;
            if !mem.writable {
                return Err(Fail::invalid(format!(
                    "{what}: the result Memory is read-only: the old value is written there"
                )));
            }
            if mem.addr.wrapping_add(offset) % 8 != 0 {
                return Err(Fail::new(
                    Status::Misaligned,
                    format!("{what}: the result word is not 8-byte aligned"),
                ));
            }
            Some((mem, offset))
        }
    };
    Ok(Op {
        spec: Spec::Atomic {
            op,
            result,
            remote,
            remote_offset,
            operand,
            operand2,
        },
    })
}

/// Atomically adds `value` to the peer's 8-byte word at `remote_offset`,
/// fetching nothing.
#[pyfunction]
#[pyo3(signature = (remote, value, *, remote_offset=0))]
pub(crate) fn atomic_add(
    py: Python<'_>,
    remote: PyRef<'_, RemoteMemory>,
    value: u64,
    remote_offset: u64,
) -> PyResult<Op> {
    atomic(AtomicOp::ADD, None, &remote, remote_offset, value, 0).or_raise(py)
}

/// Atomically adds `value` to the peer's 8-byte word; its old value is
/// written to `result` at `result_offset` (8 bytes, native byte order).
#[pyfunction]
#[pyo3(signature = (result, remote, value, *, result_offset=0, remote_offset=0))]
pub(crate) fn fetch_add(
    py: Python<'_>,
    result: PyRef<'_, Memory>,
    remote: PyRef<'_, RemoteMemory>,
    value: u64,
    result_offset: u64,
    remote_offset: u64,
) -> PyResult<Op> {
    atomic(
        AtomicOp::FADD,
        Some((&result, result_offset)),
        &remote,
        remote_offset,
        value,
        0,
    )
    .or_raise(py)
}

/// Atomically replaces the peer's 8-byte word with `value`; its old value
/// is written to `result`.
#[pyfunction]
#[pyo3(signature = (result, remote, value, *, result_offset=0, remote_offset=0))]
pub(crate) fn swap(
    py: Python<'_>,
    result: PyRef<'_, Memory>,
    remote: PyRef<'_, RemoteMemory>,
    value: u64,
    result_offset: u64,
    remote_offset: u64,
) -> PyResult<Op> {
    atomic(
        AtomicOp::SWAP,
        Some((&result, result_offset)),
        &remote,
        remote_offset,
        value,
        0,
    )
    .or_raise(py)
}

/// Atomically sets the peer's 8-byte word to `swap` if it equals
/// `compare`; its old value is written to `result` either way.
#[pyfunction]
#[pyo3(signature = (result, remote, compare, swap, *, result_offset=0, remote_offset=0))]
pub(crate) fn compare_swap(
    py: Python<'_>,
    result: PyRef<'_, Memory>,
    remote: PyRef<'_, RemoteMemory>,
    compare: u64,
    swap: u64,
    result_offset: u64,
    remote_offset: u64,
) -> PyResult<Op> {
    atomic(
        AtomicOp::CSWAP,
        Some((&result, result_offset)),
        &remote,
        remote_offset,
        compare,
        swap,
    )
    .or_raise(py)
}

/// A fence: what the batch (and the endpoint) posted before it takes
/// effect at the peer before what comes after. `mode="order"` (the
/// cheapest way that keeps the order) or `"complete"` (nothing after
/// starts before everything before is remotely complete).
#[pyfunction]
#[pyo3(signature = (mode="order"))]
pub(crate) fn fence(py: Python<'_>, mode: &str) -> PyResult<Op> {
    let mode = match mode {
        "order" => FenceMode::ORDER,
        "complete" => FenceMode::COMPLETE,
        _ => {
            return Err(Fail::invalid(format!(
                "fence: mode is 'order' or 'complete', not {mode:?}"
            ))
            .into_pyerr(py));
        }
    };
    Ok(Op {
        spec: Spec::Fence(mode),
    })
}

/// A flush: its completion means every operation posted on the endpoint
/// before it is remotely complete.
#[pyfunction]
pub(crate) fn flush() -> Op {
    Op { spec: Spec::Flush }
}

/// A notification to the peer: `tag` (a 64-bit integer) and a payload,
/// either bytes-like (copied now) or a registered `Memory` (sent from
/// where it lies, `length` bytes from `offset`: keep it unchanged until the
/// batch is done). It reaches the peer after every operation posted before
/// it on the endpoint (an implied fence).
#[pyfunction]
#[pyo3(signature = (payload=None, tag=0, *, offset=0, length=None))]
pub(crate) fn notify(
    py: Python<'_>,
    payload: Option<&Bound<'_, PyAny>>,
    tag: u64,
    offset: u64,
    length: Option<u64>,
) -> PyResult<Op> {
    let payload = match payload {
        None => Payload::Bytes(Vec::new()),
        Some(p) => {
            if let Ok(mem) = p.cast::<Memory>() {
                let mem = mem.get().inner.clone();
                mem.check_live().or_raise(py)?;
                let len = length.unwrap_or_else(|| (mem.len as u64).saturating_sub(offset));
                mem.check_range(offset, len, "notify: the payload Memory")
                    .or_raise(py)?;
                let len = length_u32(len, "notify").or_raise(py)?;
                Payload::Mem(mem, offset, len)
            } else {
                if offset != 0 || length.is_some() {
                    return Err(Fail::invalid(
                        "notify: offset and length apply to a Memory payload only",
                    )
                    .into_pyerr(py));
                }
                let buffer = PyUntypedBuffer::get(p).map_err(|e| {
                    Fail::invalid(format!(
                        "notify: the payload is a Memory or a bytes-like object ({e})"
                    ))
                    .into_pyerr(py)
                })?;
                Payload::Bytes(buffer_bytes(py, &buffer)?)
            }
        }
    };
    Ok(Op {
        spec: Spec::Notify { tag, payload },
    })
}

/// A copy of a buffer's bytes (in C order).
pub(crate) fn buffer_bytes(py: Python<'_>, buffer: &PyUntypedBuffer) -> PyResult<Vec<u8>> {
    let bytes = buffer.as_typed::<u8>().ok();
    match bytes {
        Some(b) => b.to_vec(py),
        None => {
            // Another element type: its bytes, contiguous.
            if !buffer.is_c_contiguous() {
                return Err(Fail::invalid("the payload buffer is not C-contiguous").into_pyerr(py));
            }
            let mut out = vec![0u8; buffer.len_bytes()];
            // SAFETY: the buffer is C-contiguous, `len_bytes` long at
            // `buf_ptr`, exported (so valid) while `buffer` lives, and `out`
            // is a new allocation of that length.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    buffer.buf_ptr().cast::<u8>(),
                    out.as_mut_ptr(),
                    out.len(),
                );
            }
            Ok(out)
        }
    }
}

/// A batch ready to post: its SQEs (all but `user_data`), its staged
/// payloads, and what it uses (checked live at each post).
#[derive(Debug)]
pub(crate) struct Prepared {
    pub(crate) sqes: Vec<Sqe>,
    pub(crate) payloads: Vec<(usize, Vec<u8>)>,
    /// What it uses; each post keeps it (one reference) until done.
    pub(crate) keep: Arc<crate::book::Keep>,
}

/// What a batch uses, gathered while it is built.
#[derive(Debug, Default)]
struct Uses {
    mems: Vec<Arc<MemInner>>,
    remotes: Vec<Arc<RemoteInner>>,
}

impl Prepared {
    /// `ops` as SQEs on endpoint `ep` of the worker `core` names.
    pub(crate) fn build(
        core: &Arc<crate::core::Core>,
        ep: EndpointId,
        ops: &[&Op],
    ) -> Res<Prepared> {
        if ops.is_empty() {
            return Err(Fail::invalid("a batch needs at least one operation"));
        }
        let mut p = Building {
            sqes: Vec::with_capacity(ops.len()),
            payloads: Vec::new(),
            uses: Uses::default(),
        };
        let e = ep.as_raw();
        for (i, op) in ops.iter().enumerate() {
            let sqe = match &op.spec {
                Spec::Rma {
                    get,
                    local,
                    local_offset,
                    remote,
                    remote_offset,
                    len,
                } => {
                    let l = p.local(core, local, *local_offset)?;
                    let r = p.remote(core, ep, remote, *remote_offset)?;
                    if *get {
                        Sqe::get(e, l, r, *len)
                    } else {
                        Sqe::put(e, l, r, *len)
                    }
                }
                Spec::Atomic {
                    op: aop,
                    result,
                    remote,
                    remote_offset,
                    operand,
                    operand2,
                } => {
                    let r = p.remote(core, ep, remote, *remote_offset)?;
                    let l = match result {
                        Some((mem, offset)) => p.local(core, mem, *offset)?,
                        None => LocalBuf::default(),
                    };
                    match *aop {
                        AtomicOp::ADD => Sqe::atomic_add(e, r, *operand),
                        AtomicOp::FADD => Sqe::atomic_fadd(e, l, r, *operand),
                        AtomicOp::SWAP => Sqe::atomic_swap(e, l, r, *operand),
                        _ => Sqe::atomic_cswap(e, l, r, *operand, *operand2),
                    }
                }
                Spec::Fence(mode) => Sqe::fence(e, *mode),
                Spec::Flush => Sqe::flush(e),
                Spec::Notify { tag, payload } => {
                    let mut sqe = match payload {
                        Payload::Bytes(bytes) => {
                            let len = length_u32(bytes.len() as u64, "notify")?;
                            if bytes.len() > core.notify_size as usize {
                                return Err(Fail::new(
                                    Status::InvalidLength,
                                    format!(
                                        "notify: a payload given as bytes holds at most {} \
                                         bytes (the worker's notify_size)",
                                        core.notify_size
                                    ),
                                ));
                            }
                            if len > 0 {
                                p.payloads.push((i, bytes.clone()));
                            }
                            Sqe::notify(e, LocalBuf::default(), len)
                        }
                        Payload::Mem(mem, offset, len) => {
                            let l = p.local(core, mem, *offset)?;
                            Sqe::notify(e, l, *len)
                        }
                    };
                    sqe.operand = *tag;
                    sqe
                }
            };
            p.sqes.push(sqe);
        }
        Ok(Prepared {
            sqes: p.sqes,
            payloads: p.payloads,
            keep: Arc::new(crate::book::Keep {
                mems: p.uses.mems,
                remotes: p.uses.remotes,
            }),
        })
    }

    /// `Err` if something the batch uses was released since.
    pub(crate) fn check_live(&self) -> Res<()> {
        for m in &self.keep.mems {
            m.check_live()?;
        }
        for r in &self.keep.remotes {
            r.check_live()?;
        }
        Ok(())
    }
}

/// A batch being built.
#[derive(Debug)]
struct Building {
    sqes: Vec<Sqe>,
    payloads: Vec<(usize, Vec<u8>)>,
    uses: Uses,
}

impl Building {
    fn local(
        &mut self,
        core: &Arc<crate::core::Core>,
        mem: &Arc<MemInner>,
        offset: u64,
    ) -> Res<LocalBuf> {
        if !Arc::ptr_eq(&mem.core, core) {
            return Err(Fail::new(
                Status::InvalidMemHandle,
                "the Memory is registered with another worker",
            ));
        }
        mem.check_live()?;
        if !self.uses.mems.iter().any(|m| Arc::ptr_eq(m, mem)) {
            self.uses.mems.push(mem.clone());
        }
        Ok(LocalBuf {
            mem: mem.handle.as_raw(),
            addr: mem.addr + offset,
        })
    }

    fn remote(
        &mut self,
        core: &Arc<crate::core::Core>,
        ep: EndpointId,
        remote: &Arc<RemoteInner>,
        offset: u64,
    ) -> Res<RemoteBuf> {
        if !Arc::ptr_eq(&remote.core, core) || remote.ep != ep {
            return Err(Fail::new(
                Status::InvalidRkey,
                "the RemoteMemory was unpacked for another endpoint: unpack the peer's key \
                 on the endpoint the batch is posted on",
            ));
        }
        remote.check_live()?;
        if !self.uses.remotes.iter().any(|r| Arc::ptr_eq(r, remote)) {
            self.uses.remotes.push(remote.clone());
        }
        Ok(RemoteBuf {
            rkey: remote.rkey.as_raw(),
            addr: remote.base + offset,
        })
    }
}
