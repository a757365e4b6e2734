//! Remote memory access on behalf of `Driver::post`: copies and hardware
//! atomics on a peer's memory mapped into this process, cross memory attach
//! (`process_vm_readv`/`process_vm_writev`) for a peer's memory that is not
//! in a memfd, and the two copies of a notification (into the channel on
//! the initiator, out of it into a notification buffer on the target).
//!
//! Every byte moves through the engine's copy primitive for memory a peer
//! may write concurrently ([`ringfence::peer_mem`]: an aligned 1, 2, 4 or
//! 8-byte PUT or GET is one atomic store and load; no Rust reference or
//! slice ever spans a mapping or a registration; see the `ringfence` crate
//! docs, "Memory shared with a peer"). It is inlined here: small copies
//! stay a few instructions, with no call into `memmove`.
//!
//! # Memory ordering
//! Copies are plain stores by this CPU into memory the peer maps too; a
//! copy is in the peer's memory when it returns (no device, no queue). What
//! the peer can rely on is ordering: a Release store after the copies
//! (the notification channel's tail) publishes them to the peer's Acquire
//! load, and `Driver::flush` issues a SeqCst fence (MFENCE on x86_64, DMB
//! ISH on aarch64), which also orders the weakly ordered stores a large
//! `memcpy` may use (non-temporal and fast-string stores) before anything
//! this process writes afterwards. Atomics are SeqCst read-modify-writes
//! (LOCK-prefixed on x86_64), coherent with the target's own atomics on
//! the same word whatever mapping either side uses.

use super::region::SharedRegion;
use ringfence::peer_mem::{copy_from_peer, copy_to_peer};
use ringfence::{NotifyPool, Op, OpKind};
use ringfence_ring::{AtomicOp, Status};
use std::sync::atomic::{AtomicU64, Ordering};

/// Asks the CPU to bring the cache line holding `at` into its cache, owned
/// for writing if `write` (PREFETCHW), so that a store after the
/// operation's checks finds the line here instead of starting the transfer
/// from the peer's CPU only then. A prefetch never faults and changes no
/// memory; PREFETCHW (`0F 0D /1`) executes as a no-op on x86_64 CPUs that
/// lack it. Not modelled by miri (no inline assembly): a no-op there.
#[inline(always)]
pub(crate) fn prefetch(at: *const u8, write: bool) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: a prefetch instruction reads no memory architecturally,
    // writes none and cannot fault, whatever the address.
    unsafe {
        if write {
            std::arch::asm!("prefetchw [{0}]", in(reg) at, options(nostack, preserves_flags, readonly));
        } else {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(at.cast());
        }
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = (at, write);
}

/// Runs a PUT, GET or ATOMIC on `region` (the peer's exported region,
/// mapped here), `offset` bytes into it. Bounds and alignment are checked
/// here before any byte moves.
///
/// `op`'s local range is the engine's, validated against a live local
/// registration (the `Driver::post` contract).
///
/// # Errors
/// [`Status::OutOfBounds`], [`Status::Misaligned`],
/// [`Status::InvalidLength`], [`Status::AccessDenied`] (a read-only
/// mapping), [`Status::InvalidArgument`] for a NOTIFY.
pub(crate) fn mapped(region: &SharedRegion, offset: u64, op: &Op) -> Result<u32, Status> {
    let len = op.len as usize;
    let remote = region
        .ptr_at(offset, u64::from(op.len))
        .ok_or(Status::OutOfBounds)?;
    let local = op.local_addr as usize as *mut u8;
    match op.kind {
        OpKind::Put => {
            if !region.is_writable() {
                return Err(Status::AccessDenied);
            }
            // SAFETY: the remote range is inside the writable mapping
            // (checked above; the memfd is sealed against shrinking, so no
            // page of it faults); the local range is readable (engine
            // contract). Both are reached through raw pointers only; the
            // copy tolerates overlap (a worker connected to itself).
            unsafe { copy_to_peer(local.cast_const(), remote, len) };
        }
        OpKind::Get => {
            // SAFETY: as for PUT, in the other direction; the local range is
            // writable (engine contract). A read-only mapping is fine: the
            // primitive's loads are plain or Relaxed atomic loads of at most
            // 8 bytes.
            unsafe { copy_from_peer(remote.cast_const(), local, len) };
        }
        OpKind::Atomic(aop) => {
            if op.len != 8 {
                return Err(Status::InvalidLength);
            }
            if !(remote as usize).is_multiple_of(8) {
                return Err(Status::Misaligned);
            }
            if !region.is_writable() {
                return Err(Status::AccessDenied);
            }
            // SAFETY: 8 aligned bytes inside the writable mapping (checked),
            // valid while `region` lives, which outlasts this call. The
            // target accesses words that peers update atomically only
            // atomically (the `Worker::register` contract).
            let word = unsafe { AtomicU64::from_ptr(remote.cast::<u64>()) };
            // SeqCst: atomics from several processes meet on this word; one
            // total order keeps their interleaving simple to state.
            let old = match aop {
                AtomicOp::ADD | AtomicOp::FADD => word.fetch_add(op.operand, Ordering::SeqCst),
                AtomicOp::SWAP => word.swap(op.operand, Ordering::SeqCst),
                _ => match word.compare_exchange(
                    op.operand,
                    op.operand2,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                ) {
                    Ok(old) | Err(old) => old,
                },
            };
            if aop.is_fetching() {
                // SAFETY: the engine checked that the local result word is
                // 8-aligned inside a live local registration. Stored
                // atomically so that a reader of its own buffer never sees
                // a torn value.
                unsafe { AtomicU64::from_ptr(local.cast::<u64>()) }.store(old, Ordering::Release);
            }
        }
        OpKind::Notify => return Err(Status::InvalidArgument),
    }
    Ok(op.len)
}

/// Runs a PUT or GET on the memory of process `pid` at `remote_addr` with
/// cross memory attach (one system call). The caller checked the bounds
/// against the key; the kernel checks that the pages exist and that this
/// process may access `pid` (same user, ptrace access mode).
///
/// # Errors
/// [`Status::Unsupported`] for atomics (no remote read-modify-write
/// through the kernel), [`Status::PeerUnreachable`] if the process is
/// gone, [`Status::AccessDenied`] if the pages are not mapped there or
/// access is not permitted, [`Status::Transport`] otherwise.
pub(crate) fn cma(pid: nix::unistd::Pid, remote_addr: u64, op: &Op) -> Result<u32, Status> {
    use nix::libc::{c_ulong, c_void, iovec};
    let len = op.len as usize;
    let remote = iovec {
        iov_base: usize::try_from(remote_addr).map_err(|_| Status::OutOfBounds)? as *mut c_void,
        iov_len: len,
    };
    // The local range as a raw `iovec`: the kernel reads or writes it, no
    // Rust code does, and no slice is made over it (the memory is a
    // registration that peers may write meanwhile).
    let local = iovec {
        iov_base: op.local_addr as usize as *mut c_void,
        iov_len: len,
    };
    let moved = match op.kind {
        // SAFETY: both iovecs are valid for the call (one element each);
        // the local range is readable memory of a live registration
        // (engine contract), and the kernel checks the remote one.
        OpKind::Put => unsafe {
            nix::libc::process_vm_writev(pid.as_raw(), &local, 1, &remote, 1, 0 as c_ulong)
        },
        // SAFETY: as for PUT; the local range is writable (engine
        // contract), and only the kernel writes it.
        OpKind::Get => unsafe {
            nix::libc::process_vm_readv(pid.as_raw(), &local, 1, &remote, 1, 0 as c_ulong)
        },
        OpKind::Atomic(_) => return Err(Status::Unsupported),
        OpKind::Notify => return Err(Status::InvalidArgument),
    };
    match moved {
        n if n >= 0 && n as usize == len => Ok(op.len),
        // A partial transfer stops at an unmapped page of the target.
        n if n >= 0 => Err(Status::AccessDenied),
        _ => match nix::errno::Errno::last() {
            nix::errno::Errno::ESRCH => Err(Status::PeerUnreachable),
            nix::errno::Errno::EFAULT | nix::errno::Errno::EPERM => Err(Status::AccessDenied),
            nix::errno::Errno::ENOMEM => Err(Status::NoResource),
            _ => Err(Status::Transport),
        },
    }
}

/// Copies a NOTIFY payload (`op`'s local range) into the channel at
/// `offset`; `false` (nothing written) if it does not fit there.
pub(crate) fn copy_payload(region: &SharedRegion, offset: u64, op: &Op) -> bool {
    if !region.is_writable() {
        return false;
    }
    let Some(dst) = region.ptr_at(offset, u64::from(op.len)) else {
        return false;
    };
    if op.len > 0 {
        // SAFETY: the destination is inside the writable channel mapping
        // (checked), which the peer reads (and could scribble on); the
        // source is the payload's local range (engine contract), which is
        // never inside a channel. Raw pointers only.
        unsafe { copy_to_peer(op.local_addr as usize as *const u8, dst, op.len as usize) };
    }
    true
}

/// Delivers the payload at `[offset, offset + len)` of an incoming channel
/// into one of `pool`'s buffers (the one copy on the target side).
///
/// # Errors
/// [`Status::OutOfBounds`] if the range is not inside the channel, or
/// `deliver`'s error ([`Status::NoResource`]: retry later).
pub(crate) fn deliver(
    pool: &NotifyPool,
    region: &SharedRegion,
    offset: u64,
    len: u32,
    tag: u64,
) -> Result<(), Status> {
    let src = region
        .ptr_at(offset, u64::from(len))
        .ok_or(Status::OutOfBounds)?;
    // SAFETY: `[src, src + len)` is inside the channel mapping (checked),
    // which the caller keeps mapped for the duration of the call. The peer
    // may scribble over it meanwhile: the buffer then holds garbage, never
    // more than `len` bytes.
    unsafe { pool.deliver(src as usize as u64, len, tag) }
}
