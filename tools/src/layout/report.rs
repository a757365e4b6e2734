//! Rendering layouts: pahole-like text and JSON.
//!
//! The text form lists fields by offset with `/* offset size */`, marks
//! holes and tail padding with `XXX`, and prints a
//! `/* --- cacheline N boundary (B bytes) --- */` line where a cache-line
//! boundary falls (or says which field or hole it falls inside). An enum
//! lists its tag, then each variant's fields with that variant's holes.
//!
//! ```text
//! struct fixture::Holey {
//!     u8  a; /*     0     1 */
//!     /* XXX 7 bytes hole */
//!     u64 b; /*     8     8 */
//!     u16 c; /*    16     2 */
//!     /* XXX 6 bytes tail padding */
//!
//!     /* size: 24, align: 8 (DW_AT_alignment), cachelines: 1, members: 3 */
//!     /* sum members: 11, holes: 1, sum holes: 7, tail padding: 6 */
//!     /* last cacheline: 24 bytes */
//! };
//! ```
//!
//! The JSON form is one array holding one object per type, each with
//! `name`, `kind`, `size`, `align`, `fields` (`name`, `offset`, `size`,
//! `type`, and `bit_offset`/`bit_size` for bit-fields), `holes` (`offset`,
//! `size`), `tail_padding`, and for enums `variants` (`name`, `discr`,
//! `fields`, `holes`, `tail_padding`). Sizes and offsets are bytes.

use std::fmt::Write as _;

use super::model::{AlignSource, Field, Hole, TypeLayout, Variant};

/// Widest type column before names stop being aligned.
const MAX_TYPE_COLUMN: usize = 48;
/// Widest name column before comments stop being aligned.
const MAX_NAME_COLUMN: usize = 32;

/// The layouts as one pretty-printed JSON array.
pub fn render_json(layouts: &[TypeLayout]) -> String {
    // Serialising plain structs of strings and integers cannot fail.
    serde_json::to_string_pretty(layouts).unwrap_or_else(|_| "[]".to_owned())
}

/// The pahole-like text layout of one type, with cache-line boundaries
/// every `cache_line` bytes (0 is treated as 1).
pub fn render_text(layout: &TypeLayout, cache_line: u64) -> String {
    let cache_line = cache_line.max(1);
    let mut out = String::new();
    let widths = Widths::of(layout);
    let _ = writeln!(out, "{} {} {{", layout.kind.keyword(), layout.name);
    if layout.has_variants() {
        write_enum_body(&mut out, layout, cache_line, &widths);
    } else {
        let rows = rows(
            &layout.fields,
            &layout.holes,
            layout.tail_padding,
            layout.size,
        );
        write_rows(&mut out, "    ", &rows, layout.size, cache_line, &widths);
    }
    out.push('\n');
    write_summary(&mut out, layout, cache_line);
    out.push_str("};\n");
    out
}

/// Column widths shared by every row of one type.
struct Widths {
    type_column: usize,
    name_column: usize,
}

impl Widths {
    fn of(layout: &TypeLayout) -> Self {
        let all = layout
            .fields
            .iter()
            .chain(layout.variants.iter().flat_map(|v| v.fields.iter()));
        let (mut type_column, mut name_column) = (0, 0);
        for field in all {
            type_column = type_column.max(field.type_name.chars().count());
            name_column = name_column.max(field_label(field).chars().count() + 1);
        }
        Self {
            type_column: type_column.min(MAX_TYPE_COLUMN),
            name_column: name_column.min(MAX_NAME_COLUMN),
        }
    }
}

/// One line of the body: a field, a hole or the tail padding, covering
/// `start..end`.
enum Row<'a> {
    Field(&'a Field),
    Hole(Hole),
    Tail { offset: u64, size: u64 },
}

impl Row<'_> {
    fn start(&self) -> u64 {
        match self {
            Row::Field(f) => f.offset,
            Row::Hole(h) => h.offset,
            Row::Tail { offset, .. } => *offset,
        }
    }

    fn end(&self) -> u64 {
        match self {
            Row::Field(f) => f.end(),
            Row::Hole(h) => h.offset.saturating_add(h.size),
            Row::Tail { offset, size } => offset.saturating_add(*size),
        }
    }

    fn describe(&self) -> String {
        match self {
            Row::Field(f) => format!("`{}`", field_label(f)),
            Row::Hole(_) => "this hole".into(),
            Row::Tail { .. } => "the tail padding".into(),
        }
    }
}

/// Fields, holes and tail padding in offset order.
fn rows<'a>(fields: &'a [Field], holes: &[Hole], tail: u64, size: u64) -> Vec<Row<'a>> {
    let mut rows: Vec<Row<'a>> = fields.iter().map(Row::Field).collect();
    rows.extend(holes.iter().copied().map(Row::Hole));
    if tail > 0 {
        rows.push(Row::Tail {
            offset: size.saturating_sub(tail),
            size: tail,
        });
    }
    // Stable: a hole sorts after a zero-sized field at the same offset.
    rows.sort_by_key(|r| (r.start(), u8::from(!matches!(r, Row::Field(_)))));
    rows
}

fn write_rows(
    out: &mut String,
    indent: &str,
    rows: &[Row<'_>],
    size: u64,
    cache_line: u64,
    widths: &Widths,
) {
    // The next cache-line boundary not yet reported.
    let mut next = cache_line;
    for row in rows {
        let (start, end) = (row.start(), row.end());
        if next <= start && next < size {
            let last = start.min(size.saturating_sub(1)) / cache_line * cache_line;
            write_boundaries(out, indent, next, last, cache_line, None);
            next = last.saturating_add(cache_line);
        }
        write_row(out, indent, row, widths);
        if next < end && next < size {
            let last = (end.min(size) - 1) / cache_line * cache_line;
            if last >= next {
                write_boundaries(out, indent, next, last, cache_line, Some(&row.describe()));
                next = last.saturating_add(cache_line);
            }
        }
    }
}

/// Reports the boundaries `first..=last` (multiples of `cache_line`), on
/// one line if there are several.
fn write_boundaries(
    out: &mut String,
    indent: &str,
    first: u64,
    last: u64,
    cache_line: u64,
    inside: Option<&str>,
) {
    let suffix = inside
        .map(|what| format!(" inside {what}"))
        .unwrap_or_default();
    if first == last {
        let _ = writeln!(
            out,
            "{indent}/* --- cacheline {} boundary ({first} bytes){suffix} --- */",
            first / cache_line
        );
    } else {
        let _ = writeln!(
            out,
            "{indent}/* --- cacheline {}..{} boundaries ({first}..{last} bytes){suffix} --- */",
            first / cache_line,
            last / cache_line
        );
    }
}

fn write_row(out: &mut String, indent: &str, row: &Row<'_>, widths: &Widths) {
    match row {
        Row::Field(field) => {
            let offset = match field.bit_offset {
                Some(bit) => format!("{}:{bit}", field.offset),
                None => field.offset.to_string(),
            };
            let name = format!("{};", field_label(field));
            let _ = writeln!(
                out,
                "{indent}{:<tw$} {:<nw$} /* {offset:>5} {:>5} */",
                field.type_name,
                name,
                field.size,
                tw = widths.type_column,
                nw = widths.name_column,
            );
        }
        Row::Hole(hole) => {
            let _ = writeln!(out, "{indent}/* XXX {} hole */", bytes(hole.size));
        }
        Row::Tail { size, .. } => {
            let _ = writeln!(out, "{indent}/* XXX {} tail padding */", bytes(*size));
        }
    }
}

fn write_enum_body(out: &mut String, layout: &TypeLayout, cache_line: u64, widths: &Widths) {
    for field in &layout.fields {
        write_row(out, "    ", &Row::Field(field), widths);
    }
    for variant in &layout.variants {
        out.push('\n');
        let no_fields = if variant.fields.is_empty() {
            ": no fields"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "    /* variant {}{no_fields} */",
            variant_label(variant)
        );
        let rows = rows(
            &variant.fields,
            &variant.holes,
            variant.tail_padding,
            layout.size,
        );
        write_rows(out, "        ", &rows, layout.size, cache_line, widths);
    }
}

fn variant_label(variant: &Variant) -> String {
    match &variant.discr {
        Some(discr) => format!("{} (tag {discr})", variant.name),
        None => format!("{} (every other tag value)", variant.name),
    }
}

fn write_summary(out: &mut String, layout: &TypeLayout, cache_line: u64) {
    let align_source = match layout.align_source {
        AlignSource::Dwarf => "DW_AT_alignment",
        AlignSource::Inferred => "inferred from fields",
    };
    let cachelines = layout.size.div_ceil(cache_line);
    let members = if layout.has_variants() {
        format!("variants: {}", layout.variants.len())
    } else {
        format!("members: {}", layout.fields.len())
    };
    let _ = writeln!(
        out,
        "    /* size: {}, align: {} ({align_source}), cachelines: {cachelines}, {members} */",
        layout.size, layout.align
    );
    let holes_label = if layout.has_variants() {
        "holes unused by every variant"
    } else {
        "holes"
    };
    let mut line = String::new();
    if !layout.has_variants() {
        let _ = write!(line, "sum members: {}, ", layout.field_bytes());
    }
    let _ = write!(
        line,
        "{holes_label}: {}, sum holes: {}, tail padding: {}",
        layout.holes.len(),
        layout.hole_bytes(),
        layout.tail_padding
    );
    let _ = writeln!(out, "    /* {line} */");
    if layout.has_variants() && !layout.holes.is_empty() {
        let spans: Vec<String> = layout
            .holes
            .iter()
            .map(|h| format!("{}..{}", h.offset, h.offset.saturating_add(h.size)))
            .collect();
        let _ = writeln!(
            out,
            "    /* unused by every variant: bytes {} */",
            spans.join(", ")
        );
    }
    if layout.size > 0 {
        let last = match layout.size % cache_line {
            0 => cache_line,
            rest => rest,
        };
        let _ = writeln!(out, "    /* last cacheline: {} */", bytes(last));
    }
}

/// A field's name, with its width for a bit-field (`flags:3`).
fn field_label(field: &Field) -> String {
    match field.bit_size {
        Some(bits) => format!("{}:{bits}", field.name),
        None => field.name.clone(),
    }
}

fn bytes(n: u64) -> String {
    if n == 1 {
        "1 byte".into()
    } else {
        format!("{n} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::model::{TypeKind, gaps};

    fn field(name: &str, offset: u64, size: u64, ty: &str) -> Field {
        Field {
            name: name.into(),
            offset,
            size,
            type_name: ty.into(),
            bit_offset: None,
            bit_size: None,
        }
    }

    fn layout(name: &str, size: u64, align: u64, fields: Vec<Field>) -> TypeLayout {
        let (holes, tail_padding) = gaps(size, fields.iter().map(|f| (f.offset, f.end())));
        TypeLayout {
            name: name.into(),
            kind: TypeKind::Struct,
            size,
            align,
            align_source: AlignSource::Dwarf,
            fields,
            holes,
            tail_padding,
            variants: vec![],
        }
    }

    #[test]
    fn text_shows_fields_holes_and_padding_in_offset_order() {
        let holey = layout(
            "fixture::Holey",
            24,
            8,
            vec![
                field("a", 0, 1, "u8"),
                field("b", 8, 8, "u64"),
                field("c", 16, 2, "u16"),
            ],
        );
        let text = render_text(&holey, 64);
        let expected = "\
struct fixture::Holey {
    u8  a; /*     0     1 */
    /* XXX 7 bytes hole */
    u64 b; /*     8     8 */
    u16 c; /*    16     2 */
    /* XXX 6 bytes tail padding */

    /* size: 24, align: 8 (DW_AT_alignment), cachelines: 1, members: 3 */
    /* sum members: 11, holes: 1, sum holes: 7, tail padding: 6 */
    /* last cacheline: 24 bytes */
};
";
        assert_eq!(text, expected);
    }

    #[test]
    fn text_marks_cache_line_boundaries() {
        // A 128-byte line pair: 8 bytes of fields, 120 of padding, and a
        // field that straddles the first boundary in a second type.
        let line = layout(
            "ring::ProducerLine",
            128,
            128,
            vec![
                field("tail", 0, 4, "AtomicU32"),
                field("flags", 4, 4, "AtomicU32"),
            ],
        );
        let text = render_text(&line, 64);
        assert!(text.contains("    /* XXX 120 bytes tail padding */\n    /* --- cacheline 1 boundary (64 bytes) inside the tail padding --- */\n"), "{text}");
        assert!(text.contains("cachelines: 2"));
        assert!(text.contains("/* last cacheline: 64 bytes */"));

        let straddle = layout(
            "S",
            192,
            8,
            vec![
                field("head", 0, 60, "[u8; 60]"),
                field("big", 60, 8, "u64"),
                field("rest", 128, 64, "[u8; 64]"),
            ],
        );
        let text = render_text(&straddle, 64);
        let big = text.find("big;").expect("big");
        let inside = text
            .find("cacheline 1 boundary (64 bytes) inside `big`")
            .expect("inside");
        let hole = text.find("XXX 60 bytes hole").expect("hole");
        let at_128 = text
            .find("--- cacheline 2 boundary (128 bytes) --- */")
            .expect("128");
        let rest = text.find("rest;").expect("rest");
        assert!(
            big < inside && inside < hole && hole < at_128 && at_128 < rest,
            "{text}"
        );

        // A boundary every 16 bytes inside one big field is one line.
        let text = render_text(&straddle, 16);
        assert!(
            text.contains("cacheline 1..3 boundaries (16..48 bytes) inside `head`"),
            "{text}"
        );
    }

    #[test]
    fn text_lists_enum_variants() {
        let tag = field("(tag)", 0, 1, "u8");
        let x = vec![field("__0", 1, 1, "u8"), field("__1", 4, 4, "u32")];
        let (x_holes, x_tail) = gaps(16, [(0, 1), (1, 2), (4, 8)]);
        let tagged = TypeLayout {
            name: "fixture::Tagged".into(),
            kind: TypeKind::Enum,
            size: 16,
            align: 8,
            align_source: AlignSource::Dwarf,
            fields: vec![tag],
            holes: vec![Hole { offset: 2, size: 2 }],
            tail_padding: 0,
            variants: vec![
                Variant {
                    name: "X".into(),
                    discr: Some("0".into()),
                    fields: x,
                    holes: x_holes,
                    tail_padding: x_tail,
                },
                Variant {
                    name: "Z".into(),
                    discr: None,
                    fields: vec![],
                    holes: vec![],
                    tail_padding: 15,
                },
            ],
        };
        let text = render_text(&tagged, 64);
        assert!(
            text.starts_with("enum fixture::Tagged {\n    u8  (tag); /*     0     1 */\n"),
            "{text}"
        );
        assert!(text.contains("    /* variant X (tag 0) */\n        u8  __0;   /*     1     1 */\n        /* XXX 2 bytes hole */\n"), "{text}");
        assert!(text.contains("    /* variant Z (every other tag value): no fields */\n        /* XXX 15 bytes tail padding */\n"), "{text}");
        assert!(
            text.contains("/* unused by every variant: bytes 2..4 */"),
            "{text}"
        );
        assert!(text.contains("variants: 2"));
    }

    #[test]
    fn json_is_an_array_with_the_documented_keys() {
        let holey = layout(
            "H",
            16,
            8,
            vec![field("a", 0, 1, "u8"), field("b", 8, 8, "u64")],
        );
        let value: serde_json::Value = serde_json::from_str(&render_json(&[holey])).expect("json");
        let first = &value[0];
        assert_eq!(first["name"], "H");
        assert_eq!(first["kind"], "struct");
        assert_eq!(first["size"], 16);
        assert_eq!(first["align"], 8);
        assert_eq!(first["fields"][1]["type"], "u64");
        assert_eq!(first["fields"][1]["offset"], 8);
        assert_eq!(first["holes"][0]["offset"], 1);
        assert_eq!(first["holes"][0]["size"], 7);
        assert_eq!(first["tail_padding"], 0);
        assert!(first.get("variants").is_none());
        assert!(first["fields"][0].get("bit_size").is_none());
    }
}
