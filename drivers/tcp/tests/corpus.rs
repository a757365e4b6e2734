//! The fuzz targets' checks on stable: every committed seed (and every
//! input the fuzzer kept under `fuzz/corpus-new/` or reported under
//! `fuzz/artifacts/`, when present) runs through the same check its target
//! runs, and the committed seed corpus is exactly what
//! [`checks::seeds`] generates. `RINGFENCE_BLESS=1` rewrites the seeds.

#[allow(dead_code)]
#[path = "../fuzz/checks.rs"]
mod checks;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

/// The files of `dir`, by name; none when it does not exist.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return BTreeMap::new();
    };
    entries
        .map(|e| e.expect("reading a corpus directory"))
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| {
            let name = e.file_name().into_string().expect("a UTF-8 file name");
            (
                name,
                std::fs::read(e.path()).expect("reading a corpus file"),
            )
        })
        .collect()
}

#[test]
fn the_committed_seeds_are_the_generated_ones() {
    let corpus = fuzz_dir().join("corpus");
    let mut want: BTreeMap<&str, BTreeMap<String, Vec<u8>>> = BTreeMap::new();
    for (target, name, bytes) in checks::seeds() {
        let previous = want.entry(target).or_default().insert(name.clone(), bytes);
        assert!(previous.is_none(), "seed {target}/{name} generated twice");
    }
    if std::env::var_os("RINGFENCE_BLESS").is_some() {
        for (target, seeds) in &want {
            let dir = corpus.join(target);
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            for (name, bytes) in seeds {
                std::fs::write(dir.join(name), bytes).unwrap();
            }
        }
    }
    for (target, _) in checks::TARGETS {
        let got = files(&corpus.join(target));
        let expected = want.remove(target).unwrap_or_default();
        assert!(!expected.is_empty(), "no seeds for target {target}");
        assert!(
            got == expected,
            "fuzz/corpus/{target} differs from checks::seeds() (files {:?}, expected {:?}); \
             run `RINGFENCE_BLESS=1 cargo test -p ringfence-tcp --test corpus` and commit",
            got.keys().collect::<Vec<_>>(),
            expected.keys().collect::<Vec<_>>()
        );
    }
    assert!(want.is_empty(), "seeds for no target: {:?}", want.keys());
}

#[test]
fn every_input_passes_its_target_check() {
    let dir = fuzz_dir();
    let mut ran = 0;
    for (target, check) in checks::TARGETS {
        for place in ["corpus", "corpus-new", "artifacts"] {
            for (name, bytes) in files(&dir.join(place).join(target)) {
                // A panic here names the input that broke the property.
                eprintln!("{place}/{target}/{name}");
                check(&bytes);
                ran += 1;
            }
        }
    }
    assert!(ran >= checks::seeds().len(), "only {ran} inputs ran");
}

#[test]
fn the_checks_hold_on_cut_and_shifted_seeds() {
    // Every prefix and every one-byte change of the seeds at a few places:
    // inputs the fuzzer reaches first, checked on every stable run.
    let mut ran = 0u32;
    for (target, _, bytes) in checks::seeds() {
        let check = checks::TARGETS
            .iter()
            .find(|(t, _)| *t == target)
            .map(|(_, c)| *c)
            .expect("a seed of a known target");
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
