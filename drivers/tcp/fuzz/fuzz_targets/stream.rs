//! A `Reader` fed any byte stream in any chunks, with a handler that pauses
//! and refuses: it keeps its contract and yields what one whole feed does.
//! See `../checks/stream.rs` for the input layout and the check.
#![no_main]

// Each target uses one of the shared checks.
#[allow(dead_code)]
#[path = "../checks/mod.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::stream::stream(data));
