//! Registered memory in a sealed memfd: what `Worker::alloc_registered`
//! returns when the worker has an shm driver, and what a peer maps.

use crate::memfd;
use memmap2::{MmapOptions, MmapRaw};
use ringfence::DriverMemory;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

/// One allocation: a memfd sealed against resizing, mapped shared and
/// writable in this process.
#[derive(Debug)]
pub(crate) struct ShmAlloc {
    map: MmapRaw,
    fd: OwnedFd,
    /// The length asked for (the memfd and the mapping are `len` rounded
    /// up to whole pages).
    len: usize,
}

impl ShmAlloc {
    /// Allocates `len` bytes (at least one), zero-filled and page-aligned.
    ///
    /// The memfd is allocated in full at once (`fallocate`): peers write it
    /// one-sidedly, and a page the kernel could not supply at that moment
    /// would fault in whichever process touched it. So the memory is really
    /// there when this returns, or this fails (`ENOMEM`/`ENOSPC`) cleanly;
    /// the kernel hands the pages out zeroed (nothing is filled here).
    ///
    /// # Errors
    /// `len` exceeds the memory limit ([`ringfence::limits::check`]) or is
    /// too large, or a system call failed.
    pub(crate) fn new(len: usize) -> io::Result<ShmAlloc> {
        ringfence::limits::check(len).map_err(io::Error::other)?;
        let size = ringfence::limits::round_to_pages(len)
            .map(|size| size as u64)
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        let fd = memfd::create("ringfence-shm", size)?;
        let whole =
            i64::try_from(size).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        nix::fcntl::fallocate(&fd, nix::fcntl::FallocateFlags::empty(), 0, whole)?;
        memfd::seal(fd.as_fd(), memfd::RESIZE_SEALS)?;
        let map = MmapOptions::new().len(size as usize).map_raw(&fd)?;
        Ok(ShmAlloc { map, fd, len })
    }

    /// The memfd, to pass to a peer.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The memfd's size in bytes.
    #[cfg(test)]
    pub(crate) fn size(&self) -> u64 {
        self.map.len() as u64
    }

    /// The start address in this process.
    pub(crate) fn base(&self) -> u64 {
        self.map.as_ptr() as usize as u64
    }

    /// The length asked for.
    pub(crate) fn requested(&self) -> usize {
        self.len
    }
}

// SAFETY: `map` covers `len` bytes rounded up to pages from `base()`, mapped shared
// and writable for as long as `self` lives (the memfd is sealed against
// shrinking, so no access inside faults); neither value changes; mmap
// returns page-aligned (so 64-byte aligned) memory, and a new memfd reads
// as zeros.
unsafe impl DriverMemory for ShmAlloc {
    fn addr(&self) -> u64 {
        self.base()
    }

    fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_are_sealed_page_rounded_and_zeroed() {
        let a = ShmAlloc::new(10).unwrap();
        assert_eq!(a.size(), ringfence::limits::page_size() as u64);
        assert_eq!(a.base() % 64, 0);
        assert_eq!(DriverMemory::len(&a), 10);
        assert_eq!(memfd::check(&a.fd(), a.size()), Ok(a.size()));
        assert!(nix::unistd::ftruncate(a.fd(), 1).is_err());
    }

    #[test]
    fn allocations_beyond_the_limit_fail_before_any_memfd() {
        let limit = ringfence::limits::memory_limit().bytes();
        let over = usize::try_from(limit)
            .unwrap_or(usize::MAX)
            .saturating_add(1);
        let e = ShmAlloc::new(over).unwrap_err();
        assert!(e.to_string().contains("memory limit"), "{e}");
        assert!(ShmAlloc::new(usize::MAX).is_err());
    }

    #[test]
    fn the_memfd_is_allocated_in_full() {
        let a = ShmAlloc::new(1 << 20).unwrap();
        let st = nix::sys::stat::fstat(a.fd()).unwrap();
        // st_blocks counts 512-byte units actually allocated.
        assert!(
            st.st_blocks as u64 * 512 >= a.size(),
            "{} blocks",
            st.st_blocks
        );
    }
}
