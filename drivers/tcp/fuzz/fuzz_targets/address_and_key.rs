//! The address and remote-key decoders on any bytes: never panic, and what
//! they take re-encodes to the same bytes.
//! See `../checks/address_and_key.rs` for the input layout and the check.
#![no_main]

// Each target uses one of the shared checks.
#[allow(dead_code)]
#[path = "../checks/mod.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::address_and_key::address_and_key(data));
