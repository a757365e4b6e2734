//! The shared-memory driver: cross-process one-sided communication on one
//! host, with no system call on the data path.
//!
//! ```text
//!  initiator process                              target process
//!  ─────────────────                              ──────────────
//!  engine ─post─▶ Shm ── memcpy / LOCK XADD ──▶ [memfd region]  (mapped by both)
//!                  │  ── NOTIFY record ───────▶ [channel] ─poll─▶ NotifyPool ─▶ CQE
//!                  └── unix socket (SEQPACKET) ◀──▶ control thread  (connect, keys,
//!                                                                    hang-up = death)
//! ```
//!
//! # Registration
//! [`Worker::alloc_registered`](ringfence::Worker::alloc_registered) on a
//! worker with this driver allocates from a memfd sealed against resizing
//! ([`Driver::alloc_memory`](ringfence::Driver::alloc_memory)). Registering
//! exactly such an allocation exports it on the **memfd path**: a peer that
//! presents the key's secret receives that allocation's memfd (nothing
//! else) and maps it; PUT, GET and ATOMIC are then copies and hardware
//! atomics by the initiator's CPU. Any other memory (a sub-range of an
//! allocation, a `Vec`, a stack buffer) is exported on the **cross memory
//! attach path**: PUT and GET are one `process_vm_writev`/`process_vm_readv`
//! each (which needs ptrace access to the target, i.e. the same user), and
//! ATOMIC is [`Status::Unsupported`](ringfence_ring::Status::Unsupported). [`key_path`] tells which path a key
//! uses.
//!
//! # Connection and control path
//! A worker's address names the driver's unix socket in the abstract
//! namespace (`ringfence-shm.<pid>.<random>`: no file to clean up; both
//! processes must share a network namespace). `connect` creates the
//! endpoint's connection page (indices and the notification channel) in a
//! sealed memfd and sends it with `HELLO`; the target's control thread
//! checks and maps it and answers with its export status page.
//! `unpack_rkey` sends `MAP` (slot, generation, secret); the target checks
//! them against its export table and answers with the true bounds and the
//! region's memfd, which the initiator checks (sealed, large enough) before
//! mapping. Connect and unpack are the only requests; the target answers
//! from its control thread, so it needs no progress calls for them (see
//! the `control` module for why a thread).
//!
//! # Data path
//! `post`, `execute`, `flush` and `poll` allocate nothing and make no
//! system call on the memfd path. Every operation completes inside `post`
//! ([`Posted::Done`](ringfence::Posted)), and runs of PUTs and GETs inside
//! one [`DirectPath::execute`](ringfence::DirectPath::execute) call (liveness and
//! the remote key checked once per run, the target's export status once per
//! operation); lanes are ordered (they are all this CPU). The last mapped
//! key a PUT or GET went through stays **hot**: the driver keeps its
//! mapping, bounds and status word at hand (with references that keep the
//! mappings alive), so the next runs through it skip the connection and
//! key tables; that, with the engine's
//! [`QueuePair::try_now`](ringfence::QueuePair::try_now), is the path of a
//! ping-pong. The engine also hands the driver a prefetch hint
//! ([`DirectPath::prefetch`](ringfence::DirectPath::prefetch)) for an SQE that
//! names the hot key, before checking it: the driver issues PREFETCHW on
//! the target line (inside the key's bounds; a prefetch never faults and
//! writes nothing), so the line's transfer from the peer's CPU, the
//! largest part of a ping-pong's one-way latency, overlaps the checks
//! instead of following them. NOTIFY appends a record to the endpoint's channel (or answers
//! `NoResource` when it is full, and the engine retries); the target's
//! `poll` copies each payload once into a notification buffer.
//!
//! When the target's worker does not poll (its core thread sleeps when
//! idle), the driver's control thread notices within a 10 ms tick, asks
//! producers to ring its doorbell (an eventfd: the only system call a
//! NOTIFY can make, and only then), drains the channels itself and thereby
//! wakes the core thread through the notification pool.
//!
//! # Memory ordering
//! A copy into the peer's mapping is in the peer's memory when it returns.
//! The channel's Release publish orders every earlier copy before the
//! notification (the engine also puts a fence, hence a flush, before each
//! NOTIFY); `flush` issues a SeqCst fence (MFENCE on x86_64), which also
//! orders the non-temporal and fast-string stores a large `memcpy` may use.
//! Atomics are SeqCst read-modify-writes (LOCK-prefixed) on the shared
//! word, coherent with the target's own atomics. The `layout` module has
//! the table of every shared word.
//!
//! # Liveness
//! Each driver's control thread owns a **liveness word** in the driver's
//! export status page, which every peer maps read-only: the thread stores
//! its id there and puts the word on its robust futex list
//! (`set_robust_list(2)`), so the kernel itself marks the word when the
//! thread ends, however it ends (`SIGKILL`, a crash, `execve`, or the
//! worker dropped). The kernel does so while the dying process still has
//! its memory, before the process can become a zombie, so a peer that
//! looks after `waitpid` has reaped the target always sees the mark. (A
//! pidfd says the same but costs a system call per look; the word costs
//! one load, so the data path looks at every operation.)
//!
//! - Every PUT, GET, ATOMIC, NOTIFY and `try_now` reads the word before it
//!   starts (a run of PUTs and GETs once per run); a marked word fails it
//!   with [`Status::PeerUnreachable`](ringfence_ring::Status::PeerUnreachable),
//!   which the engine treats as fatal: every request on the endpoint,
//!   queued or later, `try_now` included, completes with that status,
//!   exactly once each. A cross-memory-attach access also looks right
//!   before and right after its system call (a reaped pid can be reused).
//! - A FLUSH, the flush behind a strong fence or a NOTIFY, and a graceful
//!   CLOSE read the word after the SeqCst fence that orders the copies
//!   (also when nothing was written since the last flush:
//!   [`Driver::check_alive`](ringfence::Driver::check_alive)), and succeed
//!   only if it says alive. **What a successful FLUSH promises:** every
//!   write before it was in the target's memory (the mapped memfd) while
//!   the target's worker was still alive. If the target dies just after,
//!   nothing says it read them; as with RDMA, remote completion is not
//!   application-level delivery. A CLOSE of a dead peer completes with
//!   `PeerUnreachable`, and the endpoint is closed all the same.
//! - The connection socket is watched too: the kernel closes it when the
//!   peer dies, the control thread sees the hang-up and marks the endpoint
//!   dead, and the next `poll` unmaps the peer's memory.
//!
//! A PUT that starts before the target dies and lands while it dies
//! succeeds (it writes the memfd, which stays valid while mapped); the
//! next flush fails. Where the kernel refuses `set_robust_list` (a seccomp
//! filter), the word stays unarmed, a warning is logged, a flush asks the
//! socket instead (one `poll`), and operations learn of a death from the
//! control thread's hang-up, a few microseconds to a tick later.
//!
//! # Security
//! A peer maps only memfds of allocations explicitly registered and whose
//! key (slot, generation, 64-bit random secret) it presents; a wrong or
//! stale key is refused by the target before anything is mapped, and every
//! access is checked against the target's true bounds (never the blob's)
//! before any byte moves. Every memfd shared is sealed against resizing,
//! and every memfd received is checked (seals, size) before it is mapped,
//! so a peer cannot make this process fault by truncating one. The status
//! page is sealed against new writable mappings. Everything a peer sends —
//! control messages, key blobs, ring indices and records in shared
//! memory — is validated; garbage is an error, never a panic.
//!
//! The cross memory attach path is only as strict as the kernel's ptrace
//! access check: a peer allowed to `process_vm_writev` into this process
//! could write anywhere in it, so the bounds checks there protect against
//! mistakes, not malice. Export memory on the memfd path (allocate it with
//! `alloc_registered`) to peers you do not trust with your whole process.
//!
//! Deregistration revokes the export in the status page, which every
//! access checks first; an access that passed the check just before may
//! still land (on the memfd path it writes the memfd, which the target's
//! memory allocator never reuses for anything else). On the cross memory
//! attach path, `deregister` also waits (up to one second) for any access
//! in progress, so freed memory is never written.
//!
//! # Quick start
//! ```no_run
//! use ringfence::Worker;
//! use ringfence_shm::Shm;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let worker = Worker::builder().driver(Shm::new()?).build()?;
//! let window = worker.alloc_registered(1 << 20)?;     // a sealed memfd
//! let key = worker.pack_rkey(window.handle())?;       // send with the address
//! let address = worker.address().to_vec();            // to the other process
//! # let _ = (key, address);
//! # Ok(()) }
//! ```
//! The other process connects with `worker.connect(&address)`, unpacks the
//! key, and pushes PUT/GET/ATOMIC/NOTIFY SQEs as with any driver.
//!
//! # Cargo features
//! None.
//!
//! # Thread safety
//! [`Shm`] is `Send`; the engine calls it under its lock. Its control
//! thread (one per driver, blocked in `poll(2)`, awake every 10 ms) shares
//! only the export table (a mutex, control path), the set of incoming
//! channels (a snapshot behind a version counter), liveness flags, and a
//! counter of `poll` calls.
//!
//! # Resource cleanup
//! Dropping the driver (with its worker) revokes every export, shuts down
//! every connection socket (peers see the hang-up), and joins the control
//! thread. Mappings of a peer's memory are released when the peer dies or
//! the endpoint is disconnected.
//!
//! # Unsafe code
//! Confined to `sys`: raw copies and atomics on shared mappings, cross
//! memory attach, descriptor adoption, and the memfd memory handed to the
//! worker.
#![deny(
    unsafe_code,
    unsafe_op_in_unsafe_fn,
    missing_docs,
    missing_debug_implementations
)]
#![warn(
    clippy::undocumented_unsafe_blocks,
    clippy::unnecessary_safety_comment,
    clippy::missing_safety_doc
)]

mod channel;
mod control;
mod driver;
mod export;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod key;
mod layout;
mod memfd;
mod sys;
mod wire;

pub use driver::{DEFAULT_CHANNEL_BYTES, Shm, ShmBuilder};
pub use key::key_path;
pub use wire::KeyPath;

/// Why an [`Shm`] driver could not be created.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShmError {
    /// A builder value is out of range.
    #[error("invalid shm driver configuration: {0}")]
    InvalidConfig(String),
    /// A system call failed.
    #[error("{op} failed")]
    Os {
        /// What was being done.
        op: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}
