//! Arbitrary worker addresses to Worker::connect over loopback.
//! See `../checks/address.rs` for the input layout and the properties.
#![no_main]

// Each target uses one of the shared checks.
#[allow(dead_code)]
#[path = "../checks/mod.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::address::address_decode(data));
