//! What `rflayout show` reports for the fixture's Rust types: holes and
//! padding, reordered fields, niches and tags, generics, globs, the text
//! layout with cache lines, and the executable agreeing with the rlib.

use crate::fixture::fixture;
use crate::{field, fields, holes, rflayout, show_json, show_one, stderr, stdout, variant};
use std::ffi::OsStr;

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
