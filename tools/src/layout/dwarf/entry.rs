//! Reading one debugging information entry: its key, references,
//! language, name, numbers and flags, and the node, member or subrange
//! it describes.

use gimli::{AttributeValue, Reader, UnitSectionOffset, constants};

use super::*;

/// The graph key of an entry: its offset in `.debug_info`, or in
/// `.debug_types` with [`DEBUG_TYPES_BIT`] set.
pub(super) fn die_key<R: Reader<Offset = usize>>(
    unit: &gimli::Unit<R>,
    offset: gimli::UnitOffset,
) -> u64 {
    match unit.header.offset() {
        UnitSectionOffset::DebugInfoOffset(base) => base.0.wrapping_add(offset.0) as u64,
        UnitSectionOffset::DebugTypesOffset(base) => {
            DEBUG_TYPES_BIT | base.0.wrapping_add(offset.0) as u64
        }
    }
}

/// A `DW_AT_type` (or `DW_AT_discr`) reference as a graph key; `None` for
/// forms rflayout does not follow (type signatures, supplementary files).
pub(super) fn reference<R: Reader<Offset = usize>>(
    unit: &gimli::Unit<R>,
    value: AttributeValue<R>,
) -> Option<u64> {
    match value {
        AttributeValue::UnitRef(offset) => Some(die_key(unit, offset)),
        AttributeValue::DebugInfoRef(offset) => Some(offset.0 as u64),
        _ => None,
    }
}

pub(super) fn read_lang<R: Reader<Offset = usize>>(
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

pub(super) fn read_name<R: Reader<Offset = usize>>(
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

pub(super) fn read_udata<R: Reader<Offset = usize>>(
    entry: &gimli::DebuggingInformationEntry<'_, '_, R>,
    name: constants::DwAt,
) -> gimli::Result<Option<u64>> {
    Ok(entry.attr_value(name)?.and_then(|v| v.udata_value()))
}

pub(super) fn read_flag<R: Reader<Offset = usize>>(
    entry: &gimli::DebuggingInformationEntry<'_, '_, R>,
    name: constants::DwAt,
) -> gimli::Result<bool> {
    Ok(matches!(
        entry.attr_value(name)?,
        Some(AttributeValue::Flag(true))
    ))
}

pub(super) fn read_node<R: Reader<Offset = usize>>(
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
pub(super) fn read_member<R: Reader<Offset = usize>>(
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
pub(super) fn read_subrange<R: Reader<Offset = usize>>(
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
pub(super) fn render_constant<R: Reader<Offset = usize>>(
    value: &AttributeValue<R>,
) -> Option<String> {
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
pub(super) fn qualified(stack: &[Frame], name: &str) -> String {
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
