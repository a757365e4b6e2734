//! The only door to atomics, fences and shared cells in this crate.
//!
//! Under `--cfg loom` every type here comes from [loom], so the SPSC protocol
//! in [`producer`](crate::producer) and [`consumer`](crate::consumer) is
//! model-checked as written; otherwise they are `core`'s own. Nothing else in
//! the crate names `core::sync::atomic` directly.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, Ordering, fence};

#[cfg(not(loom))]
pub(crate) use core::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

pub(crate) use cells::Cells;

#[cfg(not(loom))]
mod cells {
    use core::ptr::NonNull;

    /// The entry array of one ring, seen as raw slots.
    ///
    /// Slots are written by the producer and read by the consumer; the index
    /// protocol (not this type) guarantees that a slot is never written and
    /// read at the same time by this process.
    #[derive(Debug)]
    pub(crate) struct Cells<T> {
        /// Start of `len` contiguous, aligned slots of `T` that live as long as
        /// the ring's owner (held beside every copy of this value).
        base: NonNull<T>,
        /// Number of slots; a power of two.
        len: u32,
    }

    impl<T> Clone for Cells<T> {
        fn clone(&self) -> Self {
            Self {
                base: self.base,
                len: self.len,
            }
        }
    }

    impl<T: Copy> Cells<T> {
        /// # Safety
        /// - `base` points to `len` slots of `T`, aligned for `T`, readable and
        ///   writable for as long as any copy of the returned value is used.
        pub(crate) unsafe fn from_raw(base: NonNull<T>, len: u32) -> Self {
            Self { base, len }
        }

        /// The first slot: where the entry array starts, for code that runs
        /// the ring protocol itself ([`RawParts`](crate::RawParts)).
        #[inline]
        pub(crate) fn as_ptr(&self) -> NonNull<T> {
            self.base
        }

        /// A pointer to slot `index`, for the producer to fill in place.
        ///
        /// # Safety
        /// - `index < len`.
        #[inline]
        pub(crate) unsafe fn slot_ptr(&self, index: u32) -> *mut T {
            debug_assert!(index < self.len);
            // SAFETY: `index < len` (caller), so the offset stays inside the
            // slot array that `base` points to (`from_raw`).
            unsafe { self.base.as_ptr().add(index as usize) }
        }

        /// Writes slot `index`.
        ///
        /// # Safety
        /// - `index < len`, and the caller is the producer and owns the slot
        ///   (it is between the consumer's head and the producer's tail).
        #[inline]
        pub(crate) unsafe fn write(&self, index: u32, value: T) {
            // SAFETY: the slot is in bounds and owned by the caller (contract).
            unsafe { self.slot_ptr(index).write(value) }
        }

        /// Copies slot `index` out.
        ///
        /// The read is one Relaxed atomic load per 8-byte word: the slot
        /// may live in memory that another process maps (and a corrupt
        /// producer may rewrite it after publishing), and the copy is what
        /// the caller validates, so the compiler must neither re-read the
        /// slot later nor tear or merge the loads (no time-of-check to
        /// time-of-use gap), and a racing write must not be undefined
        /// behaviour here. Atomics give all of that (a volatile read would
        /// not make a race defined); a Relaxed load is a plain `MOV`/`LDR`,
        /// as the volatile load it replaces. The ordering comes from the
        /// Acquire load of `tail` that published the slot.
        ///
        /// # Safety
        /// - `index < len`, and the caller is the consumer and the producer
        ///   has published the slot (it is between head and tail).
        #[inline]
        pub(crate) unsafe fn read(&self, index: u32) -> T {
            // Entries are whole 8-byte words (Sqe: 8, Cqe: 2): copying them a
            // word at a time is one load per word instead of one per field.
            const { assert!(size_of::<T>().is_multiple_of(8) && align_of::<T>() >= 8) };
            // SAFETY: `index < len` (contract).
            let src = unsafe { self.slot_ptr(index) }.cast::<u64>();
            let mut out = core::mem::MaybeUninit::<T>::uninit();
            let dst = out.as_mut_ptr().cast::<u64>();
            for word in 0..size_of::<T>() / 8 {
                // SAFETY: the slot is in bounds and published (contract) and
                // 8-aligned (asserted), so every word read is too; slots are
                // writable memory (the `&AtomicU64` lives for one load);
                // `out` has room for the same words.
                unsafe {
                    let value =
                        super::AtomicU64::from_ptr(src.add(word)).load(super::Ordering::Relaxed);
                    dst.add(word).write(value);
                }
            }
            // SAFETY: every byte of `out` was written above, and `T` is an
            // `Entry`, valid for every bit pattern.
            unsafe { out.assume_init() }
        }
    }
}

#[cfg(loom)]
mod cells {
    use loom::cell::UnsafeCell;
    use std::sync::Arc;

    /// Loom's version of the slot array: each slot is a loom cell, so the
    /// model checker sees every slot access and reports any that is not
    /// ordered by the index protocol.
    #[derive(Debug)]
    pub(crate) struct Cells<T> {
        cells: Arc<[UnsafeCell<T>]>,
    }

    impl<T> Clone for Cells<T> {
        fn clone(&self) -> Self {
            Self {
                cells: Arc::clone(&self.cells),
            }
        }
    }

    impl<T: Copy> Cells<T> {
        pub(crate) fn new(len: u32, zero: T) -> Self {
            Self {
                cells: (0..len).map(|_| UnsafeCell::new(zero)).collect(),
            }
        }

        /// # Safety
        /// As the `cfg(not(loom))` version.
        #[inline]
        pub(crate) unsafe fn write(&self, index: u32, value: T) {
            // SAFETY: the caller owns the slot (contract); loom checks it.
            self.cells[index as usize].with_mut(|p| unsafe { p.write(value) })
        }

        /// # Safety
        /// As the `cfg(not(loom))` version.
        #[inline]
        pub(crate) unsafe fn read(&self, index: u32) -> T {
            // SAFETY: the slot is published (contract); loom checks it.
            self.cells[index as usize].with(|p| unsafe { p.read() })
        }
    }
}
