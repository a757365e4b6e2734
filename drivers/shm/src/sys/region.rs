//! Shared mappings of memfds, read and written only through the peer copy
//! primitive ([`ringfence::peer_mem`]) and atomics (another process writes
//! them at any time, so no Rust reference to their bytes is ever made,
//! except `&AtomicU64`/`&AtomicU32` to words every process accesses
//! atomically).

use memmap2::{MmapOptions, MmapRaw};
use ringfence::peer_mem::{copy_from_peer, copy_to_peer};
use std::io;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU32, AtomicU64};

/// A mapping of `[offset, offset + len)` of a memfd, shared with whoever
/// else maps it.
#[derive(Debug)]
pub(crate) struct SharedRegion {
    map: MmapRaw,
    writable: bool,
}

impl SharedRegion {
    /// Maps `len` bytes (at least one) of `fd` from `offset` (any offset:
    /// the mapping starts at the page below it, and [`addr`](Self::addr) is
    /// exactly `offset`). The caller checked the memfd's seals and size, so
    /// no access inside the mapping can fault.
    ///
    /// # Errors
    /// `mmap` failed.
    pub(crate) fn map(
        fd: BorrowedFd<'_>,
        offset: u64,
        len: usize,
        writable: bool,
    ) -> io::Result<SharedRegion> {
        if len == 0 {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        let mut options = MmapOptions::new();
        options.offset(offset).len(len);
        let map = if writable {
            options.map_raw(&fd)?
        } else {
            options.map_raw_read_only(&fd)?
        };
        Ok(SharedRegion { map, writable })
    }

    /// The length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether this process may write the mapping.
    pub(crate) fn is_writable(&self) -> bool {
        self.writable
    }

    /// The start of `[offset, offset + len)` if it lies inside the mapping.
    pub(crate) fn ptr_at(&self, offset: u64, len: u64) -> Option<*mut u8> {
        let end = offset.checked_add(len)?;
        if end > self.len() as u64 {
            return None;
        }
        // SAFETY: `offset <= end <= len()`, so the result stays inside (or
        // one past the end of) the mapping.
        Some(unsafe { self.map.as_mut_ptr().add(offset as usize) })
    }

    /// The 8-byte word at `offset` (8-aligned, inside), as an atomic.
    pub(crate) fn word(&self, offset: usize) -> Option<&AtomicU64> {
        if !offset.is_multiple_of(8) {
            return None;
        }
        let ptr = self.ptr_at(offset as u64, 8)?;
        // SAFETY: in bounds (checked), 8-aligned (the mapping is page
        // aligned, the offset 8-aligned), and valid while `self` lives,
        // which bounds the returned lifetime. Every process accesses the
        // words of our shared layouts atomically; a peer that does not can
        // only give us garbage values, which every reader validates.
        Some(unsafe { AtomicU64::from_ptr(ptr.cast::<u64>()) })
    }

    /// The 4-byte word at `offset` (4-aligned, inside), as an atomic.
    pub(crate) fn word32(&self, offset: usize) -> Option<&AtomicU32> {
        if !offset.is_multiple_of(4) {
            return None;
        }
        let ptr = self.ptr_at(offset as u64, 4)?;
        // SAFETY: as in `word`, for a 4-aligned 4-byte word.
        Some(unsafe { AtomicU32::from_ptr(ptr.cast::<u32>()) })
    }

    /// Copies `out.len()` bytes at `offset` out; `false` (nothing copied)
    /// if the range is not inside.
    pub(crate) fn read(&self, offset: u64, out: &mut [u8]) -> bool {
        let Some(src) = self.ptr_at(offset, out.len() as u64) else {
            return false;
        };
        // SAFETY: the source range is inside the mapping (checked) and the
        // destination is a distinct, exclusively borrowed local buffer. The
        // bytes may change under us (another process): we copy them out
        // once and only the copy is looked at.
        unsafe { copy_from_peer(src.cast_const(), out.as_mut_ptr(), out.len()) };
        true
    }

    /// Copies `data` in at `offset`; `false` (nothing written) if the range
    /// is not inside or the mapping is read-only.
    pub(crate) fn write(&self, offset: u64, data: &[u8]) -> bool {
        if !self.writable {
            return false;
        }
        let Some(dst) = self.ptr_at(offset, data.len() as u64) else {
            return false;
        };
        // SAFETY: the destination is inside a writable mapping (checked);
        // the source is a local slice that cannot overlap it.
        unsafe { copy_to_peer(data.as_ptr(), dst, data.len()) };
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memfd;
    use std::os::fd::AsFd;
    use std::sync::atomic::Ordering;

    #[test]
    fn bounds_are_checked_and_two_mappings_share_bytes() {
        let fd = memfd::create("region-test", 8192).unwrap();
        let a = SharedRegion::map(fd.as_fd(), 0, 8192, true).unwrap();
        let b = SharedRegion::map(fd.as_fd(), 4096 + 8, 100, false).unwrap();
        assert!(a.write(4096 + 8, b"hello"));
        let mut out = [0u8; 5];
        assert!(b.read(0, &mut out));
        assert_eq!(&out, b"hello");
        assert!(!b.write(0, b"x"), "read-only mapping");
        assert!(!b.read(96, &mut [0u8; 5]), "past the end");
        assert!(!a.read(u64::MAX, &mut [0u8; 1]), "overflow");
        assert!(a.word(3).is_none() && a.word(8192).is_none());
        a.word(4096 + 16).unwrap().store(7, Ordering::SeqCst);
        assert_eq!(b.word(8).unwrap().load(Ordering::SeqCst), 7);
        assert!(SharedRegion::map(fd.as_fd(), 0, 0, true).is_err());
    }
}
