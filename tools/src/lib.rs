//! ringfence tools: `rflayout` (struct layout audit from DWARF) and
//! `rfbench` (the nixlbench-style benchmark).
//!
//! The binaries under `src/bin/` are thin: they parse their command line and
//! call into the modules of this library, so the logic is unit-testable.
//!
//! - [`layout`]: reads DWARF debug info from a built artifact (executable,
//!   shared object, `.rlib`, `.o`) and reports the size, alignment, fields,
//!   holes and padding of named types; checks them against a TOML budget.
//!   Used by the `rflayout` binary.
//! - [`bench`](mod@bench): the `rfbench` benchmark: a sweep of PUT/GET/ATOMIC batches
//!   over the shm or loopback driver printed as nixlbench's table (or JSON,
//!   CSV, an SVG plot), and a PUT ping-pong latency mode. Used by the
//!   `rfbench` binary.
#![deny(unsafe_code, missing_docs, missing_debug_implementations)]

pub mod bench;
pub mod layout;
