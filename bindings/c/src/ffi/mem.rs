//! Memory: register, allocate, free, deregister, and remote keys.

use super::worker::{WorkerEntry, with_worker};
use super::{check_out, guard, store};
use crate::abi::rf_worker_t;
use core::ffi::{c_int, c_void};
use ringfence::{MemHandle, MemKind};
use ringfence_ring::Status;

/// The engine's handle for memory handle `raw` of this worker.
fn mem_handle(w: &WorkerEntry, raw: u32) -> Result<MemHandle, Status> {
    w.ids()
        .memory
        .get(&raw)
        .map(|(handle, _)| *handle)
        .ok_or(Status::InvalidMemHandle)
}

/// Registers `[addr, addr + len)` for local use in SQEs (`local_mem`) and
/// for remote access by peers given its key (`rf_rkey_pack`); stores the
/// memory handle in `*mem`.
///
/// Returns 0; `RF_EINVALID_ARGUMENT` for NULL `addr` or `mem`;
/// `RF_EINVALID_LENGTH` for a zero `len`, one above `PTRDIFF_MAX`, or a
/// range that wraps the address space; `RF_ENO_RESOURCE` when 65,536
/// registrations exist; `RF_ESTALE_HANDLE`.
///
/// # Safety
/// - The range is memory of this process that stays valid and writable
///   until `rf_mem_deregister` or `rf_worker_destroy` (the library cannot
///   check this: registering memory that is not yours is undefined).
/// - Peers and the engine may write it at any time while it is registered.
/// - `mem` is NULL or points to a writable `uint32_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rf_mem_register(
    worker: rf_worker_t,
    addr: *mut c_void,
    len: usize,
    mem: *mut u32,
) -> c_int {
    guard(|| {
        let out = check_out(mem)?;
        if addr.is_null() {
            return Err(Status::InvalidArgument);
        }
        if len == 0 || isize::try_from(len).is_err() || (addr as usize).checked_add(len).is_none() {
            return Err(Status::InvalidLength);
        }
        let handle = with_worker(worker, |w| {
            // SAFETY: the range stays valid, writable memory until
            // deregistered or the worker is destroyed, and may be written by
            // peers meanwhile (the caller's contract, passed on).
            let handle = unsafe { w.worker.register(addr.cast(), len, MemKind::Host) }
                .map_err(|e| e.status())?;
            w.ids().memory.insert(handle.as_raw(), (handle, None));
            Ok(handle)
        })?;
        // SAFETY: checked; writable (contract).
        unsafe { store(out, handle.as_raw()) };
        Ok(0)
    })
}

/// Allocates `len` zeroed, 64-byte aligned bytes and registers them (from
/// the shm driver's sealed memfd when the worker has it, so that peers map
/// it directly); stores the address in `*addr` and the memory handle in
/// `*mem`. Free it with `rf_mem_free` (or `rf_mem_deregister`); it is also
/// freed by `rf_worker_destroy`.
///
/// The memory limit: `len` rounded up to whole pages, plus the
/// process's live ringfence allocations (memory from `rf_mem_alloc`,
/// workers' notification buffers), must fit in the smallest of physical
/// memory plus swap, the cgroup's memory limit (v2 `memory.max` plus
/// `memory.swap.max`, v1 `memory.limit_in_bytes`, of the process's cgroup
/// and its ancestors) and a finite `RLIMIT_AS` or `RLIMIT_DATA`, as read
/// when the worker was created; beyond it the call fails at once. Memory
/// from the shm driver is allocated in full here (it is there, or the call
/// fails); heap memory is zeroed by the kernel page by page as first
/// touched.
///
/// Returns 0; `RF_EINVALID_ARGUMENT` for NULL `addr` or `mem`;
/// `RF_EINVALID_LENGTH` for a zero `len` or one above `PTRDIFF_MAX`;
/// `RF_ENO_MEMORY` beyond the memory limit or if it cannot be had;
/// `RF_ESTALE_HANDLE`.
///
/// # Safety
/// - `addr` is NULL or points to a writable `void *`; `mem` is NULL or
///   points to a writable `uint32_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rf_mem_alloc(
    worker: rf_worker_t,
    len: usize,
    addr: *mut *mut c_void,
    mem: *mut u32,
) -> c_int {
    guard(|| {
        let (addr_out, mem_out) = (check_out(addr)?, check_out(mem)?);
        if len == 0 || isize::try_from(len).is_err() {
            return Err(Status::InvalidLength);
        }
        let buf = with_worker(worker, |w| {
            let buf = w.worker.alloc_registered(len).map_err(|e| e.status())?;
            w.ids()
                .memory
                .insert(buf.handle().as_raw(), (buf.handle(), Some(buf.clone())));
            Ok(buf)
        })?;
        let ptr = usize::try_from(buf.addr()).map_err(|_| Status::NoMemory)? as *mut c_void;
        // SAFETY: both checked; writable (contract).
        unsafe {
            store(addr_out, ptr);
            store(mem_out, buf.handle().as_raw());
        }
        Ok(0)
    })
}

fn deregister(worker: rf_worker_t, mem: u32, only_allocated: bool) -> Result<c_int, Status> {
    with_worker(worker, |w| {
        let mut ids = w.ids();
        let handle = match ids.memory.get(&mem) {
            Some((_, None)) if only_allocated => return Err(Status::InvalidMemHandle),
            Some((handle, _)) => *handle,
            None => return Err(Status::InvalidMemHandle),
        };
        w.worker.deregister(handle).map_err(|e| e.status())?;
        // Memory from `rf_mem_alloc` goes with its last handle: here, or
        // when the engine lets go of it.
        ids.memory.remove(&mem);
        Ok(0)
    })
}

/// Withdraws a registration (`rf_mem_register` or `rf_mem_alloc`; memory
/// from `rf_mem_alloc` is freed once no driver can touch it). Fails
/// cleanly, changing nothing, while operations that use it are in flight.
/// For memory from `rf_mem_register`, 0 means that no driver can touch it
/// any more and it may be freed; while a driver still holds it (a peer's
/// PUT still arriving), the handle is withdrawn but this returns
/// `RF_EBUSY`: keep the memory, progress, and call again with the same
/// handle (for ever `RF_EBUSY` if a driver can never release it: then the
/// memory must never be freed).
///
/// Returns 0; `RF_EINVALID_MEM_HANDLE` for a handle that is not a live
/// registration of this worker (a second deregistration included);
/// `RF_EBUSY` while in use or held; `RF_ESTALE_HANDLE`.
#[unsafe(no_mangle)]
pub extern "C" fn rf_mem_deregister(worker: rf_worker_t, mem: u32) -> c_int {
    guard(|| deregister(worker, mem, false))
}

/// Deregisters and frees memory from `rf_mem_alloc`.
///
/// Returns 0; `RF_EINVALID_MEM_HANDLE` for a handle that is not a live
/// allocation of this worker (a double free, or memory from
/// `rf_mem_register`); `RF_EBUSY` while in use; `RF_ESTALE_HANDLE`.
#[unsafe(no_mangle)]
pub extern "C" fn rf_mem_free(worker: rf_worker_t, mem: u32) -> c_int {
    guard(|| deregister(worker, mem, true))
}

/// Copies the remote key of registration `mem` (a blob for a peer's
/// `rf_rkey_unpack`: exact bounds and a random secret) into `buf`, and its
/// length into `*len`; `buf` NULL with `cap` 0 is a size query.
///
/// Returns 0; `RF_ETRUNCATED` if `cap` is too small (`*len` holds the size
/// needed); `RF_EINVALID_MEM_HANDLE`; `RF_EINVALID_ARGUMENT` for a NULL
/// `len`, or a NULL `buf` with a non-zero `cap`; `RF_ESTALE_HANDLE`.
///
/// # Safety
/// - `buf` is NULL or points to `cap` writable bytes.
/// - `len` is NULL or points to a writable `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rf_rkey_pack(
    worker: rf_worker_t,
    mem: u32,
    buf: *mut c_void,
    cap: usize,
    len: *mut usize,
) -> c_int {
    guard(|| {
        let blob = with_worker(worker, |w| {
            w.worker
                .pack_rkey(mem_handle(w, mem)?)
                .map_err(|e| e.status())
        })?;
        // SAFETY: `buf` and `len` as the contract says.
        unsafe { super::copy_out(&blob, buf, cap, len) }
    })
}

/// The remote region that remote key `rkey` (from `rf_rkey_unpack` on
/// endpoint `ep`) reaches: stores its base in `*base`, the target's own
/// virtual address of the window, which is the address PUTs and GETs
/// name, and its length in bytes in `*len`.
///
/// Returns 0; `RF_EINVALID_RKEY` if `rkey` was not unpacked for `ep`;
/// `RF_EINVALID_ENDPOINT`; `RF_EINVALID_ARGUMENT` for NULL pointers;
/// `RF_ESTALE_HANDLE`.
///
/// # Safety
/// - `base` and `len` are NULL or point to writable `uint64_t`s.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rf_rkey_bounds(
    worker: rf_worker_t,
    ep: u32,
    rkey: u32,
    base: *mut u64,
    len: *mut u64,
) -> c_int {
    guard(|| {
        let (out_base, out_len) = (check_out(base)?, check_out(len)?);
        let (b, l) = with_worker(worker, |w| {
            let ep = *w.ids().endpoints.get(&ep).ok_or(Status::InvalidEndpoint)?;
            w.worker
                .rkey_bounds(ep, ringfence::RkeyId::from_raw(rkey))
                .map_err(|e| e.status())
        })?;
        // SAFETY: checked; writable (contract).
        unsafe {
            store(out_base, b);
            store(out_len, l);
        }
        Ok(0)
    })
}

/// Turns a peer's key blob (the `len` bytes at `blob`, from its
/// `rf_rkey_pack`) into a remote key id for SQEs on endpoint `ep`
/// (`rkey`); stores it in `*rkey`.
///
/// The whole blob is checked first, field by field and against its
/// integrity check (a CRC-32C), so that a damaged one is refused before
/// anything is sent to the target.
///
/// Returns 0; `RF_EINVALID_ARGUMENT` for NULL pointers, or a blob that is
/// malformed or damaged (a flipped bit, cut short, bytes after its end),
/// its driver's part included; `RF_EINVALID_RKEY` if the endpoint's
/// driver refuses the key (it belongs to another peer, or names no region
/// the target exports with those bounds); `RF_EINVALID_LENGTH` for a zero
/// `len` or one over `RF_MAX_BLOB`; `RF_EINVALID_ENDPOINT`; the target's
/// refusal (`RF_EACCESS_DENIED` for a wrong secret); `RF_ESTALE_HANDLE`.
///
/// # Safety
/// - `blob` is NULL or points to `len` readable bytes.
/// - `rkey` is NULL or points to a writable `uint32_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rf_rkey_unpack(
    worker: rf_worker_t,
    ep: u32,
    blob: *const c_void,
    len: usize,
    rkey: *mut u32,
) -> c_int {
    guard(|| {
        let out = check_out(rkey)?;
        // SAFETY: `len` readable bytes (contract).
        let blob = unsafe { super::blob(blob, len) }?;
        let id = with_worker(worker, |w| {
            let ep = *w.ids().endpoints.get(&ep).ok_or(Status::InvalidEndpoint)?;
            w.worker.unpack_rkey(ep, blob).map_err(|e| e.status())
        })?;
        // SAFETY: checked; writable (contract).
        unsafe { store(out, id.as_raw()) };
        Ok(0)
    })
}

/// Releases remote key `rkey` (from `rf_rkey_unpack`): each driver frees
/// what unpacking it made (a table entry, a device mapping), and the id is
/// stale from now on (SQEs naming it fail with `RF_EINVALID_RKEY`). Keys
/// still unpacked when their endpoint closes, or the worker is destroyed,
/// are released then.
///
/// Returns 0; `RF_EINVALID_RKEY` for an id that is not a live key of this
/// worker (a second release included); `RF_EBUSY`, changing nothing,
/// while the key's endpoint has operations queued or in flight (release
/// it after they completed); `RF_EINVALID_ARGUMENT` for a NULL `worker`;
/// `RF_ESTALE_HANDLE`.
#[unsafe(no_mangle)]
pub extern "C" fn rf_rkey_release(worker: rf_worker_t, rkey: u32) -> c_int {
    guard(|| {
        with_worker(worker, |w| {
            w.worker
                .release_rkey(ringfence::RkeyId::from_raw(rkey))
                .map_err(|e| e.status())
        })?;
        Ok(0)
    })
}
