//! `shm_wire` and `shm_control`: the shm driver's control messages and
//! key parts, and the connection page a peer hands over with its
//! notification channel records.
//!
//! `shm_wire` input: any bytes, given to the control message decoder and
//! the key part decoder.
//!
//! `shm_control` input: byte 0: the channel capacity, `4096 << (byte % 4)`
//! (bit 7 set: `byte * 37` raw, mostly invalid); byte 1: sink buffers per
//! round (mod 8); byte 2: sink buffer size, `byte * 4`; byte 3: drain
//! budget (mod 16, 0 meaning 64); byte 4, bit 0: the page opens with a
//! valid header and the tail word is set to `u32` bytes 5..9 (the rest of
//! the page follows from byte 9); else the page is bytes 5.. as they are.
//!
//! Properties: no panic; an accepted message is at most `MAX_MESSAGE`
//! bytes and re-encodes to the same length and the same message; an
//! accepted key part is non-empty, does not wrap and re-encodes the same;
//! a connection page is either refused whole or drained, every delivered
//! payload lying inside the channel and 16-aligned after its record
//! header, the published head never beyond the tail the page holds.

use super::Cursor;
use ringfence_shm::fuzzing as shm;

pub fn shm_wire(data: &[u8]) {
    if let Some((seq, message, encoded)) = shm::decode_message(data) {
        assert!(
            data.len() <= shm::MAX_MESSAGE,
            "{} bytes accepted",
            data.len()
        );
        assert_eq!(
            encoded.len(),
            data.len(),
            "{message} re-encodes to another length"
        );
        let again = shm::decode_message(&encoded).expect("a re-encoded message decodes");
        assert_eq!(
            (again.0, &again.1),
            (seq, &message),
            "re-encoding changed the message"
        );
        assert_eq!(again.2, encoded, "encoding is not stable");
    }
    if let Some(k) = shm::decode_key(data) {
        assert!(k.len > 0 && k.base.checked_add(k.len).is_some(), "{k:?}");
        assert_eq!(shm::decode_key(&shm::encode_key(&k)), Some(k));
    }
}

pub fn shm_control(data: &[u8]) {
    let _ = shm_control_outcome(data);
}

/// Runs [`shm_control`]'s checks; returns what draining did.
pub fn shm_control_outcome(data: &[u8]) -> shm::ChannelOutcome {
    let mut c = Cursor(data);
    let cap_byte = c.u8();
    let capacity = if cap_byte & 0x80 != 0 {
        u32::from(cap_byte) * 37
    } else {
        4096 << (cap_byte % 4)
    };
    let buffers = usize::from(c.u8() % 8);
    let buffer_size = u32::from(c.u8()) * 4;
    let budget = match c.u8() % 16 {
        0 => 64,
        n => usize::from(n),
    };
    let structured = c.u8() & 1 != 0;
    let page = if structured {
        let tail = c.u32();
        let (tail_at, _, _) = shm::PAGE_WORDS;
        let mut page = shm::page_header(capacity);
        page.resize(tail_at as usize, 0);
        page.extend_from_slice(&u64::from(tail).to_le_bytes());
        page.resize(shm::CHANNEL_OFFSET as usize, 0);
        page.extend_from_slice(c.0);
        page
    } else {
        c.0.to_vec()
    };
    let outcome = shm::drain_connection_page(capacity, &page, 4, budget, buffers, buffer_size);
    let shm::ChannelOutcome::Drained {
        delivered, head, ..
    } = &outcome
    else {
        return outcome;
    };
    let head = *head;
    let start = shm::CHANNEL_OFFSET;
    let end = start + u64::from(capacity);
    for d in delivered {
        assert!(d.inside, "a payload outside the page: {d:?}");
        assert!(
            d.offset >= start + 16 && d.offset + u64::from(d.len) <= end,
            "a payload outside the channel: {d:?}"
        );
        assert_eq!((d.offset - start) % 16, 0, "a misaligned payload: {d:?}");
        assert!(
            d.len <= buffer_size,
            "delivered beyond the sink's buffers: {d:?}"
        );
    }
    assert!(
        delivered.len() <= 4 * budget,
        "{} delivered",
        delivered.len()
    );
    assert_eq!(head % 16, 0, "a misaligned head {head}");
    outcome
}

/// A connection page's channel bytes holding `records` notifications of
/// `len` bytes (tagged by index), then a pad to the end when `pad`.
fn records(capacity: u32, lens: &[u32], pad: bool) -> (u32, Vec<u8>) {
    let (notify, pad_kind) = shm::RECORD_KINDS;
    let mut out = Vec::new();
    for (i, &len) in lens.iter().enumerate() {
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&notify.to_le_bytes());
        out.extend_from_slice(&(i as u64).to_le_bytes());
        out.extend(std::iter::repeat_n(
            i as u8,
            len.next_multiple_of(16) as usize,
        ));
    }
    if pad {
        let rest = capacity as usize - out.len();
        out.extend_from_slice(&((rest - 16) as u32).to_le_bytes());
        out.extend_from_slice(&pad_kind.to_le_bytes());
        out.extend_from_slice(&0u64.to_le_bytes());
        out.resize(capacity as usize, 0);
    }
    (out.len() as u32, out)
}

pub fn wire_seeds() -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = shm::sample_messages(9)
        .into_iter()
        .enumerate()
        .map(|(i, m)| (format!("message_{i}"), m))
        .collect();
    out.push(("key".into(), super::rkey::sample_shm_key()));
    out.push(("short".into(), b"RFSC".to_vec()));
    out
}

pub fn control_seeds() -> Vec<(String, Vec<u8>)> {
    let seed = |cap: u8, buffers: u8, size: u8, budget: u8, recs: (u32, Vec<u8>)| {
        let mut out = vec![cap, buffers, size, budget, 1];
        out.extend_from_slice(&recs.0.to_le_bytes());
        out.extend_from_slice(&recs.1);
        out
    };
    vec![
        ("one".into(), seed(0, 4, 64, 0, records(4096, &[32], false))),
        (
            "several".into(),
            seed(0, 2, 64, 3, records(4096, &[1, 0, 100, 255, 16], false)),
        ),
        (
            "too_large".into(),
            seed(0, 4, 4, 0, records(4096, &[200], false)),
        ),
        (
            "padded".into(),
            seed(0, 7, 255, 0, records(4096, &[1000, 1000, 1000], true)),
        ),
        (
            "bigger".into(),
            seed(2, 7, 200, 0, records(16384, &[800; 12], false)),
        ),
        (
            "bad_tail".into(),
            seed(0, 4, 64, 0, (5000, records(4096, &[32], false).1)),
        ),
        ("unknown_kind".into(), {
            let (n, mut r) = records(4096, &[32], false);
            r[4] = 9;
            seed(0, 4, 64, 0, (n, r))
        }),
        ("raw".into(), vec![0, 4, 64, 0, 0]),
        ("bad_capacity".into(), vec![0x81, 4, 64, 0, 1, 0, 0, 0, 0]),
    ]
}
