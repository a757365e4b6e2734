//! Arbitrary region headers and indices to Region::attach, then entries both ways.
//! See `../checks/ring.rs` for the input layout and the properties.
#![no_main]

// Each target uses one of the shared checks.
#[allow(dead_code)]
#[path = "../checks/mod.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::ring::ring_attach(data));
