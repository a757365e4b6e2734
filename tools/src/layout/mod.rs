//! Struct size and layout audit from DWARF debug info (`rflayout`).
//!
//! # Architecture
//!
//! - [`artifact`] opens a built file (ELF executable, shared object, `.o`,
//!   or an `.rlib`/`.a` archive of object files), applies the relocations of
//!   relocatable objects, and hands every object's DWARF to [`dwarf`].
//! - [`dwarf`] walks the debugging information entries once and keeps a
//!   small graph of the types it finds (names built from the
//!   `DW_TAG_namespace` and enclosing-type parents, joined with `::`), and
//!   builds a [`TypeLayout`] for the types that are asked for: members sorted
//!   by `DW_AT_data_member_location` (Rust reorders fields), Rust enums from
//!   their `DW_TAG_variant_part`, C structs, unions, bit-fields and enums.
//! - [`model`] is the result: [`TypeLayout`], [`Field`], [`Hole`],
//!   [`Variant`], and the hole/padding arithmetic.
//! - [`pattern`] matches type names: exact, or a glob with `*` and `?`.
//! - [`report`] renders a layout as pahole-like text (with cache-line
//!   boundaries) or JSON.
//! - [`baseline`] reads and writes the TOML size budget and checks a binary
//!   against it.
//! - [`cli`] is the `rflayout` command line.
//!
//! # Errors
//!
//! Every failure is a [`LayoutError`] whose message is one line naming the
//! file; malformed input gives an error, never a panic.

pub mod artifact;
pub mod baseline;
pub mod cli;
pub mod dwarf;
pub mod error;
pub mod model;
pub mod pattern;
pub mod report;

pub use artifact::Binary;
pub use baseline::{Baseline, Budget, CheckReport};
pub use error::LayoutError;
pub use model::{AlignSource, Field, Hole, TypeKind, TypeLayout, Variant};
pub use pattern::TypePattern;
