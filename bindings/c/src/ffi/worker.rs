//! Workers: create, destroy, address, connect, progress, the core thread,
//! and the status and version queries.

use super::{check_out, count, guard, read, store, write};
use crate::abi::{
    RF_EP_CLOSED, RF_EP_CLOSING, RF_EP_CONNECTED, RF_EP_CONNECTING, RF_EP_FAILED, RF_VERSION,
    rf_fence_state, rf_worker_config, rf_worker_t,
};
use crate::table::{Kind, Table};
use core::ffi::{c_char, c_int, c_void};
use ringfence::{
    Config, EndpointId, EndpointState, Loopback, MemHandle, RegisteredBuf, Worker, WorkerBuilder,
};
use ringfence_ring::{MAX_ENTRIES, Status};
use std::collections::HashMap;
use std::ffi::CString;
use std::panic::catch_unwind;
use std::sync::{Mutex, OnceLock, RwLock};

/// A live worker and the engine's handles that C holds as raw ids.
#[derive(Debug)]
pub(crate) struct WorkerEntry {
    pub(crate) worker: Worker,
    pub(crate) ids: Mutex<Ids>,
}

/// What a raw id from C stands for. The engine checks these values again
/// (memory handles carry a generation); the maps turn C's integers back
/// into the engine's typed handles.
#[derive(Debug, Default)]
pub(crate) struct Ids {
    /// Endpoints from `rf_ep_connect`, by id.
    pub(crate) endpoints: HashMap<u32, EndpointId>,
    /// Registrations, by memory handle, with the buffer for memory from
    /// `rf_mem_alloc` (kept until it is freed).
    pub(crate) memory: HashMap<u32, (MemHandle, Option<RegisteredBuf>)>,
}

impl WorkerEntry {
    pub(crate) fn ids(&self) -> std::sync::MutexGuard<'_, Ids> {
        self.ids.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Every live worker. Data-path calls take the read lock; create, destroy
/// and core thread start/stop the write lock. Lock order: `WORKERS`, then
/// `RINGS`.
pub(crate) static WORKERS: RwLock<Table<WorkerEntry>> = RwLock::new(Table::new(Kind::Worker));

/// Runs `f` on the live worker `handle` names, under the read lock.
pub(crate) fn with_worker<R>(
    handle: rf_worker_t,
    f: impl FnOnce(&WorkerEntry) -> Result<R, Status>,
) -> Result<R, Status> {
    f(read(&WORKERS).get(handle)?)
}

const DEFAULT_DRIVERS: &str = if cfg!(feature = "shm") {
    "shm"
} else {
    "loopback"
};

/// The longest `drivers` string read (to its NUL).
const MAX_DRIVERS_LEN: usize = 1024;

/// The NUL-terminated string at `p`, at most [`MAX_DRIVERS_LEN`] bytes.
///
/// # Safety
/// - `p` is NULL or points to readable bytes up to a NUL or
///   `MAX_DRIVERS_LEN` bytes, whichever comes first.
unsafe fn c_str(p: *const c_char) -> Result<Option<String>, Status> {
    if p.is_null() {
        return Ok(None);
    }
    let mut bytes = Vec::new();
    for i in 0..MAX_DRIVERS_LEN {
        // SAFETY: every byte up to the NUL (or the limit) is readable
        // (contract), and `i` has not passed either.
        let b = unsafe { p.add(i).cast::<u8>().read() };
        if b == 0 {
            return String::from_utf8(bytes)
                .map(Some)
                .map_err(|_| Status::InvalidArgument);
        }
        bytes.push(b);
    }
    Err(Status::InvalidArgument)
}

/// Applies a C configuration to a builder (drivers included).
fn configure(
    builder: &mut WorkerBuilder,
    config: &rf_worker_config,
    drivers: &str,
) -> Result<(), Status> {
    if config.reserved != [0; 7] {
        return Err(Status::InvalidArgument);
    }
    let defaults = Config::default();
    let mut any = false;
    let mut seen: Vec<&str> = Vec::new();
    for name in drivers.split(',').map(str::trim) {
        // A name given twice is the one driver (a worker has at most one
        // driver of each name).
        if seen.contains(&name) {
            continue;
        }
        seen.push(name);
        match name {
            "loopback" => {
                builder.driver(Loopback::new());
            }
            #[cfg(feature = "shm")]
            "shm" => {
                let shm = ringfence_shm::Shm::new().map_err(|_| Status::Io)?;
                builder.driver(shm);
            }
            #[cfg(feature = "tcp")]
            "tcp" => {
                let tcp = if config.ignore_env != 0 {
                    ringfence_tcp::Tcp::builder().ignore_env().build()
                } else {
                    ringfence_tcp::Tcp::new()
                };
                builder.driver(tcp.map_err(|e| e.status)?);
            }
            _ => return Err(Status::InvalidArgument),
        }
        any = true;
    }
    if !any {
        return Err(Status::InvalidArgument);
    }
    match (config.sq_entries, config.cq_entries) {
        (0, 0) => {}
        (sq, 0) => {
            builder.ring_entries(sq, sq.saturating_mul(2).min(MAX_ENTRIES));
        }
        (0, cq) => {
            builder.ring_entries(defaults.sq_entries, cq);
        }
        (sq, cq) => {
            builder.ring_entries(sq, cq);
        }
    }
    if config.requests != 0 {
        builder.requests(config.requests);
    }
    if config.lanes != 0 {
        builder.lanes(u8::try_from(config.lanes).map_err(|_| Status::InvalidArgument)?);
    }
    if config.notify_buffers != 0 || config.notify_size != 0 {
        let pick = |v: u32, default: u32| if v == 0 { default } else { v };
        builder.notify_buffers(
            pick(config.notify_buffers, defaults.notify_buffers),
            pick(config.notify_size, defaults.notify_size),
        );
    }
    if config.ignore_env != 0 {
        builder.ignore_env();
    }
    Ok(())
}

/// The default configuration: every number zero (the defaults), the default
/// drivers, no core thread, environment variables honoured.
fn default_config() -> rf_worker_config {
    rf_worker_config {
        drivers: core::ptr::null(),
        sq_entries: 0,
        cq_entries: 0,
        requests: 0,
        lanes: 0,
        notify_buffers: 0,
        notify_size: 0,
        core_thread: 0,
        core_cpu: -1,
        ignore_env: 0,
        reserved: [0; 7],
    }
}

fn core_cpu(cpu: c_int) -> Option<usize> {
    usize::try_from(cpu).ok()
}

/// Fills `*config` with the defaults: every number zero (meaning the
/// library's default or the `RINGFENCE_*` variable), NULL drivers (`"shm"`
/// when the library has it, else `"loopback"`), no core thread, `core_cpu`
/// -1, environment variables honoured.
///
/// Returns 0, or `RF_EINVALID_ARGUMENT` for a NULL or misaligned `config`.
///
/// # Safety
/// - `config` is NULL or points to a writable `struct rf_worker_config`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rf_worker_config_init(config: *mut rf_worker_config) -> c_int {
    guard(|| {
        let config = check_out(config)?;
        // SAFETY: checked; writable (contract).
        unsafe { store(config, default_config()) };
        Ok(0)
    })
}

/// Creates a worker from `config` (NULL: the defaults of
/// `rf_worker_config_init`) and stores its handle in `*worker`; starts its
/// core thread if `config->core_thread` is set.
///
/// Returns 0; `RF_EINVALID_ARGUMENT` for a NULL `worker`, an unknown driver
/// name, a non-zero reserved field or a bad value (entries not a power of
/// two, lanes outside 1 to `RF_MAX_LANES`, a malformed `RINGFENCE_*`
/// variable);
/// `RF_ENO_MEMORY` if the notification buffers (`notify_buffers` times
/// `notify_size` bytes) exceed the memory limit (see `rf_mem_alloc`) or
/// cannot be allocated; a large pool is not touched here: the kernel
/// zeroes its pages as buffers are first used;
/// `RF_EIO` if a driver or the core thread cannot start. `*worker` is
/// written only on success.
///
/// # Safety
/// - `config` is NULL or points to a readable `struct rf_worker_config`
///   whose `drivers` is NULL or a NUL-terminated string.
/// - `worker` is NULL or points to a writable `rf_worker_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rf_worker_create(
    config: *const rf_worker_config,
    worker: *mut rf_worker_t,
) -> c_int {
    guard(|| {
        let out = check_out(worker)?;
        let config = if config.is_null() {
            default_config()
        } else if !config.is_aligned() {
            return Err(Status::InvalidArgument);
        } else {
            // SAFETY: not NULL, aligned, readable (contract); the struct is
            // plain data, valid for any bits.
            unsafe { config.read() }
        };
        // SAFETY: NULL or NUL-terminated (contract).
        let drivers = unsafe { c_str(config.drivers) }?;
        let mut builder = Worker::builder();
        configure(
            &mut builder,
            &config,
            drivers.as_deref().unwrap_or(DEFAULT_DRIVERS),
        )?;
        let mut w = builder.build().map_err(|e| e.status())?;
        if config.core_thread != 0 {
            w.start_core_thread(core_cpu(config.core_cpu))
                .map_err(|e| e.status())?;
        }
        let handle = write(&WORKERS).insert(WorkerEntry {
            worker: w,
            ids: Mutex::default(),
        })?;
        // SAFETY: checked above; writable (contract).
        unsafe { store(out, handle) };
        Ok(0)
    })
}

/// Destroys a worker: stops its core thread, cancels what is outstanding,
/// and frees its registrations (memory from `rf_mem_alloc` included).
///
/// Returns 0; `RF_ESTALE_HANDLE` for a destroyed worker (a second destroy
/// included); `RF_EINVALID_ARGUMENT` for 0 or a handle that is not a
/// worker's; `RF_EBUSY` while one of its rings lives (destroy rings
/// first).
#[unsafe(no_mangle)]
pub extern "C" fn rf_worker_destroy(worker: rf_worker_t) -> c_int {
    guard(|| {
        let entry = {
            let mut workers = write(&WORKERS);
            workers.get(worker)?;
            if super::ring::worker_has_rings(worker) {
                return Err(Status::Busy);
            }
            workers.remove(worker)?
        };
        // Dropped outside the lock: this joins the core thread.
        drop(entry);
        Ok(0)
    })
}

/// Copies the worker's address (for peers' `rf_ep_connect`) into `buf` and
/// its length into `*len`. With `buf` NULL and `cap` 0, only `*len` is
/// written (a size query).
///
/// Returns 0; `RF_ETRUNCATED` if `cap` is too small (`*len` holds the size
/// needed); `RF_EINVALID_ARGUMENT` for a NULL `len`, or a NULL `buf` with
/// a non-zero `cap`; `RF_ESTALE_HANDLE`.
///
/// # Safety
/// - `buf` is NULL or points to `cap` writable bytes.
/// - `len` is NULL or points to a writable `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rf_worker_address(
    worker: rf_worker_t,
    buf: *mut c_void,
    cap: usize,
    len: *mut usize,
) -> c_int {
    guard(|| {
        // SAFETY: `buf` and `len` as the contract says.
        with_worker(worker, |w| unsafe {
            super::copy_out(w.worker.address(), buf, cap, len)
        })
    })
}

/// Connects to the peer whose address (from its `rf_worker_address`) is
/// the `len` bytes at `addr`; stores the endpoint id for SQEs in `*ep`.
///
/// Never blocks on the peer: the endpoint is usable at once. A driver that
/// needs a handshake (tcp, verbs) finishes it through progress; SQEs
/// submitted meanwhile queue in order and start once it is up, or each
/// completes with the handshake's error. `rf_ep_state` tells where it is.
///
/// Returns 0; `RF_EINVALID_ARGUMENT` for NULL pointers, or an address
/// that is malformed or damaged (it fails its integrity check: a flipped
/// bit, cut short, bytes after its end); `RF_EINVALID_LENGTH` for a zero
/// `len` or one over
/// `RF_MAX_BLOB`; `RF_EPEER_UNREACHABLE` if no driver is shared or the peer
/// is known unreachable at once; `RF_ESTALE_HANDLE`.
///
/// # Safety
/// - `addr` is NULL or points to `len` readable bytes.
/// - `ep` is NULL or points to a writable `uint32_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rf_ep_connect(
    worker: rf_worker_t,
    addr: *const c_void,
    len: usize,
    ep: *mut u32,
) -> c_int {
    guard(|| {
        let out = check_out(ep)?;
        // SAFETY: `len` readable bytes (contract).
        let addr = unsafe { super::blob(addr, len) }?;
        let id = with_worker(worker, |w| {
            let id = w.worker.connect(addr).map_err(|e| e.status())?;
            w.ids().endpoints.insert(id.as_raw(), id);
            Ok(id)
        })?;
        // SAFETY: checked; writable (contract).
        unsafe { store(out, id.as_raw()) };
        Ok(0)
    })
}

/// Where endpoint `ep` is: `RF_EP_CONNECTING`, `RF_EP_CONNECTED`,
/// `RF_EP_CLOSING`, `RF_EP_FAILED` (its sticky first error, a negative
/// `rf_status`, is stored in `*error` when `error` is not NULL) or
/// `RF_EP_CLOSED`. A snapshot: progress may change it at any time.
///
/// Returns the state (non-negative); `RF_EINVALID_ENDPOINT` for an id
/// `rf_ep_connect` did not hand out; `RF_ESTALE_HANDLE`;
/// `RF_EINVALID_ARGUMENT` for a handle that is not a worker's.
///
/// # Safety
/// - `error` is NULL or points to a writable `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rf_ep_state(worker: rf_worker_t, ep: u32, error: *mut c_int) -> c_int {
    guard(|| {
        let state = with_worker(worker, |w| {
            let id = *w.ids().endpoints.get(&ep).ok_or(Status::InvalidEndpoint)?;
            w.worker.endpoint_state(id).map_err(|e| e.status())
        })?;
        Ok(match state {
            EndpointState::Connecting => RF_EP_CONNECTING,
            EndpointState::Connected => RF_EP_CONNECTED,
            EndpointState::Closing => RF_EP_CLOSING,
            EndpointState::Failed(status) => {
                if !error.is_null() {
                    // SAFETY: not NULL, writable (contract).
                    unsafe { store(error, status.as_raw()) };
                }
                RF_EP_FAILED
            }
            // A state added later reads as closed to a C caller built
            // before it.
            _ => RF_EP_CLOSED,
        })
    })
}

/// Stores a snapshot of endpoint `ep`'s fence engine in `*state`: its
/// epochs, dirty and covered lanes, the fence flush in flight, the weak
/// admission, the deferred and in-flight counts, and its fence and flush
/// counters by cause.
///
/// Returns 0; `RF_EINVALID_ARGUMENT` if `state` is NULL or misaligned;
/// `RF_EINVALID_ENDPOINT` for an id `rf_ep_connect` did not hand out;
/// `RF_ESTALE_HANDLE`.
///
/// # Safety
/// - `state` is NULL or points to a writable `struct rf_fence_state`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rf_ep_fence_state(
    worker: rf_worker_t,
    ep: u32,
    state: *mut rf_fence_state,
) -> c_int {
    guard(|| {
        let out = check_out(state)?;
        let (f, s) = with_worker(worker, |w| {
            let id = *w.ids().endpoints.get(&ep).ok_or(Status::InvalidEndpoint)?;
            let f = w.worker.fence_state(id).map_err(|e| e.status())?;
            let s = w.worker.endpoint_stats(id).ok_or(Status::InvalidEndpoint)?;
            Ok((f, s))
        })?;
        let (flushing_lanes, fence_target) = f.fence_flush.unwrap_or_default();
        let (weak_lane, weak_epoch) = f.weak.unwrap_or((u8::MAX, 0));
        let snapshot = rf_fence_state {
            submit_epoch: f.submit_epoch,
            admitted_epoch: f.admitted_epoch,
            dirty_lanes: f.dirty_lanes,
            covered_lanes: f.covered_lanes,
            flushing_lanes,
            fence_target,
            weak_epoch,
            fences: s.fences,
            weak_fences: s.weak_fences,
            fence_flushes: s.fence_flushes,
            notify_flushes: s.notify_flushes,
            user_flushes: s.user_flushes,
            worker_flushes: s.worker_flushes,
            deferred: f.deferred,
            in_flight: f.in_flight,
            weak_lane,
            reserved: [0; 7],
        };
        // SAFETY: checked; writable (contract).
        unsafe { store(out, snapshot) };
        Ok(0)
    })
}

/// One bounded round of progress on the caller's thread: drains the rings'
/// SQs, advances fences, polls the drivers, posts CQEs.
///
/// Returns how much work it did (0: nothing to do);
/// `RF_ERING_CORRUPT` while a ring of this worker that the engine failed
/// (it found the ring memory corrupt; see the inline helpers' "A failed
/// ring") is not destroyed yet: the round ran all the same, and the other
/// rings keep working; that ring's own calls (`rf_ring_check`,
/// `rf_wait_cqes`, `rf_peek_cqe`) say which it is; `rf_ring_destroy` it.
/// Or `RF_ESTALE_HANDLE`/`RF_EINVALID_ARGUMENT`. Takes no global lock other
/// than the handle table's read lock.
#[unsafe(no_mangle)]
pub extern "C" fn rf_progress(worker: rf_worker_t) -> c_int {
    guard(|| with_worker(worker, |w| Ok(count(w.worker.progress_checked()?))))
}

/// Starts the worker's core thread, which runs progress and busy-polls,
/// sleeping only when nothing is in flight (an `rf_submit` wakes it).
/// `cpu` >= 0 pins it to that CPU; negative: `RINGFENCE_CORE_CPU`, else
/// not pinned.
///
/// Returns 0; `RF_EBUSY` if one runs already; `RF_EIO` (or the reason) if
/// the CPU cannot be used; `RF_ESTALE_HANDLE`.
#[unsafe(no_mangle)]
pub extern "C" fn rf_core_thread_start(worker: rf_worker_t, cpu: c_int) -> c_int {
    guard(|| {
        let mut workers = write(&WORKERS);
        let entry = workers.get_mut(worker)?;
        entry
            .worker
            .start_core_thread(core_cpu(cpu))
            .map_err(|e| e.status())?;
        Ok(0)
    })
}

/// Stops the core thread, if one runs (waits for it); progress is then the
/// caller's (`rf_progress`).
///
/// Returns 0 or `RF_ESTALE_HANDLE`/`RF_EINVALID_ARGUMENT`.
#[unsafe(no_mangle)]
pub extern "C" fn rf_core_thread_stop(worker: rf_worker_t) -> c_int {
    guard(|| {
        let mut workers = write(&WORKERS);
        workers.get_mut(worker)?.worker.stop_core_thread();
        Ok(0)
    })
}

/// A static, NUL-terminated description of any status or result: "success"
/// for zero and above, the status's message for a known negative value,
/// "unknown status" otherwise. Never NULL.
#[unsafe(no_mangle)]
pub extern "C" fn rf_strerror(status: c_int) -> *const c_char {
    static MESSAGES: OnceLock<Vec<CString>> = OnceLock::new();
    let message = catch_unwind(|| {
        let messages = MESSAGES.get_or_init(|| {
            // Index 0: "success"; 1..=N: the statuses in `Status::ALL`'s
            // order; N + 1: unknown.
            let mut all = vec!["success"];
            all.extend(Status::ALL.iter().map(|s| s.message()));
            all.push(ringfence_ring::strerror(i32::MIN));
            all.into_iter()
                .map(|m| CString::new(m).expect("messages have no NUL"))
                .collect()
        });
        let unknown = messages.len() - 1;
        let index = if status >= 0 {
            0
        } else {
            Status::ALL
                .iter()
                .position(|s| s.as_raw() == status)
                .map_or(unknown, |i| i + 1)
        };
        messages[index.min(unknown)].as_ptr()
    });
    message.unwrap_or(c"unknown status".as_ptr())
}

/// The library version, `major << 16 | minor << 8 | patch`; compare with
/// the header's `RF_VERSION`.
#[unsafe(no_mangle)]
pub extern "C" fn rf_version() -> u32 {
    RF_VERSION
}
