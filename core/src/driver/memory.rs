//! Memory at the seam: registrations and their keys ([`Registered`],
//! [`DriverMemKey`]), peers' key parts and their handles ([`KeyPart`],
//! [`Unpacked`], [`DriverRkey`]), the slow first phase ([`Prepare`],
//! [`Prepared`]) and memory a driver allocates ([`DriverMemory`]).

use super::MemKind;
use super::{DriverEp, DriverError};
use std::fmt;
#[cfg(doc)]
use {
    super::{Capabilities, Driver},
    ringfence_ring::Status,
};

/// A driver's handle for a local registration. Registration with a driver
/// that does not support the memory's kind yields none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DriverMemKey(pub u64);

/// A driver's handle for an unpacked remote key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DriverRkey(pub u32);

/// What [`Driver::register`] did with memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registered {
    /// Registered for local use and remote access: packed keys carry this
    /// driver's part ([`Driver::pack_rkey`]).
    Shared(DriverMemKey),
    /// Registered for local use only: the driver runs operations whose
    /// local side is this memory, but peers never reach it through this
    /// driver (packed keys carry no part of it). A CUDA driver's pinned
    /// host memory for host-device copies.
    Local(DriverMemKey),
    /// Not this driver's: it keeps nothing, the engine never names this
    /// memory to it again (no `deregister`, no `quiesce` of it), and its
    /// operations never use it. Other drivers may still register it; if
    /// none does, registration fails with [`Status::Unsupported`].
    Declined,
}

impl Registered {
    /// The key, unless declined.
    pub fn key(self) -> Option<DriverMemKey> {
        match self {
            Registered::Shared(key) | Registered::Local(key) => Some(key),
            Registered::Declined => None,
        }
    }
}

/// What [`Driver::unpack_rkey`] made of a peer's key part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unpacked {
    /// A handle for operations on the endpoint.
    Key(DriverRkey),
    /// The part is well formed, but names memory this driver cannot reach
    /// from here (device memory of another host, an IPC handle this
    /// process cannot open): the engine skips it, and operations on the
    /// key take another driver's lanes. The driver keeps nothing
    /// (no [`Driver::release_rkey`] follows). If no part of a key is
    /// usable, unpacking fails with [`Status::Unsupported`].
    Unreachable,
}

/// One driver's part of a peer's packed key, as the engine decoded and
/// checked it (the packed key's integrity check passed, and the part
/// names this driver): the region it covers at the peer, and the blob the
/// peer's driver of the same name packed. The blob is still the peer's
/// word: the driver validates it.
#[derive(Debug, Clone, Copy)]
pub struct KeyPart<'a> {
    /// What memory the region is at the peer (one of this driver's
    /// [`Capabilities::remote_kinds`]).
    pub kind: MemKind,
    /// The region's address, in the peer's address space.
    pub base: u64,
    /// The region's length in bytes, at least 1.
    pub len: u64,
    /// The peer driver's own part.
    pub blob: &'a [u8],
}

/// The slow first phase of registering memory and unpacking keys, run
/// without the engine lock (see [`Driver::prepare`]).
///
/// Registering a large region (`ibv_reg_mr` pins every page) or unpacking
/// an IPC key (`cuIpcOpenMemHandle` maps device memory) can take
/// milliseconds; under the engine lock that would stall every endpoint of
/// the worker. A driver that has such work does it here, on the
/// application thread that registers or unpacks, while the engine keeps
/// progressing, and hands the result to the second phase
/// ([`Driver::register`], [`Driver::unpack_rkey`]) as a [`Prepared`],
/// which takes only the lock's short while (a table entry).
///
/// Both methods may run on several threads at once, and at the same time
/// as any method of the driver: whatever they touch is theirs or
/// thread-safe (a protection domain, a CUDA context). If the second phase
/// never comes (another driver failed, the worker refused the
/// registration), the [`Prepared`] is dropped: its value's `Drop` undoes
/// the first phase (deregisters, closes the handle).
pub trait Prepare: Send + Sync + fmt::Debug {
    /// The slow part of registering `mem` (only of a kind in
    /// [`Capabilities::mem_kinds`]). The default does nothing.
    ///
    /// # Errors
    /// As [`Driver::register`]: the registration fails.
    fn register(&self, mem: &MemDesc) -> Result<Prepared, DriverError> {
        let _ = mem;
        Ok(Prepared::none())
    }

    /// The slow part of unpacking `part` for endpoint `ep` (only of a
    /// kind in [`Capabilities::remote_kinds`]; a request to the peer, an
    /// IPC handle to open). The default does nothing.
    ///
    /// # Errors
    /// As [`Driver::unpack_rkey`]: the unpack fails.
    fn unpack(&self, ep: DriverEp, part: &KeyPart<'_>) -> Result<Prepared, DriverError> {
        let _ = (ep, part);
        Ok(Prepared::none())
    }
}

/// What a [`Prepare`] phase made, for the second phase to take
/// ([`Prepared::take`]); empty for a driver without one.
#[derive(Default)]
pub struct Prepared(Option<Box<dyn std::any::Any + Send>>);

impl Prepared {
    /// Nothing prepared.
    pub fn none() -> Prepared {
        Prepared(None)
    }

    /// `value` for the second phase; dropped (undoing the first phase in
    /// its `Drop`) if that never comes.
    pub fn new<T: std::any::Any + Send>(value: T) -> Prepared {
        Prepared(Some(Box::new(value)))
    }

    /// The value, if one of type `T` was prepared.
    pub fn take<T: std::any::Any>(self) -> Option<T> {
        self.0?.downcast().ok().map(|b| *b)
    }

    /// Whether nothing was prepared.
    pub fn is_none(&self) -> bool {
        self.0.is_none()
    }
}

impl fmt::Debug for Prepared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "Prepared(..)"
        } else {
            "Prepared(none)"
        })
    }
}

/// Memory to register with a driver.
#[derive(Debug, Clone, Copy)]
pub struct MemDesc {
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// What memory it is.
    pub kind: MemKind,
    /// The random secret a remote access must present.
    pub secret: u64,
}

/// Memory a driver allocated for [`Worker::alloc_registered`](crate::Worker::alloc_registered)
/// (see [`Driver::alloc_memory`]): for example a sealed memfd mapping that
/// peers can map too. The worker keeps it alive while the registration or
/// any [`RegisteredBuf`](crate::RegisteredBuf) handle to it lives, and reads
/// and writes it only through raw copies and atomics.
///
/// # Safety
/// Implementors guarantee, for as long as the object lives:
/// - for host memory ([`MemKind::Host`]), `[addr(), addr() + len())` is
///   mapped, readable and writable memory of this process; for a device
///   kind it is the device's range (the worker never dereferences it);
///   neither value ever changes;
/// - `addr()` is 64-byte aligned and `len()` is at least the length asked
///   for in `alloc_memory`;
/// - the bytes were zero when the object was handed out;
/// - [`kind`](DriverMemory::kind) is the kind `alloc_memory` was asked for.
#[allow(unsafe_code)]
pub unsafe trait DriverMemory: Send + Sync + fmt::Debug {
    /// The start address.
    fn addr(&self) -> u64;
    /// The length in bytes.
    fn len(&self) -> usize;
    /// What memory it is.
    fn kind(&self) -> MemKind {
        MemKind::Host
    }
    /// Whether the length is zero (never, for memory handed to a worker).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
