//! The `stream` target: a `Reader` fed any byte stream in any chunks, with a
//! handler that pauses and refuses, keeps its contract and yields what one
//! whole feed does.
//!
//! Input: a control prefix, then the byte stream:
//!
//! - byte 0, `pauses`: the handler pauses the header of frame `i` once
//!   when bit `i % 8` is set;
//! - byte 1, `fail_at`: the handler refuses the header of frame
//!   `fail_at` (`0xff`: never);
//! - bytes 2..6: `max_len`, little-endian;
//! - byte 6, `k`, then `k` little-endian `u16` chunk sizes: the stream is
//!   fed in chunks of these sizes, cycled (0 is an empty feed; no sizes,
//!   or only zeros: the whole stream at once).

use super::{Cursor, every_opcode};
use ringfence_tcp::MAX_LEN;
use ringfence_tcp::stream::{Broken, Handler, Reader, Stop};
use ringfence_tcp::wire::{HEADER_LEN, Header, LAST, Opcode};

/// One frame as the handler saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    header: Header,
    payload: Vec<u8>,
    ended: bool,
}

/// A [`Handler`] that checks the reader's contract and records frames.
struct Contract {
    max_len: u32,
    /// Bit `i % 8`: pause frame `i`'s header once.
    pauses: u8,
    /// Refuse frame `fail_at`'s header (`None`: never).
    fail_at: Option<usize>,
    frames: Vec<Seen>,
    /// A header paused and not yet offered again.
    paused: Option<Header>,
    /// Whether the last frame is between its header and its end.
    open: bool,
}

const REFUSED: &str = "refused by the fuzz handler";

impl Contract {
    fn new(max_len: u32, pauses: u8, fail_at: Option<usize>) -> Contract {
        Contract {
            max_len,
            pauses,
            fail_at,
            frames: Vec::new(),
            paused: None,
            open: false,
        }
    }

    fn current(&mut self, h: &Header) -> &mut Seen {
        assert!(self.open, "{h:?}: payload or end outside a frame");
        let seen = self.frames.last_mut().expect("an open frame");
        assert_eq!(&seen.header, h, "payload or end for another header");
        seen
    }
}

impl Handler for Contract {
    fn header(&mut self, h: &Header) -> Result<(), Stop> {
        assert!(!self.open, "{h:?}: a header inside the previous frame");
        assert_eq!(
            Header::decode(&h.encode(), self.max_len),
            Ok(*h),
            "the reader handed out a header that does not decode"
        );
        let index = self.frames.len();
        if let Some(kept) = self.paused.take() {
            assert_eq!(&kept, h, "a paused header came back changed");
        } else if self.pauses & (1 << (index % 8)) != 0 {
            self.paused = Some(*h);
            return Err(Stop::Pause);
        }
        if self.fail_at == Some(index) {
            return Err(Stop::Fail(Broken::Protocol(REFUSED)));
        }
        self.frames.push(Seen {
            header: *h,
            payload: Vec::new(),
            ended: false,
        });
        self.open = true;
        Ok(())
    }

    fn payload(&mut self, h: &Header, at: u32, bytes: &[u8]) -> Result<(), Stop> {
        let seen = self.current(h);
        assert!(h.opcode.has_payload(), "payload for {h:?}");
        assert!(!bytes.is_empty(), "an empty payload piece");
        assert_eq!(at as usize, seen.payload.len(), "payload out of order");
        assert!(
            u64::from(at) + bytes.len() as u64 <= u64::from(h.len),
            "payload beyond the frame: at {at} + {} > {}",
            bytes.len(),
            h.len
        );
        seen.payload.extend_from_slice(bytes);
        Ok(())
    }

    fn end(&mut self, h: &Header) -> Result<(), Stop> {
        let seen = self.current(h);
        let want = if h.opcode.has_payload() { h.len } else { 0 };
        assert_eq!(seen.payload.len(), want as usize, "end before the payload");
        seen.ended = true;
        self.open = false;
        Ok(())
    }
}

/// What a whole run over a stream produced.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    frames: Vec<Seen>,
    result: Result<(), Broken>,
    at_boundary: bool,
    eof: Result<(), Broken>,
}

/// Feeds `data` once, all of it.
fn feed_whole(data: &[u8], max_len: u32, fail_at: Option<usize>) -> Outcome {
    let mut reader = Reader::new(max_len);
    let mut handler = Contract::new(max_len, 0, fail_at);
    let result = reader.feed(data, &mut handler).map(|n| {
        assert_eq!(
            n,
            data.len(),
            "a handler that never pauses gets all bytes taken"
        );
    });
    Outcome {
        frames: handler.frames,
        result,
        at_boundary: reader.at_boundary(),
        eof: reader.eof(),
    }
}

/// Feeds `data` in chunks of `sizes` (cycled), with pauses; a paused
/// header is offered again by an empty feed every other time, else by the
/// rest of the chunk.
fn feed_chunked(
    data: &[u8],
    max_len: u32,
    pauses: u8,
    fail_at: Option<usize>,
    sizes: &[u16],
) -> Outcome {
    let mut reader = Reader::new(max_len);
    let mut handler = Contract::new(max_len, pauses, fail_at);
    let whole = sizes.iter().all(|&s| s == 0);
    let mut sizes = sizes.iter().cycle();
    let mut pos = 0;
    let mut retries = 0usize;
    let mut result = Ok(());
    'feed: while pos < data.len() || handler.paused.is_some() {
        let size = match sizes.next() {
            Some(&s) if !whole => usize::from(s),
            _ => data.len() - pos,
        };
        let mut chunk = &data[pos..(pos + size).min(data.len())];
        loop {
            let was_paused = handler.paused.is_some();
            let offered = if was_paused && retries.is_multiple_of(2) {
                &[][..]
            } else {
                chunk
            };
            retries += usize::from(was_paused);
            match reader.feed(offered, &mut handler) {
                Ok(n) => {
                    assert!(n <= offered.len(), "took {n} of {} bytes", offered.len());
                    if handler.paused.is_none() {
                        assert_eq!(n, offered.len(), "bytes left without a pause");
                    }
                    if !offered.is_empty() {
                        pos += n;
                        chunk = &chunk[n..];
                    }
                }
                Err(b) => {
                    result = Err(b);
                    break 'feed;
                }
            }
            // A pause is released by the next feed (one per frame at most).
            if chunk.is_empty() && (handler.paused.is_none() || pos < data.len()) {
                break;
            }
        }
    }
    Outcome {
        frames: handler.frames,
        result,
        at_boundary: reader.at_boundary(),
        eof: reader.eof(),
    }
}

/// Checks what a whole run saw against the stream's bytes: each frame's
/// header and payload sit where the previous one ended, and a failure
/// names the bytes right after the last frame.
fn check_against_bytes(data: &[u8], max_len: u32, fail_at: Option<usize>, out: &Outcome) {
    let mut at = 0usize;
    for (i, seen) in out.frames.iter().enumerate() {
        let last = i + 1 == out.frames.len();
        assert!(seen.ended || last, "frame {i} never ended");
        assert_eq!(
            &data[at..at + HEADER_LEN],
            &seen.header.encode()[..],
            "frame {i}'s header is not the stream's bytes"
        );
        at += HEADER_LEN;
        let plen = seen.payload.len();
        assert_eq!(
            &data[at..at + plen],
            &seen.payload[..],
            "frame {i}'s payload"
        );
        at += plen;
        if !seen.ended {
            // The stream ended inside this payload.
            assert_eq!(at, data.len(), "an open frame before the end");
            assert!(out.result.is_ok());
        }
    }
    let open = out.frames.last().is_some_and(|s| !s.ended);
    match out.result {
        Ok(()) => {
            assert_eq!(
                out.at_boundary,
                !open && at == data.len(),
                "at_boundary at byte {at} of {}",
                data.len()
            );
            if !open {
                // Only a partial header is left.
                assert!(data.len() - at < HEADER_LEN);
            }
        }
        Err(Broken::Frame(e)) => {
            let mut b = [0u8; HEADER_LEN];
            b.copy_from_slice(&data[at..at + HEADER_LEN]);
            assert_eq!(
                Header::decode(&b, max_len),
                Err(e),
                "the failure is not the next header's"
            );
        }
        Err(Broken::Protocol(why)) => {
            assert_eq!(why, REFUSED);
            assert_eq!(Some(out.frames.len()), fail_at);
        }
    }
    assert_eq!(out.eof.is_ok(), out.at_boundary);
}

/// `stream`: a stream cut in arbitrary chunks, with pauses, yields the same
/// frames as the whole stream fed at once, and both keep the reader's
/// contract.
pub fn stream(data: &[u8]) {
    let mut cursor = Cursor(data);
    let pauses = cursor.u8();
    let fail_at = match cursor.u8() {
        0xff => None,
        n => Some(usize::from(n)),
    };
    let max_len = cursor.u32();
    let k = cursor.u8();
    let sizes: Vec<u16> = (0..k).map(|_| cursor.u16()).collect();
    let bytes = cursor.0;
    let whole = feed_whole(bytes, max_len, fail_at);
    check_against_bytes(bytes, max_len, fail_at, &whole);
    let chunked = feed_chunked(bytes, max_len, pauses, fail_at, &sizes);
    assert_eq!(chunked, whole, "chunks {sizes:?}, pauses {pauses:#04x}");
}

/// The stream target's control prefix.
fn stream_input(pauses: u8, fail_at: u8, max_len: u32, sizes: &[u16], stream: &[u8]) -> Vec<u8> {
    let mut out = vec![pauses, fail_at];
    out.extend_from_slice(&max_len.to_le_bytes());
    out.push(sizes.len() as u8);
    for s in sizes {
        out.extend_from_slice(&s.to_le_bytes());
    }
    out.extend_from_slice(stream);
    out
}

/// The target's seeds: every opcode in one stream fed in several ways, each
/// alone, truncated and bad streams.
pub fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut out = Vec::new();
    let frames = every_opcode();
    // stream: every opcode in one stream, fed in several ways.
    let mut all = Vec::new();
    for (_, h, payload) in &frames {
        all.extend_from_slice(&h.encode());
        all.extend_from_slice(payload);
    }
    let cuts: [(&str, u8, &[u16]); 6] = [
        ("whole", 0, &[]),
        ("bytes", 0, &[1]),
        ("around_headers", 0, &[55, 1, 57]),
        ("odd", 0b1010_0101, &[7, 0, 13]),
        ("paused", 0xff, &[56]),
        ("paused_whole", 0xff, &[]),
    ];
    for (name, pauses, sizes) in cuts {
        out.push((
            "stream",
            format!("all_{name}"),
            stream_input(pauses, 0xff, MAX_LEN, sizes, &all),
        ));
    }
    out.push((
        "stream",
        "refused_at_3".into(),
        stream_input(0b100, 3, MAX_LEN, &[100], &all),
    ));
    // One of every opcode, alone.
    for (name, h, payload) in &frames {
        let mut s = h.encode().to_vec();
        s.extend_from_slice(payload);
        out.push((
            "stream",
            format!("one_{name}"),
            stream_input(0, 0xff, MAX_LEN, &[3], &s),
        ));
    }
    // Empty payloads, then a stream that ends inside a payload.
    let mut s = Vec::new();
    for opcode in [Opcode::Put, Opcode::Notify, Opcode::GetData] {
        let h = Header {
            arg: if opcode == Opcode::GetData { LAST } else { 0 },
            ..Header::new(opcode, 0)
        };
        s.extend_from_slice(&h.encode());
    }
    s.extend_from_slice(&frames[2].1.encode());
    s.extend_from_slice(&frames[2].2[..10]);
    out.push((
        "stream",
        "truncated_payload".into(),
        stream_input(0, 0xff, MAX_LEN, &[9], &s),
    ));
    let mut s = all.clone();
    s.extend_from_slice(&frames[0].1.encode()[..30]);
    out.push((
        "stream",
        "truncated_header".into(),
        stream_input(0, 0xff, MAX_LEN, &[64], &s),
    ));
    // A bad frame in the middle: nothing after it is taken.
    let mut s = frames[2].1.encode().to_vec();
    s.extend_from_slice(&frames[2].2);
    let mut bad = frames[7].1.encode();
    bad[1] = 0x42;
    s.extend_from_slice(&bad);
    s.extend_from_slice(&frames[7].1.encode());
    out.push((
        "stream",
        "bad_opcode_midway".into(),
        stream_input(0, 0xff, MAX_LEN, &[17], &s),
    ));
    // A limit below a frame's length.
    out.push((
        "stream",
        "over_limit".into(),
        stream_input(0, 0xff, 16, &[5], &all),
    ));
    out
}
