//! Building a [`TypeLayout`] from the graph: aggregates, variants,
//! enumerations, fields, and sizes, alignments and names through
//! references.

use gimli::constants;

use super::super::model::{AlignSource, Field, TypeKind, TypeLayout, Variant, gaps};

use super::*;

impl TypeGraph {
    /// The layout of the type at `key`, reported under `name`.
    pub(super) fn layout(&self, name: &str, key: u64) -> Option<TypeLayout> {
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

    pub(super) fn aggregate_layout(&self, name: &str, node: &Node) -> Option<TypeLayout> {
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
    pub(super) fn variant(&self, raw: &RawVariant, tag: &[Field], size: u64) -> Option<Variant> {
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

    pub(super) fn enumeration_layout(&self, name: &str, node: &Node) -> Option<TypeLayout> {
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
    pub(super) fn field(&self, member: &Member, base: u64) -> Option<Field> {
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
    pub(super) fn type_size(&self, key: u64, depth: usize) -> Option<u64> {
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
    pub(super) fn type_align(&self, key: u64, depth: usize) -> u64 {
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
    pub(super) fn aggregate_align(&self, node: &Node, depth: usize) -> u64 {
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
    pub(super) fn type_name(&self, key: u64, depth: usize) -> String {
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
pub(super) fn sort_fields(fields: &mut [Field]) {
    fields.sort_by_key(|f| (f.offset, f.bit_offset.unwrap_or(0)));
}
