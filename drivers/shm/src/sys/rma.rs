//! Remote memory access on behalf of `Driver::post`: copies and hardware
//! atomics on a peer's memory mapped into this process, cross memory attach
//! (`process_vm_readv`/`process_vm_writev`) for a peer's memory that is not
//! in a memfd, and the two copies of a notification (into the channel on
//! the initiator, out of it into a notification buffer on the target).
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
use ringfence::{NotifyPool, Op, OpKind};
use ringfence_ring::{AtomicOp, Status};
use std::io::{IoSlice, IoSliceMut};
use std::sync::atomic::{AtomicU64, Ordering};

/// Copies `len` bytes from `src` to `dst` (the ranges may overlap). Up to
/// 16 bytes, with at most two loads then two stores, inline: a call into
/// the C library's `memmove` costs more than an 8-byte PUT itself. Sizes of
/// 4, 8 and 16 bytes store each byte once: a peer spinning on the word must
/// not see its cache line taken back by a second store of the same bytes
/// (one more line transfer on a ping-pong's critical path).
///
/// # Safety
/// As [`std::ptr::copy`]: `src` readable and `dst` writable for `len`
/// bytes.
#[inline]
pub(crate) unsafe fn copy(src: *const u8, dst: *mut u8, len: usize) {
    // SAFETY: in every arm, each load and store covers a sub-range of
    // `[0, len)` of its pointer, which the caller makes valid; unaligned
    // accesses are used throughout except the aligned word's atomic
    // store, whose pointer the match guard checked for 8-byte alignment
    // (`AtomicU64::from_ptr` needs that, and 8 valid bytes, which `len`
    // gives); all loads precede the stores, so overlapping ranges copy as
    // `ptr::copy` would.
    unsafe {
        match len {
            // An aligned word lands with one atomic store: a peer polling it
            // (with `rf_load_u64` or `RegisteredBuf::load_u64`) sees the
            // old or the new value, never a mix (the documented guarantee
            // of an aligned 8-byte PUT).
            8 if dst.cast::<u64>().is_aligned() => AtomicU64::from_ptr(dst.cast::<u64>())
                .store(src.cast::<u64>().read_unaligned(), Ordering::Release),
            8 => dst
                .cast::<u64>()
                .write_unaligned(src.cast::<u64>().read_unaligned()),
            4 => dst
                .cast::<u32>()
                .write_unaligned(src.cast::<u32>().read_unaligned()),
            9..=16 => {
                // 16: two halves; 9..=15: two overlapping words.
                let (a, b) = (
                    src.cast::<u64>().read_unaligned(),
                    src.add(len - 8).cast::<u64>().read_unaligned(),
                );
                dst.cast::<u64>().write_unaligned(a);
                dst.add(len - 8).cast::<u64>().write_unaligned(b);
            }
            5..=7 => {
                let (a, b) = (
                    src.cast::<u32>().read_unaligned(),
                    src.add(len - 4).cast::<u32>().read_unaligned(),
                );
                dst.cast::<u32>().write_unaligned(a);
                dst.add(len - 4).cast::<u32>().write_unaligned(b);
            }
            _ => std::ptr::copy(src, dst, len),
        }
    }
}

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
            // contract). `copy` tolerates overlap (a worker connected to
            // itself).
            unsafe { copy(local.cast_const(), remote, len) };
        }
        OpKind::Get => {
            // SAFETY: as for PUT, in the other direction; the local range is
            // writable (engine contract).
            unsafe { copy(remote.cast_const(), local, len) };
        }
        OpKind::Atomic(aop) => {
            if op.len != 8 {
                return Err(Status::InvalidLength);
            }
            if remote as usize % 8 != 0 {
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
    use nix::sys::uio::{RemoteIoVec, process_vm_readv, process_vm_writev};
    let len = op.len as usize;
    let remote = [RemoteIoVec {
        base: usize::try_from(remote_addr).map_err(|_| Status::OutOfBounds)?,
        len,
    }];
    let local = op.local_addr as usize as *mut u8;
    let moved = match op.kind {
        OpKind::Put => {
            // SAFETY: the local range is readable memory of a live
            // registration (engine contract). The slice only carries its
            // address and length to the kernel; no Rust code reads it.
            let src = unsafe { std::slice::from_raw_parts(local.cast_const(), len) };
            process_vm_writev(pid, &[IoSlice::new(src)], &remote)
        }
        OpKind::Get => {
            // SAFETY: as for PUT; the range is writable (engine contract),
            // and only the kernel writes through the slice.
            let dst = unsafe { std::slice::from_raw_parts_mut(local, len) };
            process_vm_readv(pid, &mut [IoSliceMut::new(dst)], &remote)
        }
        OpKind::Atomic(_) => return Err(Status::Unsupported),
        OpKind::Notify => return Err(Status::InvalidArgument),
    };
    match moved {
        Ok(n) if n == len => Ok(op.len),
        // A partial transfer stops at an unmapped page of the target.
        Ok(_) => Err(Status::AccessDenied),
        Err(nix::errno::Errno::ESRCH) => Err(Status::PeerUnreachable),
        Err(nix::errno::Errno::EFAULT | nix::errno::Errno::EPERM) => Err(Status::AccessDenied),
        Err(nix::errno::Errno::ENOMEM) => Err(Status::NoResource),
        Err(_) => Err(Status::Transport),
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
        // (checked); the source is the payload's local range (engine
        // contract), which is never inside a channel.
        unsafe {
            std::ptr::copy_nonoverlapping(op.local_addr as usize as *const u8, dst, op.len as usize)
        };
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

#[cfg(test)]
mod tests {
    use super::copy;

    /// Every length up to 40, between separate buffers and within one
    /// buffer with the ranges overlapping either way, copies exactly what
    /// `ptr::copy` copies.
    #[test]
    fn small_copies_match_ptr_copy() {
        for len in 0..=40usize {
            let src: Vec<u8> = (0..len as u8).map(|b| b.wrapping_mul(7) + 1).collect();
            let mut dst = vec![0u8; len];
            // SAFETY: both buffers hold `len` bytes.
            unsafe { copy(src.as_ptr(), dst.as_mut_ptr(), len) };
            assert_eq!(dst, src, "len {len}");
            for shift in [1usize, 3, 8] {
                let base: Vec<u8> = (0..(len + shift) as u8).collect();
                let (mut ours, mut std_) = (base.clone(), base.clone());
                // SAFETY: both ranges lie inside buffers of `len + shift`.
                unsafe {
                    let (o, s) = (ours.as_mut_ptr(), std_.as_mut_ptr());
                    copy(o, o.add(shift), len);
                    std::ptr::copy(s, s.add(shift), len);
                }
                assert_eq!(ours, std_, "len {len}, forward by {shift}");
                let (mut ours, mut std_) = (base.clone(), base);
                // SAFETY: as above, the other way.
                unsafe {
                    let (o, s) = (ours.as_mut_ptr(), std_.as_mut_ptr());
                    copy(o.add(shift), o, len);
                    std::ptr::copy(s.add(shift), s, len);
                }
                assert_eq!(ours, std_, "len {len}, back by {shift}");
            }
        }
    }
}
