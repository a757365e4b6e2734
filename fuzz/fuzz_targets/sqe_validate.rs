//! Arbitrary SQEs through a real worker over loopback: one CQE each, invalid ones fail, no byte written outside what succeeded.
//! See `../checks/sqe.rs` for the input layout and the properties.
#![no_main]

// Each target uses one of the shared checks.
#[allow(dead_code)]
#[path = "../checks/mod.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::sqe::sqe_validate(data));
