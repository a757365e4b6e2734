//! What a driver can do ([`Capabilities`]): lanes and their ordering,
//! operations and their largest size, atomics and what executes them,
//! memory kinds; and what a connected peer accepts ([`PeerLimits`]).

use super::MAX_LANES;
use super::{MemKind, MemKinds};
use ringfence_ring::AtomicOp;
#[cfg(doc)]
use {super::Driver, super::Registered, ringfence_ring::Status};

/// What a driver can do. [`Capabilities::new`] claims nothing beyond the
/// limits it is given: a driver sets each field it supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Operations posted on one lane take effect at the target in posting
    /// order once the transport fence flag ([`Op::fence`](super::Op::fence))
    /// orders them after what came before (RC QP, TCP stream, shm FIFO, one
    /// CUDA stream), on every lane of every connection: a weak fence may
    /// then use the lane (docs/fence.md R8, R9). An endpoint with lanes on
    /// several drivers takes each lane's from its driver.
    pub ordered_lanes: bool,
    /// The ATOMIC operations the driver executes (verbs has no SWAP).
    pub atomic_ops: AtomicOps,
    /// What executes them, and so which other atomics on the same word
    /// they are atomic with ([`AtomicDomain`]).
    pub atomic_domain: AtomicDomain,
    /// The driver executes GET.
    pub get: bool,
    /// The driver delivers NOTIFY payloads.
    pub notify: bool,
    /// A NOTIFY posted on a lane is delivered after every write posted
    /// before it on that lane has taken effect (an RC QP's write with
    /// immediate after writes, a TCP stream, a CUDA stream): the engine
    /// then orders a NOTIFY by the weak path when its own lane is the only
    /// dirty one (a transport fence flag, no flush), and by a flush
    /// otherwise (docs/fence.md R8, R9).
    pub notify_ordered: bool,
    /// Memory kinds it registers (for local use, remote access or both:
    /// [`Registered`]).
    pub mem_kinds: MemKinds,
    /// Memory kinds at a peer it reaches: a part of a peer's key for
    /// memory of another kind is never unpacked by it, and operations on
    /// that key take another driver's lanes (or fail with
    /// [`Status::Unsupported`]). A CUDA driver that copies between host
    /// and device memory registers both kinds but reaches only a peer's
    /// device memory (IPC maps nothing else): host-to-host PUTs then go to
    /// shm or tcp.
    pub remote_kinds: MemKinds,
    /// Most lanes per endpoint, `1..=64`.
    pub max_lanes: u8,
    /// Largest single PUT/GET/NOTIFY in bytes, at least 1.
    pub max_len: u32,
}

impl Capabilities {
    /// `max_lanes` lanes per endpoint and operations of up to `max_len`
    /// bytes, and nothing else: lanes unordered, no atomics, GET or NOTIFY,
    /// no memory kind. The driver sets what it supports.
    pub const fn new(max_lanes: u8, max_len: u32) -> Self {
        Capabilities {
            ordered_lanes: false,
            atomic_ops: AtomicOps::NONE,
            atomic_domain: AtomicDomain::Host,
            get: false,
            notify: false,
            notify_ordered: false,
            mem_kinds: MemKinds::NONE,
            remote_kinds: MemKinds::NONE,
            max_lanes,
            max_len,
        }
    }

    /// Every operation (GET, every atomic, NOTIFY ordered after the writes
    /// before it on its lane) on ordered lanes over host memory, atomics
    /// executed by a CPU: what a complete host transport claims.
    pub const fn host_rma(max_lanes: u8, max_len: u32) -> Self {
        Capabilities {
            ordered_lanes: true,
            atomic_ops: AtomicOps::ALL,
            atomic_domain: AtomicDomain::Host,
            get: true,
            notify: true,
            notify_ordered: true,
            mem_kinds: MemKinds::HOST,
            remote_kinds: MemKinds::HOST,
            max_lanes,
            max_len,
        }
    }

    /// Why these capabilities cannot be used, if they cannot: lanes
    /// outside `1..=64` or a zero `max_len`.
    pub fn invalid(&self) -> Option<&'static str> {
        if self.max_lanes == 0 || self.max_lanes > MAX_LANES {
            Some("max_lanes must be 1..=64")
        } else if self.max_len == 0 {
            Some("max_len must be at least 1")
        } else {
            None
        }
    }

    /// Whether memory of `kind` can be registered.
    pub fn supports_mem_kind(&self, kind: MemKind) -> bool {
        self.mem_kinds.contains(kind)
    }

    /// Whether a peer's memory of `kind` can be reached.
    pub fn reaches(&self, kind: MemKind) -> bool {
        self.remote_kinds.contains(kind)
    }
}

/// A set of [`AtomicOp`]s: the atomics a driver executes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AtomicOps(u8);

impl AtomicOps {
    /// No atomic.
    pub const NONE: AtomicOps = AtomicOps(0);
    /// ADD, FADD, SWAP and CSWAP.
    pub const ALL: AtomicOps = AtomicOps::NONE
        .with(AtomicOp::ADD)
        .with(AtomicOp::FADD)
        .with(AtomicOp::SWAP)
        .with(AtomicOp::CSWAP);

    /// This set with `op` added.
    pub const fn with(self, op: AtomicOp) -> AtomicOps {
        AtomicOps(self.0 | 1 << (op.as_raw() & 7))
    }

    /// This set without `op`.
    pub const fn without(self, op: AtomicOp) -> AtomicOps {
        AtomicOps(self.0 & !(1 << (op.as_raw() & 7)))
    }

    /// Whether `op` is in the set.
    pub const fn contains(self, op: AtomicOp) -> bool {
        self.0 & 1 << (op.as_raw() & 7) != 0
    }

    /// Whether the set is empty (the driver executes no ATOMIC).
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

/// What executes a driver's atomics, which decides what they are atomic
/// with. Two atomics on one word are atomic with each other only if the
/// same kind of agent executes both:
///
/// - [`Host`](AtomicDomain::Host): a CPU's locked instructions on host
///   memory (loopback, shm, and the tcp target, which executes them in its
///   progress). Coherent with each other across host drivers, and with
///   the application's own CPU atomics on that word.
/// - [`Nic`](AtomicDomain::Nic): an RDMA NIC. Atomic with other NIC
///   atomics through the same device only; not with CPU atomics on the
///   same word, nor with another driver's.
/// - [`Device`](AtomicDomain::Device): a GPU kernel on device memory.
///   Atomic with the device's own atomics only.
///
/// On an endpoint with lanes on several drivers, every ATOMIC goes to the
/// atomic lane group (the last group whose driver executes atomics) or to
/// another group of the same domain; one that only a driver of another
/// domain could run fails with [`Status::Unsupported`] instead, so that
/// atomics on one word never mix domains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AtomicDomain {
    /// A CPU.
    Host,
    /// An RDMA NIC.
    Nic,
    /// A GPU.
    Device,
}

/// What the peer of one connection accepts, learnt at connect
/// ([`Driver::peer_limits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PeerLimits {
    /// The largest NOTIFY payload the peer's notification buffers hold.
    pub max_notify_len: u32,
}

impl PeerLimits {
    /// A peer that takes NOTIFY payloads of up to `max_notify_len` bytes.
    pub const fn new(max_notify_len: u32) -> PeerLimits {
        PeerLimits { max_notify_len }
    }
}
