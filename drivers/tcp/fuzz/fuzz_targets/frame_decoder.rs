//! `Header::decode` on any 56 bytes and limit: never panics, agrees with a
//! model of the wire tables, and what it takes re-encodes to the same bytes.
//! See `../checks/frame_decoder.rs` for the input layout and the check.
#![no_main]

// Each target uses one of the shared checks.
#[allow(dead_code)]
#[path = "../checks/mod.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::frame_decoder::frame_decoder(data));
