//! The ringfence engine: workers, endpoints, lanes, the request pool, the
//! memory registry and remote keys, the fence engine, the progress loop and
//! the `Driver` trait.
//!
//! Not yet built: this crate is filled by the core engine issue. The ring ABI
//! it sits on is in [`ringfence-ring`](../ringfence_ring/index.html).
#![deny(unsafe_code, missing_docs)]
