//! The driver's remote-key blob: a registration as a peer sees it.

const KEY_MAGIC: &[u8; 4] = b"RFTK";
/// The remote-key blob's version (the first had none).
const KEY_VERSION: u8 = 2;
/// Bytes in a remote-key blob.
pub const KEY_LEN: usize = 44;

/// A registration as a peer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyBlob {
    /// The target worker's instance.
    pub instance: u64,
    /// The registration id.
    pub key: u32,
    /// Its secret.
    pub secret: u64,
    /// Its start address in the target.
    pub base: u64,
    /// Its length.
    pub len: u64,
}

impl KeyBlob {
    /// `"RFTK"`, version 2, three reserved zero bytes, then key,
    /// instance, secret, base and len, little-endian.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(KEY_LEN);
        out.extend_from_slice(KEY_MAGIC);
        out.extend_from_slice(&[KEY_VERSION, 0, 0, 0]);
        out.extend_from_slice(&self.key.to_le_bytes());
        out.extend_from_slice(&self.instance.to_le_bytes());
        out.extend_from_slice(&self.secret.to_le_bytes());
        out.extend_from_slice(&self.base.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out
    }

    /// Decodes a blob, checking every field: exactly [`KEY_LEN`] bytes,
    /// the magic, the version, zero reserved bytes, a non-empty range that
    /// does not wrap; `None` otherwise. (The packed key around it carries
    /// an integrity check: damage is refused before this part is decoded.)
    pub fn decode(b: &[u8]) -> Option<KeyBlob> {
        if b.len() != KEY_LEN {
            return None;
        }
        let rest = b.strip_prefix(KEY_MAGIC)?;
        let rest = rest.strip_prefix(&[KEY_VERSION, 0, 0, 0])?;
        let u64_at = |at: usize| Some(u64::from_le_bytes(rest.get(at..at + 8)?.try_into().ok()?));
        let key = KeyBlob {
            key: u32::from_le_bytes(rest.get(0..4)?.try_into().ok()?),
            instance: u64_at(4)?,
            secret: u64_at(12)?,
            base: u64_at(20)?,
            len: u64_at(28)?,
        };
        if key.len == 0 {
            return None;
        }
        key.base.checked_add(key.len)?;
        Some(key)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn key_blobs_round_trip_and_refuse_garbage() {
        let k = KeyBlob {
            instance: 1,
            key: 2,
            secret: 3,
            base: 0x7f00_0000,
            len: 4096,
        };
        let b = k.encode();
        assert_eq!(b.len(), KEY_LEN);
        assert_eq!(KeyBlob::decode(&b), Some(k));
        assert_eq!(KeyBlob::decode(&b[..KEY_LEN - 1]), None);
        let mut trailing = b.clone();
        trailing.push(0);
        assert_eq!(KeyBlob::decode(&trailing), None);
        let wraps = KeyBlob {
            base: u64::MAX - 10,
            len: 11,
            ..k
        };
        assert_eq!(KeyBlob::decode(&wraps.encode()), None);
        let empty = KeyBlob { len: 0, ..k };
        assert_eq!(KeyBlob::decode(&empty.encode()), None);
        // The magic, the version and each reserved byte.
        for (at, value) in [(0, b'X'), (4, 1), (4, 3), (5, 1), (6, 0x80), (7, 2)] {
            let mut bad = b.clone();
            bad[at] = value;
            assert_eq!(KeyBlob::decode(&bad), None, "byte {at}");
        }
    }
}
