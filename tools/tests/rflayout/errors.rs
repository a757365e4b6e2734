//! Bad input and bad usage: malformed files are one-line errors, never
//! panics, and usage errors exit with 2.

use crate::fixture::fixture;
use crate::{rflayout, stderr, stdout};
use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

/// Expects exit status 2 with a one-line message naming `file` that
/// contains `expected`, and no panic.
fn assert_input_error(file: &Path, expected: &str) {
    let output = rflayout([
        OsStr::new("show"),
        file.as_os_str(),
        OsStr::new("fixture::Holey"),
    ]);
    let message = stderr(&output);
    assert_eq!(
        output.status.code(),
        Some(2),
        "{}: {message}",
        file.display()
    );
    assert!(!message.contains("panicked"), "{message}");
    assert_eq!(message.lines().count(), 1, "{message}");
    assert!(message.starts_with("rflayout: "), "{message}");
    assert!(message.contains(&file.display().to_string()), "{message}");
    assert!(message.contains(expected), "{}: {message}", file.display());
    assert!(output.stdout.is_empty());
}

#[test]
fn malformed_inputs_are_errors_not_panics() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = |name: &str| dir.path().join(name);

    assert_input_error(&path("does-not-exist.rlib"), "cannot read");
    assert_input_error(dir.path(), "cannot read");

    std::fs::write(path("empty"), b"").expect("write");
    assert_input_error(&path("empty"), "not an object file");

    std::fs::write(path("notes.txt"), "struct Holey { a: u8 }\n").expect("write");
    assert_input_error(&path("notes.txt"), "not an object file");

    // Deterministic pseudo-random bytes (xorshift).
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let random: Vec<u8> = (0..65_536)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    std::fs::write(path("random.bin"), &random).expect("write");
    assert_input_error(&path("random.bin"), "not an object file");

    // Random bytes behind a valid ELF magic and class.
    let mut fake_elf = random.clone();
    fake_elf[..6].copy_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1]);
    std::fs::write(path("fake.elf"), &fake_elf).expect("write");
    assert_input_error(&path("fake.elf"), "malformed");

    let exe = std::fs::read(&fixture().exe).expect("read fixture executable");
    std::fs::write(path("truncated"), &exe[..200]).expect("write");
    assert_input_error(&path("truncated"), "malformed object file");

    // The executable cut in half: headers intact, sections beyond the end.
    std::fs::write(path("half"), &exe[..exe.len() / 2]).expect("write");
    let output = rflayout([
        OsStr::new("show"),
        path("half").as_os_str(),
        OsStr::new("fixture::Holey"),
    ]);
    assert!(!stderr(&output).contains("panicked"), "{}", stderr(&output));
    assert!(
        matches!(output.status.code(), Some(0 | 2)),
        "{}",
        stderr(&output)
    );

    // An rlib truncated inside its first member.
    let rlib = std::fs::read(&fixture().rlib).expect("read rlib");
    std::fs::write(path("truncated.rlib"), &rlib[..rlib.len().min(300)]).expect("write");
    assert_input_error(&path("truncated.rlib"), "malformed");

    match Command::new("strip")
        .arg("-o")
        .arg(path("stripped"))
        .arg(&fixture().exe)
        .output()
    {
        Ok(out) if out.status.success() => {
            assert_input_error(&path("stripped"), "no DWARF debug info");
        }
        Ok(out) => panic!("strip failed: {}", String::from_utf8_lossy(&out.stderr)),
        Err(e) => eprintln!("skipping the stripped-binary case: strip not available ({e})"),
    }
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        &[][..],
        &["show"],
        &["show", "file-only"],
        &["check", "file"],
        &["show", "f", "T", "--cache-line", "0"],
        &["bogus"],
    ] {
        let output = rflayout(args);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            stderr(&output)
        );
    }
    let help = rflayout(["--help"]);
    assert_eq!(help.status.code(), Some(0));
    assert!(stdout(&help).contains("baseline"));
}
