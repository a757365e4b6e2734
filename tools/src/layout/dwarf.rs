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

use gimli::{Reader, constants};

use super::model::TypeLayout;
use super::pattern::TypePattern;

mod entry;
mod layout;

use entry::*;

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
                        if let Some(node) = self.nodes.get_mut(&owner)
                            && node.tag == constants::DW_TAG_array_type
                        {
                            node.dims.push(dim);
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
}

#[cfg(test)]
mod tests;
