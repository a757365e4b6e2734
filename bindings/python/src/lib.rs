//! The native module of the `ringfence` Python package
//! (`ringfence._ringfence`): workers, registered memory, endpoints, batches
//! of operations, transfers and notifications, over the engine's Rust API
//! (`ringfence`, with the `ringfence-shm` and `ringfence-tcp` drivers), not
//! the C ABI.
//!
//! ```text
//!  Python thread                      this module                 engine
//!  ─────────────                      ───────────                 ──────
//!  Endpoint.post([put, fence, notify]) ─▶ SQEs (GIL released) ─SQ─▶ progress / core thread
//!  Transfer.wait() / await transfer   ◀─ routed by user_data ◀─CQ─
//!  Worker.wait_notification()         ◀─ notification CQEs
//! ```
//!
//! # Why PyO3 and maturin
//! The engine is Rust; PyO3 calls it directly (no C ABI in between, no
//! second set of handle tables), exports Python's buffer protocol and
//! takes other objects' buffers with checked wrappers, releases the GIL
//! with `Python::detach`, and turns Rust errors into exceptions.
//! maturin builds the one `cdylib` into an abi3 wheel (one wheel for
//! CPython 3.11 and later; 3.11 is the first whose stable ABI has the
//! buffer protocol) together with the pure-Python part of the package
//! (`python/ringfence`: the exception classes, the asyncio helpers, the
//! type stubs), and `maturin develop` installs it into a virtual
//! environment, which is what `scripts/test.sh`'s `python` step does. A
//! hand-written setuptools extension or cffi over `libringfence` would
//! go through the C ABI and re-implement the buffer and GIL handling.
//!
//! # Not in the root workspace
//! This crate is excluded from the root Cargo workspace: PyO3's build
//! script needs a Python interpreter, and a test binary linking PyO3
//! needs libpython; with the crate out, `cargo clippy --workspace`,
//! `cargo test --workspace`, the docs, miri and tsan steps build exactly
//! what they built before, on machines without Python. It has its own
//! `Cargo.lock`; `scripts/test.sh`'s `python` step formats and lints it.
//!
//! # Safety
//! Unsafe code is confined to: registering a Python object's buffer
//! (`Worker::register`'s contract is kept by holding the buffer's export
//! until the engine lets go: `memory.rs`), exporting allocated memory and
//! forwarding a registered object's buffer through the buffer protocol
//! (`Memory.__getbuffer__`), copying a notification into a caller's
//! buffer and a typed buffer's bytes out (`transfer.rs`, `ops.rs`), and
//! the fork handler (`core.rs`). Each block says why it holds.
//!
//! # Exactly once
//! Every operation posted gets exactly one result in its `Transfer`: from
//! its CQE, or, for one never pushed (the worker closed under a post), a
//! `Canceled` result set here; see `book.rs`.
#![deny(unsafe_op_in_unsafe_fn, missing_debug_implementations)]
#![warn(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

mod book;
mod core;
mod errors;
mod memory;
mod ops;
mod transfer;
mod worker;

use pyo3::prelude::*;

/// The native part of the `ringfence` package (import `ringfence`).
#[pymodule]
fn _ringfence(m: &Bound<'_, PyModule>) -> PyResult<()> {
    core::watch_fork();
    m.add_class::<worker::Worker>()?;
    m.add_class::<worker::Port>()?;
    m.add_class::<memory::Memory>()?;
    m.add_class::<memory::RemoteMemory>()?;
    m.add_class::<transfer::Endpoint>()?;
    m.add_class::<transfer::Batch>()?;
    m.add_class::<transfer::Transfer>()?;
    m.add_class::<transfer::Notification>()?;
    m.add_class::<ops::Op>()?;
    m.add_function(wrap_pyfunction!(ops::put, m)?)?;
    m.add_function(wrap_pyfunction!(ops::get, m)?)?;
    m.add_function(wrap_pyfunction!(ops::atomic_add, m)?)?;
    m.add_function(wrap_pyfunction!(ops::fetch_add, m)?)?;
    m.add_function(wrap_pyfunction!(ops::swap, m)?)?;
    m.add_function(wrap_pyfunction!(ops::compare_swap, m)?)?;
    m.add_function(wrap_pyfunction!(ops::fence, m)?)?;
    m.add_function(wrap_pyfunction!(ops::flush, m)?)?;
    m.add_function(wrap_pyfunction!(ops::notify, m)?)?;
    m.add("DRIVERS", worker::drivers_in_build())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
