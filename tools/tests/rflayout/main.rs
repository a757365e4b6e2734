//! End-to-end tests of the `rflayout` binary.
//!
//! A small fixture crate is written under `CARGO_TARGET_TMPDIR` and built
//! once per run with `cargo build --offline` (it has no dependencies); the
//! tests read its `.rlib` and executable. A second copy, where one struct
//! has an extra field, is built for the budget check. The C test compiles
//! one struct with `gcc -g -c` and is skipped (with a message) where gcc is
//! missing.

use serde_json::Value;
use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Output};

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

mod check;
mod errors;
mod fixture;
mod gcc;
mod layouts;
