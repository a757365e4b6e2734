//! `rflayout check` against a baseline: unchanged passes, a grown struct or
//! a missing type fails, an invalid baseline is an input error.

use crate::fixture::{fixture, grown_fixture};
use crate::{rflayout, stderr, stdout};
use std::ffi::OsStr;
use std::path::Path;

#[test]
fn check_passes_unchanged_and_fails_grown_struct() {
    let dir = tempfile::tempdir().expect("tempdir");
    let baseline_path = dir.path().join("layout.toml");
    let output = rflayout([
        OsStr::new("baseline"),
        fixture().rlib.as_os_str(),
        OsStr::new("fixture::Holey"),
        OsStr::new("fixture::Reordered"),
        OsStr::new("fixture::Wrap<u32>"),
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let baseline = stdout(&output);
    assert!(
        baseline.contains("[\"fixture::Holey\"]\nmax_size = 24\nmax_holes = 1\n"),
        "{baseline}"
    );
    assert!(
        baseline.contains("[\"fixture::Reordered\"]\nmax_size = 16\nmax_holes = 0\n"),
        "{baseline}"
    );
    assert!(
        baseline.contains("[\"fixture::Wrap<u32>\"]\nmax_size = 8\nmax_holes = 0\n"),
        "{baseline}"
    );
    std::fs::write(&baseline_path, &baseline).expect("write baseline");

    let check = |file: &Path| {
        rflayout([
            OsStr::new("check"),
            file.as_os_str(),
            OsStr::new("--baseline"),
            baseline_path.as_os_str(),
        ])
    };
    let unchanged = check(&fixture().rlib);
    assert_eq!(
        unchanged.status.code(),
        Some(0),
        "{}{}",
        stdout(&unchanged),
        stderr(&unchanged)
    );
    assert!(
        stdout(&unchanged)
            .contains("ok    fixture::Holey: size 24 <= max_size 24, holes 1 <= max_holes 1\n")
    );
    // The executable holds the same types.
    assert_eq!(check(&fixture().exe).status.code(), Some(0));

    let grown = check(&grown_fixture().rlib);
    let report = stdout(&grown);
    assert_eq!(grown.status.code(), Some(1), "{report}{}", stderr(&grown));
    // `d` also turns the tail padding after `c` into a second hole.
    assert!(
        report.contains(
            "FAIL  fixture::Holey: size 32 > max_size 24, holes 2 > max_holes 1 (grew by 8 bytes)\n"
        ),
        "{report}"
    );
    // The diff shows the grown type's field layout.
    assert!(
        report.contains("      struct fixture::Holey {\n"),
        "{report}"
    );
    assert!(report.contains("u64 d; /*    24     8 */"), "{report}");
    assert!(
        report.contains("ok    fixture::Reordered: size 16 <= max_size 16"),
        "{report}"
    );
    assert!(
        report.contains("rflayout check: 1 of 3 baseline entries failed"),
        "{report}"
    );
}

#[test]
fn check_fails_when_a_type_disappears() {
    let dir = tempfile::tempdir().expect("tempdir");
    let baseline = dir.path().join("layout.toml");
    std::fs::write(
        &baseline,
        "[\"fixture::Holey\"]\nmax_size = 24\n\n[\"fixture::Holy\"]\nmax_size = 24\nmax_holes = 0\n",
    )
    .expect("write baseline");
    let output = rflayout([
        OsStr::new("check"),
        fixture().rlib.as_os_str(),
        OsStr::new("--baseline"),
        baseline.as_os_str(),
    ]);
    let report = stdout(&output);
    assert_eq!(output.status.code(), Some(1), "{report}");
    assert!(
        report.contains("FAIL  fixture::Holy: missing from "),
        "{report}"
    );
    assert!(report.contains("near matches: fixture::Holey"), "{report}");
    assert!(report.contains("ok    fixture::Holey"), "{report}");
}

#[test]
fn invalid_baseline_is_an_input_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let baseline = dir.path().join("layout.toml");
    std::fs::write(&baseline, "[\"fixture::Holey\"]\nmax_szie = 24\n").expect("write");
    let output = rflayout([
        OsStr::new("check"),
        fixture().rlib.as_os_str(),
        OsStr::new("--baseline"),
        baseline.as_os_str(),
    ]);
    assert_eq!(output.status.code(), Some(2));
    let message = stderr(&output);
    assert!(
        message.contains("layout.toml: invalid baseline: "),
        "{message}"
    );
    assert!(message.contains("unknown field `max_szie`"), "{message}");
    let missing = dir.path().join("nope.toml");
    let output = rflayout([
        OsStr::new("check"),
        fixture().rlib.as_os_str(),
        OsStr::new("--baseline"),
        missing.as_os_str(),
    ]);
    assert_eq!(output.status.code(), Some(2));
    assert!(stderr(&output).contains("nope.toml: cannot read"));
}
