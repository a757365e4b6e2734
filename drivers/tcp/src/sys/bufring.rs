//! The provided-buffer ring: receive buffers the kernel picks from for
//! the buffer receives (multishot and busy), and the ring of entries that
//! offers them to it. The kernel writes a buffer only between its offer
//! and the completion that names it; the driver reads it after that
//! completion, until it offers it again.

use io_uring::types;
use memmap2::MmapMut;
use std::io;
use std::sync::atomic::{AtomicU16, Ordering};

/// The buffer group of the provided-buffer ring.
pub(crate) const BUF_GROUP: u16 = 0;

/// Receive buffers the kernel picks from for multishot receives: `count`
/// buffers of `size` bytes, and the ring that offers them to the kernel.
pub(super) struct BufRing {
    /// `count` entries of 16 bytes; the kernel reads it, we write it.
    ring: MmapMut,
    /// The buffers, `count * size` bytes.
    buffers: MmapMut,
    pub(super) count: u16,
    pub(super) size: u32,
    /// Our copy of the ring's tail.
    tail: u16,
}

impl BufRing {
    /// `count` buffers (a power of two) of `size` bytes, all offered.
    pub(super) fn new(count: u16, size: u32) -> io::Result<BufRing> {
        assert!(
            count.is_power_of_two(),
            "buffer count must be a power of two"
        );
        let ring = MmapMut::map_anon(usize::from(count) * size_of::<types::BufRingEntry>())?;
        let buffers = MmapMut::map_anon(usize::from(count) * size as usize)?;
        let mut r = BufRing {
            ring,
            buffers,
            count,
            size,
            tail: 0,
        };
        for bid in 0..count {
            r.offer(bid);
        }
        r.publish();
        Ok(r)
    }

    fn entries(&mut self) -> *mut types::BufRingEntry {
        self.ring.as_mut_ptr().cast()
    }

    /// Where the ring of entries starts (what the kernel is told at
    /// registration).
    pub(super) fn ring_addr(&self) -> u64 {
        self.ring.as_ptr() as u64
    }

    /// Puts buffer `bid` at the tail (not yet visible to the kernel).
    pub(super) fn offer(&mut self, bid: u16) {
        let index = usize::from(self.tail & (self.count - 1));
        let addr = self.buffers.as_ptr() as u64 + u64::from(bid) * u64::from(self.size);
        // SAFETY: `index < count`: the entry lies inside the ring mapping,
        // which is 16-byte aligned (page aligned). The kernel reads entries
        // only between its head and the published tail, and this one is past
        // the published tail until `publish`.
        let entry = unsafe { &mut *self.entries().add(index) };
        entry.set_addr(addr);
        entry.set_len(self.size);
        entry.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
    }

    /// Makes every offered buffer visible to the kernel.
    pub(super) fn publish(&mut self) {
        // SAFETY: the tail field overlays the reserved field of entry 0,
        // inside the mapping, 2-byte aligned; the kernel reads it
        // concurrently, so it is written atomically (Release: the entries
        // written before are visible first).
        let tail = unsafe { &*types::BufRingEntry::tail(self.entries()).cast::<AtomicU16>() };
        tail.store(self.tail, Ordering::Release);
    }

    /// Buffer `bid`'s first `len` bytes.
    pub(super) fn get(&self, bid: u16, len: usize) -> Option<&[u8]> {
        if bid >= self.count || len > self.size as usize {
            return None;
        }
        let start = usize::from(bid) * self.size as usize;
        self.buffers.get(start..start + len)
    }
}
