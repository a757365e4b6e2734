//! The ringfence test kit: driver wrappers and rigs for the tests of the
//! engine and of drivers. Nothing here is for production: it allocates on
//! its data paths, and its drivers misbehave on purpose.
//!
//! - [`FaultInjector`] wraps a driver and holds each post and flush until
//!   a program ([`FaultHandle`]) lets it through: reordered across lanes,
//!   delayed, duplicated, failed, lost with a replaced lane, or killed as
//!   an RC queue pair's error kills it.
//! - [`SimDriver`] makes a synchronous driver asynchronous in every way
//!   the tcp, verbs and CUDA drivers are: nothing executes in `post` or
//!   before the round's `commit`, effects land at completion time out of
//!   order across lanes, connects complete through `poll`, a timerfd is
//!   its wake descriptor, `quiesce` cancels what it holds, registrations
//!   have a first phase, and a [`SimHandle`] logs every execution and
//!   quiesce so tests can prove nothing touched memory after it was
//!   quiesced or freed.
//! - [`LoopbackTarget`] and [`run_sqes`]: the set-ups the suites share;
//!   [`Pair`], two workers of any driver connected to each other, with its
//!   submit-progress-reap loops under a hang guard ([`Wait`]) and
//!   [`assert_exactly_once`].
//! - [`conformance`]: the checks every driver runs, and
//!   [`conformance_suite!`] to run them all.
//!
//! Both wrappers hold what the engine posts in one shared core (the
//! private `held` module: per-lane queues, flushes tracked by sequence
//! number, the release rule of ordered and unordered lanes, a seeded
//! xorshift, forwarding to the inner driver); each adds its own policy.
//!
//! Both wrappers forward every method of [`ringfence::Driver`] (a test in
//! the engine's suite checks it).
//!
//! # Unsafe code
//! The wrappers forward the unsafe `post` and `DirectPath::execute`, and
//! `SimDriver` allocates the memory it hands out; each `unsafe` block
//! says why it holds.
#![deny(unsafe_op_in_unsafe_fn, missing_docs, missing_debug_implementations)]
#![warn(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

pub mod conformance;
mod fault;
mod held;
mod rig;
mod sim;

pub use fault::{FaultHandle, FaultInjector, Timing};
pub use held::Executed;
pub use rig::{HANG, LoopbackTarget, Pair, PairConfig, Wait, assert_exactly_once, run_sqes};
pub use sim::{SimDriver, SimEvent, SimHandle, SimStats, SimTiming};
