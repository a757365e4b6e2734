//! The only code in this crate allowed to be unsafe: what hands the kernel
//! a pointer (io_uring requests naming send batches, connect addresses,
//! receive buffers and windows; the provided-buffer ring), raw copies and
//! atomics on memory the driver does not own (an operation's local memory,
//! registered windows), and adopting the descriptor an accept returns.
//! Everything here is reached through safe functions, except making an
//! operation's [`mem::Local`] (an `unsafe fn`, for `Tcp::post`); each
//! unsafe block says why it is sound.
//!
//! The memory that comes from outside rests on three promises:
//!
//! - **An operation's local memory** ([`mem::Local`]) is the engine's
//!   `Driver::post` contract: made once per operation, in `Tcp::post` (the
//!   one item outside `sys` allowed unsafe code, since the trait declares
//!   `post` unsafe), and kept no longer than the operation. A large PUT's
//!   payload is sent from it: the kernel reads it before the operation
//!   completes, except on a connection that goes on serving the peer after
//!   our lane let go (a known gap: [`send::SendQueue::push_local`]).
//! - **Registered windows** ([`mem::Window`], [`mem::Span`]) stay allocated
//!   until the driver's quiesce of their key answers `Done` (the engine's
//!   contract for `register`, `deregister` and `quiesce`); the driver
//!   answers `Pending` while a connection may still reach one
//!   (`Tcp::holds_key`, in `driver/teardown.rs`).
//! - **A connection's own memory** the kernel reads (its connect address,
//!   its send batches) lives in its boxed `Conn`, which the driver frees
//!   only once no request in flight names it (`Conns::take_finished`), or
//!   never (`Conns::leak`); the ring and its buffers are dropped only once
//!   the kernel holds no request, or never ([`uring::Uring::leak`]).
//!
//! The last two are kept by code outside `sys` (the connection table, the
//! teardown): the functions that rely on them say so.

pub(crate) mod bufring;
pub(crate) mod mem;
pub(crate) mod requests;
pub(crate) mod send;
pub(crate) mod uring;
