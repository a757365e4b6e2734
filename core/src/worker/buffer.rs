//! Registered memory owned by ringfence.

use super::*;

/// Registered memory owned by ringfence (from
/// [`Worker::alloc_registered`]).
///
/// Peers write it at any time, so it is read and written by copies
/// ([`read`](RegisteredBuf::read), [`write`](RegisteredBuf::write)) or
/// atomically ([`load_u64`](RegisteredBuf::load_u64)), never through Rust
/// references. The memory stays allocated while it is registered, even if
/// this handle is dropped.
#[derive(Debug, Clone)]
pub struct RegisteredBuf {
    pub(super) mem: Arc<OwnedMem>,
    pub(super) handle: MemHandle,
    pub(super) len: usize,
    pub(super) kind: MemKind,
}

impl RegisteredBuf {
    /// The registration handle, for SQEs and keys.
    pub fn handle(&self) -> MemHandle {
        self.handle
    }

    /// The start address.
    pub fn addr(&self) -> u64 {
        self.mem.addr()
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the length is zero (never, for a registration).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// What memory it is.
    pub fn kind(&self) -> MemKind {
        self.kind
    }

    /// Panics unless this is host memory: device memory is never read or
    /// written by host code.
    fn check_host(&self) {
        assert!(
            self.kind == MemKind::Host,
            "{:?} memory is device memory: host code never reads or writes it",
            self.kind
        );
    }

    /// A local buffer `offset` bytes in, for SQE builders.
    pub fn local(&self, offset: u64) -> LocalBuf {
        LocalBuf {
            mem: self.handle.as_raw(),
            addr: self.addr() + offset,
        }
    }

    /// Copies bytes out.
    ///
    /// # Panics
    /// If the range is out of bounds, or the memory is device memory.
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        self.check_host();
        assert!(
            offset
                .checked_add(out.len())
                .is_some_and(|end| end <= self.len),
            "read out of bounds"
        );
        self.mem.read(offset, out);
    }

    /// Copies bytes in.
    ///
    /// # Panics
    /// If the range is out of bounds, or the memory is device memory.
    pub fn write(&self, offset: usize, data: &[u8]) {
        self.check_host();
        assert!(
            offset
                .checked_add(data.len())
                .is_some_and(|end| end <= self.len),
            "write out of bounds"
        );
        self.mem.write(offset, data);
    }

    /// The 8-byte word at `offset`, read atomically (for words that peers
    /// update with atomics).
    ///
    /// # Panics
    /// If `offset` is not 8-byte aligned or out of bounds, or the memory is
    /// device memory.
    pub fn load_u64(&self, offset: usize) -> u64 {
        self.check_word(offset);
        self.mem.load_u64(offset)
    }

    /// Writes the 8-byte word at `offset` atomically, with Release order:
    /// one store, for a word a peer polls or reads with atomics (a
    /// ping-pong's sequence number, a flag after a payload).
    ///
    /// # Panics
    /// If `offset` is not 8-byte aligned or out of bounds, or the memory is
    /// device memory.
    pub fn store_u64(&self, offset: usize, value: u64) {
        self.check_word(offset);
        self.mem.store_u64(offset, value);
    }

    /// Panics unless the 8-byte word at `offset` lies inside this buffer
    /// (the allocation under it may be longer).
    fn check_word(&self, offset: usize) {
        self.check_host();
        assert!(
            offset.checked_add(8).is_some_and(|end| end <= self.len),
            "word out of bounds"
        );
    }
}
