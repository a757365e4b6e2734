//! ringfence tools: `rflayout` (struct layout audit from DWARF) and, later,
//! `rfbench` (the nixlbench-style benchmark).
//!
//! The binaries under `src/bin/` are thin: they parse their command line and
//! call into the modules of this library, so the logic is unit-testable.
//!
//! - [`layout`]: reads DWARF debug info from a built artifact (executable,
//!   shared object, `.rlib`, `.o`) and reports the size, alignment, fields,
//!   holes and padding of named types; checks them against a TOML budget.
//!   Used by the `rflayout` binary.
#![deny(unsafe_code, missing_docs, missing_debug_implementations)]

pub mod layout;
