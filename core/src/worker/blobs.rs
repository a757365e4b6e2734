//! What travels between workers out of band: worker addresses and packed
//! remote keys, as one framing each.

use super::*;

/// The worker address: `"RFWA"`, version 1, then per driver its name and
/// its part.
pub(super) fn encode_address(drivers: &[Box<dyn Driver>]) -> Vec<u8> {
    let mut out = b"RFWA\x01".to_vec();
    out.push(drivers.len() as u8);
    for d in drivers {
        let part = d.address();
        out.push(d.name().len() as u8);
        out.extend_from_slice(d.name().as_bytes());
        out.extend_from_slice(&(part.len() as u16).to_le_bytes());
        out.extend_from_slice(&part);
    }
    out
}

/// The (name, part) pairs of a peer's address; `None` if malformed.
pub(super) fn decode_address(address: &[u8]) -> Option<Vec<(&str, &[u8])>> {
    let rest = address.strip_prefix(b"RFWA\x01")?;
    let (&count, mut rest) = rest.split_first()?;
    let mut parts = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let (&name_len, r) = rest.split_first()?;
        let (name, r) = r.split_at_checked(name_len as usize)?;
        let (len, r) = r.split_at_checked(2)?;
        let (part, r) = r.split_at_checked(u16::from_le_bytes([len[0], len[1]]) as usize)?;
        parts.push((std::str::from_utf8(name).ok()?, part));
        rest = r;
    }
    rest.is_empty().then_some(parts)
}

/// A packed remote key: one part per driver (each made by
/// `memory::blob::encode`), each prefixed with its length as a
/// little-endian `u32`.
pub(super) fn encode_key_parts(parts: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(parts.iter().map(|p| 4 + p.len()).sum());
    for p in parts {
        out.extend_from_slice(&(p.len() as u32).to_le_bytes());
        out.extend_from_slice(p);
    }
    out
}

/// The parts of a packed remote key, in order; `None` for a truncated
/// part (and nothing after it).
pub(super) fn key_parts(mut blob: &[u8]) -> impl Iterator<Item = Option<&[u8]>> {
    std::iter::from_fn(move || {
        if blob.is_empty() {
            return None;
        }
        let part = blob.split_at_checked(4).and_then(|(len, rest)| {
            let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize;
            rest.split_at_checked(len)
        });
        match part {
            Some((part, rest)) => {
                blob = rest;
                Some(Some(part))
            }
            None => {
                blob = &[];
                Some(None)
            }
        }
    })
}
