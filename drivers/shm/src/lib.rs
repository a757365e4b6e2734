//! The shared-memory driver: memfd-backed registered memory mapped by the peer, put/get/atomics as loads and stores.
//!
//! Not yet built: a later issue fills this crate. It exists so that the
//! workspace already has the shape of the architecture.
#![deny(unsafe_code, missing_docs)]
