//! Layouts read back from real and hand-built DWARF.

use super::*;
use crate::layout::model::{AlignSource, TypeKind};

fn node(tag: constants::DwTag, name: Option<&str>, byte_size: Option<u64>) -> Node {
    Node {
        tag,
        name: name.map(str::to_owned),
        full_name: name.map(str::to_owned),
        byte_size,
        alignment: None,
        target: None,
        declaration: false,
        members: Vec::new(),
        variant_part: None,
        dims: Vec::new(),
        enumerators: Vec::new(),
        lang: Lang::C,
        address_size: 8,
    }
}

fn member(name: &str, target: u64, offset: u64) -> Member {
    Member {
        name: Some(name.to_owned()),
        target: Some(target),
        location: Some(Location::Bytes(offset)),
        data_bit_offset: None,
        legacy_bit_offset: None,
        bit_size: None,
        byte_size: None,
        alignment: None,
        artificial: false,
        is_base: false,
    }
}

const CHAR: u64 = 1;
const LONG: u64 = 2;
const CHAR_PTR: u64 = 3;
const ARRAY: u64 = 4;

/// A graph with base types, a pointer and an array, plus `extra`.
fn graph(extra: Vec<(u64, Node)>) -> TypeGraph {
    let mut nodes = HashMap::new();
    nodes.insert(
        CHAR,
        node(constants::DW_TAG_base_type, Some("char"), Some(1)),
    );
    nodes.insert(
        LONG,
        node(constants::DW_TAG_base_type, Some("long"), Some(8)),
    );
    let mut pointer = node(constants::DW_TAG_pointer_type, None, None);
    pointer.target = Some(CHAR);
    nodes.insert(CHAR_PTR, pointer);
    let mut array = node(constants::DW_TAG_array_type, None, None);
    array.target = Some(LONG);
    array.dims = vec![Some(2), Some(3)];
    nodes.insert(ARRAY, array);
    let mut named = Vec::new();
    for (key, n) in extra {
        if let Some(name) = &n.full_name {
            named.push(NamedType {
                name: name.clone(),
                key,
                is_variant_struct: false,
            });
        }
        nodes.insert(key, n);
    }
    TypeGraph { nodes, named }
}

fn find(graph: &TypeGraph, name: &str) -> TypeLayout {
    let mut found = graph.layouts_matching(&TypePattern::new(name));
    assert_eq!(found.len(), 1, "{name}");
    found.remove(0)
}

#[test]
fn c_struct_without_alignment_infers_it_and_names_types_c_style() {
    let mut s = node(constants::DW_TAG_structure_type, Some("rf_x"), Some(72));
    // Declaration order differs from offset order.
    s.members = vec![
        member("name", CHAR_PTR, 8),
        member("tag", CHAR, 0),
        member("grid", ARRAY, 16),
        member("last", CHAR, 64),
    ];
    let graph = graph(vec![(10, s)]);
    let layout = find(&graph, "rf_x");
    assert_eq!(layout.align, 8);
    assert_eq!(layout.align_source, AlignSource::Inferred);
    let summary: Vec<(&str, u64, u64, &str)> = layout
        .fields
        .iter()
        .map(|f| (f.name.as_str(), f.offset, f.size, f.type_name.as_str()))
        .collect();
    assert_eq!(
        summary,
        [
            ("tag", 0, 1, "char"),
            ("name", 8, 8, "char *"),
            ("grid", 16, 48, "long[2][3]"),
            ("last", 64, 1, "char"),
        ]
    );
    assert_eq!(
        layout.holes,
        [super::super::model::Hole { offset: 1, size: 7 }]
    );
    assert_eq!(layout.tail_padding, 7);
}

#[test]
fn rust_arrays_and_enum_variant_parts() {
    let mut array = node(constants::DW_TAG_array_type, None, None);
    array.target = Some(CHAR);
    array.dims = vec![Some(4)];
    array.lang = Lang::Rust;
    // enum E { A(u64), B } with a one-byte tag at 8.
    let mut a = node(constants::DW_TAG_structure_type, Some("A"), Some(16));
    a.members = vec![member("__0", LONG, 0)];
    let mut e = node(constants::DW_TAG_structure_type, Some("m::E"), Some(16));
    e.lang = Lang::Rust;
    e.alignment = Some(8);
    let mut tag = member("tag", CHAR, 8);
    tag.name = None;
    tag.artificial = true;
    let va = RawVariant {
        discr: Some("0".into()),
        members: vec![member("A", 21, 0)],
    };
    let vb = RawVariant {
        discr: Some("1".into()),
        members: vec![member("B", 22, 0)],
    };
    e.variant_part = Some(VariantPart {
        members: vec![tag],
        variants: vec![va, vb],
    });
    let b = node(constants::DW_TAG_structure_type, Some("B"), Some(16));
    let graph = graph(vec![(20, e), (21, a), (22, b), (30, array)]);
    assert_eq!(graph.type_name(30, 0), "[char; 4]");
    assert_eq!(graph.type_size(30, 0), Some(4));

    let layout = find(&graph, "m::E");
    assert_eq!(layout.kind, TypeKind::Enum);
    assert_eq!(layout.fields.len(), 1);
    assert_eq!(layout.fields[0].name, "(tag)");
    assert_eq!(layout.fields[0].offset, 8);
    assert_eq!(layout.variants[0].name, "A");
    assert_eq!(layout.variants[0].fields[0].offset, 0);
    assert_eq!(layout.variants[0].tail_padding, 7);
    assert_eq!(layout.variants[1].name, "B");
    assert_eq!(layout.variants[1].discr.as_deref(), Some("1"));
    // B uses only the tag: bytes 0..8 are a hole in B, but A uses them.
    assert_eq!(layout.variants[1].holes.len(), 1);
    assert!(layout.holes.is_empty());
    assert_eq!(layout.tail_padding, 7);
}

#[test]
fn typedef_of_anonymous_struct_and_bit_fields() {
    let mut anonymous = node(constants::DW_TAG_structure_type, None, Some(4));
    let mut lo = member("lo", CHAR, 0);
    lo.bit_size = Some(3);
    lo.data_bit_offset = Some(0);
    // 7 bits from bit 3: it spills into the second byte.
    let mut hi = member("hi", CHAR, 0);
    hi.bit_size = Some(7);
    hi.data_bit_offset = Some(3);
    anonymous.members = vec![lo, hi];
    let mut typedef = node(constants::DW_TAG_typedef, Some("rf_bits_t"), None);
    typedef.target = Some(40);
    let mut graph = graph(vec![(41, typedef)]);
    graph.nodes.insert(40, anonymous);
    let layout = find(&graph, "rf_bits_t");
    assert_eq!(layout.name, "rf_bits_t");
    assert_eq!(
        (
            layout.fields[0].offset,
            layout.fields[0].bit_offset,
            layout.fields[0].size
        ),
        (0, Some(0), 1)
    );
    assert_eq!(
        (
            layout.fields[1].offset,
            layout.fields[1].bit_offset,
            layout.fields[1].size
        ),
        (0, Some(3), 2)
    );
    assert!(layout.holes.is_empty());
    assert_eq!(layout.tail_padding, 2);
}

#[test]
fn legacy_bit_offsets_count_from_the_most_significant_bit() {
    let mut s = node(constants::DW_TAG_structure_type, Some("s"), Some(4));
    let mut f = member("f", CHAR, 1);
    f.bit_size = Some(2);
    // Bits 5..7 of byte 1 from the LSB: 1 bit above it in the byte.
    f.legacy_bit_offset = Some(1);
    s.members = vec![f];
    let graph = graph(vec![(50, s)]);
    let layout = find(&graph, "s");
    assert_eq!(
        (
            layout.fields[0].offset,
            layout.fields[0].bit_offset,
            layout.fields[0].bit_size
        ),
        (1, Some(5), Some(2))
    );
}

#[test]
fn cycles_and_dangling_references_do_not_hang_or_panic() {
    let mut a = node(constants::DW_TAG_typedef, Some("loop_a"), None);
    a.target = Some(61);
    let mut b = node(constants::DW_TAG_const_type, None, None);
    b.target = Some(60);
    let mut s = node(constants::DW_TAG_structure_type, Some("holder"), Some(8));
    s.members = vec![member("x", 60, 0), member("y", 999, 4)];
    // A struct that contains itself (only malformed DWARF can say so).
    let mut selfish = node(constants::DW_TAG_structure_type, Some("selfish"), None);
    selfish.members = vec![member("me", 63, 0)];
    let graph = graph(vec![(60, a), (61, b), (62, s), (63, selfish)]);
    assert!(
        graph
            .layouts_matching(&TypePattern::new("loop_a"))
            .is_empty()
    );
    let holder = find(&graph, "holder");
    assert_eq!(holder.fields[0].type_name, "loop_a");
    assert_eq!(holder.fields[0].size, 0);
    assert_eq!(holder.fields[1].type_name, "?");
    assert_eq!(holder.align, 1);
    assert_eq!(graph.type_align(63, 0), 1);
    // No size: no layout, rather than a made-up one.
    assert!(
        graph
            .layouts_matching(&TypePattern::new("selfish"))
            .is_empty()
    );
}

#[test]
fn unsupported_member_locations_hide_the_type() {
    let mut s = node(
        constants::DW_TAG_structure_type,
        Some("virtual_base"),
        Some(16),
    );
    let mut m = member("base", LONG, 0);
    m.location = Some(Location::Unsupported);
    s.members = vec![m];
    let graph = graph(vec![(70, s)]);
    assert!(
        graph
            .layouts_matching(&TypePattern::new("virtual_base"))
            .is_empty()
    );
}
