//! Replaying a cargo-fuzz crate's corpus on stable, through the same checks
//! its targets run: the committed seeds are exactly what the crate's seed
//! generator makes (`RINGFENCE_BLESS=1` rewrites them), and every input
//! kept under `corpus/`, `corpus-new/` or `artifacts/` passes its target's
//! check. Used for the top-level `fuzz/` crate and the tcp driver's.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A target's check: panics on a broken property.
pub type Check = fn(&[u8]);

/// One fuzz crate: where it lives, its targets, its generated seeds, and
/// the command that rewrites them.
#[derive(Debug)]
pub struct Corpus {
    /// The fuzz crate's directory (holding `corpus/`).
    pub dir: PathBuf,
    /// Each target's name and check.
    pub targets: &'static [(&'static str, Check)],
    /// (target, name, bytes) of every seed, as the generator makes them.
    pub seeds: Vec<(&'static str, String, Vec<u8>)>,
    /// The command that rewrites the committed seeds.
    pub bless: &'static str,
}

/// The files of `dir`, by name; none when it does not exist.
///
/// # Panics
/// If a directory entry or file cannot be read.
pub fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
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

impl Corpus {
    /// The check of `target`.
    ///
    /// # Panics
    /// If there is no such target.
    pub fn check_of(&self, target: &str) -> Check {
        self.targets
            .iter()
            .find(|(t, _)| *t == target)
            .map(|(_, c)| *c)
            .unwrap_or_else(|| panic!("no fuzz target {target}"))
    }

    /// Asserts that `corpus/<target>/` holds exactly the generated seeds of
    /// every target (after rewriting them under `RINGFENCE_BLESS`).
    ///
    /// # Panics
    /// If they differ, or a seed is generated twice or for no target.
    pub fn assert_committed_seeds_are_generated(&self) {
        let corpus = self.dir.join("corpus");
        let mut want: BTreeMap<&str, BTreeMap<String, Vec<u8>>> = BTreeMap::new();
        for (target, name, bytes) in &self.seeds {
            let previous = want
                .entry(target)
                .or_default()
                .insert(name.clone(), bytes.clone());
            assert!(previous.is_none(), "seed {target}/{name} generated twice");
        }
        if std::env::var_os("RINGFENCE_BLESS").is_some() {
            for (target, seeds) in &want {
                let dir = corpus.join(target);
                let _ = std::fs::remove_dir_all(&dir);
                std::fs::create_dir_all(&dir).expect("creating a corpus directory");
                for (name, bytes) in seeds {
                    std::fs::write(dir.join(name), bytes).expect("writing a seed");
                }
            }
        }
        for (target, _) in self.targets {
            let got = files(&corpus.join(target));
            let expected = want.remove(target).unwrap_or_default();
            assert!(!expected.is_empty(), "no seeds for target {target}");
            assert!(
                got == expected,
                "{}/corpus/{target} differs from the generated seeds (files {:?}, expected {:?}); \
                 run `{}` and commit",
                self.dir.display(),
                got.keys().collect::<Vec<_>>(),
                expected.keys().collect::<Vec<_>>(),
                self.bless
            );
        }
        assert!(want.is_empty(), "seeds for no target: {:?}", want.keys());
    }

    /// Runs every input under `corpus/`, `corpus-new/` and `artifacts/`
    /// through its target's check; a panic names the input first.
    ///
    /// # Panics
    /// If a check fails, or fewer inputs ran than there are seeds.
    pub fn assert_every_input_passes(&self) {
        let mut ran = 0;
        for (target, check) in self.targets {
            for place in ["corpus", "corpus-new", "artifacts"] {
                for (name, bytes) in files(&self.dir.join(place).join(target)) {
                    eprintln!("{place}/{target}/{name}");
                    check(&bytes);
                    ran += 1;
                }
            }
        }
        assert!(ran >= self.seeds.len(), "only {ran} inputs ran");
    }
}
