//! The checks behind the fuzz targets, and the seed corpus they start from.
//!
//! Shared by the fuzz targets (`fuzz_targets/*.rs`) and by
//! `tests/corpus.rs`, which replays the committed corpus through the same
//! checks on stable, so CI covers them without a nightly toolchain. Both
//! include this module with `#[path]`: it is no part of the crate's API.
//!
//! Every check panics (through `assert!`) on a broken property; libFuzzer
//! reports a panic as a crash and keeps the input under `artifacts/`.
//! Each target's check, input layout and seeds are in its module
//! ([`frame_decoder`], [`stream`], [`address_and_key`]); missing control bytes read as
//! zero.

use ringfence_tcp::wire::{Header, LAST, Opcode};

pub mod address_and_key;
pub mod frame_decoder;
pub mod stream;

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

/// A target's check: panics on a broken property.
pub type Check = fn(&[u8]);

/// The fuzz targets, by corpus directory name.
pub const TARGETS: [(&str, Check); 3] = [
    ("frame_decoder", frame_decoder::frame_decoder),
    ("stream", stream::stream),
    ("address_and_key", address_and_key::address_and_key),
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

/// The seed corpus: (target, file name, contents). Regenerate the files
/// with `RINGFENCE_BLESS=1 cargo test -p ringfence-tcp --test corpus`.
pub fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut out = frame_decoder::seeds();
    out.extend(stream::seeds());
    out.extend(address_and_key::seeds());
    out
}
