//! Copies and atomics on registered memory, and owned aligned allocations.
//!
//! Registered memory is shared with peers that write it without the owner's
//! involvement (that is what one-sided communication is), so nothing here
//! creates Rust references into it: every copy and word access goes
//! through [`peer`](super::peer), the one copy primitive for such memory,
//! and read-modify-write atomics through `AtomicU64::from_ptr`.

use super::peer;
use crate::driver::DriverMemory;
use crate::limits::{self, Reservation};
use nix::sys::mman::{self, MapFlags, ProtFlags};
use ringfence_ring::AtomicOp;
use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::num::NonZeroUsize;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Copies `len` bytes from `src` into `dst`, memory a peer may read or
/// write: [`peer::copy_to_peer`] on integer addresses. An aligned word of
/// 1, 2, 4 or 8 bytes is one atomic store, so a peer polling it never sees
/// it torn. The source is read with plain loads (it may be a borrowed
/// local buffer); to copy out of memory a peer writes, with its aligned
/// words loaded atomically, use [`peer::copy_from_peer`].
///
/// # Safety
/// - `[src, src + len)` is readable and `[dst, dst + len)` writable memory
///   of live registrations (the caller checked both against the registry
///   and holds whatever keeps them registered).
/// - Overlap is allowed (a put into the same buffer it reads from).
pub unsafe fn copy(src: u64, dst: u64, len: usize) {
    // SAFETY: both ranges are valid (contract) and reached through raw
    // pointers only; the primitive allows overlap.
    unsafe { peer::copy_to_peer(src as usize as *const u8, dst as usize as *mut u8, len) }
}

/// Performs `op` on the 8-byte word at `addr` and returns the old value.
///
/// SeqCst: atomics from several initiators and the target's own CPU meet on
/// this word; the strongest order keeps their interleaving simple to state.
///
/// # Safety
/// - `addr` is 8-byte aligned and `[addr, addr + 8)` is writable memory of a
///   live registration.
/// - Every other access to that word while the atomic runs is atomic too
///   (the registration's owner promised that when registering it).
pub unsafe fn atomic(addr: u64, op: AtomicOp, operand: u64, operand2: u64) -> u64 {
    // SAFETY: aligned and valid for the lifetime of this call (contract).
    let word = unsafe { AtomicU64::from_ptr(addr as usize as *mut u64) };
    match op {
        AtomicOp::ADD | AtomicOp::FADD => word.fetch_add(operand, Ordering::SeqCst),
        AtomicOp::SWAP => word.swap(operand, Ordering::SeqCst),
        // CSWAP and anything the decoder let through: compare-and-swap.
        _ => match word.compare_exchange(operand, operand2, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(old) | Err(old) => old,
        },
    }
}

/// Writes `value` to the 8-byte word at `addr`.
///
/// # Safety
/// - As [`atomic`]'s first point, for the local result buffer of a fetching
///   atomic (8-byte alignment was checked at validation).
pub unsafe fn store_u64(addr: u64, value: u64) {
    // SAFETY: aligned and writable (contract); written atomically so a
    // concurrent reader of its own buffer never sees a torn value.
    unsafe { peer::store_u64(addr as usize as *mut u64, value) }
}

/// Zeroed, 64-byte-aligned memory owned by the registry, whose address
/// can be handed out for registration: a heap allocation, an anonymous
/// mapping (large ones), or memory a driver provided ([`DriverMemory`],
/// e.g. a sealed memfd that peers map). Counted against the process's
/// memory limit while it lives ([`crate::limits`]).
#[derive(Debug)]
pub(crate) struct OwnedMem {
    backing: Backing,
    /// Released when the memory is: after `backing` is dropped.
    _reservation: Option<Reservation>,
}

/// From this size on, [`OwnedMem::new`] maps anonymous memory: the kernel
/// hands it out zeroed and faults pages in as they are first touched, so a
/// large allocation costs neither a zero fill nor resident memory up front
/// (the global allocator zero-fills 64-byte-aligned memory by hand).
const MAP_FROM: usize = 64 << 10;

#[derive(Debug)]
enum Backing {
    /// From the global allocator with exactly this layout; freed on drop.
    Heap { ptr: NonNull<u8>, layout: Layout },
    /// A private anonymous mapping of `len` bytes (whole pages), made
    /// without `MAP_NORESERVE`: the kernel commits it at creation (under
    /// strict overcommit a commitment beyond the commit limit fails there).
    /// Unmapped on drop.
    Anon { ptr: NonNull<u8>, len: usize },
    /// A driver's memory; `len` is the length asked for (at most the
    /// driver's, checked in `from_driver`). Unmapped when the last `Arc`
    /// goes.
    Driver {
        mem: Arc<dyn DriverMemory>,
        len: usize,
    },
}

// SAFETY: `OwnedMem` owns its allocation (or an `Arc` of `Send + Sync`
// driver memory) and exposes only its address; every access to the bytes
// goes through this module's raw-pointer functions, whose callers
// synchronize through the registry.
unsafe impl Send for OwnedMem {}
// SAFETY: as above; `&OwnedMem` gives out only the address.
unsafe impl Sync for OwnedMem {}

impl OwnedMem {
    /// Allocates `len` zeroed bytes (at least one), 64-byte aligned, kept
    /// counted by `reservation` (the caller reserved `len` bytes). From
    /// [`MAP_FROM`] bytes on, an anonymous mapping: zero pages from the
    /// kernel, faulted in lazily, never filled here.
    ///
    /// # Errors
    /// `None` if `len` is too large to lay out or the allocation fails.
    pub(crate) fn new(len: usize, reservation: Reservation) -> Option<OwnedMem> {
        let backing = if len >= MAP_FROM {
            let size = limits::round_to_pages(len)?;
            let flags = MapFlags::MAP_PRIVATE;
            let prot = ProtFlags::PROT_READ | ProtFlags::PROT_WRITE;
            // SAFETY: a fresh anonymous mapping at an address the kernel
            // picks overlaps nothing of ours.
            let ptr = unsafe { mman::mmap_anonymous(None, NonZeroUsize::new(size)?, prot, flags) }
                .ok()?;
            Backing::Anon {
                ptr: ptr.cast(),
                len: size,
            }
        } else {
            let layout = Layout::from_size_align(len.max(1), 64).ok()?;
            // SAFETY: the layout has a non-zero size.
            let ptr = NonNull::new(unsafe { alloc_zeroed(layout) })?;
            Backing::Heap { ptr, layout }
        };
        Some(OwnedMem {
            backing,
            _reservation: Some(reservation),
        })
    }

    /// Wraps `len` bytes of memory a driver allocated, counted by
    /// `reservation` (host memory) or not at all (device memory).
    ///
    /// # Errors
    /// `None` if the driver's memory breaks the [`DriverMemory`] contract
    /// in a way that can be seen: shorter than `len`, unaligned, or at
    /// address 0.
    pub(crate) fn from_driver(
        mem: Arc<dyn DriverMemory>,
        len: usize,
        reservation: Option<Reservation>,
    ) -> Option<OwnedMem> {
        if mem.len() < len.max(1) || mem.addr() == 0 || !mem.addr().is_multiple_of(64) {
            return None;
        }
        Some(OwnedMem {
            backing: Backing::Driver { mem, len },
            _reservation: reservation,
        })
    }

    /// The start address.
    pub(crate) fn addr(&self) -> u64 {
        match &self.backing {
            Backing::Heap { ptr, .. } | Backing::Anon { ptr, .. } => ptr.as_ptr() as usize as u64,
            Backing::Driver { mem, .. } => mem.addr(),
        }
    }

    /// The start as a pointer (keeping the heap allocation's provenance).
    fn ptr(&self) -> *const u8 {
        match &self.backing {
            Backing::Heap { ptr, .. } | Backing::Anon { ptr, .. } => ptr.as_ptr(),
            Backing::Driver { mem, .. } => mem.addr() as usize as *const u8,
        }
    }

    /// The length in bytes (at least one).
    pub(crate) fn len(&self) -> usize {
        match &self.backing {
            Backing::Heap { layout, .. } => layout.size(),
            Backing::Anon { len, .. } => *len,
            Backing::Driver { len, .. } => (*len).max(1),
        }
    }

    /// Copies `out.len()` bytes starting at `offset` out.
    ///
    /// # Panics
    /// If the range is outside the allocation (a programmer error).
    pub(crate) fn read(&self, offset: usize, out: &mut [u8]) {
        let end = offset.checked_add(out.len()).expect("range overflows");
        assert!(end <= self.len(), "read past the end of the allocation");
        // SAFETY: in bounds (asserted), from `ptr()`, which keeps the heap
        // allocation's provenance; `out` is a distinct local buffer. The
        // memory may be written by a peer meanwhile: see the module docs.
        unsafe { peer::copy_from_peer(self.ptr().add(offset), out.as_mut_ptr(), out.len()) }
    }

    /// Copies `data` in at `offset`.
    ///
    /// # Panics
    /// If the range is outside the allocation (a programmer error).
    pub(crate) fn write(&self, offset: usize, data: &[u8]) {
        let end = offset.checked_add(data.len()).expect("range overflows");
        assert!(end <= self.len(), "write past the end of the allocation");
        // SAFETY: in bounds (asserted), writable (owned memory, handed out
        // for writing), from `ptr()` (see `read`); `data` is a distinct
        // local buffer.
        unsafe { peer::copy_to_peer(data.as_ptr(), self.ptr().cast_mut().add(offset), data.len()) }
    }

    /// The word at `offset`, for atomic access.
    ///
    /// # Panics
    /// If `offset` is not 8-byte aligned or the word is out of bounds.
    fn word(&self, offset: usize) -> *mut u64 {
        assert!(
            offset.is_multiple_of(8) && offset.checked_add(8).is_some_and(|end| end <= self.len()),
            "unaligned or out of bounds"
        );
        // In bounds (asserted), and 8-aligned: the base is 64-aligned and
        // the offset 8-aligned.
        self.ptr().cast_mut().wrapping_add(offset).cast::<u64>()
    }

    /// The word at `offset`, read atomically.
    ///
    /// # Panics
    /// If `offset` is not 8-byte aligned or the word is out of bounds.
    pub(crate) fn load_u64(&self, offset: usize) -> u64 {
        // SAFETY: aligned and in bounds (`word`), allocated while `self`
        // lives, and writable memory (heap, or a driver's read-write
        // mapping).
        unsafe { peer::load_u64(self.word(offset)) }
    }

    /// Writes the word at `offset` atomically (Release: the writes before
    /// it are visible to whoever reads it with Acquire).
    ///
    /// # Panics
    /// If `offset` is not 8-byte aligned or the word is out of bounds.
    pub(crate) fn store_u64(&self, offset: usize, value: u64) {
        // SAFETY: as in `load_u64`.
        unsafe { peer::store_u64(self.word(offset), value) }
    }

    /// A borrowed view of `len` bytes at `offset`.
    ///
    /// Only for memory no peer can reach: the notification buffers, private
    /// memory (the heap or a private anonymous mapping, from `new`) that is
    /// never registered or mapped by another process, and written only by
    /// a driver's `NotifyPool::deliver` while the buffer is FILLING. Registered memory is never viewed as a slice (a peer may
    /// write it at any time).
    ///
    /// # Safety
    /// - The memory is not registered and no other process maps it.
    /// - Nobody writes the range while the slice lives (the caller owns it
    ///   through a protocol such as the notify buffer states).
    ///
    /// # Panics
    /// If the range is out of bounds.
    pub(crate) unsafe fn slice(&self, offset: usize, len: usize) -> &[u8] {
        assert!(offset.checked_add(len).is_some_and(|end| end <= self.len()));
        // SAFETY: in bounds (asserted), initialized (zeroed at allocation),
        // and not written while borrowed: no peer reaches it, and this
        // process's writers keep off it (contract).
        unsafe { std::slice::from_raw_parts(self.ptr().add(offset), len) }
    }
}

impl Drop for OwnedMem {
    fn drop(&mut self) {
        match &self.backing {
            // SAFETY: allocated in `new` with exactly this layout.
            Backing::Heap { ptr, layout } => unsafe { dealloc(ptr.as_ptr(), *layout) },
            Backing::Anon { ptr, len } => {
                // SAFETY: mapped in `new` with exactly this length; nothing
                // uses it any more (we are its only owner, being dropped).
                let _ = unsafe { mman::munmap(ptr.cast(), *len) };
            }
            Backing::Driver { .. } => {}
        }
        // Driver memory is released by its own `Drop` with the last `Arc`.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owned(len: usize) -> OwnedMem {
        OwnedMem::new(len, limits::reserve(len).unwrap()).unwrap()
    }

    #[test]
    fn owned_memory_reads_writes_and_atomics() {
        let mem = owned(64);
        assert_eq!(mem.addr() % 64, 0);
        mem.write(8, &5u64.to_ne_bytes());
        assert_eq!(mem.load_u64(8), 5);
        // SAFETY: word 8 is aligned and inside `mem`.
        unsafe {
            assert_eq!(atomic(mem.addr() + 8, AtomicOp::FADD, 3, 0), 5);
            assert_eq!(atomic(mem.addr() + 8, AtomicOp::SWAP, 100, 0), 8);
            assert_eq!(
                atomic(mem.addr() + 8, AtomicOp::CSWAP, 1, 2),
                100,
                "compare fails"
            );
            assert_eq!(
                atomic(mem.addr() + 8, AtomicOp::CSWAP, 100, 2),
                100,
                "compare succeeds"
            );
            store_u64(mem.addr() + 16, 9);
            copy(mem.addr() + 8, mem.addr() + 24, 8);
        }
        assert_eq!(mem.load_u64(8), 2);
        assert_eq!(mem.load_u64(16), 9);
        mem.store_u64(56, u64::MAX - 1);
        assert_eq!(mem.load_u64(56), u64::MAX - 1);
        let mut out = [0u8; 8];
        mem.read(24, &mut out);
        assert_eq!(u64::from_ne_bytes(out), 2);
        // SAFETY: nothing writes `mem` while the slice lives.
        assert_eq!(unsafe { mem.slice(16, 8) }, &9u64.to_ne_bytes());
        assert!(OwnedMem::new(usize::MAX, limits::reserve(1).unwrap()).is_none());
        assert!(OwnedMem::new(usize::MAX / 2, limits::reserve(1).unwrap()).is_none());
    }

    #[test]
    fn large_allocations_are_zeroed_mappings_counted_while_live() {
        let len = MAP_FROM * 4 + 1;
        let mem = owned(len);
        assert!(matches!(mem.backing, Backing::Anon { .. }));
        assert_eq!(mem.addr() % limits::page_size() as u64, 0);
        assert_eq!(mem.len(), limits::round_to_pages(len).unwrap());
        assert_eq!(mem.load_u64(mem.len() - 8), 0, "zero from the kernel");
        mem.store_u64(mem.len() - 8, 3);
        assert_eq!(mem.load_u64(mem.len() - 8), 3);
        // Other tests allocate concurrently: ours is part of the total.
        assert!(limits::live_bytes() >= mem.len() as u64);
    }

    /// Driver memory for the test: a heap allocation, `skew` bytes in.
    #[derive(Debug)]
    struct Fake {
        mem: OwnedMem,
        skew: u64,
        len: usize,
    }

    // SAFETY: `[addr, addr + len)` lies inside `mem` (the tests keep
    // `skew + len` within it), which lives as long as `self` and is zeroed.
    unsafe impl DriverMemory for Fake {
        fn addr(&self) -> u64 {
            self.mem.addr() + self.skew
        }
        fn len(&self) -> usize {
            self.len
        }
    }

    #[test]
    fn driver_memory_is_used_as_is_and_checked() {
        let fake = |skew, len| -> Arc<dyn DriverMemory> {
            Arc::new(Fake {
                mem: owned(256),
                skew,
                len,
            })
        };
        let mem = OwnedMem::from_driver(fake(64, 128), 100, None).unwrap();
        assert_eq!((mem.addr() % 64, mem.len()), (0, 100));
        mem.write(88, &7u64.to_ne_bytes());
        assert_eq!(mem.load_u64(88), 7);
        let mut out = [0u8; 8];
        mem.read(88, &mut out);
        assert_eq!(u64::from_ne_bytes(out), 7);
        assert!(
            OwnedMem::from_driver(fake(64, 50), 100, None).is_none(),
            "shorter than asked"
        );
        assert!(
            OwnedMem::from_driver(fake(8, 128), 100, None).is_none(),
            "not 64-byte aligned"
        );
        drop(mem);
    }
}
