//! Kinds of memory: host memory, or the memory of one device. A driver
//! says which kinds it registers and which it reaches at a peer
//! ([`Capabilities`](super::Capabilities)); registrations and key parts
//! carry their kind.

/// What kind of memory a registration is, and on which device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MemKind {
    /// Ordinary host memory.
    Host,
    /// Memory of one CUDA device, named by its ordinal in the process that
    /// registers it (as `cuDeviceGet` numbers the devices it sees).
    Cuda(u16),
}

impl MemKind {
    /// The device ordinal, for device memory.
    pub const fn device(self) -> Option<u16> {
        match self {
            MemKind::Host => None,
            MemKind::Cuda(device) => Some(device),
        }
    }

    /// The kind's number in a packed key part, and in [`MemKinds`].
    pub(crate) const fn code(self) -> u8 {
        match self {
            MemKind::Host => 0,
            MemKind::Cuda(_) => 1,
        }
    }

    /// The kind a packed key part names, if it is one (host memory has no
    /// device: its ordinal must be zero).
    pub(crate) const fn from_code(code: u8, device: u16) -> Option<MemKind> {
        match (code, device) {
            (0, 0) => Some(MemKind::Host),
            (1, device) => Some(MemKind::Cuda(device)),
            _ => None,
        }
    }
}

/// A set of memory kinds, each with any device: what a driver registers
/// ([`Capabilities::mem_kinds`](crate::driver::Capabilities::mem_kinds))
/// and what it reaches at a peer
/// ([`Capabilities::remote_kinds`](crate::driver::Capabilities::remote_kinds)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MemKinds(u8);

impl MemKinds {
    /// No kind.
    pub const NONE: MemKinds = MemKinds(0);
    /// Host memory.
    pub const HOST: MemKinds = MemKinds::of(MemKind::Host);
    /// CUDA device memory, of any device.
    pub const CUDA: MemKinds = MemKinds::of(MemKind::Cuda(0));

    /// The set of `kind` alone (any device of it).
    pub const fn of(kind: MemKind) -> MemKinds {
        MemKinds(1 << kind.code())
    }

    /// The kinds of both sets.
    pub const fn union(self, other: MemKinds) -> MemKinds {
        MemKinds(self.0 | other.0)
    }

    /// Whether memory of `kind` (on any device) is in the set.
    pub const fn contains(self, kind: MemKind) -> bool {
        self.0 & 1 << kind.code() != 0
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}
