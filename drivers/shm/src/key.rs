//! The shm driver's part of a remote key blob.
//!
//! `"RFSK"`, version 2, [`KeyPath`], two reserved zero bytes, the target
//! driver's instance id, the export slot and generation, the secret, and
//! the region's bounds (little-endian). Decoding checks every field: the
//! exact length, the magic, the version, a known path, the reserved bytes,
//! a non-empty region that does not wrap. (The packed key around it
//! carries an integrity check, so damage is refused before this part is
//! even decoded.) The blob is only a claim: `unpack_rkey` presents slot, generation and secret
//! to the target, which checks them against its export table and answers
//! with the true bounds (and the memfd); the blob's own bounds are never
//! used for an access.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use crate::wire::KeyPath;

const MAGIC: &[u8; 4] = b"RFSK";
/// Version 1 did not check its reserved bytes.
const VERSION: u8 = 2;
/// Encoded size.
pub(crate) const KEY_LEN: usize = 48;

/// A decoded key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KeyBlob {
    pub path: KeyPath,
    pub instance: u64,
    pub slot: u32,
    pub generation: u32,
    pub secret: u64,
    pub base: u64,
    pub len: u64,
}

impl KeyBlob {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(KEY_LEN);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&[VERSION, self.path.as_raw(), 0, 0]);
        out.extend_from_slice(&self.instance.to_le_bytes());
        out.extend_from_slice(&self.slot.to_le_bytes());
        out.extend_from_slice(&self.generation.to_le_bytes());
        out.extend_from_slice(&self.secret.to_le_bytes());
        out.extend_from_slice(&self.base.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out
    }

    /// Decodes a blob from a peer; `None` for anything malformed.
    pub(crate) fn decode(blob: &[u8]) -> Option<KeyBlob> {
        let blob: &[u8; KEY_LEN] = blob.try_into().ok()?;
        let at = |i: usize| -> Option<[u8; 8]> { blob.get(i..i + 8)?.try_into().ok() };
        let at4 = |i: usize| -> Option<[u8; 4]> { blob.get(i..i + 4)?.try_into().ok() };
        if blob.get(..4)? != MAGIC || blob.get(4) != Some(&VERSION) {
            return None;
        }
        if blob.get(6..8)? != [0, 0] {
            return None; // reserved
        }
        let key = KeyBlob {
            path: KeyPath::from_raw(*blob.get(5)?)?,
            instance: u64::from_le_bytes(at(8)?),
            slot: u32::from_le_bytes(at4(16)?),
            generation: u32::from_le_bytes(at4(20)?),
            secret: u64::from_le_bytes(at(24)?),
            base: u64::from_le_bytes(at(32)?),
            len: u64::from_le_bytes(at(40)?),
        };
        (key.len > 0 && key.base.checked_add(key.len).is_some()).then_some(key)
    }
}

/// How the region behind an shm key blob (the driver's part) is reached;
/// `None` if it is not a well-formed shm key.
pub fn key_path(driver_blob: &[u8]) -> Option<KeyPath> {
    KeyBlob::decode(driver_blob).map(|k| k.path)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let key = KeyBlob {
            path: KeyPath::CrossMemoryAttach,
            instance: 1,
            slot: 2,
            generation: 3,
            secret: 4,
            base: 0x1000,
            len: 64,
        };
        let blob = key.encode();
        assert_eq!(blob.len(), KEY_LEN);
        assert_eq!(KeyBlob::decode(&blob), Some(key));
        assert_eq!(key_path(&blob), Some(KeyPath::CrossMemoryAttach));
        for cut in 0..blob.len() {
            assert_eq!(KeyBlob::decode(&blob[..cut]), None);
        }
        for (at, value) in [(0, b'X'), (4, 1), (4, 9), (5, 0), (5, 3), (6, 1), (7, 0x80)] {
            let mut bad = blob.clone();
            bad[at] = value;
            assert_eq!(KeyBlob::decode(&bad), None, "byte {at}");
        }
        let mut long = blob.clone();
        long.push(0);
        assert_eq!(KeyBlob::decode(&long), None, "a trailing byte");
        let wrap = KeyBlob {
            base: u64::MAX,
            ..key
        };
        assert_eq!(KeyBlob::decode(&wrap.encode()), None);
        let empty = KeyBlob { len: 0, ..key };
        assert_eq!(KeyBlob::decode(&empty.encode()), None);
    }
}
