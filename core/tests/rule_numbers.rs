//! Every fence rule the sources cite ("R17", "W2") is defined in
//! `docs/fence.md`, so a reader of the code can look each one up.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The workspace's Rust sources, outside build output.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if path.is_dir() {
            if !name.starts_with('.') && name != "target" && name != "corpus" {
                sources(&path, out);
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

/// The rule citations in `text`: `R` or `W` then digits, as a word of
/// its own.
fn citations(text: &str) -> BTreeSet<String> {
    let bytes = text.as_bytes();
    let mut found = BTreeSet::new();
    for (i, &b) in bytes.iter().enumerate() {
        if b != b'R' && b != b'W' {
            continue;
        }
        if i > 0 && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_') {
            continue;
        }
        let digits = bytes[i + 1..]
            .iter()
            .take_while(|d| d.is_ascii_digit())
            .count();
        let end = i + 1 + digits;
        let word_ends = bytes
            .get(end)
            .is_none_or(|c| !c.is_ascii_alphanumeric() && *c != b'_');
        if (1..=2).contains(&digits) && word_ends {
            found.insert(text[i..end].to_owned());
        }
    }
    found
}

#[test]
fn every_cited_rule_is_defined_in_docs_fence_md() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let doc = std::fs::read_to_string(root.join("docs/fence.md")).expect("docs/fence.md");
    let defined = |rule: &str| {
        let (kind, n) = rule.split_at(1);
        match kind {
            // A numbered list item: "17. **D across a flush.**".
            "R" => doc
                .lines()
                .any(|l| l.trim_start().starts_with(&format!("{n}. "))),
            // "- **W2.** ...".
            _ => doc.contains(&format!("**W{n}.**")),
        }
    };
    let mut files = Vec::new();
    sources(&root, &mut files);
    assert!(files.len() > 50, "the sources were found: {}", files.len());
    let mut missing = BTreeSet::new();
    let mut cited = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for rule in citations(&text) {
            cited += 1;
            if !defined(&rule) {
                missing.insert(format!("{rule} ({})", file.display()));
            }
        }
    }
    assert!(cited > 50, "rule citations were found: {cited}");
    assert!(missing.is_empty(), "cited but not defined: {missing:?}");
}
