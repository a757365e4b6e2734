//! What travels between workers out of band: worker addresses and packed
//! remote keys, as one framing each. Both end in an integrity check (a
//! CRC-32C of every byte before it, `crate::checksum`), so that a blob
//! damaged on its way (a flipped bit, a cut or padded copy) is refused as
//! it is decoded, with a clear error, before anything reaches the peer.
//! Decoding checks every field; the errors say what is wrong, for
//! [`Error::Malformed`].

use super::*;
use crate::checksum;

const ADDRESS_MAGIC: &[u8; 4] = b"RFWA";
/// Version 1 had no integrity check.
const ADDRESS_VERSION: u8 = 2;
const KEY_MAGIC: &[u8; 4] = b"RFKY";
/// Format 1 (no header, no integrity check) was the bare parts.
const KEY_VERSION: u8 = 2;

/// The worker address: `"RFWA"`, version 2, the number of drivers, per
/// driver its name's length (`u8`), its name, its part's length
/// (little-endian `u16`) and its part; then the check.
pub(super) fn encode_address(drivers: &[Box<dyn Driver>]) -> Vec<u8> {
    let mut out = ADDRESS_MAGIC.to_vec();
    out.push(ADDRESS_VERSION);
    out.push(drivers.len() as u8);
    for d in drivers {
        let part = d.address();
        out.push(d.name().len() as u8);
        out.extend_from_slice(d.name().as_bytes());
        out.extend_from_slice(&(part.len() as u16).to_le_bytes());
        out.extend_from_slice(&part);
    }
    checksum::seal(&mut out);
    out
}

/// The body of a sealed blob after its magic and version byte, checked in
/// order: the magic, the version, that there is a version byte, the check.
/// `errors` says what is wrong at each of those four steps.
fn open_sealed<'a>(
    blob: &'a [u8],
    magic: &[u8],
    version: u8,
    errors: [&'static str; 4],
) -> Result<&'a [u8], &'static str> {
    let [no_magic, unknown_version, cut, damaged] = errors;
    let rest = blob.strip_prefix(magic).ok_or(no_magic)?;
    match rest.first() {
        Some(&v) if v == version => {}
        Some(_) => return Err(unknown_version),
        None => return Err(cut),
    }
    let body = checksum::open(blob).ok_or(damaged)?;
    body.get(magic.len() + 1..).ok_or(cut)
}

/// The (name, part) pairs of a peer's address, checked field by field: the
/// magic, the version, the check, names that are non-empty UTF-8 and
/// distinct, lengths that account for every byte.
///
/// # Errors
/// What is wrong with it.
pub(super) fn decode_address(address: &[u8]) -> Result<Vec<(&str, &[u8])>, &'static str> {
    let cut = "the worker address is cut short";
    let (&count, mut rest) = open_sealed(
        address,
        ADDRESS_MAGIC,
        ADDRESS_VERSION,
        [
            "not a worker address (no RFWA magic)",
            "a worker address of an unknown version",
            cut,
            "the worker address fails its integrity check (damaged or cut short)",
        ],
    )?
    .split_first()
    .ok_or(cut)?;
    let mut parts: Vec<(&str, &[u8])> = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        let (&name_len, r) = rest.split_first().ok_or(cut)?;
        let (name, r) = r.split_at_checked(usize::from(name_len)).ok_or(cut)?;
        let (len, r) = r.split_first_chunk::<2>().ok_or(cut)?;
        let (part, r) = r
            .split_at_checked(usize::from(u16::from_le_bytes(*len)))
            .ok_or(cut)?;
        let name = std::str::from_utf8(name)
            .ok()
            .filter(|n| !n.is_empty())
            .ok_or("a driver name in the worker address is not a name")?;
        if parts.iter().any(|(n, _)| *n == name) {
            return Err("the worker address names a driver twice");
        }
        parts.push((name, part));
        rest = r;
    }
    if !rest.is_empty() {
        return Err("the worker address has bytes after its last part");
    }
    Ok(parts)
}

/// A packed remote key: `"RFKY"`, format 2, the number of parts, each part
/// (made by `memory::blob::encode`) prefixed with its length as a
/// little-endian `u32`; then the check.
pub(super) fn encode_key(parts: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(6 + parts.iter().map(|p| 4 + p.len()).sum::<usize>() + 4);
    out.extend_from_slice(KEY_MAGIC);
    out.push(KEY_VERSION);
    out.push(parts.len() as u8);
    for p in parts {
        out.extend_from_slice(&(p.len() as u32).to_le_bytes());
        out.extend_from_slice(p);
    }
    checksum::seal(&mut out);
    out
}

/// The parts of a packed remote key, in order, each decoded and checked
/// (`memory::blob::decode`) before any of them is used: the magic, the
/// format, the check, no bytes after the last part, no driver twice, and
/// the same region in every part.
///
/// # Errors
/// What is wrong with it.
pub(super) fn decode_key(key: &[u8]) -> Result<Vec<blob::Decoded<'_>>, &'static str> {
    let cut = "the packed remote key is cut short";
    let (&count, mut rest) = open_sealed(
        key,
        KEY_MAGIC,
        KEY_VERSION,
        [
            "not a packed remote key (no RFKY magic)",
            "a packed remote key of an unknown format",
            cut,
            "the packed remote key fails its integrity check (damaged or cut short)",
        ],
    )?
    .split_first()
    .ok_or(cut)?;
    let mut parts: Vec<blob::Decoded<'_>> = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        let (len, r) = rest.split_first_chunk::<4>().ok_or(cut)?;
        let (part, r) = r
            .split_at_checked(u32::from_le_bytes(*len) as usize)
            .ok_or(cut)?;
        let part = blob::decode(part)?;
        if parts.iter().any(|p| p.driver == part.driver) {
            return Err("the packed remote key has two parts for one driver");
        }
        if parts
            .first()
            .is_some_and(|p| (p.base, p.len) != (part.base, part.len))
        {
            return Err("the parts of the packed remote key disagree on the region");
        }
        parts.push(part);
        rest = r;
    }
    if !rest.is_empty() {
        return Err("the packed remote key has bytes after its last part");
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Loopback;

    fn address() -> Vec<u8> {
        let drivers: Vec<Box<dyn Driver>> = vec![Box::new(Loopback::new())];
        encode_address(&drivers)
    }

    fn flip(blob: &[u8], bit: usize) -> Vec<u8> {
        let mut bad = blob.to_vec();
        bad[bit / 8] ^= 1 << (bit % 8);
        bad
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "safe decoding only, and a checksum per flipped bit is too slow interpreted"
    )]
    fn an_address_round_trips_and_every_damage_is_refused() {
        let a = address();
        let parts = decode_address(&a).unwrap();
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].0, "loopback");
        for bit in 0..a.len() * 8 {
            assert!(decode_address(&flip(&a, bit)).is_err(), "bit {bit}");
        }
        for cut in 0..a.len() {
            assert!(decode_address(&a[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = a.clone();
        long.push(0);
        assert!(decode_address(&long).is_err(), "a trailing byte");
        // Well sealed but malformed: each field is checked on its own.
        let sealed = |mut body: Vec<u8>| {
            checksum::seal(&mut body);
            body
        };
        let mut two = b"RFWA\x02\x02".to_vec();
        for _ in 0..2 {
            two.extend_from_slice(b"\x01x\x00\x00");
        }
        assert_eq!(
            decode_address(&sealed(two)).unwrap_err(),
            "the worker address names a driver twice"
        );
        assert!(decode_address(&sealed(b"RFWA\x02\x01\x00\x00\x00".to_vec())).is_err());
        assert!(decode_address(&sealed(b"RFWA\x02\x00\x00".to_vec())).is_err());
        assert!(decode_address(&sealed(b"RFWA\x02\x01\x01x\x05\x00ab".to_vec())).is_err());
        assert!(decode_address(&sealed(b"RFWA\x01\x00".to_vec())).is_err());
        assert!(decode_address(&sealed(b"RFWA\x02\x00".to_vec())).is_ok());
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "safe decoding only, and a checksum per flipped bit is too slow interpreted"
    )]
    fn a_packed_key_round_trips_and_every_damage_is_refused() {
        let parts = [
            blob::encode("shm", 0x1000, 64, &[7; 48]),
            blob::encode("tcp", 0x1000, 64, &[9; 44]),
        ];
        let key = encode_key(&parts);
        let decoded = decode_key(&key).unwrap();
        assert_eq!(decoded.len(), 2);
        assert_eq!(
            (decoded[1].driver, decoded[1].driver_blob),
            ("tcp", &[9; 44][..])
        );
        for bit in 0..key.len() * 8 {
            assert!(decode_key(&flip(&key, bit)).is_err(), "bit {bit}");
        }
        for cut in 0..key.len() {
            assert!(decode_key(&key[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = key.clone();
        long.push(0);
        assert!(decode_key(&long).is_err(), "a trailing byte");
        // Well sealed but inconsistent.
        let twice = encode_key(&[parts[0].clone(), parts[0].clone()]);
        assert_eq!(
            decode_key(&twice).unwrap_err(),
            "the packed remote key has two parts for one driver"
        );
        let other = blob::encode("tcp", 0x1000, 65, &[9; 44]);
        assert_eq!(
            decode_key(&encode_key(&[parts[0].clone(), other])).unwrap_err(),
            "the parts of the packed remote key disagree on the region"
        );
        let mut padded = key[..key.len() - 4].to_vec();
        padded.push(0);
        checksum::seal(&mut padded);
        assert_eq!(
            decode_key(&padded).unwrap_err(),
            "the packed remote key has bytes after its last part"
        );
        assert!(decode_key(&encode_key(&[])).unwrap().is_empty());
    }
}
