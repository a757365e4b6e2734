//! The one copy primitive for memory a peer may write concurrently:
//! registered windows (a peer PUTs into them whenever it likes), a peer's
//! windows mapped here, notification channels, and the words the engine
//! stores results into. Every byte this process moves to or from such
//! memory goes through [`copy_to_peer`], [`copy_from_peer`],
//! [`load_u64`] or [`store_u64`] (the crate docs, "Memory shared with a
//! peer", state the rules; this module is where they are implemented).
//!
//! # What it guarantees
//! - A copy of exactly 1, 2, 4 or 8 bytes whose destination is aligned to
//!   its size is **one atomic store** (Release): a peer polling that word
//!   sees the old value or the new one, never a mix. In
//!   [`copy_from_peer`] the source word, when aligned, is read with one
//!   atomic load (Relaxed) too, so a GET of a word a peer is storing to is
//!   never torn either. [`copy_to_peer`] reads its (local) source with
//!   plain loads, so that it may be any memory, a borrowed `&[u8]` too.
//! - Nothing here ever creates a Rust reference or slice over the memory:
//!   only raw pointers, `Atomic*::from_ptr` for the duration of one access,
//!   and `ptr::copy`.
//! - The ranges may overlap (a worker connected to itself PUTs from a
//!   buffer into the same buffer): the result is that of [`ptr::copy`].
//!
//! # Argument order
//! Every copy here and in `peer_mem` takes the source first, then the
//! destination, then the length: `copy_to_peer(src, dst, len)`,
//! `copy_from_peer(src, dst, len)`, `peer_mem::copy(src, dst, len)`, as
//! [`ptr::copy`]`(src, dst, count)` and `copy_nonoverlapping` do. The
//! word accessors name their one address first (`store_u64(dst, value)`,
//! `peer_mem::atomic(addr, ..)`).
//!
//! # Why the orderings
//! Stores are Release: free on x86_64 (a plain `MOV`), one `STLR` on
//! aarch64, and they make a single-word copy behind earlier copies of the
//! same thread (a payload, then its flag) a message a peer can read with
//! an Acquire load. Loads are Relaxed: a GET may read
//! through a read-only mapping, and only Relaxed atomic loads of at most
//! 8 bytes are allowed on read-only memory (`core::sync::atomic`, "Atomic
//! accesses to read-only memory"); what a GET's bytes mean is ordered by its
//! completion, not by the load.
//!
//! # Why plain copies for everything else
//! A copy of any other size or alignment is plain loads and stores
//! (`read_unaligned`/`write_unaligned` inline up to 16 bytes, `ptr::copy`,
//! i.e. `memmove`, beyond). If a peer writes the same bytes meanwhile, the
//! two race; at the machine level that yields some mix of old and new
//! bytes in the destination, no fault and no other effect, because:
//! - the access is through raw pointers the compiler knows nothing about:
//!   it cannot prove the bytes unchanged, and never re-reads them (each
//!   byte is read once, into the destination, and the code looks only at
//!   the destination);
//! - nothing this process decides depends on those bytes before a
//!   completion or notification orders the peer's writes before the read,
//!   or the bytes are data to be validated (a channel record, which is
//!   copied out once and checked);
//! - no reference, slice or `&mut` ever covers the memory, so no
//!   `noalias`/`readonly`/`dereferenceable` promise is made about it.
//!
//! Per-byte atomics would make a race defined in the Rust memory model too,
//! at the price of every copy above 16 bytes: atomic accesses are never
//! merged into vector loads or fast string moves, so a large PUT would
//! move one byte (or word) per instruction instead of a cache line. The
//! volatile copy intrinsics (`core::intrinsics::volatile_copy_memory`) are
//! unstable and would not vectorize either; an element-wise atomic
//! `memcpy` (`AtomicPerByte`, RFC 3301) is not in the standard library.
//! So large copies are `memmove`, and the guarantee is stated where it
//! holds: per aligned word of up to 8 bytes.

use std::ptr;
use std::sync::atomic::{AtomicU8, AtomicU16, AtomicU32, AtomicU64, Ordering};

/// Copies `len` bytes from local memory at `src` into memory a peer may
/// read or write concurrently, at `dst` (see the module docs: an aligned
/// 1, 2, 4 or 8-byte destination is one atomic store). The source is read
/// with plain loads: it may be any readable memory, a `&[u8]` included.
///
/// # Safety
/// - `[src, src + len)` is readable and `[dst, dst + len)` writable for
///   the duration of the call (as [`ptr::copy`]; the ranges may overlap).
/// - No Rust reference to the destination is alive in this process (other
///   processes and other threads' raw or atomic accesses are allowed).
#[inline]
pub unsafe fn copy_to_peer(src: *const u8, dst: *mut u8, len: usize) {
    // SAFETY: the caller's contract is `copy`'s.
    unsafe { copy::<false>(src, dst, len) }
}

/// Copies `len` bytes from memory a peer may write concurrently, at `src`,
/// into memory at `dst` (see the module docs: an aligned 1, 2, 4 or
/// 8-byte source is read with one atomic load, and an aligned destination
/// word is one atomic store, since the destination may be registered
/// memory that a peer or the application polls too).
///
/// # Safety
/// - As [`copy_to_peer`], and no Rust reference to the source is alive in
///   this process either (its aligned words are read atomically, which a
///   shared borrow does not allow). The source may be a read-only
///   mapping: its atomic loads are Relaxed and at most 8 bytes.
#[inline]
pub unsafe fn copy_from_peer(src: *const u8, dst: *mut u8, len: usize) {
    // SAFETY: the caller's contract is `copy`'s.
    unsafe { copy::<true>(src, dst, len) }
}

/// The 8-byte word at `src`, read with one atomic load (Acquire: the
/// writes a peer published with a Release store of it are visible after).
///
/// # Safety
/// - `src` is 8-byte aligned and readable and writable (not a read-only
///   mapping) for the duration of the call.
#[inline]
pub unsafe fn load_u64(src: *const u64) -> u64 {
    // SAFETY: aligned and valid (contract); the `&AtomicU64` lives for this
    // one load, and an atomic is exactly the access the rules allow.
    unsafe { AtomicU64::from_ptr(src.cast_mut()) }.load(Ordering::Acquire)
}

/// Writes `value` to the 8-byte word at `dst` with one atomic store
/// (Release: this thread's earlier writes are visible to whoever loads the
/// word with Acquire).
///
/// # Safety
/// - `dst` is 8-byte aligned and writable for the duration of the call.
#[inline]
pub unsafe fn store_u64(dst: *mut u64, value: u64) {
    // SAFETY: as in `load_u64`.
    unsafe { AtomicU64::from_ptr(dst) }.store(value, Ordering::Release);
}

/// One word of `$ty` from `$src` to `$dst` (source first, as everywhere here): the destination atomic when
/// aligned to the word's size, the source too if `$atomic_src`; plain
/// unaligned accesses otherwise. The load comes first, so overlapping
/// ranges copy as `ptr::copy` would.
///
/// Alignment is tested with `align_offset`, which is exact at run time for
/// a byte pointer (any address can be aligned, so it never answers
/// `usize::MAX`), and which Miri answers from the allocation's alignment,
/// so that its symbolic alignment check agrees with the branch taken.
macro_rules! word {
    ($ty:ty, $atomic:ty, $src:expr, $dst:expr, $atomic_src:expr) => {{
        let (src, dst): (*const u8, *mut u8) = ($src, $dst);
        const SIZE: usize = size_of::<$ty>();
        let value: $ty = if $atomic_src && src.align_offset(SIZE) == 0 {
            // SAFETY: `src` is readable for SIZE bytes and not under a
            // shared borrow (the contract of `copy_from_peer`, the only
            // caller with `$atomic_src`), and aligned to them (the atomic
            // type's alignment is its size). A read-only mapping is fine:
            // a Relaxed load of at most 8 bytes (`core::sync::atomic`,
            // "Atomic accesses to read-only memory").
            unsafe { &*src.cast::<$atomic>() }.load(Ordering::Relaxed)
        } else {
            // SAFETY: readable for SIZE bytes (`copy`'s contract).
            unsafe { src.cast::<$ty>().read_unaligned() }
        };
        if dst.align_offset(SIZE) == 0 {
            // SAFETY: writable for SIZE bytes (`copy`'s contract) and
            // aligned to them.
            unsafe { <$atomic>::from_ptr(dst.cast::<$ty>()) }.store(value, Ordering::Release);
        } else {
            // SAFETY: writable for SIZE bytes (`copy`'s contract).
            unsafe { dst.cast::<$ty>().write_unaligned(value) };
        }
    }};
}

/// The copy behind both directions. Up to 16 bytes, with at most two loads
/// then two stores, inline: a call into the C library's `memmove` costs
/// more than an 8-byte PUT itself. Sizes of 4, 8 and 16 bytes store each
/// byte once: a peer spinning on the word must not see its cache line
/// taken back by a second store of the same bytes (one more line transfer
/// on a ping-pong's critical path).
///
/// `ATOMIC_SRC`: aligned source words are read atomically
/// ([`copy_from_peer`]).
///
/// # Safety
/// As [`copy_to_peer`], or [`copy_from_peer`] with `ATOMIC_SRC`.
#[inline(always)]
unsafe fn copy<const ATOMIC_SRC: bool>(src: *const u8, dst: *mut u8, len: usize) {
    // Every load and store below covers a sub-range of `[0, len)` of its
    // pointer, which the caller makes valid; the atomic accesses check
    // their pointer's alignment first (`word!`); in every arm all loads
    // precede the stores, so overlapping ranges copy as `ptr::copy` would.
    match len {
        0 => {}
        1 => word!(u8, AtomicU8, src, dst, ATOMIC_SRC),
        2 => word!(u16, AtomicU16, src, dst, ATOMIC_SRC),
        4 => word!(u32, AtomicU32, src, dst, ATOMIC_SRC),
        8 => word!(u64, AtomicU64, src, dst, ATOMIC_SRC),
        // SAFETY: bytes 0..2 and 2 of each range (contract).
        3 => unsafe {
            let (a, b) = (src.cast::<u16>().read_unaligned(), src.add(2).read());
            dst.cast::<u16>().write_unaligned(a);
            dst.add(2).write(b);
        },
        // SAFETY: two overlapping 4-byte words inside each range (contract).
        5..=7 => unsafe {
            let (a, b) = (
                src.cast::<u32>().read_unaligned(),
                src.add(len - 4).cast::<u32>().read_unaligned(),
            );
            dst.cast::<u32>().write_unaligned(a);
            dst.add(len - 4).cast::<u32>().write_unaligned(b);
        },
        // SAFETY: 16: two halves; 9..=15: two overlapping words; inside
        // each range (contract).
        9..=16 => unsafe {
            let (a, b) = (
                src.cast::<u64>().read_unaligned(),
                src.add(len - 8).cast::<u64>().read_unaligned(),
            );
            dst.cast::<u64>().write_unaligned(a);
            dst.add(len - 8).cast::<u64>().write_unaligned(b);
        },
        // SAFETY: as `ptr::copy` (contract).
        _ => unsafe { ptr::copy(src, dst, len) },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Room for every length up to 64 at every offset up to 16 (and a
    /// shift of up to 16 within one buffer), 64-byte aligned so that the
    /// offsets decide each word's alignment (also under Miri's symbolic
    /// alignment check).
    #[repr(C, align(64))]
    struct Buf([u8; 160]);

    fn buf(seed: u8) -> Box<Buf> {
        let mut b = Box::new(Buf([0; 160]));
        for (i, byte) in b.0.iter_mut().enumerate() {
            *byte = (i as u8).wrapping_mul(31).wrapping_add(seed);
        }
        b
    }

    /// Every length 0..=64, at every source and destination offset 0..8
    /// (so every alignment of 1, 2, 4 and 8-byte words on both sides),
    /// between separate buffers: exactly the bytes `ptr::copy` moves, and
    /// no byte outside the destination range changes.
    #[test]
    fn every_size_and_alignment_copies_exactly() {
        for len in 0..=64usize {
            // Under Miri (slow), every offset pair where the size has an
            // arm of its own, a few elsewhere.
            let offsets: &[usize] = match len {
                _ if !cfg!(miri) => &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 15],
                // Aligned to 8, 4, 2 and 1 only, and not at all.
                0..=17 | 32 | 64 => &[0, 1, 2, 4, 7],
                _ => &[],
            };
            for &s in offsets {
                for &d in offsets {
                    let mut src = buf(1);
                    let (mut ours, mut expect) = (buf(2), buf(2));
                    // SAFETY: `s + len` and `d + len` are at most 79 < 160;
                    // the source of `copy_from_peer` is reached through a
                    // raw pointer only (not a shared borrow).
                    unsafe {
                        if (len + s + d) % 2 == 0 {
                            copy_to_peer(src.0.as_ptr().add(s), ours.0.as_mut_ptr().add(d), len);
                        } else {
                            let from = src.0.as_mut_ptr().add(s);
                            copy_from_peer(from, ours.0.as_mut_ptr().add(d), len);
                        }
                        ptr::copy(src.0.as_ptr().add(s), expect.0.as_mut_ptr().add(d), len);
                    }
                    assert!(ours.0 == expect.0, "len {len}, src +{s}, dst +{d}");
                }
            }
        }
    }

    /// Within one buffer, with the ranges overlapping either way by 1 to 16
    /// bytes: what `ptr::copy` gives.
    #[test]
    fn overlapping_ranges_copy_as_ptr_copy() {
        let lens: Vec<usize> = if cfg!(miri) {
            (0..=17).chain([32, 64]).collect()
        } else {
            (0..=64).collect()
        };
        let (shifts, starts): (&[usize], &[usize]) = if cfg!(miri) {
            (&[1, 4, 8, 16], &[0, 1])
        } else {
            (&[1, 2, 3, 4, 7, 8, 16], &[0, 1, 8])
        };
        for len in lens {
            for &shift in shifts {
                for &start in starts {
                    let (mut ours, mut expect) = (buf(3), buf(3));
                    // SAFETY: every range ends before `start + shift + len`,
                    // at most 8 + 16 + 64 < 160.
                    unsafe {
                        let (o, e) = (
                            ours.0.as_mut_ptr().add(start),
                            expect.0.as_mut_ptr().add(start),
                        );
                        copy_to_peer(o, o.add(shift), len);
                        ptr::copy(e, e.add(shift), len);
                    }
                    assert!(
                        ours.0 == expect.0,
                        "len {len}, forward by {shift} at {start}"
                    );
                    let (mut ours, mut expect) = (buf(4), buf(4));
                    // SAFETY: as above, the other way.
                    unsafe {
                        let (o, e) = (
                            ours.0.as_mut_ptr().add(start),
                            expect.0.as_mut_ptr().add(start),
                        );
                        copy_from_peer(o.add(shift), o, len);
                        ptr::copy(e.add(shift), e, len);
                    }
                    assert!(ours.0 == expect.0, "len {len}, back by {shift} at {start}");
                }
            }
        }
    }

    #[test]
    fn words_load_and_store() {
        let mut b = buf(5);
        let word = b.0.as_mut_ptr().wrapping_add(8).cast::<u64>();
        // SAFETY: 8-aligned (the buffer is 64-aligned), inside `b`.
        unsafe {
            store_u64(word, 0x0102_0304_0506_0708);
            assert_eq!(load_u64(word), 0x0102_0304_0506_0708);
        }
        assert_eq!(b.0[8..16], 0x0102_0304_0506_0708u64.to_ne_bytes());
    }

    /// The paths `RegisteredBuf` takes on heap memory (`OwnedMem::read`,
    /// `write`, `load_u64`, `store_u64`): every length at every offset of
    /// an 8-byte word lands and reads back exactly, and the bytes around it
    /// stay as they were.
    #[test]
    fn registered_buffer_paths_round_trip() {
        use super::super::mem::OwnedMem;
        let mem = OwnedMem::new(256, crate::limits::reserve(256).unwrap()).unwrap();
        let lens: Vec<usize> = if cfg!(miri) {
            (0..=17).chain([32, 63, 64]).collect()
        } else {
            (0..=64).collect()
        };
        for len in lens {
            for off in 64..72 {
                mem.write(off - 8, &[0xee; 8]);
                mem.write(off + len, &[0xee; 8]);
                let data: Vec<u8> = (0..len).map(|i| (i as u8) ^ (off as u8) ^ 0xa5).collect();
                mem.write(off, &data);
                let mut out = vec![0u8; len + 16];
                mem.read(off - 8, &mut out);
                assert!(
                    out[..8] == [0xee; 8] && out[8 + len..] == [0xee; 8],
                    "len {len} at {off}"
                );
                assert_eq!(out[8..8 + len], data[..], "len {len} at {off}");
            }
        }
        mem.write(16, &7u64.to_ne_bytes());
        assert_eq!(mem.load_u64(16), 7);
        mem.store_u64(24, u64::MAX - 1);
        let mut out = [0u8; 8];
        mem.read(24, &mut out);
        assert_eq!(u64::from_ne_bytes(out), u64::MAX - 1);
    }

    /// A word of a registered buffer that one thread writes with
    /// `RegisteredBuf::write` (a PUT landing through loopback takes the same
    /// primitive) while another polls it with `load_u64`: whole values only,
    /// and under Miri no data race (both sides are one atomic access).
    #[test]
    fn a_polled_registered_word_is_written_whole() {
        use super::super::mem::OwnedMem;
        let mem = Arc::new(OwnedMem::new(64, crate::limits::reserve(64).unwrap()).unwrap());
        let rounds = if cfg!(miri) { 20 } else { 20_000 };
        let writer = {
            let mem = Arc::clone(&mem);
            std::thread::spawn(move || {
                for round in 0..rounds {
                    let value = if round % 2 == 0 { u64::MAX } else { 0 };
                    mem.write(8, &value.to_ne_bytes());
                }
            })
        };
        for _ in 0..rounds {
            let v = mem.load_u64(8);
            assert!(v == 0 || v == u64::MAX, "torn: {v:#x}");
            std::thread::yield_now();
        }
        writer.join().unwrap();
    }

    /// Memory a "peer" (another thread here) writes while this thread
    /// polls it, both through the primitive: for aligned words of 1, 2, 4
    /// and 8 bytes, every value read is one that was written whole (all
    /// zeros or all ones). Under Miri this is also the proof that those
    /// copies are atomic: a plain access racing with the peer's would be
    /// reported as a data race.
    #[test]
    fn aligned_words_are_never_torn() {
        #[repr(C, align(64))]
        struct Shared(std::cell::UnsafeCell<[u8; 64]>);
        // SAFETY: the bytes are only reached through raw pointers and the
        // primitive's atomics, never through a reference.
        unsafe impl Sync for Shared {}
        let rounds = if cfg!(miri) { 20 } else { 20_000 };
        for size in [1usize, 2, 4, 8] {
            let shared = Arc::new(Shared(std::cell::UnsafeCell::new([0; 64])));
            let writer = {
                let shared = Arc::clone(&shared);
                std::thread::spawn(move || {
                    let (zeros, ones) = ([0u8; 8], [0xffu8; 8]);
                    let at = shared.0.get().cast::<u8>().wrapping_add(16);
                    for round in 0..rounds {
                        let src = if round % 2 == 0 { &ones } else { &zeros };
                        // SAFETY: `at` is `size`-aligned (16 into a 64-aligned
                        // array) with `size` bytes inside it.
                        unsafe { copy_to_peer(src.as_ptr(), at, size) };
                    }
                })
            };
            let at = shared.0.get().cast::<u8>().wrapping_add(16);
            for _ in 0..rounds {
                let mut out = [0x5au8; 8];
                // SAFETY: as for the writer.
                unsafe { copy_from_peer(at, out.as_mut_ptr(), size) };
                let got = &out[..size];
                assert!(
                    got.iter().all(|&b| b == 0) || got.iter().all(|&b| b == 0xff),
                    "a {size}-byte word read torn: {got:?}"
                );
                std::thread::yield_now();
            }
            writer.join().unwrap();
        }
    }
}
