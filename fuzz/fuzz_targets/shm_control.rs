//! Arbitrary connection pages attached and drained as the shm control thread does.
//! See `../checks/shm.rs` for the input layout and the properties.
#![no_main]

// Each target uses one of the shared checks.
#[allow(dead_code)]
#[path = "../checks/mod.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::shm::shm_control(data));
