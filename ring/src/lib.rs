//! The ringfence ring ABI: 64-byte submission entries, 16-byte completion
//! entries, and the lock-free single-producer single-consumer rings that
//! carry them, in memory that another process (or C code) can share.
//!
//! ```text
//!  application thread                          polling core (engine)
//!  ──────────────────                          ─────────────────────
//!  Producer<Sqe> ──push…push, submit──▶ SQ ──▶ Consumer<Sqe>  pop_batch
//!  Consumer<Cqe> ◀──pop_batch────────── CQ ◀── Producer<Cqe>  push, submit
//! ```
//!
//! A [`Region`] holds one SQ and one CQ behind a validated header, in
//! anonymous memory or in a sealed memfd that another process
//! [`attach`](Region::attach)es. [`channel`] makes a single heap ring for
//! threads of one process. Both give the same [`Producer`] and [`Consumer`].
//!
//! # The shared words
//!
//! Every atomic lives in [`ProducerLine`] or [`ConsumerLine`], each on its own
//! 128-byte line, and is reached only through `sync.rs` (loom under
//! `--cfg loom`).
//!
//! | field | writer | reader | ordering | pairs with |
//! |---|---|---|---|---|
//! | `ProducerLine::tail` | producer, once per batch (`submit`) | consumer, when its cached tail says empty | Release store / Acquire load | `Producer::submit` ↔ `Consumer::refresh_tail`: publishes the entries' contents |
//! | `ConsumerLine::head` | consumer, once per `pop`/`pop_batch` | producer, when its cached head says full | Release store / Acquire load | `Consumer::release` ↔ `Producer::refresh_head`: the consumer's copies are done before slots are reused |
//! | `ConsumerLine::flags` (`NEED_WAKEUP`) | consumer (`prepare_wait`, `finish_wait`) | producer (`needs_wakeup`) | Relaxed, each side fenced by SeqCst | the two SeqCst fences (store-buffering; see [`Producer::needs_wakeup`]) |
//! | `ProducerLine::flags` (`OVERFLOW`) | producer (`set_overflow`) | consumer (`is_overflowed`) | Release / Acquire | each other |
//! | `ProducerLine::flags`, `ConsumerLine::flags` (`FAILED`) | the word's owner, once, never cleared (`Producer::fail`, `Consumer::fail`) | the other side, on its slow paths only: the producer when its cached head says full (`refresh_head`), the consumer when the ring is empty (`refresh_tail`) | Release / Acquire | each other: a consumer that sees `FAILED` sees every entry published before it |
//! | `RegionHeader::claims` | whoever takes a side | the same | AcqRel `fetch_or` | itself (one-shot lock) |
//! | `WakeFlag::flag` | consumer (`announce`, `withdraw`) | producer (`is_announced`) | Relaxed, each side fenced by SeqCst | the two SeqCst fences, as `NEED_WAKEUP` |
//!
//! [`sleep`] is the consumer's side of sleeping on many such sources and on
//! level-triggered descriptors at once, and says why no wake-up is missed.
//!
//! Each side keeps its own index locally and never reloads it from shared
//! memory; the peer's index is read through a cache that is refreshed only
//! when it says full (producer) or empty (consumer).
//!
//! # Untrusted memory
//!
//! A region may be shared with a process that misbehaves. Indices are
//! checked on every refresh (`tail - head` above the capacity is
//! [`Corrupt`]); slot indices are always masked, so no index leads outside
//! the ring; entries are copied out (atomic loads, word by word) before
//! anyone looks at them, and every field of an entry is decoded with
//! `TryFrom`; no reference ever spans bytes the other side may write
//! (but the atomics, and the SQ slot `next_entry` lends). The header is copied
//! and checked once at [`Region::attach`], which also requires the memfd to
//! be sealed against shrinking. Garbage in shared memory yields errors,
//! never undefined behaviour in this process.
//!
//! # Giving a ring up
//!
//! A side that finds the ring memory corrupt can tell the other side so:
//! [`Producer::fail`] or [`Consumer::fail`] sets `FAILED`
//! ([`ProducerLine::FAILED`], [`ConsumerLine::FAILED`], bit 1) in its own
//! flags word, with one Release store, and it is never cleared. The other
//! side does not look for it per entry: a producer reads it when its cached
//! view says the ring is full, a consumer when the ring is empty (entries
//! published before the flag stay readable first). From then on that side
//! gets [`Corrupt`] (with [`Corrupt::marked_failed`] set if its own indices
//! look fine) instead of waiting for room or entries that will never come.
//! The ringfence engine sets it on the SQ and the CQ of a queue pair whose
//! memory it found corrupt.
//!
//! # Quick start
//! ```
//! use ringfence_ring::{Cqe, Region, Sqe};
//! let mut region = Region::builder().sq_entries(8).build_anonymous()?;
//! let (mut sq, mut cq) = region.app_side()?;
//! let (mut engine_sq, mut engine_cq) = region.engine_side()?;
//!
//! sq.push_batch(&[Sqe::nop().with_user_data(1), Sqe::nop().with_user_data(2)])?;
//! sq.submit();
//!
//! let mut batch = [Sqe::default(); 8];
//! let n = engine_sq.pop_batch(&mut batch)?;
//! for sqe in &batch[..n] {
//!     engine_cq.push(Cqe::new(sqe.user_data, 0, 0))?;
//! }
//! engine_cq.submit();
//!
//! let mut done = [Cqe::default(); 8];
//! assert_eq!(cq.pop_batch(&mut done)?, 2);
//! assert_eq!(done[1].user_data, 2);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Cargo features
//! None. Build with `RUSTFLAGS="--cfg loom"` to model-check the ring
//! protocol (`ring/tests/loom.rs`) and the sleep protocol
//! (`ring/tests/loom_sleep.rs`); regions and doorbells are left out then.
//!
//! # Thread safety
//! [`Producer`] and [`Consumer`] are `Send` and not `Sync`: each side belongs
//! to one thread at a time, which is what makes the rings wait-free.
//!
//! # Resource cleanup
//! The memory of a ring stays mapped while its [`Region`], or any
//! [`Producer`] or [`Consumer`] taken from it, lives.
#![deny(unsafe_op_in_unsafe_fn, missing_docs, missing_debug_implementations)]
#![warn(
    clippy::undocumented_unsafe_blocks,
    clippy::unnecessary_safety_comment,
    clippy::missing_safety_doc
)]

mod consumer;
mod cqe;
#[cfg(not(loom))]
mod doorbell;
mod entry;
mod error;
mod layout;
mod producer;
mod raw;
#[cfg(not(loom))]
mod region;
mod sleep;
mod sqe;
mod status;
mod sync;
mod value;

pub use consumer::Consumer;
pub use cqe::{CQE_BUFFER_SHIFT, Cqe};
#[cfg(not(loom))]
pub use doorbell::Doorbell;
pub use entry::Entry;
pub use error::{Corrupt, RingError};
pub use layout::{
    BadEntries, ConsumerLine, Layout, MAX_ENTRIES, ProducerLine, RegionHeader, RingOffsets,
};
pub use producer::Producer;
#[cfg(not(loom))]
pub use raw::RawParts;
pub use raw::channel;
#[cfg(not(loom))]
pub use region::{AppSide, EngineSide, Region, RegionBuilder, RegionError};
pub use sleep::{Sleeper, WakeFlag, sleep};
pub use sqe::{LocalBuf, RemoteBuf, Sqe};
pub use status::{LIBRARY_BASE, Status, UnknownStatus, strerror};
pub use value::{
    AtomicOp, CloseMode, CqeFlags, FenceMode, Field, FlushScope, Opcode, SqeFlags, UnknownValue,
};

/// Why [`Consumer::wait`] failed.
#[cfg(not(loom))]
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WaitError {
    /// The shared indices are corrupt.
    #[error(transparent)]
    Corrupt(#[from] Corrupt),
    /// Waiting on the doorbell failed.
    #[error("waiting on the doorbell failed")]
    Io(#[from] std::io::Error),
}
