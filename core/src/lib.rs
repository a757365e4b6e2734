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
//! # Testing drivers
//! The test kit is its own crate, `ringfence-testkit`: `FaultInjector`
//! reorders, delays and fails a driver's operations on purpose,
//! `SimDriver` makes a synchronous driver asynchronous in every way the
//! tcp, verbs and CUDA drivers are, and the rigs set up targets.
//!
//! # Unsafe code
//! Confined to `sys` (raw memory copies and atomics on registered memory,
//! the notification buffers), the loopback driver (which executes RMA on
//! registered addresses), the driver seam's declaration of the unsafe
//! data-path contract ([`Driver::post`], [`DirectPath::execute`],
//! [`DriverMemory`]) and the two engine functions that call it (in
//! `engine::post` and `engine::direct`, each call with the reason it
//! holds), [`Worker::register`] (an `unsafe fn`:
//! its caller vouches for the memory), and a unit test's driver that
//! forwards `post`; everything else is `#![deny(unsafe_code)]`.
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
pub mod limits;
mod loopback;
mod memory;
mod request;
mod stats;
mod sys;
mod worker;

pub use checksum::reseal;
pub use config::Config;
pub use driver::{
    AtomicDomain, AtomicOps, Capabilities, Completion, Connect, DirectPath, Driver, DriverContext,
    DriverEp, DriverError, DriverMemKey, DriverMemory, DriverRkey, Fails, KeyPart, LaneMask,
    MAX_LANES, MemDesc, MemKind, MemKinds, Op, OpKind, PeerLimits, Posted, Prepare, Prepared,
    Quiesce, Quiesced, Registered, Sleep, Token, Unpacked, drain_completions, execute_by_post,
    fails_endpoint,
};
pub use endpoint::{EndpointId, EndpointState, FenceState};
pub use engine::UnreleasedMemory;
pub use error::Error;
pub use loopback::{CompletionMode, Loopback};
pub use memory::{MemHandle, RkeyId};
pub use request::{MAX_QUEUES, MAX_REQUESTS};
pub use ringfence_ring::{Cqe, Sqe, Status};
pub use stats::Stats;
pub use sys::notify::{Delivery, MAX_NOTIFY_BUFFERS, NotifyPool};
pub use worker::{Notification, QueuePair, RegisteredBuf, Worker, WorkerBuilder};

/// The README's Rust example, compiled and run as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeExample;

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
