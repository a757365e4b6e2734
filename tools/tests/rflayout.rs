//! End-to-end tests of the `rflayout` binary.
//!
//! A small fixture crate is written under `CARGO_TARGET_TMPDIR` and built
//! once per run with `cargo build --offline` (it has no dependencies); the
//! tests read its `.rlib` and executable. A second copy, where one struct
//! has an extra field, is built for the budget check. The C test compiles
//! one struct with `gcc -g -c` and is skipped (with a message) where gcc is
//! missing.

use std::ffi::OsStr;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_json::Value;

const FIXTURE_MANIFEST: &str = r#"[package]
name = "fixture"
version = "0.1.0"
edition = "2021"
publish = false

# Not part of the ringfence workspace this directory lives under.
[workspace]

[profile.dev]
debug = 2
incremental = false
"#;

/// The fixture library; `{EXTRA}` adds fields to `Holey` in the grown copy.
const FIXTURE_LIB: &str = r#"//! rflayout test fixture: types with known layouts.
use core::num::NonZeroU32;

/// repr(C): a 7-byte hole after `a`, 6 bytes of tail padding.
#[repr(C)]
pub struct Holey { pub a: u8, pub b: u64, pub c: u16, {EXTRA} }

/// Rust reorders: `b` first.
pub struct Reordered { pub a: u8, pub b: u64, pub c: u8 }

/// The null pointer niche of `&u8` holds `B`: 8 bytes, no separate tag.
pub enum Niche { A(&'static u8), B }

/// A tagged enum: u8 tag, variants with different field offsets.
pub enum Tagged { X(u8, u32), Y(u64), Z }

/// A generic struct, used as `Wrap<u32>`.
pub struct Wrap<T> { pub x: T, pub y: u8 }

/// Two cache lines: a field straddles the 64-byte boundary.
#[repr(C, align(64))]
pub struct Lines { pub head: [u8; 56], pub straddle: [u32; 4], pub tail: u64 }

static BYTE: u8 = 7;

#[inline(never)] pub fn holey() -> Holey { Holey { a: 1, b: 2, c: 3, {EXTRA_INIT} } }
#[inline(never)] pub fn reordered() -> Reordered { Reordered { a: 1, b: 2, c: 3 } }
#[inline(never)] pub fn niche(some: bool) -> Niche { if some { Niche::A(&BYTE) } else { Niche::B } }
#[inline(never)] pub fn tagged(n: u8) -> Tagged { match n { 0 => Tagged::X(1, 2), 1 => Tagged::Y(3), _ => Tagged::Z } }
#[inline(never)] pub fn nonzero(n: u32) -> Option<NonZeroU32> { NonZeroU32::new(n) }
#[inline(never)] pub fn wrap(x: u32) -> Wrap<u32> { Wrap { x, y: 1 } }
#[inline(never)] pub fn lines() -> Lines { Lines { head: [0; 56], straddle: [1; 4], tail: 2 } }
"#;

const FIXTURE_MAIN: &str = r#"use std::hint::black_box;

fn main() {
    let some = std::env::args().count() > 1;
    black_box(fixture::holey());
    black_box(fixture::reordered());
    black_box(fixture::niche(some));
    black_box(fixture::tagged(u8::from(some)));
    black_box(fixture::nonzero(u32::from(some)));
    black_box(fixture::wrap(5));
    black_box(fixture::lines());
}
"#;

/// A built fixture crate.
struct Fixture {
    rlib: PathBuf,
    exe: PathBuf,
}

/// Writes and builds the fixture crate under `CARGO_TARGET_TMPDIR` (cargo's
/// scratch space for integration tests, removed by `cargo clean`).
///
/// The directory is named after a hash of the sources rather than being a
/// `TempDir`: the fixture lives in a static, which is never dropped, so a
/// temporary directory would be left behind by every run. A stable
/// directory is reused (and rebuilt only if needed); a changed fixture gets
/// a fresh one, so a stale build can never be read.
fn build_fixture(grown: bool) -> Fixture {
    let (extra, extra_init) = if grown {
        ("pub d: u64", "d: 4")
    } else {
        ("", "")
    };
    let lib = FIXTURE_LIB
        .replace("{EXTRA}", extra)
        .replace("{EXTRA_INIT}", extra_init);
    let files = [
        ("Cargo.toml", FIXTURE_MANIFEST),
        ("src/lib.rs", lib.as_str()),
        ("src/main.rs", FIXTURE_MAIN),
    ];
    let mut hasher = DefaultHasher::new();
    files.hash(&mut hasher);
    let name = format!(
        "rflayout-{}-{:016x}",
        if grown { "grown" } else { "fixture" },
        hasher.finish()
    );
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let root = root.as_path();
    std::fs::create_dir_all(root.join("src")).expect("mkdir src");
    for (path, contents) in files {
        let path = root.join(path);
        // Rewriting an unchanged file would make cargo rebuild it.
        if std::fs::read_to_string(&path).ok().as_deref() != Some(contents) {
            std::fs::write(&path, contents).expect("write fixture source");
        }
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let target = root.join("target");
    let output = Command::new(cargo)
        .args(["build", "--offline", "--quiet"])
        .current_dir(root)
        .env("CARGO_TARGET_DIR", &target)
        .env_remove("CARGO_BUILD_TARGET")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .output()
        .expect("run cargo build for the fixture");
    assert!(
        output.status.success(),
        "fixture build failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    Fixture {
        rlib: target.join("debug/libfixture.rlib"),
        exe: target.join("debug/fixture"),
    }
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| build_fixture(false))
}

fn grown_fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| build_fixture(true))
}

fn rflayout<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    Command::new(env!("CARGO_BIN_EXE_rflayout"))
        .args(args)
        .output()
        .expect("run rflayout")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Runs `rflayout show FILE TYPES... --json`, expects success, and returns
/// the parsed array.
fn show_json(file: &Path, types: &[&str]) -> Vec<Value> {
    let mut args: Vec<&OsStr> = vec![OsStr::new("show"), file.as_os_str()];
    args.extend(types.iter().map(OsStr::new));
    args.push(OsStr::new("--json"));
    let output = rflayout(&args);
    assert!(
        output.status.success(),
        "rflayout show {types:?} failed: {}",
        stderr(&output)
    );
    let value: Value = serde_json::from_str(&stdout(&output)).expect("stdout is JSON");
    value.as_array().expect("a JSON array").clone()
}

fn show_one(file: &Path, name: &str) -> Value {
    let mut all = show_json(file, &[name]);
    assert_eq!(all.len(), 1, "{name}: {all:#?}");
    all.remove(0)
}

/// `(name, offset, size, type)` of each field.
fn fields(value: &Value) -> Vec<(String, u64, u64, String)> {
    value["fields"]
        .as_array()
        .expect("fields")
        .iter()
        .map(|f| {
            (
                f["name"].as_str().expect("name").to_owned(),
                f["offset"].as_u64().expect("offset"),
                f["size"].as_u64().expect("size"),
                f["type"].as_str().expect("type").to_owned(),
            )
        })
        .collect()
}

fn holes(value: &Value) -> Vec<(u64, u64)> {
    value["holes"]
        .as_array()
        .expect("holes")
        .iter()
        .map(|h| {
            (
                h["offset"].as_u64().expect("offset"),
                h["size"].as_u64().expect("size"),
            )
        })
        .collect()
}

fn field(name: &str, offset: u64, size: u64, ty: &str) -> (String, u64, u64, String) {
    (name.to_owned(), offset, size, ty.to_owned())
}

fn variant<'a>(value: &'a Value, name: &str) -> &'a Value {
    value["variants"]
        .as_array()
        .expect("variants")
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("no variant {name} in {value:#}"))
}

#[test]
fn repr_c_struct_has_known_hole_and_padding() {
    let holey = show_one(&fixture().rlib, "fixture::Holey");
    assert_eq!(holey["name"], "fixture::Holey");
    assert_eq!(holey["kind"], "struct");
    assert_eq!(holey["size"], 24);
    assert_eq!(holey["align"], 8);
    assert_eq!(
        fields(&holey),
        [
            field("a", 0, 1, "u8"),
            field("b", 8, 8, "u64"),
            field("c", 16, 2, "u16")
        ]
    );
    assert_eq!(holes(&holey), [(1, 7)]);
    assert_eq!(holey["tail_padding"], 6);
}

#[test]
fn reordered_rust_struct_is_listed_by_offset() {
    let reordered = show_one(&fixture().rlib, "fixture::Reordered");
    assert_eq!(reordered["size"], 16);
    assert_eq!(reordered["align"], 8);
    let fields = fields(&reordered);
    assert_eq!(fields[0], field("b", 0, 8, "u64"));
    let mut rest: Vec<(String, u64)> = fields[1..].iter().map(|f| (f.0.clone(), f.1)).collect();
    rest.sort();
    // rustc puts the two bytes right after `b`, in some order.
    assert_eq!(
        rest.iter().map(|f| f.0.as_str()).collect::<Vec<_>>(),
        ["a", "c"]
    );
    let mut offsets: Vec<u64> = rest.iter().map(|f| f.1).collect();
    offsets.sort_unstable();
    assert_eq!(offsets, [8, 9]);
    assert!(holes(&reordered).is_empty());
    assert_eq!(reordered["tail_padding"], 6);
}

#[test]
fn niche_enum_has_no_separate_tag() {
    let niche = show_one(&fixture().rlib, "fixture::Niche");
    assert_eq!(niche["kind"], "enum");
    assert_eq!(niche["size"], 8);
    assert_eq!(niche["align"], 8);
    // The tag is the pointer itself.
    assert_eq!(fields(&niche), [field("(tag)", 0, 8, "u64")]);
    let a = variant(&niche, "A");
    assert!(a.get("discr").is_none(), "A is the dataful variant: {a}");
    assert_eq!(fields(a), [field("__0", 0, 8, "&u8")]);
    let b = variant(&niche, "B");
    assert_eq!(b["discr"], "0");
    assert!(fields(b).is_empty());
    assert!(holes(&niche).is_empty());
    assert_eq!(niche["tail_padding"], 0);

    let option = show_one(
        &fixture().rlib,
        "core::option::Option<core::num::nonzero::NonZero<u32>>",
    );
    assert_eq!(option["kind"], "enum");
    assert_eq!(option["size"], 4);
    assert_eq!(option["align"], 4);
    assert_eq!(variant(&option, "None")["discr"], "0");
    let some = variant(&option, "Some");
    assert!(some.get("discr").is_none());
    assert_eq!(
        fields(some),
        [field("__0", 0, 4, "core::num::nonzero::NonZero<u32>")]
    );
}

#[test]
fn tagged_enum_lists_each_variant() {
    let tagged = show_one(&fixture().rlib, "fixture::Tagged");
    assert_eq!(tagged["size"], 16);
    assert_eq!(fields(&tagged), [field("(tag)", 0, 1, "u8")]);
    let x = variant(&tagged, "X");
    assert_eq!(x["discr"], "0");
    assert_eq!(
        fields(x),
        [field("__0", 1, 1, "u8"), field("__1", 4, 4, "u32")]
    );
    assert_eq!(holes(x), [(2, 2)]);
    assert_eq!(x["tail_padding"], 8);
    let y = variant(&tagged, "Y");
    assert_eq!(fields(y), [field("__0", 8, 8, "u64")]);
    assert_eq!(holes(y), [(1, 7)]);
    assert_eq!(variant(&tagged, "Z")["tail_padding"], 15);
    // Bytes 2..4 are used by no variant.
    assert_eq!(holes(&tagged), [(2, 2)]);
}

#[test]
fn generic_instantiation_is_found_by_its_full_name() {
    let wrap = show_one(&fixture().rlib, "fixture::Wrap<u32>");
    assert_eq!(wrap["size"], 8);
    assert_eq!(wrap["align"], 4);
    assert_eq!(
        fields(&wrap),
        [field("x", 0, 4, "u32"), field("y", 4, 1, "u8")]
    );
    assert_eq!(wrap["tail_padding"], 3);
    // Globs find it too; without its arguments the name is not found, and
    // the error suggests the instantiation.
    assert_eq!(show_json(&fixture().rlib, &["*::Wrap<*>"]).len(), 1);
    let output = rflayout([
        OsStr::new("show"),
        fixture().rlib.as_os_str(),
        OsStr::new("fixture::Wrap"),
    ]);
    assert_eq!(output.status.code(), Some(2));
    let message = stderr(&output);
    assert!(
        message.contains("no type matches `fixture::Wrap`"),
        "{message}"
    );
    assert!(
        message.contains("near matches: fixture::Wrap<u32>"),
        "{message}"
    );
    assert_eq!(message.lines().count(), 1, "{message}");
}

#[test]
fn globs_expand_and_skip_variant_structs() {
    let all = show_json(&fixture().rlib, &["fixture::*"]);
    let names: Vec<&str> = all
        .iter()
        .map(|v| v["name"].as_str().expect("name"))
        .collect();
    assert_eq!(
        names,
        [
            "fixture::Holey",
            "fixture::Lines",
            "fixture::Niche",
            "fixture::Reordered",
            "fixture::Tagged",
            "fixture::Wrap<u32>"
        ]
    );
    // A variant struct is still there by its exact name.
    let x = show_one(&fixture().rlib, "fixture::Tagged::X");
    assert_eq!(x["size"], 16);
}

#[test]
fn executable_and_rlib_agree_and_duplicates_are_merged() {
    let fx = fixture();
    for name in ["fixture::Holey", "fixture::Tagged", "fixture::Wrap<u32>"] {
        // The type is emitted by several codegen units and compile units;
        // show_one asserts it is reported once.
        assert_eq!(show_one(&fx.exe, name), show_one(&fx.rlib, name), "{name}");
    }
}

#[test]
fn text_layout_marks_holes_padding_and_cache_lines() {
    let output = rflayout([
        OsStr::new("show"),
        fixture().rlib.as_os_str(),
        OsStr::new("fixture::Holey"),
        OsStr::new("fixture::Lines"),
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    assert!(text.starts_with("struct fixture::Holey {\n    u8  a; /*     0     1 */\n    /* XXX 7 bytes hole */\n    u64 b; /*     8     8 */\n"), "{text}");
    assert!(
        text.contains("    /* XXX 6 bytes tail padding */\n"),
        "{text}"
    );
    assert!(
        text.contains("/* size: 24, align: 8 (DW_AT_alignment), cachelines: 1, members: 3 */"),
        "{text}"
    );
    assert!(
        text.contains("/* sum members: 11, holes: 1, sum holes: 7, tail padding: 6 */"),
        "{text}"
    );
    // Lines: head 0..56, straddle 56..72 (across the boundary), tail 72..80.
    assert!(text.contains("    [u32; 4] straddle; /*    56    16 */\n    /* --- cacheline 1 boundary (64 bytes) inside `straddle` --- */\n    u64      tail;     /*    72     8 */\n"), "{text}");
    assert!(text.contains("/* XXX 48 bytes tail padding */"), "{text}");
    assert!(
        text.contains("/* size: 128, align: 64 (DW_AT_alignment), cachelines: 2, members: 3 */"),
        "{text}"
    );

    // A smaller cache line moves the markers.
    let output = rflayout([
        OsStr::new("show"),
        fixture().rlib.as_os_str(),
        OsStr::new("fixture::Holey"),
        OsStr::new("--cache-line"),
        OsStr::new("16"),
    ]);
    let text = stdout(&output);
    assert!(text.contains("u64 b; /*     8     8 */\n    /* --- cacheline 1 boundary (16 bytes) --- */\n    u16 c;"), "{text}");
    assert!(text.contains("cachelines: 2"), "{text}");
}

#[test]
fn c_struct_from_gcc_object() {
    let dir = tempfile::tempdir().expect("tempdir");
    let source = dir.path().join("rf_sample.c");
    let object = dir.path().join("rf_sample.o");
    std::fs::write(
        &source,
        "struct rf_sample { char a; long b; short c; };\n\
         typedef struct { unsigned int lo:3; unsigned int hi:5; int n; } rf_bits_t;\n\
         struct rf_sample rf_sample_instance;\n\
         rf_bits_t rf_bits_instance;\n",
    )
    .expect("write C source");
    let compiled = Command::new("gcc")
        .args(["-g", "-c"])
        .arg(&source)
        .arg("-o")
        .arg(&object)
        .output();
    match compiled {
        Ok(out) if out.status.success() => {}
        Ok(out) => panic!("gcc failed: {}", String::from_utf8_lossy(&out.stderr)),
        Err(e) => {
            eprintln!("skipping c_struct_from_gcc_object: gcc not available ({e})");
            return;
        }
    }
    let sample = show_one(&object, "rf_sample");
    assert_eq!(sample["size"], 24);
    assert_eq!(sample["align"], 8);
    assert_eq!(
        fields(&sample),
        [
            field("a", 0, 1, "char"),
            field("b", 8, 8, "long int"),
            field("c", 16, 2, "short int")
        ]
    );
    assert_eq!(holes(&sample), [(1, 7)]);
    assert_eq!(sample["tail_padding"], 6);
    // The C keyword is accepted.
    assert_eq!(show_one(&object, "struct rf_sample"), sample);

    // A typedef of an anonymous struct, with bit-fields.
    let bits = show_one(&object, "rf_bits_t");
    assert_eq!(bits["size"], 8);
    let lo = &bits["fields"][0];
    assert_eq!(
        (
            lo["name"].as_str(),
            lo["offset"].as_u64(),
            lo["bit_offset"].as_u64(),
            lo["bit_size"].as_u64()
        ),
        (Some("lo"), Some(0), Some(0), Some(3))
    );
    let hi = &bits["fields"][1];
    assert_eq!(
        (
            hi["name"].as_str(),
            hi["offset"].as_u64(),
            hi["bit_offset"].as_u64(),
            hi["bit_size"].as_u64()
        ),
        (Some("hi"), Some(0), Some(3), Some(5))
    );
    assert_eq!(bits["fields"][2]["offset"], 4);
}

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
