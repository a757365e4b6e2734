//! `rflayout_elf`: arbitrary bytes as an artifact for rflayout's reader
//! (ELF objects and `ar` archives of them, with DWARF).
//!
//! Input: the artifact's bytes.
//!
//! Properties: no panic (malformed input is a `LayoutError`, whose message
//! can be had); an artifact that reads lists its types, and a baseline made
//! from them prints as TOML that parses back.

use ringfence_tools::layout::{Baseline, Binary, TypePattern};
use std::path::Path;

pub fn rflayout_elf(data: &[u8]) {
    let _ = layouts(data);
}

/// Runs [`rflayout_elf`]'s checks; returns the names of the types read
/// (`None`: the artifact was refused).
pub fn layouts(data: &[u8]) -> Option<Vec<String>> {
    let binary = match Binary::parse(Path::new("fuzz-input"), data) {
        Ok(b) => b,
        Err(e) => {
            let _ = e.to_string();
            return None;
        }
    };
    assert!(
        binary.object_count() > 0,
        "an artifact without objects was read"
    );
    let layouts = binary.find(&TypePattern::new("*"));
    for l in &layouts {
        let _ = format!("{l:?}");
        let _ = (l.hole_bytes(), l.field_bytes(), l.has_variants());
    }
    let _ = binary.near_matches(&TypePattern::new("header"));
    // A baseline lists at least one type (an empty one is refused).
    if !layouts.is_empty() {
        let toml = Baseline::from_layouts(&layouts).to_toml();
        let baseline = Baseline::parse(Path::new("fuzz-baseline"), &toml)
            .unwrap_or_else(|e| panic!("a generated baseline does not parse back: {e}\n{toml}"));
        let _ = baseline.check(&binary).render(64);
    }
    Some(layouts.iter().map(|l| l.name.clone()).collect())
}

/// An `ar` archive (the format of `.rlib` and `.a`) of `members`.
pub fn archive(members: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = b"!<arch>\n".to_vec();
    for (name, data) in members {
        let header = format!(
            "{:<16}{:<12}{:<6}{:<6}{:<8}{:<10}`\n",
            format!("{name}/"),
            0,
            0,
            0,
            644,
            data.len()
        );
        assert_eq!(header.len(), 60);
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(data);
        if data.len() % 2 == 1 {
            out.push(b'\n');
        }
    }
    out
}

/// A small C object and a small Rust object, both with DWARF (their
/// sources and the commands that built them are in `fuzz/seeds/`).
pub const C_OBJECT: &[u8] = include_bytes!("../seeds/tiny.o");
/// See [`C_OBJECT`].
pub const RUST_OBJECT: &[u8] = include_bytes!("../seeds/tiny_rs.o");

pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = vec![
        ("c_object".to_string(), C_OBJECT.to_vec()),
        ("rust_object".to_string(), RUST_OBJECT.to_vec()),
        (
            "archive".to_string(),
            archive(&[
                ("tiny.o", C_OBJECT),
                ("lib.rmeta", b"not an object"),
                ("tiny_rs.o", RUST_OBJECT),
            ]),
        ),
        (
            "cut_object".to_string(),
            C_OBJECT[..C_OBJECT.len() / 2].to_vec(),
        ),
        ("empty_archive".to_string(), archive(&[])),
    ];
    // A member that claims more bytes than the archive holds.
    let mut long = archive(&[("tiny.o", C_OBJECT)]);
    long[8 + 48..8 + 58].copy_from_slice(b"999999    ");
    out.push(("archive_overlong_member".into(), long));
    out
}
