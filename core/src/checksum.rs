//! The integrity check of the blobs that travel between workers out of
//! band (worker addresses, packed remote keys): a CRC-32C (Castagnoli) of
//! everything before it, stored little-endian in the last four bytes.
//!
//! A CRC of degree 32 detects every single-bit error and every burst of up
//! to 32 bits; the Castagnoli polynomial also keeps a Hamming distance of 6
//! over blobs far longer than ours. It is computed bit by bit, without a
//! table: blobs are a few hundred bytes at most, made and checked on the
//! control path only.
//!
//! The check catches damage (a flipped bit, a cut or padded copy), not
//! forgery: anyone can compute it. Access control is the secret in each
//! driver's part, which the target checks.

/// CRC-32C, reflected, of `bytes` (initial value and final XOR all ones).
pub(crate) fn crc32c(bytes: &[u8]) -> u32 {
    const POLY: u32 = 0x82f6_3b78; // 0x1edc6f41, bit-reversed
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = (crc >> 1) ^ (POLY & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

/// Appends the check of everything in `out`.
pub(crate) fn seal(out: &mut Vec<u8>) {
    let crc = crc32c(out);
    out.extend_from_slice(&crc.to_le_bytes());
}

/// The body of a sealed blob (everything before its check), if the check
/// holds.
pub(crate) fn open(blob: &[u8]) -> Option<&[u8]> {
    let (body, crc) = blob.split_last_chunk::<4>()?;
    (crc32c(body) == u32::from_le_bytes(*crc)).then_some(body)
}

/// Recomputes the integrity check in the last four bytes of a packed remote
/// key or a worker address whose other bytes were edited. For tests that
/// forge blobs to see the target refuse them by itself (the check stops
/// damage at unpack or connect, not a forger, who can compute it too).
/// Does nothing to a blob shorter than its check.
#[doc(hidden)]
pub fn reseal(blob: &mut [u8]) {
    if let Some((body, crc)) = blob.split_last_chunk_mut::<4>() {
        *crc = crc32c(body).to_le_bytes();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_standard_check_value() {
        // The check value every CRC-32C implementation agrees on.
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(b""), 0);
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "safe arithmetic only (nothing for miri to check), and 100k checksums are too slow interpreted"
    )]
    fn every_single_bit_flip_and_every_short_burst_is_caught() {
        let mut blob: Vec<u8> = (0..96u32).map(|i| (i * 37 + 11) as u8).collect();
        seal(&mut blob);
        assert_eq!(open(&blob).map(<[u8]>::len), Some(96));
        let bits = blob.len() * 8;
        let flip = |b: &mut [u8], bit: usize| b[bit / 8] ^= 1 << (bit % 8);
        for bit in 0..bits {
            let mut bad = blob.clone();
            flip(&mut bad, bit);
            assert_eq!(open(&bad), None, "bit {bit}");
        }
        // Bursts of 2 to 32 bits (first and last flipped, patterns inside),
        // at every offset.
        for start in 0..bits {
            for len in 2..=32usize.min(bits - start) {
                for inside in [0u32, !0, 0x5555_5555, 0x9e37_79b9] {
                    let mut bad = blob.clone();
                    flip(&mut bad, start);
                    flip(&mut bad, start + len - 1);
                    for k in 1..len - 1 {
                        if inside >> (k % 32) & 1 == 1 {
                            flip(&mut bad, start + k);
                        }
                    }
                    assert_eq!(open(&bad), None, "burst {start}+{len}");
                }
            }
        }
        // Cut, padded, empty.
        for cut in 0..blob.len() {
            assert_eq!(open(&blob[..cut]), None, "cut at {cut}");
        }
        let mut long = blob.clone();
        long.push(0);
        assert_eq!(open(&long), None);
    }

    #[test]
    fn reseal_makes_an_edited_blob_open_again() {
        let mut blob = b"hello".to_vec();
        seal(&mut blob);
        blob[0] = b'j';
        assert_eq!(open(&blob), None);
        reseal(&mut blob);
        assert_eq!(open(&blob), Some(&b"jello"[..]));
        let mut short = [1u8, 2, 3];
        reseal(&mut short);
        assert_eq!(short, [1, 2, 3]);
    }
}
