//! Writing garbage into shared memory on purpose, to test that the other
//! side turns it into errors.
#![allow(unsafe_code)]

use memmap2::{MmapOptions, MmapRaw};
use std::io;
use std::os::fd::BorrowedFd;

/// A writable shared mapping of a whole memfd, outside any ring API.
#[derive(Debug)]
pub struct Scribbler {
    map: MmapRaw,
}

impl Scribbler {
    /// Maps the memfd behind `fd` (all `len` bytes of it).
    ///
    /// # Errors
    /// The mapping failed.
    pub fn new(fd: BorrowedFd<'_>, len: usize) -> io::Result<Scribbler> {
        Ok(Scribbler {
            map: MmapOptions::new().len(len).map_raw(&fd)?,
        })
    }

    /// Writes `bytes` at `offset`.
    ///
    /// # Panics
    /// If the range is outside the mapping.
    pub fn write(&self, offset: usize, bytes: &[u8]) {
        let end = offset.checked_add(bytes.len()).expect("offset overflow");
        assert!(end <= self.map.len(), "write past the end of the mapping");
        // SAFETY: the range is inside the mapping (asserted). The other side
        // reads this memory only through atomics and volatile copies, which
        // is what the test exercises; in this process nothing else
        // references the bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.map.as_mut_ptr().add(offset),
                bytes.len(),
            )
        }
    }
}
