//! The checks behind the fuzz targets, and the seed corpus they start from.
//!
//! Shared by the fuzz targets (`fuzz_targets/*.rs`) and by
//! `tests/corpus.rs`, which replays the committed corpus through the same
//! checks on stable, so CI covers them without a nightly toolchain. Both
//! include this file with `#[path]`: it is no part of the crate's API.
//!
//! Every check panics (through `assert!`) on a broken property; libFuzzer
//! reports a panic as a crash and keeps the input under `artifacts/`.
//!
//! # Input layouts
//!
//! - `frame_decoder`: 56 header bytes (zero-padded when shorter), then
//!   `max_len` as a little-endian `u32` (default [`MAX_LEN`] when absent).
//! - `stream`: a control prefix, then the byte stream:
//!   - byte 0, `pauses`: the handler pauses the header of frame `i` once
//!     when bit `i % 8` is set;
//!   - byte 1, `fail_at`: the handler refuses the header of frame
//!     `fail_at` (`0xff`: never);
//!   - bytes 2..6: `max_len`, little-endian;
//!   - byte 6, `k`, then `k` little-endian `u16` chunk sizes: the stream is
//!     fed in chunks of these sizes, cycled (0 is an empty feed; no sizes,
//!     or only zeros: the whole stream at once).
//! - `blobs`: any bytes, given to [`Address::decode`] and
//!   [`KeyBlob::decode`].
//!
//! Missing control bytes read as zero.

use ringfence_tcp::MAX_LEN;
use ringfence_tcp::stream::{Broken, Handler, Reader, Stop};
use ringfence_tcp::wire::{
    Address, FrameError, HEADER_LEN, Header, KEY_LEN, KeyBlob, LAST, Opcode,
};

/// Lanes a frame may name: `lane < 64` (the wire's header table).
const LANES: u8 = 64;
/// The atomic sub-operation that takes a second operand (CSWAP).
const CSWAP: u8 = 3;
/// Atomic sub-operations the wire knows (ADD, FADD, SWAP, CSWAP).
const ATOMIC_OPS: u8 = 4;

/// Reads the inputs' control fields; missing bytes read as zero.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        head
    }

    fn u8(&mut self) -> u8 {
        self.take(1).first().copied().unwrap_or(0)
    }

    fn u16(&mut self) -> u16 {
        let mut b = [0u8; 2];
        let got = self.take(2);
        b[..got.len()].copy_from_slice(got);
        u16::from_le_bytes(b)
    }

    fn u32(&mut self) -> u32 {
        let mut b = [0u8; 4];
        let got = self.take(4);
        b[..got.len()].copy_from_slice(got);
        u32::from_le_bytes(b)
    }
}

// ------------------------------------------------------------ frame_decoder

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

// ------------------------------------------------------------ stream

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
            let offered = if was_paused && retries % 2 == 0 {
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

// ------------------------------------------------------------ blobs

/// `blobs`: the address and key decoders never panic, and what they take
/// re-encodes to the same bytes.
pub fn blobs(data: &[u8]) {
    if let Some(a) = Address::decode(data) {
        assert_eq!(a.encode(), data, "{a:?}");
        assert_ne!(a.socket.port(), 0);
        assert!(!a.socket.ip().is_unspecified());
    }
    if let Some(k) = KeyBlob::decode(data) {
        assert_eq!(k.encode(), data, "{k:?}");
        assert_eq!(data.len(), KEY_LEN);
        assert!(k.base.checked_add(k.len).is_some());
    }
}

// ------------------------------------------------------------ seeds

/// A target's check: panics on a broken property.
pub type Check = fn(&[u8]);

/// The fuzz targets, by corpus directory name.
pub const TARGETS: [(&str, Check); 3] = [
    ("frame_decoder", frame_decoder),
    ("stream", stream),
    ("blobs", blobs),
];

/// A valid header of every opcode, with a payload where it carries one.
pub fn every_opcode() -> Vec<(&'static str, Header, Vec<u8>)> {
    let request = |opcode, len| Header {
        len,
        seq: 41,
        key: 2,
        secret: 0x5ec2_e75e_c2e7_5ec2,
        addr: 0x7f00_0000_1000,
        ..Header::new(opcode, 1)
    };
    vec![
        (
            "hello",
            Header {
                arg: 4,
                seq: 0x1234_5678,
                addr: 3,
                operand: 0x9abc_def0,
                ..Header::new(Opcode::Hello, 1)
            },
            Vec::new(),
        ),
        (
            "hello_ack",
            Header {
                operand: 0x9abc_def0,
                addr: 4096,
                ..Header::new(Opcode::HelloAck, 1)
            },
            Vec::new(),
        ),
        (
            "put",
            request(Opcode::Put, 24),
            b"twenty-four bytes of PUT".to_vec(),
        ),
        ("get", request(Opcode::Get, 4096), Vec::new()),
        (
            "atomic_fadd",
            Header {
                arg: 1,
                operand: 5,
                ..request(Opcode::Atomic, 8)
            },
            Vec::new(),
        ),
        (
            "atomic_cswap",
            Header {
                arg: CSWAP,
                operand: 7,
                operand2: 9,
                ..request(Opcode::Atomic, 8)
            },
            Vec::new(),
        ),
        (
            "notify",
            Header {
                len: 5,
                seq: 42,
                operand: 66,
                ..Header::new(Opcode::Notify, 1)
            },
            b"ping!".to_vec(),
        ),
        (
            "ack",
            Header {
                seq: 42,
                ..Header::new(Opcode::Ack, 1)
            },
            Vec::new(),
        ),
        (
            "ack_failed",
            Header {
                seq: 43,
                status: -7,
                ..Header::new(Opcode::Ack, 1)
            },
            Vec::new(),
        ),
        (
            "get_data",
            Header {
                seq: 44,
                len: 6,
                arg: LAST,
                ..Header::new(Opcode::GetData, 1)
            },
            b"data!!".to_vec(),
        ),
        (
            "get_data_failed",
            Header {
                seq: 44,
                arg: LAST,
                status: -7,
                ..Header::new(Opcode::GetData, 1)
            },
            Vec::new(),
        ),
        (
            "atomic_data",
            Header {
                seq: 45,
                operand: u64::MAX,
                ..Header::new(Opcode::AtomicData, 1)
            },
            Vec::new(),
        ),
        ("bye", Header::new(Opcode::Bye, 0), Vec::new()),
    ]
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

/// The seed corpus: (target, file name, contents). Regenerate the files
/// with `RINGFENCE_BLESS=1 cargo test -p ringfence-tcp --test corpus`.
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

    // blobs: addresses and keys, valid and not.
    let v4 = Address {
        socket: "127.0.0.1:7000".parse().expect("v4"),
        instance: 0x0123_4567_89ab_cdef,
    };
    let v6 = Address {
        socket: "[fd00::2]:65535".parse().expect("v6"),
        instance: 1,
    };
    let key = KeyBlob {
        instance: 0x0123_4567_89ab_cdef,
        key: 3,
        secret: 0x5ec2_e75e_c2e7_5ec2,
        base: 0x7f00_0000_0000,
        len: 1 << 20,
    };
    out.push(("blobs", "address_v4".into(), v4.encode()));
    out.push(("blobs", "address_v6".into(), v6.encode()));
    out.push(("blobs", "key".into(), key.encode()));
    let mut unspecified = v4.encode();
    unspecified[15..19].copy_from_slice(&[0; 4]);
    out.push(("blobs", "address_unspecified".into(), unspecified));
    let mut port0 = v4.encode();
    port0[5..7].copy_from_slice(&[0; 2]);
    out.push(("blobs", "address_port0".into(), port0));
    let wraps = KeyBlob {
        base: u64::MAX - 10,
        len: 11,
        ..key
    };
    out.push(("blobs", "key_wraps".into(), wraps.encode()));
    let mut short = key.encode();
    short.pop();
    out.push(("blobs", "key_short".into(), short));
    out
}
