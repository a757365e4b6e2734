//! The layout of one type as `rflayout` reports it, and the hole/padding
//! arithmetic.
//!
//! All offsets and sizes are in bytes. Fields are sorted by offset (not by
//! declaration order: Rust reorders fields of non-`repr(C)` structs).

use serde::Serialize;

/// What kind of type a [`TypeLayout`] describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TypeKind {
    /// A struct (`DW_TAG_structure_type` without a variant part).
    Struct,
    /// A C++ class (`DW_TAG_class_type`).
    Class,
    /// A union (`DW_TAG_union_type`); every field starts at offset 0.
    Union,
    /// A Rust enum (a struct with a `DW_TAG_variant_part`) or a C enum
    /// (`DW_TAG_enumeration_type`).
    Enum,
}

impl TypeKind {
    /// The keyword the text report opens the type with.
    pub fn keyword(self) -> &'static str {
        match self {
            Self::Struct => "struct",
            Self::Class => "class",
            Self::Union => "union",
            Self::Enum => "enum",
        }
    }
}

/// Where a type's alignment came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AlignSource {
    /// `DW_AT_alignment` on the type (rustc always emits it; C compilers
    /// only for explicitly aligned types).
    Dwarf,
    /// The largest alignment of the fields: a base type aligns to its size
    /// capped at 16, a pointer to its size, an array to its element.
    Inferred,
}

/// One field (DWARF member) of a type.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Field {
    /// The member's name (`__0`, `__1`… for Rust tuple fields,
    /// `(anonymous)` for an unnamed C member, `(tag)` for an enum's
    /// unnamed discriminant).
    pub name: String,
    /// Byte offset from the start of the type.
    pub offset: u64,
    /// Bytes the field occupies (for a bit-field: the bytes it touches).
    pub size: u64,
    /// The field's type, as the compiler names it (`u64`, `&u8`,
    /// `alloc::vec::Vec<u8, alloc::alloc::Global>`, `struct rf_sqe`).
    #[serde(rename = "type")]
    pub type_name: String,
    /// For a bit-field: the first bit within the byte at `offset` (0 is the
    /// least significant bit).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bit_offset: Option<u64>,
    /// For a bit-field: its width in bits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bit_size: Option<u64>,
}

impl Field {
    /// The first byte after the field.
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.size)
    }
}

/// Bytes inside a type that no field covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Hole {
    /// Byte offset of the first unused byte.
    pub offset: u64,
    /// Number of unused bytes.
    pub size: u64,
}

/// One variant of an enum.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Variant {
    /// The variant's name.
    pub name: String,
    /// The tag value that selects it, as DWARF states it; `None` for the
    /// variant a niche-optimised enum selects with every other tag value,
    /// and for C enumerators without a value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub discr: Option<String>,
    /// The variant's fields, offsets from the start of the enum.
    pub fields: Vec<Field>,
    /// Bytes neither the tag nor a field of this variant covers.
    pub holes: Vec<Hole>,
    /// Bytes after the last field (or tag) of this variant.
    pub tail_padding: u64,
}

/// The layout of one type.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct TypeLayout {
    /// Full name: namespaces and enclosing types joined with `::`, generic
    /// arguments included (`fixture::Wrap<u32>`); a C struct's tag
    /// (`rf_sample`) or typedef name.
    pub name: String,
    /// Struct, union, enum or class.
    pub kind: TypeKind,
    /// `DW_AT_byte_size`.
    pub size: u64,
    /// Alignment in bytes.
    pub align: u64,
    /// Where [`TypeLayout::align`] came from (not in the JSON output).
    #[serde(skip)]
    pub align_source: AlignSource,
    /// Fields sorted by offset. For a Rust enum: the tag (discriminant or
    /// niche) only; the variants' fields are under `variants`.
    pub fields: Vec<Field>,
    /// Gaps between fields. For an enum: bytes no variant and no tag uses.
    pub holes: Vec<Hole>,
    /// Bytes after the end of the last field up to `size`. For an enum:
    /// after the end of the longest variant.
    pub tail_padding: u64,
    /// Enum variants (empty for structs and unions).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub variants: Vec<Variant>,
}

impl TypeLayout {
    /// Total bytes in holes (tail padding not included).
    pub fn hole_bytes(&self) -> u64 {
        self.holes.iter().map(|h| h.size).sum()
    }

    /// Sum of the sizes of the type-level fields.
    pub fn field_bytes(&self) -> u64 {
        self.fields.iter().map(|f| f.size).sum()
    }

    /// Whether the type is an enum with variants.
    pub fn has_variants(&self) -> bool {
        !self.variants.is_empty()
    }
}

/// Holes and tail padding of a type of `size` bytes whose fields cover the
/// half-open byte ranges `spans` (in any order, possibly overlapping, as in
/// unions, bit-fields and enum variants sharing a tag).
///
/// Empty ranges (zero-sized fields) cover nothing. A range past `size`
/// (malformed input) simply leaves no tail padding.
pub fn gaps(size: u64, spans: impl IntoIterator<Item = (u64, u64)>) -> (Vec<Hole>, u64) {
    let mut spans: Vec<(u64, u64)> = spans.into_iter().filter(|(s, e)| e > s).collect();
    spans.sort_unstable();
    let mut holes = Vec::new();
    let mut covered = 0u64;
    for (start, end) in spans {
        if start > covered {
            holes.push(Hole {
                offset: covered,
                size: start - covered,
            });
        }
        covered = covered.max(end);
    }
    (holes, size.saturating_sub(covered))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_of_a_repr_c_struct_with_holes() {
        // struct { u8 a; u64 b; u16 c; }
        let (holes, tail) = gaps(24, [(0, 1), (8, 16), (16, 18)]);
        assert_eq!(holes, [Hole { offset: 1, size: 7 }]);
        assert_eq!(tail, 6);
    }

    #[test]
    fn gaps_ignore_order_overlap_and_zero_sized_fields() {
        // A union, a zero-sized marker at 4, declaration order reversed.
        let (holes, tail) = gaps(8, [(0, 2), (4, 4), (0, 8), (0, 4)]);
        assert!(holes.is_empty());
        assert_eq!(tail, 0);
        let (holes, tail) = gaps(16, [(8, 9), (0, 1), (9, 10)]);
        assert_eq!(holes, [Hole { offset: 1, size: 7 }]);
        assert_eq!(tail, 6);
    }

    #[test]
    fn gaps_of_empty_and_overlong_types() {
        assert_eq!(gaps(0, []), (vec![], 0));
        assert_eq!(gaps(128, []), (vec![], 128));
        // A field past the end (malformed DWARF) does not underflow.
        assert_eq!(gaps(4, [(0, 8)]), (vec![], 0));
        assert_eq!(gaps(u64::MAX, [(u64::MAX - 1, u64::MAX)]).0.len(), 1);
    }
}
