//! Criterion benchmarks for ringfence live in `benches/benches/`; this library is empty.
#![deny(missing_docs)]
