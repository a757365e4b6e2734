//! The byte form of a rank's published values, as the MPI bootstrap
//! exchanges them: `[u32 key length][key][u32 value length][value]`,
//! repeated, little-endian. What comes from another rank is checked
//! before it is used.

use crate::{Error, Result, check_key};

/// Appends one entry to `out`.
pub(crate) fn put_entry(out: &mut Vec<u8>, key: &str, value: &[u8]) -> Result<()> {
    let vlen = u32::try_from(value.len())
        .map_err(|_| Error::Invalid(format!("value of {} bytes (at most 4 GiB)", value.len())))?;
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(&vlen.to_le_bytes());
    out.extend_from_slice(value);
    Ok(())
}

/// The entries of `bytes`, published by `rank`.
pub(crate) fn entries(rank: u32, mut bytes: &[u8]) -> Result<Vec<(String, Vec<u8>)>> {
    let bad = |why: &str| Error::Malformed {
        rank,
        why: why.to_owned(),
    };
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let key = take(&mut bytes).ok_or_else(|| bad("truncated key"))?;
        let key = std::str::from_utf8(key).map_err(|_| bad("key is not UTF-8"))?;
        check_key(key).map_err(|_| bad("invalid key name"))?;
        let value = take(&mut bytes).ok_or_else(|| bad("truncated value"))?;
        out.push((key.to_owned(), value.to_vec()));
    }
    Ok(out)
}

/// One length-prefixed field off the front of `bytes`.
fn take<'a>(bytes: &mut &'a [u8]) -> Option<&'a [u8]> {
    let (len, rest) = bytes.split_first_chunk::<4>()?;
    let len = usize::try_from(u32::from_le_bytes(*len)).ok()?;
    if rest.len() < len {
        return None;
    }
    let (field, rest) = rest.split_at(len);
    *bytes = rest;
    Some(field)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip() {
        let mut b = Vec::new();
        put_entry(&mut b, "address", b"\x00\x01 addr").unwrap();
        put_entry(&mut b, "empty", b"").unwrap();
        let e = entries(3, &b).unwrap();
        assert_eq!(
            e,
            vec![
                ("address".into(), b"\x00\x01 addr".to_vec()),
                ("empty".into(), vec![])
            ]
        );
        assert!(entries(0, &[]).unwrap().is_empty());
    }

    #[test]
    fn every_truncation_and_bad_key_is_refused() {
        let mut b = Vec::new();
        put_entry(&mut b, "k", b"value").unwrap();
        for cut in 1..b.len() {
            let r = entries(5, &b[..cut]);
            assert!(
                matches!(r, Err(Error::Malformed { rank: 5, .. })),
                "cut at {cut}"
            );
        }
        let mut bad = Vec::new();
        put_entry(&mut bad, "k", b"").unwrap();
        bad[4] = b'/';
        assert!(matches!(entries(1, &bad), Err(Error::Malformed { .. })));
        // A length far past the end.
        assert!(entries(1, &[0xff, 0xff, 0xff, 0xff, b'k']).is_err());
    }
}
