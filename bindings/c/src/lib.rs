//! The C ABI: `libringfence`, `ringfence.h` and the inline ring helpers.
//!
//! Not yet built: a later issue fills this crate. It exists so that the
//! workspace already has the shape of the architecture.
#![deny(unsafe_code, missing_docs)]
