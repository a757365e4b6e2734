//! Reading type layouts out of DWARF.
//!
//! [`TypeGraph::read`] walks every unit's debugging information entries
//! once, depth first, and keeps only what layouts need: one node per
//! type entry (its tag, name, `DW_AT_byte_size`, `DW_AT_alignment`,
//! `DW_AT_type`, members, variant part, array bounds, enumerators), keyed
//! by the entry's section offset so that both unit-relative and
//! section-relative references resolve. Full names are built while walking:
//! the names of the enclosing `DW_TAG_namespace` and type entries joined
//! with `::` (rustc nests a Rust enum's per-variant structs inside the enum,
//! so they are `crate::Enum::Variant`).
//!
//! [`TypeGraph::layouts_matching`] then builds a [`TypeLayout`] for each
//! named type a pattern matches:
//!
//! - members are sorted by `DW_AT_data_member_location` (or
//!   `DW_AT_data_bit_offset` for bit-fields), never by declaration order;
//! - a Rust enum is a `DW_TAG_structure_type` holding a
//!   `DW_TAG_variant_part`: its tag member (an artificial member named by
//!   `DW_AT_discr`, which for a niche-optimised enum overlaps a field of the
//!   dataful variant) and one `DW_TAG_variant` per variant, each with a
//!   member whose type is the variant's struct; that struct's fields are the
//!   variant's fields;
//! - a C `enum` or a fieldless Rust enum is a `DW_TAG_enumeration_type`;
//! - a C `typedef` of a struct is found under the typedef's name too.
//!
//! Every reference is bounds-checked; cycles in malformed input are cut by a
//! depth limit. Nothing here panics on bad input.

use std::collections::HashMap;

use gimli::{AttributeValue, Reader, UnitSectionOffset, constants};

use super::model::{AlignSource, Field, TypeKind, TypeLayout, Variant, gaps};
use super::pattern::TypePattern;

/// How deep type references are followed (typedef chains, nested
/// aggregates for inferred alignment). Real programs stay far below it; it
/// only stops cycles in malformed input.
const MAX_DEPTH: usize = 48;

/// Marks keys of entries in `.debug_types`, so they do not collide with
/// `.debug_info` offsets.
const DEBUG_TYPES_BIT: u64 = 1 << 63;

/// The source language of a unit, which decides how type names are
/// spelled (`[u8; 4]` in Rust, `unsigned char[4]` and `struct x` in C).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lang {
    Rust,
    C,
    Other,
}

/// A member of a struct, union, variant part or variant.
#[derive(Debug, Clone)]
struct Member {
    /// `DW_AT_name`.
    name: Option<String>,
    /// `DW_AT_type`, as a graph key.
    target: Option<u64>,
    /// `DW_AT_data_member_location`: `None` when absent (union members).
    location: Option<Location>,
    /// `DW_AT_data_bit_offset` (DWARF 4+ bit-fields).
    data_bit_offset: Option<u64>,
    /// `DW_AT_bit_offset` (DWARF 2/3 bit-fields, counted from the most
    /// significant bit of the storage unit).
    legacy_bit_offset: Option<u64>,
    /// `DW_AT_bit_size`.
    bit_size: Option<u64>,
    /// `DW_AT_byte_size` on the member itself.
    byte_size: Option<u64>,
    /// `DW_AT_alignment` on the member.
    alignment: Option<u64>,
    /// `DW_AT_artificial` (the tag of a Rust enum).
    artificial: bool,
    /// A `DW_TAG_inheritance` (C++ base class) rather than a member.
    is_base: bool,
}

/// Where a member starts.
#[derive(Debug, Clone, Copy)]
enum Location {
    /// A constant byte offset (or a `DW_OP_plus_uconst` expression).
    Bytes(u64),
    /// A location expression rflayout does not evaluate.
    Unsupported,
}

/// One `DW_TAG_variant`.
#[derive(Debug, Clone, Default)]
struct RawVariant {
    /// `DW_AT_discr_value`, rendered.
    discr: Option<String>,
    members: Vec<Member>,
}

/// A `DW_TAG_variant_part`.
#[derive(Debug, Clone, Default)]
struct VariantPart {
    /// Members directly inside the variant part: the tag that
    /// `DW_AT_discr` names (rustc emits no other).
    members: Vec<Member>,
    variants: Vec<RawVariant>,
}

/// A type entry.
#[derive(Debug, Clone)]
struct Node {
    tag: constants::DwTag,
    /// `DW_AT_name`.
    name: Option<String>,
    /// The name with its namespaces and enclosing types, for named
    /// aggregates, enums and typedefs.
    full_name: Option<String>,
    byte_size: Option<u64>,
    alignment: Option<u64>,
    /// `DW_AT_type`, as a graph key.
    target: Option<u64>,
    /// `DW_AT_declaration`: a forward declaration without a layout.
    declaration: bool,
    members: Vec<Member>,
    variant_part: Option<VariantPart>,
    /// Array dimensions, outermost first; `None` when unknown (`int a[]`).
    dims: Vec<Option<u64>>,
    /// Enumerators: name and value.
    enumerators: Vec<(String, Option<String>)>,
    lang: Lang,
    address_size: u8,
}

/// The types of one object file's DWARF.
#[derive(Debug, Default)]
pub struct TypeGraph {
    nodes: HashMap<u64, Node>,
    /// Named, defined aggregates, enums and typedefs.
    named: Vec<NamedType>,
}

/// A type that can be looked up by name.
#[derive(Debug)]
struct NamedType {
    /// Full name.
    name: String,
    /// Graph key.
    key: u64,
    /// A Rust enum's per-variant struct (`crate::Enum::Variant`), nested in
    /// the enum: found by its exact name, but left out of glob matches,
    /// since its fields are already shown with the enum and on its own it
    /// reports the tag's bytes as a hole.
    is_variant_struct: bool,
}

/// What an open entry means for its children.
#[derive(Debug)]
enum Scope {
    /// A namespace or named aggregate: its name prefixes nested types.
    Named(Option<String>),
    /// A type node (aggregate, array, enum) that collects members,
    /// subranges or enumerators; `name` prefixes nested types.
    Type { key: u64, name: Option<String> },
    /// A variant part of the type `key`.
    VariantPart { key: u64 },
    /// Variant `index` of the variant part of type `key`.
    Variant { key: u64, index: usize },
    /// Anything else (subprograms, lexical blocks).
    Other,
}

#[derive(Debug)]
struct Frame {
    depth: isize,
    scope: Scope,
}

impl TypeGraph {
    /// Reads every unit (`.debug_info` and `.debug_types`) of `dwarf` into
    /// a graph.
    ///
    /// # Errors
    ///
    /// Any error gimli reports for malformed DWARF.
    pub fn read<R: Reader<Offset = usize>>(dwarf: &gimli::Dwarf<R>) -> gimli::Result<Self> {
        let mut graph = Self::default();
        let mut units = dwarf.units();
        while let Some(header) = units.next()? {
            let unit = dwarf.unit(header)?;
            graph.read_unit(dwarf, &unit)?;
        }
        let mut units = dwarf.type_units();
        while let Some(header) = units.next()? {
            let unit = dwarf.unit(header)?;
            graph.read_unit(dwarf, &unit)?;
        }
        Ok(graph)
    }

    /// Whether no type was found at all.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The full names of the named, defined types (with repeats).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.named.iter().map(|named| named.name.as_str())
    }

    /// The layouts of the named types `pattern` matches, in the order they
    /// appear, repeats included (the caller deduplicates across units and
    /// objects). Types whose layout cannot be built (a declaration, a
    /// typedef of a non-aggregate, a member at a computed location) are left
    /// out, and so are a Rust enum's per-variant structs unless named
    /// exactly.
    pub fn layouts_matching(&self, pattern: &TypePattern) -> Vec<TypeLayout> {
        self.named
            .iter()
            .filter(|named| !(named.is_variant_struct && pattern.is_glob()))
            .filter(|named| pattern.matches(&named.name))
            .filter_map(|named| self.layout(&named.name, named.key))
            .collect()
    }

    fn read_unit<R: Reader<Offset = usize>>(
        &mut self,
        dwarf: &gimli::Dwarf<R>,
        unit: &gimli::Unit<R>,
    ) -> gimli::Result<()> {
        let address_size = unit.encoding().address_size;
        let mut lang = Lang::Other;
        let mut entries = unit.entries();
        let mut depth: isize = 0;
        let mut stack: Vec<Frame> = Vec::new();
        while let Some((delta, entry)) = entries.next_dfs()? {
            depth = depth.saturating_add(delta);
            while stack.last().is_some_and(|f| f.depth >= depth) {
                stack.pop();
            }
            let key = die_key(unit, entry.offset());
            let tag = entry.tag();
            let scope = match tag {
                constants::DW_TAG_compile_unit
                | constants::DW_TAG_type_unit
                | constants::DW_TAG_partial_unit => {
                    lang = read_lang(entry)?;
                    Scope::Other
                }
                constants::DW_TAG_namespace => Scope::Named(read_name(dwarf, unit, entry)?),
                constants::DW_TAG_structure_type
                | constants::DW_TAG_union_type
                | constants::DW_TAG_class_type
                | constants::DW_TAG_enumeration_type
                | constants::DW_TAG_typedef => {
                    let mut node = read_node(dwarf, unit, entry, lang, address_size)?;
                    if let Some(name) = &node.name {
                        let full = qualified(&stack, name);
                        if !node.declaration {
                            let is_variant_struct = match stack.last().map(|f| &f.scope) {
                                Some(Scope::Type { key: parent, .. }) => self
                                    .nodes
                                    .get(parent)
                                    .is_some_and(|p| p.variant_part.is_some()),
                                _ => false,
                            };
                            self.named.push(NamedType {
                                name: full.clone(),
                                key,
                                is_variant_struct,
                            });
                        }
                        node.full_name = Some(full);
                    }
                    let name = node.name.clone();
                    self.nodes.insert(key, node);
                    if tag == constants::DW_TAG_typedef {
                        Scope::Other
                    } else {
                        Scope::Type { key, name }
                    }
                }
                constants::DW_TAG_base_type
                | constants::DW_TAG_pointer_type
                | constants::DW_TAG_reference_type
                | constants::DW_TAG_rvalue_reference_type
                | constants::DW_TAG_ptr_to_member_type
                | constants::DW_TAG_const_type
                | constants::DW_TAG_volatile_type
                | constants::DW_TAG_atomic_type
                | constants::DW_TAG_restrict_type
                | constants::DW_TAG_array_type
                | constants::DW_TAG_subroutine_type
                | constants::DW_TAG_unspecified_type => {
                    let node = read_node(dwarf, unit, entry, lang, address_size)?;
                    self.nodes.insert(key, node);
                    Scope::Type { key, name: None }
                }
                constants::DW_TAG_member | constants::DW_TAG_inheritance => {
                    if let Some(member) = read_member(dwarf, unit, entry)? {
                        self.attach_member(stack.last(), member);
                    }
                    Scope::Other
                }
                constants::DW_TAG_variant_part => match stack.last().map(|f| &f.scope) {
                    Some(&Scope::Type { key: owner, .. }) => match self.nodes.get_mut(&owner) {
                        Some(node) => {
                            node.variant_part.get_or_insert_with(VariantPart::default);
                            Scope::VariantPart { key: owner }
                        }
                        None => Scope::Other,
                    },
                    _ => Scope::Other,
                },
                constants::DW_TAG_variant => match stack.last().map(|f| &f.scope) {
                    Some(&Scope::VariantPart { key: owner }) => {
                        let discr = entry
                            .attr_value(constants::DW_AT_discr_value)?
                            .and_then(|v| render_constant(&v));
                        match self
                            .nodes
                            .get_mut(&owner)
                            .and_then(|n| n.variant_part.as_mut())
                        {
                            Some(part) => {
                                part.variants.push(RawVariant {
                                    discr,
                                    members: Vec::new(),
                                });
                                Scope::Variant {
                                    key: owner,
                                    index: part.variants.len() - 1,
                                }
                            }
                            None => Scope::Other,
                        }
                    }
                    _ => Scope::Other,
                },
                constants::DW_TAG_subrange_type => {
                    if let Some(&Scope::Type { key: owner, .. }) = stack.last().map(|f| &f.scope) {
                        let dim = read_subrange(entry)?;
                        if let Some(node) = self.nodes.get_mut(&owner) {
                            if node.tag == constants::DW_TAG_array_type {
                                node.dims.push(dim);
                            }
                        }
                    }
                    Scope::Other
                }
                constants::DW_TAG_enumerator => {
                    if let Some(&Scope::Type { key: owner, .. }) = stack.last().map(|f| &f.scope) {
                        let name = read_name(dwarf, unit, entry)?.unwrap_or_else(|| "?".into());
                        let value = entry
                            .attr_value(constants::DW_AT_const_value)?
                            .and_then(|v| render_constant(&v));
                        if let Some(node) = self.nodes.get_mut(&owner) {
                            node.enumerators.push((name, value));
                        }
                    }
                    Scope::Other
                }
                _ => Scope::Other,
            };
            if entry.has_children() {
                stack.push(Frame { depth, scope });
            }
        }
        Ok(())
    }

    /// Adds a member to the type, variant part or variant that encloses it.
    fn attach_member(&mut self, parent: Option<&Frame>, member: Member) {
        let Some(parent) = parent else { return };
        match parent.scope {
            Scope::Type { key, .. } => {
                if let Some(node) = self.nodes.get_mut(&key) {
                    node.members.push(member);
                }
            }
            Scope::VariantPart { key } => {
                if let Some(part) = self
                    .nodes
                    .get_mut(&key)
                    .and_then(|n| n.variant_part.as_mut())
                {
                    part.members.push(member);
                }
            }
            Scope::Variant { key, index } => {
                if let Some(variant) = self
                    .nodes
                    .get_mut(&key)
                    .and_then(|n| n.variant_part.as_mut())
                    .and_then(|p| p.variants.get_mut(index))
                {
                    variant.members.push(member);
                }
            }
            Scope::Named(_) | Scope::Other => {}
        }
    }

    /// The layout of the type at `key`, reported under `name`.
    fn layout(&self, name: &str, key: u64) -> Option<TypeLayout> {
        let mut node = self.nodes.get(&key)?;
        let mut depth = 0;
        // A typedef is reported under its own name with its target's layout.
        while matches!(
            node.tag,
            constants::DW_TAG_typedef
                | constants::DW_TAG_const_type
                | constants::DW_TAG_volatile_type
        ) {
            depth += 1;
            if depth > MAX_DEPTH {
                return None;
            }
            node = self.nodes.get(&node.target?)?;
        }
        if node.declaration {
            return None;
        }
        match node.tag {
            constants::DW_TAG_structure_type
            | constants::DW_TAG_union_type
            | constants::DW_TAG_class_type => self.aggregate_layout(name, node),
            constants::DW_TAG_enumeration_type => self.enumeration_layout(name, node),
            _ => None,
        }
    }

    fn aggregate_layout(&self, name: &str, node: &Node) -> Option<TypeLayout> {
        let size = node.byte_size?;
        let mut fields = node
            .members
            .iter()
            .map(|m| self.field(m, 0))
            .collect::<Option<Vec<_>>>()?;
        let mut variants = Vec::new();
        if let Some(part) = &node.variant_part {
            for member in &part.members {
                fields.push(self.field(member, 0)?);
            }
            for raw in &part.variants {
                variants.push(self.variant(raw, &fields, size)?);
            }
        }
        sort_fields(&mut fields);
        let kind = match node.tag {
            constants::DW_TAG_union_type => TypeKind::Union,
            constants::DW_TAG_class_type => TypeKind::Class,
            _ if node.variant_part.is_some() => TypeKind::Enum,
            _ => TypeKind::Struct,
        };
        let (align, align_source) = match node.alignment.filter(|&a| a > 0) {
            Some(a) => (a, AlignSource::Dwarf),
            None => (self.aggregate_align(node, 0), AlignSource::Inferred),
        };
        let spans = fields
            .iter()
            .chain(variants.iter().flat_map(|v| v.fields.iter()))
            .map(|f| (f.offset, f.end()));
        let (holes, tail_padding) = gaps(size, spans);
        Some(TypeLayout {
            name: name.to_owned(),
            kind,
            size,
            align,
            align_source,
            fields,
            holes,
            tail_padding,
            variants,
        })
    }

    /// One variant of a Rust enum: the fields of its struct, shifted by the
    /// variant member's offset. `tag` are the enum's tag fields, which every
    /// variant shares.
    fn variant(&self, raw: &RawVariant, tag: &[Field], size: u64) -> Option<Variant> {
        let mut fields = Vec::new();
        for member in &raw.members {
            let holder = self.field(member, 0)?;
            match member
                .target
                .and_then(|t| self.nodes.get(&t))
                .filter(|n| n.tag == constants::DW_TAG_structure_type)
            {
                Some(inner) => {
                    for m in &inner.members {
                        fields.push(self.field(m, holder.offset)?);
                    }
                }
                None => fields.push(holder),
            }
        }
        sort_fields(&mut fields);
        let spans = tag.iter().chain(&fields).map(|f| (f.offset, f.end()));
        let (holes, tail_padding) = gaps(size, spans);
        let name = raw
            .members
            .iter()
            .find_map(|m| m.name.clone())
            .unwrap_or_else(|| "?".into());
        Some(Variant {
            name,
            discr: raw.discr.clone(),
            fields,
            holes,
            tail_padding,
        })
    }

    fn enumeration_layout(&self, name: &str, node: &Node) -> Option<TypeLayout> {
        let size = node
            .byte_size
            .or_else(|| node.target.and_then(|t| self.type_size(t, 0)))?;
        let (align, align_source) = match node.alignment.filter(|&a| a > 0) {
            Some(a) => (a, AlignSource::Dwarf),
            None => (
                node.target
                    .map_or(size.clamp(1, 16), |t| self.type_align(t, 0)),
                AlignSource::Inferred,
            ),
        };
        let type_name = node
            .target
            .map_or_else(|| format!("{size}-byte integer"), |t| self.type_name(t, 0));
        let fields = vec![Field {
            name: "(tag)".into(),
            offset: 0,
            size,
            type_name,
            bit_offset: None,
            bit_size: None,
        }];
        let variants = node
            .enumerators
            .iter()
            .map(|(name, value)| Variant {
                name: name.clone(),
                discr: value.clone(),
                fields: Vec::new(),
                holes: Vec::new(),
                tail_padding: 0,
            })
            .collect();
        Some(TypeLayout {
            name: name.to_owned(),
            kind: TypeKind::Enum,
            size,
            align,
            align_source,
            fields,
            holes: Vec::new(),
            tail_padding: 0,
            variants,
        })
    }

    /// A member as a field, `base` bytes further into the enclosing type.
    /// `None` when the member's location is an expression rflayout does not
    /// evaluate (then the type has no trustworthy layout).
    fn field(&self, member: &Member, base: u64) -> Option<Field> {
        let type_name = member
            .target
            .map_or_else(|| "?".to_owned(), |t| self.type_name(t, 0));
        let type_size = member
            .byte_size
            .or_else(|| member.target.and_then(|t| self.type_size(t, 0)));
        let location = match member.location {
            None => 0,
            Some(Location::Bytes(offset)) => offset,
            Some(Location::Unsupported) => return None,
        };
        let name = member.name.clone().unwrap_or_else(|| {
            if member.is_base {
                format!("(base {type_name})")
            } else if member.artificial {
                "(tag)".into()
            } else {
                "(anonymous)".into()
            }
        });
        let field = match member.bit_size {
            Some(bits) => {
                let absolute = if let Some(offset) = member.data_bit_offset {
                    offset
                } else if let Some(from_msb) = member.legacy_bit_offset {
                    // DWARF 2/3: counted from the most significant bit of a
                    // storage unit of `type_size` bytes at `location`
                    // (little-endian targets).
                    let storage_bits = type_size.unwrap_or(0).saturating_mul(8);
                    location
                        .saturating_mul(8)
                        .saturating_add(storage_bits.saturating_sub(from_msb.saturating_add(bits)))
                } else {
                    location.saturating_mul(8)
                };
                let bit = absolute % 8;
                Field {
                    name,
                    offset: base.saturating_add(absolute / 8),
                    size: bit.saturating_add(bits).div_ceil(8),
                    type_name,
                    bit_offset: Some(bit),
                    bit_size: Some(bits),
                }
            }
            None => Field {
                name,
                offset: base.saturating_add(location),
                size: type_size.unwrap_or(0),
                type_name,
                bit_offset: None,
                bit_size: None,
            },
        };
        Some(field)
    }

    /// The size in bytes of the type at `key`, if DWARF states or implies it.
    fn type_size(&self, key: u64, depth: usize) -> Option<u64> {
        if depth > MAX_DEPTH {
            return None;
        }
        let node = self.nodes.get(&key)?;
        let target_size = || node.target.and_then(|t| self.type_size(t, depth + 1));
        match node.tag {
            constants::DW_TAG_pointer_type
            | constants::DW_TAG_reference_type
            | constants::DW_TAG_rvalue_reference_type
            | constants::DW_TAG_ptr_to_member_type => {
                Some(node.byte_size.unwrap_or(u64::from(node.address_size)))
            }
            constants::DW_TAG_typedef
            | constants::DW_TAG_const_type
            | constants::DW_TAG_volatile_type
            | constants::DW_TAG_atomic_type
            | constants::DW_TAG_restrict_type
            | constants::DW_TAG_enumeration_type => node.byte_size.or_else(target_size),
            constants::DW_TAG_array_type => node.byte_size.or_else(|| {
                node.dims
                    .iter()
                    .try_fold(target_size()?, |total, dim| total.checked_mul((*dim)?))
            }),
            constants::DW_TAG_subroutine_type => None,
            _ => node.byte_size,
        }
    }

    /// The alignment of the type at `key`: `DW_AT_alignment`, else what the
    /// type implies (see [`AlignSource::Inferred`]).
    fn type_align(&self, key: u64, depth: usize) -> u64 {
        if depth > MAX_DEPTH {
            return 1;
        }
        let Some(node) = self.nodes.get(&key) else {
            return 1;
        };
        if let Some(align) = node.alignment.filter(|&a| a > 0) {
            return align;
        }
        let target_align = || node.target.map_or(1, |t| self.type_align(t, depth + 1));
        match node.tag {
            constants::DW_TAG_base_type => node.byte_size.unwrap_or(1).clamp(1, 16),
            constants::DW_TAG_pointer_type
            | constants::DW_TAG_reference_type
            | constants::DW_TAG_rvalue_reference_type
            | constants::DW_TAG_ptr_to_member_type => node
                .byte_size
                .unwrap_or(u64::from(node.address_size))
                .clamp(1, 16),
            constants::DW_TAG_typedef
            | constants::DW_TAG_const_type
            | constants::DW_TAG_volatile_type
            | constants::DW_TAG_atomic_type
            | constants::DW_TAG_restrict_type
            | constants::DW_TAG_array_type => target_align(),
            constants::DW_TAG_enumeration_type => match node.target {
                Some(_) => target_align(),
                None => node.byte_size.unwrap_or(1).clamp(1, 16),
            },
            constants::DW_TAG_structure_type
            | constants::DW_TAG_union_type
            | constants::DW_TAG_class_type => self.aggregate_align(node, depth + 1),
            _ => 1,
        }
    }

    /// The largest alignment of an aggregate's members (its tag and variant
    /// members included), at least 1.
    fn aggregate_align(&self, node: &Node, depth: usize) -> u64 {
        let part = node.variant_part.as_ref();
        node.members
            .iter()
            .chain(part.into_iter().flat_map(|p| p.members.iter()))
            .chain(
                part.into_iter()
                    .flat_map(|p| p.variants.iter().flat_map(|v| v.members.iter())),
            )
            .map(|m| {
                m.alignment
                    .filter(|&a| a > 0)
                    .unwrap_or_else(|| m.target.map_or(1, |t| self.type_align(t, depth + 1)))
            })
            .max()
            .unwrap_or(1)
    }

    /// How the type at `key` is spelled in a field list.
    fn type_name(&self, key: u64, depth: usize) -> String {
        if depth > MAX_DEPTH {
            return "…".into();
        }
        let Some(node) = self.nodes.get(&key) else {
            return "?".into();
        };
        let target = || {
            node.target
                .map_or_else(|| "void".to_owned(), |t| self.type_name(t, depth + 1))
        };
        let own = node.full_name.as_ref().or(node.name.as_ref()).cloned();
        match node.tag {
            constants::DW_TAG_structure_type
            | constants::DW_TAG_union_type
            | constants::DW_TAG_class_type
            | constants::DW_TAG_enumeration_type => {
                let base = own.unwrap_or_else(|| "{anonymous}".into());
                if node.lang == Lang::C {
                    let keyword = match node.tag {
                        constants::DW_TAG_union_type => "union",
                        constants::DW_TAG_enumeration_type => "enum",
                        _ => "struct",
                    };
                    format!("{keyword} {base}")
                } else {
                    base
                }
            }
            constants::DW_TAG_pointer_type => own.unwrap_or_else(|| format!("{} *", target())),
            constants::DW_TAG_reference_type => own.unwrap_or_else(|| format!("{} &", target())),
            constants::DW_TAG_rvalue_reference_type => {
                own.unwrap_or_else(|| format!("{} &&", target()))
            }
            constants::DW_TAG_const_type => own.unwrap_or_else(|| format!("const {}", target())),
            constants::DW_TAG_volatile_type => {
                own.unwrap_or_else(|| format!("volatile {}", target()))
            }
            constants::DW_TAG_atomic_type => own.unwrap_or_else(|| format!("_Atomic {}", target())),
            constants::DW_TAG_restrict_type => {
                own.unwrap_or_else(|| format!("{} restrict", target()))
            }
            constants::DW_TAG_array_type => {
                if let Some(own) = own {
                    return own;
                }
                let element = target();
                let dims = node
                    .dims
                    .iter()
                    .map(|d| d.map_or(String::new(), |n| n.to_string()));
                if node.lang == Lang::Rust {
                    let dims: Vec<String> = dims.collect();
                    dims.iter()
                        .rev()
                        .fold(element, |inner, n| format!("[{inner}; {n}]"))
                } else {
                    dims.fold(element, |outer, n| format!("{outer}[{n}]"))
                }
            }
            constants::DW_TAG_subroutine_type => own.unwrap_or_else(|| "fn(..)".into()),
            constants::DW_TAG_ptr_to_member_type => {
                own.unwrap_or_else(|| format!("{} member pointer", target()))
            }
            _ => own.unwrap_or_else(|| "?".into()),
        }
    }
}

/// Sorts fields by offset, then bit offset; declaration order breaks ties.
fn sort_fields(fields: &mut [Field]) {
    fields.sort_by_key(|f| (f.offset, f.bit_offset.unwrap_or(0)));
}

/// The graph key of an entry: its offset in `.debug_info`, or in
/// `.debug_types` with [`DEBUG_TYPES_BIT`] set.
fn die_key<R: Reader<Offset = usize>>(unit: &gimli::Unit<R>, offset: gimli::UnitOffset) -> u64 {
    match unit.header.offset() {
        UnitSectionOffset::DebugInfoOffset(base) => base.0.wrapping_add(offset.0) as u64,
        UnitSectionOffset::DebugTypesOffset(base) => {
            DEBUG_TYPES_BIT | base.0.wrapping_add(offset.0) as u64
        }
    }
}

/// A `DW_AT_type` (or `DW_AT_discr`) reference as a graph key; `None` for
/// forms rflayout does not follow (type signatures, supplementary files).
fn reference<R: Reader<Offset = usize>>(
    unit: &gimli::Unit<R>,
    value: AttributeValue<R>,
) -> Option<u64> {
    match value {
        AttributeValue::UnitRef(offset) => Some(die_key(unit, offset)),
        AttributeValue::DebugInfoRef(offset) => Some(offset.0 as u64),
        _ => None,
    }
}

fn read_lang<R: Reader<Offset = usize>>(
    entry: &gimli::DebuggingInformationEntry<'_, '_, R>,
) -> gimli::Result<Lang> {
    Ok(match entry.attr_value(constants::DW_AT_language)? {
        Some(AttributeValue::Language(constants::DW_LANG_Rust)) => Lang::Rust,
        Some(AttributeValue::Language(
            constants::DW_LANG_C89
            | constants::DW_LANG_C
            | constants::DW_LANG_C99
            | constants::DW_LANG_C11
            | constants::DW_LANG_C17,
        )) => Lang::C,
        _ => Lang::Other,
    })
}

fn read_name<R: Reader<Offset = usize>>(
    dwarf: &gimli::Dwarf<R>,
    unit: &gimli::Unit<R>,
    entry: &gimli::DebuggingInformationEntry<'_, '_, R>,
) -> gimli::Result<Option<String>> {
    match entry.attr_value(constants::DW_AT_name)? {
        Some(value) => {
            let name = dwarf.attr_string(unit, value)?;
            Ok(Some(name.to_string_lossy()?.into_owned()))
        }
        None => Ok(None),
    }
}

fn read_udata<R: Reader<Offset = usize>>(
    entry: &gimli::DebuggingInformationEntry<'_, '_, R>,
    name: constants::DwAt,
) -> gimli::Result<Option<u64>> {
    Ok(entry.attr_value(name)?.and_then(|v| v.udata_value()))
}

fn read_flag<R: Reader<Offset = usize>>(
    entry: &gimli::DebuggingInformationEntry<'_, '_, R>,
    name: constants::DwAt,
) -> gimli::Result<bool> {
    Ok(matches!(
        entry.attr_value(name)?,
        Some(AttributeValue::Flag(true))
    ))
}

fn read_node<R: Reader<Offset = usize>>(
    dwarf: &gimli::Dwarf<R>,
    unit: &gimli::Unit<R>,
    entry: &gimli::DebuggingInformationEntry<'_, '_, R>,
    lang: Lang,
    address_size: u8,
) -> gimli::Result<Node> {
    Ok(Node {
        tag: entry.tag(),
        name: read_name(dwarf, unit, entry)?,
        full_name: None,
        byte_size: read_udata(entry, constants::DW_AT_byte_size)?,
        alignment: read_udata(entry, constants::DW_AT_alignment)?,
        target: entry
            .attr_value(constants::DW_AT_type)?
            .and_then(|v| reference(unit, v)),
        declaration: read_flag(entry, constants::DW_AT_declaration)?,
        members: Vec::new(),
        variant_part: None,
        dims: Vec::new(),
        enumerators: Vec::new(),
        lang,
        address_size,
    })
}

/// Reads a `DW_TAG_member` or `DW_TAG_inheritance`; `None` for a static
/// member (which takes no space in the object).
fn read_member<R: Reader<Offset = usize>>(
    dwarf: &gimli::Dwarf<R>,
    unit: &gimli::Unit<R>,
    entry: &gimli::DebuggingInformationEntry<'_, '_, R>,
) -> gimli::Result<Option<Member>> {
    if read_flag(entry, constants::DW_AT_external)?
        || read_flag(entry, constants::DW_AT_declaration)?
    {
        return Ok(None);
    }
    let location = match entry.attr_value(constants::DW_AT_data_member_location)? {
        None => None,
        Some(AttributeValue::Exprloc(expression)) => {
            let mut operations = expression.operations(unit.encoding());
            let first = operations.next()?;
            let rest = operations.next()?;
            Some(match (first, rest) {
                (
                    Some(
                        gimli::Operation::PlusConstant { value }
                        | gimli::Operation::UnsignedConstant { value },
                    ),
                    None,
                ) => Location::Bytes(value),
                _ => Location::Unsupported,
            })
        }
        Some(value) => Some(
            value
                .udata_value()
                .map_or(Location::Unsupported, Location::Bytes),
        ),
    };
    Ok(Some(Member {
        name: read_name(dwarf, unit, entry)?,
        target: entry
            .attr_value(constants::DW_AT_type)?
            .and_then(|v| reference(unit, v)),
        location,
        data_bit_offset: read_udata(entry, constants::DW_AT_data_bit_offset)?,
        legacy_bit_offset: read_udata(entry, constants::DW_AT_bit_offset)?,
        bit_size: read_udata(entry, constants::DW_AT_bit_size)?,
        byte_size: read_udata(entry, constants::DW_AT_byte_size)?,
        alignment: read_udata(entry, constants::DW_AT_alignment)?,
        artificial: read_flag(entry, constants::DW_AT_artificial)?,
        is_base: entry.tag() == constants::DW_TAG_inheritance,
    }))
}

/// The element count of one array dimension: `DW_AT_count`, else
/// `DW_AT_upper_bound - DW_AT_lower_bound + 1` (lower bound 0 by default).
fn read_subrange<R: Reader<Offset = usize>>(
    entry: &gimli::DebuggingInformationEntry<'_, '_, R>,
) -> gimli::Result<Option<u64>> {
    if let Some(count) = read_udata(entry, constants::DW_AT_count)? {
        return Ok(Some(count));
    }
    let upper = entry
        .attr_value(constants::DW_AT_upper_bound)?
        .and_then(|v| {
            v.sdata_value()
                .or_else(|| v.udata_value().and_then(|u| i64::try_from(u).ok()))
        });
    let lower = entry
        .attr_value(constants::DW_AT_lower_bound)?
        .and_then(|v| v.sdata_value())
        .unwrap_or(0);
    Ok(upper.and_then(|upper| {
        let count = upper.checked_sub(lower)?.checked_add(1)?;
        u64::try_from(count).ok()
    }))
}

/// A constant attribute (`DW_AT_discr_value`, `DW_AT_const_value`) as
/// text: signed forms as signed, data forms as unsigned, blocks (128-bit
/// values) as little-endian hex.
fn render_constant<R: Reader<Offset = usize>>(value: &AttributeValue<R>) -> Option<String> {
    match value {
        AttributeValue::Sdata(v) => Some(v.to_string()),
        AttributeValue::Block(bytes) => {
            let bytes = bytes.to_slice().ok()?;
            let hex: String = bytes.iter().rev().map(|b| format!("{b:02x}")).collect();
            Some(format!("0x{hex}"))
        }
        other => other.udata_value().map(|v| v.to_string()),
    }
}

/// `name` prefixed with the names of the enclosing namespaces and types.
fn qualified(stack: &[Frame], name: &str) -> String {
    let mut full = String::new();
    for frame in stack {
        let scope_name = match &frame.scope {
            Scope::Named(name) | Scope::Type { name, .. } => name.as_deref(),
            _ => None,
        };
        if let Some(scope_name) = scope_name {
            full.push_str(scope_name);
            full.push_str("::");
        }
    }
    full.push_str(name);
    full
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
