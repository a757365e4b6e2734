//! The `frame_decoder` target: [`Header::decode`] on any 56 bytes and limit
//! never panics, agrees with a model of the wire tables, and what it takes
//! re-encodes to the same bytes.
//!
//! Input: 56 header bytes (zero-padded when shorter), then `max_len` as a
//! little-endian `u32` (default [`MAX_LEN`] when absent).

use super::{ATOMIC_OPS, CSWAP, Cursor, LANES, every_opcode};
use ringfence_tcp::MAX_LEN;
use ringfence_tcp::wire::{FrameError, HEADER_LEN, Header, LAST, Opcode};

/// The class of a refusal, without its details.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    Version,
    Opcode,
    Lane,
    Length,
    Reserved,
}

fn refusal(e: &FrameError) -> Refusal {
    match e {
        FrameError::Version(_) => Refusal::Version,
        FrameError::Opcode(_) => Refusal::Opcode,
        FrameError::Lane(_) => Refusal::Lane,
        FrameError::Length { .. } => Refusal::Length,
        FrameError::Reserved { .. } => Refusal::Reserved,
        FrameError::Truncated => panic!("a header decode cannot report truncation"),
    }
}

fn u32_at(b: &[u8; HEADER_LEN], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8; HEADER_LEN], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

/// An independent model of the header check, written from the wire
/// module's tables (not from its code): `Ok` or the class of the first
/// refusal, in the documented order (version, opcode, lane, then the
/// opcode's length, then its unused fields).
fn model(b: &[u8; HEADER_LEN], max_len: u32) -> Result<(), Refusal> {
    if b[0] != 3 {
        return Err(Refusal::Version);
    }
    let opcode = b[1];
    if !(1..=10).contains(&opcode) {
        return Err(Refusal::Opcode);
    }
    if b[2] >= LANES {
        return Err(Refusal::Lane);
    }
    let arg = b[3];
    let len = u32_at(b, 4);
    let key = u32_at(b, 16);
    let status = u32_at(b, 20) as i32;
    let secret = u64_at(b, 24);
    let addr = u64_at(b, 32);
    let operand = u64_at(b, 40);
    let operand2 = u64_at(b, 48);
    let length_ok = match opcode {
        // HELLO, HELLO_ACK, ACK, ATOMIC_DATA, BYE: no payload.
        1 | 2 | 7 | 9 | 10 => len == 0,
        // PUT, GET, NOTIFY: up to the limit.
        3 | 4 | 6 => len <= max_len,
        // ATOMIC: one word.
        5 => len == 8,
        // GET_DATA: up to the limit, none with a failure.
        _ => len <= max_len && (status == 0 || len == 0),
    };
    if !length_ok {
        return Err(Refusal::Length);
    }
    let fields_ok = match opcode {
        1 => key == 0 && status == 0 && secret == 0 && operand2 == 0,
        // HELLO_ACK: `addr` is the target's NOTIFY limit, 32 bits.
        2 => {
            arg == 0
                && key == 0
                && secret == 0
                && addr <= u64::from(u32::MAX)
                && operand2 == 0
                && status <= 0
        }
        9 => arg == 0 && key == 0 && secret == 0 && addr == 0 && operand2 == 0 && status <= 0,
        3 | 4 => arg == 0 && status == 0 && operand == 0 && operand2 == 0,
        // An unknown sub-operation passes: the target answers it.
        5 => status == 0 && (operand2 == 0 || arg == CSWAP || arg >= ATOMIC_OPS),
        6 => arg == 0 && key == 0 && status == 0 && secret == 0 && addr == 0 && operand2 == 0,
        7 | 8 => {
            (opcode == 7 && arg == 0 || opcode == 8 && arg <= LAST)
                && status <= 0
                && key == 0
                && secret == 0
                && addr == 0
                && operand == 0
                && operand2 == 0
        }
        // BYE: nothing but the lane.
        10 => {
            arg == 0
                && u64_at(b, 8) == 0
                && key == 0
                && status == 0
                && secret == 0
                && addr == 0
                && operand == 0
                && operand2 == 0
        }
        _ => unreachable!("opcode checked above"),
    };
    if fields_ok {
        Ok(())
    } else {
        Err(Refusal::Reserved)
    }
}

/// `frame_decoder`: [`Header::decode`] never panics, agrees with the
/// model, and a decoded header re-encodes to the same bytes.
pub fn frame_decoder(data: &[u8]) {
    let mut cursor = Cursor(data);
    let mut bytes = [0u8; HEADER_LEN];
    let head = cursor.take(HEADER_LEN);
    bytes[..head.len()].copy_from_slice(head);
    let max_len = if cursor.0.is_empty() {
        MAX_LEN
    } else {
        cursor.u32()
    };
    let decoded = Header::decode(&bytes, max_len);
    assert_eq!(
        decoded.as_ref().map(|_| ()).map_err(refusal),
        model(&bytes, max_len),
        "decode disagrees with the wire tables on {bytes:02x?} (max_len {max_len})"
    );
    match decoded {
        Ok(h) => {
            assert_eq!(h.encode(), bytes, "{h:?} re-encodes differently");
            assert_eq!(Header::decode(&h.encode(), max_len), Ok(h));
            // A header taken under a limit is taken under any larger one.
            assert_eq!(Header::decode(&bytes, u32::MAX), Ok(h));
            assert!(h.lane < LANES);
            if h.opcode.has_payload() || h.opcode == Opcode::Get {
                assert!(h.len <= max_len, "{h:?} beyond {max_len}");
            }
            // Statuses of responses map without panicking.
            let _ = h.result();
        }
        Err(e) => {
            // The message for the log never panics.
            let _ = e.to_string();
        }
    }
}

/// The target's seeds: every opcode, valid, and malformed ones.
pub fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut out = Vec::new();
    let frames = every_opcode();
    let with_limit = |h: &Header, max_len: u32| {
        let mut b = h.encode().to_vec();
        b.extend_from_slice(&max_len.to_le_bytes());
        b
    };
    // frame_decoder: every opcode, valid.
    for (name, h, _) in &frames {
        out.push(("frame_decoder", name.to_string(), with_limit(h, MAX_LEN)));
    }
    // frame_decoder: malformed, one byte or field off a valid frame.
    let put = frames[2].1;
    let mut malformed: Vec<(&str, Vec<u8>)> = Vec::new();
    let mut poke = |name, at: usize, value: u8| {
        let mut b = with_limit(&put, MAX_LEN);
        b[at] = value;
        malformed.push((name, b));
    };
    poke("bad_version", 0, 1);
    poke("bad_opcode", 1, 11);
    poke("bad_lane", 2, 64);
    poke("put_with_arg", 3, 1);
    poke("put_with_status", 20, 0xff);
    poke("put_with_operand", 40, 1);
    poke("put_with_operand2", 55, 0x80);
    malformed.push(("put_oversized", with_limit(&put, 23)));
    malformed.push((
        "ack_positive_status",
        with_limit(
            &Header {
                status: 1,
                ..Header::new(Opcode::Ack, 0)
            },
            MAX_LEN,
        ),
    ));
    malformed.push((
        "atomic_add_with_operand2",
        with_limit(
            &Header {
                arg: 0,
                operand2: 1,
                ..frames[4].1
            },
            MAX_LEN,
        ),
    ));
    malformed.push((
        "atomic_unknown_subop",
        with_limit(
            &Header {
                arg: 200,
                operand2: 1,
                ..frames[4].1
            },
            MAX_LEN,
        ),
    ));
    malformed.push((
        "get_data_failed_with_data",
        with_limit(
            &Header {
                len: 4,
                ..frames[10].1
            },
            MAX_LEN,
        ),
    ));
    malformed.push(("short", put.encode()[..20].to_vec()));
    for (name, b) in malformed {
        out.push(("frame_decoder", format!("malformed_{name}"), b));
    }
    out
}
