//! The fixture crate (types with known layouts), written under
//! `CARGO_TARGET_TMPDIR` and built once per run, plain and grown.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

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
pub struct Fixture {
    pub rlib: PathBuf,
    pub exe: PathBuf,
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

pub fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| build_fixture(false))
}

pub fn grown_fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| build_fixture(true))
}
