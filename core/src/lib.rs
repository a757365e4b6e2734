//! The ringfence engine: workers, endpoints, lanes, the request pool, the
//! memory registry and remote keys, the fence engine, the progress loop and
//! the [`Driver`] trait, with the built-in [`Loopback`] driver.
//!
//! ```text
//!  QueuePair (app thread) ──SQ──▶ Engine::progress ──post/flush──▶ Driver
//!           ◀──CQ───────────────  (one bounded round) ◀──poll──────
//! ```
//!
//! A [`Worker`] is built from the drivers the caller hands it. Application
//! threads each create a [`QueuePair`] and write [`Sqe`]s straight into its
//! ring; the engine runs on whichever thread calls [`Worker::progress`], or
//! on a core thread ([`Worker::start_core_thread`]). Every SQE yields exactly
//! one CQE (unless it asked to skip a successful one), whatever happens: a
//! validation error, a driver error, a failed endpoint, or worker teardown.
//!
//! # Quick start
//! See [`Worker`]'s example: two loopback workers, a registered window, a
//! PUT and a FLUSH.
//!
//! # Cargo features
//! - `testkit`: driver wrappers for tests. `FaultInjector` reorders,
//!   delays and fails operations on purpose. `SimDriver` makes a
//!   synchronous driver asynchronous in every way the tcp, verbs and CUDA
//!   drivers are: nothing executes in `post` or before the round's
//!   `commit`, effects land at completion time out of order across lanes,
//!   connects complete through `poll`, a timerfd is its wake descriptor,
//!   `quiesce` cancels what it holds, and a `SimHandle` logs every
//!   execution and quiesce so tests can prove nothing touched memory after
//!   it was quiesced or freed.
//!
//! # Thread safety
//! A `Worker` is `Send + Sync`; its engine sits behind one mutex, taken once
//! per progress round (uncontended when one thread makes progress) and by
//! control calls (connect, register). A `QueuePair` is `Send`, owned by one
//! thread at a time; its rings are wait-free.
//!
//! # Resource cleanup
//! Dropping the worker stops the core thread, completes everything
//! outstanding with [`Status::Canceled`](ringfence_ring::Status), and drops
//! the drivers, after which no peer reaches this worker's memory. Memory from
//! [`Worker::alloc_registered`] is freed when its last handle and its
//! registration are gone.
//!
//! # Memory shared with a peer
//! Registered windows (a peer PUTs into them, the engine stores results
//! and notification payloads), a peer's windows mapped by a driver,
//! notification channels and ring regions are memory that another process
//! (or C code, or a device) may write at any moment. The rules for every
//! crate of the workspace, and for the C inline helpers:
//!
//! 1. No Rust reference, slice or `&mut` ever spans such memory. It is
//!    reached through raw pointers only. The one exception is an atomic
//!    (`&AtomicU32`, `&AtomicU64`, or a struct made only of atomics, such
//!    as the rings' index lines) over a word every party accesses
//!    atomically.
//! 2. Bytes move through one primitive, [`peer_mem`]
//!    ([`copy_to_peer`](peer_mem::copy_to_peer),
//!    [`copy_from_peer`](peer_mem::copy_from_peer)): a copy of exactly 1,
//!    2, 4 or 8 bytes to an address aligned to its size is one atomic
//!    store (Release), and from such an address one atomic load, so a peer
//!    polling that word sees the old or the new value, never a mix. Larger
//!    or unaligned copies are plain copies; racing with a peer they yield
//!    some mix of bytes, never undefined behaviour in this process (the
//!    primitive's docs say why, and why not volatile or per-byte atomic
//!    copies). Words that peers update with atomics are read and written
//!    only atomically ([`RegisteredBuf::load_u64`] and
//!    [`store_u64`](RegisteredBuf::store_u64), [`peer_mem::store_u64`];
//!    `rf_load_u64` and `rf_store_u64` in C).
//! 3. What comes out of such memory is copied once into local memory and
//!    only the copy is looked at and validated (ring entries, channel
//!    records, region headers): no field is read twice and trusted.
//! 4. Kernel copies (cross memory attach) get raw `iovec`s, never a slice.
//! 5. Memory that only this process writes, under a protocol, may be
//!    borrowed: the SQ slot [`QueuePair::next_sqe`] hands out (a slot of
//!    the application's own ring that the engine reads only once it is
//!    submitted; its only other writer would be a corrupt peer, see
//!    `Producer::next_entry`), and the private notification buffers a
//!    [`Notification`] reads (never registered, never mapped by a peer).
//!
//! # Unsafe code
//! Confined to `sys` (raw memory copies and atomics on registered memory,
//! the notification buffers), the loopback driver (which executes RMA on
//! registered addresses), the driver seam's declaration of the unsafe
//! data-path contract ([`Driver::post`], [`DirectPath::execute`]) and the
//! two engine modules that call it (`engine::post`, `engine::direct`, each
//! call with the reason it holds), and the test kit's wrappers (which
//! forward the unsafe `post`; `SimDriver` also allocates the memory it
//! hands out); everything else is `#![deny(unsafe_code)]`.
#![deny(
    unsafe_code,
    unsafe_op_in_unsafe_fn,
    missing_docs,
    missing_debug_implementations
)]
#![warn(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

mod checksum;
mod config;
mod driver;
mod endpoint;
mod engine;
mod error;
#[cfg(feature = "testkit")]
mod fault;
pub mod limits;
mod loopback;
mod memory;
mod request;
#[cfg(feature = "testkit")]
mod sim;
mod stats;
mod sys;
#[cfg(feature = "testkit")]
mod testkit;
mod worker;

pub use checksum::reseal;
pub use config::Config;
pub use driver::{
    AtomicDomain, AtomicOps, Capabilities, Completion, Connect, DirectPath, Driver, DriverContext,
    DriverEp, DriverError, DriverMemKey, DriverMemory, DriverRkey, Fails, KeyPart, LaneMask,
    MAX_LANES, MemDesc, Op, OpKind, PeerLimits, Posted, Prepare, Prepared, Quiesce, Quiesced,
    Registered, Sleep, Token, Unpacked, drain_completions, execute_by_post, fails_endpoint,
};
pub use endpoint::{EndpointId, EndpointState, FenceState};
pub use engine::UnreleasedMemory;
pub use error::Error;
#[cfg(feature = "testkit")]
pub use fault::{Executed, FaultHandle, FaultInjector, Timing};
pub use loopback::{CompletionMode, Loopback};
pub use memory::{MemHandle, MemKind, MemKinds, RkeyId};
pub use request::{MAX_QUEUES, MAX_REQUESTS};
pub use ringfence_ring::{Cqe, Sqe, Status};
#[cfg(feature = "testkit")]
pub use sim::{SimDriver, SimEvent, SimHandle, SimStats, SimTiming};
pub use stats::Stats;
pub use sys::notify::{Delivery, MAX_NOTIFY_BUFFERS, NotifyPool};
#[cfg(feature = "testkit")]
pub use testkit::{LoopbackTarget, run_sqes};
pub use worker::{Notification, QueuePair, RegisteredBuf, Worker, WorkerBuilder};

/// Copies and atomics on memory a peer may write concurrently: registered
/// memory (shared with peers and the application at once) and a peer's
/// memory mapped by a driver, for drivers that move bytes into or out of
/// it. These never form a Rust reference into it: raw copies, atomic words
/// (see the crate docs, "Memory shared with a peer").
///
/// Every copy takes its source first, then its destination, then the
/// length, as [`std::ptr::copy`] does: [`copy`](peer_mem::copy)`(src, dst,
/// len)`, [`copy_to_peer`](peer_mem::copy_to_peer)`(src, dst, len)`,
/// [`copy_from_peer`](peer_mem::copy_from_peer)`(src, dst, len)`.
pub mod peer_mem {
    pub use crate::sys::mem::{atomic, copy, store_u64};
    pub use crate::sys::peer::{copy_from_peer, copy_to_peer};
}
