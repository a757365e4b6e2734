//! The fuzz targets' checks on stable: every committed seed (and every
//! input the fuzzer kept under `fuzz/corpus-new/` or reported under
//! `fuzz/artifacts/`, when present) runs through the same check its target
//! runs, and the committed seed corpus is exactly what
//! [`checks::seeds`] generates. `RINGFENCE_BLESS=1` rewrites the seeds.

#[allow(dead_code)]
#[path = "../fuzz/checks/mod.rs"]
mod checks;

use ringfence_tests::corpus::Corpus;
use std::path::Path;

fn corpus() -> Corpus {
    Corpus {
        dir: Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz"),
        targets: &checks::TARGETS,
        seeds: checks::seeds(),
        bless: "RINGFENCE_BLESS=1 cargo test -p ringfence-tcp --test corpus",
    }
}

#[test]
fn the_committed_seeds_are_the_generated_ones() {
    corpus().assert_committed_seeds_are_generated();
}

#[test]
fn every_input_passes_its_target_check() {
    corpus().assert_every_input_passes();
}

#[test]
fn the_checks_hold_on_cut_and_shifted_seeds() {
    // Every prefix and every one-byte change of the seeds at a few places:
    // inputs the fuzzer reaches first, checked on every stable run.
    let mut ran = 0u32;
    for (target, _, bytes) in checks::seeds() {
        let check = corpus().check_of(target);
        for end in 0..=bytes.len().min(160) {
            check(&bytes[..end]);
            ran += 1;
        }
        for at in (0..bytes.len().min(64)).step_by(3) {
            for flip in [0x01u8, 0x80, 0xff] {
                let mut b = bytes.clone();
                b[at] ^= flip;
                check(&b);
                ran += 1;
            }
        }
    }
    assert!(ran > 1000, "{ran}");
}
