//! The exported functions. Each one runs its body through [`guard`] (panics
//! become `RF_EIO`), checks its pointers with the helpers here before
//! touching them, and names objects by generation-checked handles.
#![allow(unsafe_code)]

mod mem;
mod ring;
mod worker;

pub use mem::*;
pub use ring::*;
pub use worker::*;

use crate::table::Table;
use core::ffi::{c_int, c_void};
use ringfence_ring::Status;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// The longest address or key blob a function reads (real ones are tens of
/// bytes): a larger length is `RF_EINVALID_LENGTH`, before anything is read.
pub const RF_MAX_BLOB: usize = 1 << 16;

/// Runs an exported function's body: its value on success, the status on
/// failure, and `RF_EIO` if it panicked (a bug in the library; the default
/// panic hook has printed it). A panic never unwinds into C.
fn guard(body: impl FnOnce() -> Result<c_int, Status>) -> c_int {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(n)) => n,
        Ok(Err(status)) => status.as_raw(),
        Err(_) => Status::Io.as_raw(),
    }
}

/// A count as a return value (saturating: counts are small in practice).
fn count(n: usize) -> c_int {
    c_int::try_from(n).unwrap_or(c_int::MAX)
}

fn read<T>(table: &RwLock<Table<T>>) -> RwLockReadGuard<'_, Table<T>> {
    // A panic while a table was locked leaves it consistent (every update
    // is a single insert or remove); keep serving rather than poison C.
    table.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(table: &RwLock<Table<T>>) -> RwLockWriteGuard<'_, Table<T>> {
    table.write().unwrap_or_else(|e| e.into_inner())
}

/// Checks an output pointer: not NULL and aligned for `T`.
fn check_out<T>(p: *mut T) -> Result<*mut T, Status> {
    if p.is_null() || !p.is_aligned() {
        Err(Status::InvalidArgument)
    } else {
        Ok(p)
    }
}

/// Stores `value` through a pointer that [`check_out`] accepted.
///
/// # Safety
/// - `p` passed [`check_out`] and points to writable memory for a `T`.
unsafe fn store<T>(p: *mut T, value: T) {
    debug_assert!(check_out(p).is_ok());
    // SAFETY: not NULL, aligned (checked) and writable (contract).
    unsafe { p.write(value) }
}

/// The `len` bytes at `p`, for an input blob (an address or a key).
///
/// # Errors
/// `RF_EINVALID_ARGUMENT` for NULL; `RF_EINVALID_LENGTH` for zero or more
/// than [`RF_MAX_BLOB`].
///
/// # Safety
/// - If `p` is not NULL and `len` is within the limits, `p` points to `len`
///   readable bytes that nobody writes during the call.
unsafe fn blob<'a>(p: *const c_void, len: usize) -> Result<&'a [u8], Status> {
    if p.is_null() {
        return Err(Status::InvalidArgument);
    }
    if len == 0 || len > RF_MAX_BLOB {
        return Err(Status::InvalidLength);
    }
    // SAFETY: not NULL, and `len` readable bytes (contract); `u8` needs no
    // alignment.
    Ok(unsafe { core::slice::from_raw_parts(p.cast::<u8>(), len) })
}

/// The output-buffer convention of `rf_worker_address` and `rf_rkey_pack`:
/// `*len` always receives the full length; with `buf` NULL and `cap` 0 that
/// is all (a size query); a `cap` below the length is `RF_ETRUNCATED`.
///
/// # Safety
/// - `len` points to a writable `size_t` (or is NULL: refused).
/// - If `buf` is not NULL, it points to `cap` writable bytes.
unsafe fn copy_out(
    data: &[u8],
    buf: *mut c_void,
    cap: usize,
    len: *mut usize,
) -> Result<c_int, Status> {
    let len = check_out(len)?;
    if buf.is_null() && cap != 0 {
        return Err(Status::InvalidArgument);
    }
    // SAFETY: checked, writable (contract).
    unsafe { store(len, data.len()) };
    if buf.is_null() {
        return Ok(0);
    }
    if cap < data.len() {
        return Err(Status::Truncated);
    }
    // SAFETY: `buf` has `cap >= data.len()` writable bytes (contract) and
    // cannot overlap `data`, which the library owns.
    unsafe { core::ptr::copy_nonoverlapping(data.as_ptr(), buf.cast::<u8>(), data.len()) };
    Ok(0)
}

/// Registers the `fork()` child handler that makes a parent's handles
/// stale in the child (`table`).
pub(crate) fn watch_forks() {
    // SAFETY: registers a handler that only does an atomic add, which is
    // async-signal-safe as a fork child handler must be; nothing else is
    // passed.
    let rc = unsafe { libc::pthread_atfork(None, None, Some(crate::table::count_fork_in_child)) };
    debug_assert_eq!(rc, 0, "pthread_atfork failed");
}
