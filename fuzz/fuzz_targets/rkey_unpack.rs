//! Arbitrary remote key blobs to Worker::unpack_rkey and the shm key decoder.
//! See `../checks/rkey.rs` for the input layout and the properties.
#![no_main]

// Each target uses one of the shared checks.
#[allow(dead_code)]
#[path = "../checks/mod.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::rkey::rkey_unpack(data));
