//! The wire protocol: fixed-size frame headers on each lane's TCP stream,
//! the driver's part of a worker address, and its remote-key blob.
//!
//! Every frame starts with a 56-byte header; PUT, NOTIFY and GET_DATA
//! frames carry `len` payload bytes right after it. All integers are
//! little-endian. Frames come from the network and are untrusted:
//! [`Header::decode`] checks the version, the opcode, the length against
//! the receiver's limit and every field the opcode leaves unused (zero), and
//! refuses anything else with a [`FrameError`], after which the stream
//! cannot be resynchronized and the connection is closed.
//!
//! | offset | field | |
//! |---|---|---|
//! | 0 | `u8` version | [`VERSION`] |
//! | 1 | `u8` opcode | [`Opcode`] |
//! | 2 | `u8` lane | the lane index, `< 64` |
//! | 3 | `u8` arg | the atomic sub-operation; the lane count in HELLO |
//! | 4 | `u32` len | payload bytes, or bytes asked for (GET), 8 (ATOMIC) |
//! | 8 | `u64` seq | the request's sequence number on its lane, echoed by its response |
//! | 16 | `u32` key | the target's registration id (requests) |
//! | 20 | `i32` status | 0, or a negative [`Status`] (responses) |
//! | 24 | `u64` secret | the registration's secret (requests) |
//! | 32 | `u64` addr | the target's virtual address (requests) |
//! | 40 | `u64` operand | atomic operand; NOTIFY tag; fetched old value (ATOMIC_DATA) |
//! | 48 | `u64` operand2 | CSWAP's swap value |
//!
//! Requests go from the initiator to the target on the lane's connection;
//! the target answers each one, in order, on the same connection:
//!
//! | request | response |
//! |---|---|
//! | HELLO (first frame of each direction's requests) | HELLO_ACK |
//! | PUT, NOTIFY | ACK (one ACK may answer every successful request up to its `seq`) |
//! | GET | GET_DATA, one or more frames; the last has `arg` = [`LAST`] |
//! | ATOMIC | ATOMIC_DATA |
//! | BYE | none: the sender sends no more requests on this connection |
//!
//! # Both ways on one connection (version 2)
//!
//! A connection carries requests both ways when the worker that accepted
//! it sends a HELLO of its own on it (it *adopts* the connection for a
//! lane of its endpoint back to the connecting worker). Each direction's
//! requests and the other direction's answers then share the stream, and
//! TCP's acknowledgements ride on data both ways. Rules that keep such a
//! connection from ever stalling (neither side's reader may wait for room
//! to answer while the other's waits too):
//! - **Depth.** A side keeps at most [`DUPLEX_DEPTH`] requests without an
//!   answer on it (from the moment it sent or received the adopting
//!   HELLO), and keeps send room for that many answers that its own
//!   requests may not take. The side that receives the adopting HELLO
//!   sends its HELLO_ACK only once that room is free in its filling batch
//!   (the other side sends no request before the HELLO_ACK), and the
//!   adopting side takes only a connection with nothing queued to send.
//! - **GET data by reference.** A target sends GET data straight from its
//!   window (no staging), so an answer never needs more than a header of
//!   room. The adopting side starts doing so once its HELLO is answered:
//!   the other side's requests before that HELLO_ACK may have been sent
//!   before it knew the rules (a GET, then a PUT over its bytes), and are
//!   answered from staging as on any connection.
//! - **Writes after a GET wait for its data.** An initiator sends no PUT,
//!   NOTIFY or ATOMIC on the lane while a GET on it is unanswered, so the
//!   data a GET returns is never that of a later write on its lane.
//! - **Ending.** A side whose endpoint lets go of the lane sends BYE if the
//!   other side still sends requests on it, and keeps serving; a side
//!   closes the connection once it neither sends requests on it nor expects
//!   any.
//! - **Who may be adopted.** The adopting side takes only a connection
//!   greeted with the instance of the worker it connects to and coming
//!   from that worker's IP address. A process on that host that knows both
//!   workers' addresses could greet as that worker; the instance is not a
//!   secret (registration secrets still guard every window).
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use ringfence_ring::{AtomicOp, Status};
use std::fmt;

mod address;
mod key;

pub use address::Address;
pub use key::{KEY_LEN, KeyBlob};

/// The protocol version this build speaks.
pub const VERSION: u8 = 3;
/// Bytes in a frame header.
pub const HEADER_LEN: usize = 56;
/// `arg` of the last GET_DATA frame of a response.
pub const LAST: u8 = 1;
/// Requests a side keeps without an answer on a connection that carries
/// requests both ways.
pub const DUPLEX_DEPTH: usize = 256;

/// What a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Opcode {
    /// First frame of a connection: `lane`, `arg` = lane count, `seq` =
    /// the initiator's instance, `addr` = its connection group, `operand`
    /// = the instance of the worker it means to reach.
    Hello = 1,
    /// The answer to HELLO: `status`, `operand` = the target's instance,
    /// `addr` = the longest NOTIFY payload it accepts (version 3), so the
    /// initiator refuses a longer one at submission instead of sending it.
    HelloAck = 2,
    /// Write the payload at `addr`.
    Put = 3,
    /// Read `len` bytes at `addr`.
    Get = 4,
    /// `arg` (an [`AtomicOp`]) on the 8 bytes at `addr`.
    Atomic = 5,
    /// Deliver the payload to a notification buffer, tag `operand`.
    Notify = 6,
    /// Every PUT and NOTIFY up to `seq` not answered otherwise succeeded
    /// (`status` 0), or the one at `seq` failed (`status` < 0).
    Ack = 7,
    /// Part of a GET's data (`len` bytes follow), or its failure.
    GetData = 8,
    /// An atomic's result: `status`, `operand` = the old value.
    AtomicData = 9,
    /// The sender sends no more requests on this connection (it goes on
    /// answering the other side's).
    Bye = 10,
}

impl Opcode {
    fn from_raw(raw: u8) -> Option<Opcode> {
        Some(match raw {
            1 => Opcode::Hello,
            2 => Opcode::HelloAck,
            3 => Opcode::Put,
            4 => Opcode::Get,
            5 => Opcode::Atomic,
            6 => Opcode::Notify,
            7 => Opcode::Ack,
            8 => Opcode::GetData,
            9 => Opcode::AtomicData,
            10 => Opcode::Bye,
            _ => return None,
        })
    }

    /// Whether a payload of `len` bytes follows the header.
    pub fn has_payload(self) -> bool {
        matches!(self, Opcode::Put | Opcode::Notify | Opcode::GetData)
    }

    /// Whether the frame goes from the initiator to the target (BYE does:
    /// it ends the initiator's requests).
    pub fn is_request(self) -> bool {
        matches!(
            self,
            Opcode::Hello
                | Opcode::Put
                | Opcode::Get
                | Opcode::Atomic
                | Opcode::Notify
                | Opcode::Bye
        )
    }
}

/// A frame that cannot be taken: the stream is not in sync any more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameError {
    /// A version this build does not speak.
    Version(u8),
    /// An unknown opcode.
    Opcode(u8),
    /// A length beyond the receiver's limit, or wrong for the opcode.
    Length {
        /// The opcode.
        opcode: Opcode,
        /// The length the frame claims.
        len: u32,
    },
    /// A lane index of 64 or more.
    Lane(u8),
    /// A field the opcode leaves unused is not zero.
    Reserved {
        /// The opcode.
        opcode: Opcode,
        /// The offending field.
        field: &'static str,
    },
    /// The stream ended inside a frame.
    Truncated,
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Version(v) => {
                write!(f, "protocol version {v} (this build speaks {VERSION})")
            }
            FrameError::Opcode(o) => write!(f, "unknown opcode {o}"),
            FrameError::Length { opcode, len } => write!(f, "{opcode:?} frame of {len} bytes"),
            FrameError::Lane(l) => write!(f, "lane {l} out of range"),
            FrameError::Reserved { opcode, field } => {
                write!(f, "{opcode:?} frame with non-zero {field}")
            }
            FrameError::Truncated => write!(f, "stream ended inside a frame"),
        }
    }
}

impl std::error::Error for FrameError {}

/// A decoded frame header. Fields an opcode does not use are zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// What the frame is.
    pub opcode: Opcode,
    /// The lane it belongs to.
    pub lane: u8,
    /// Atomic sub-operation, HELLO's lane count, GET_DATA's [`LAST`].
    pub arg: u8,
    /// Payload bytes, or bytes asked for.
    pub len: u32,
    /// Sequence number on the lane.
    pub seq: u64,
    /// The target's registration id.
    pub key: u32,
    /// 0, or a negative status.
    pub status: i32,
    /// The registration's secret.
    pub secret: u64,
    /// The target address.
    pub addr: u64,
    /// First operand.
    pub operand: u64,
    /// Second operand.
    pub operand2: u64,
}

/// Reads a little-endian integer of `N` bytes at `at` (inside the header,
/// by construction of the callers' constant offsets).
fn le<const N: usize>(b: &[u8; HEADER_LEN], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    if let Some(src) = b.get(at..at + N) {
        out.copy_from_slice(src);
    }
    out
}

impl Header {
    /// A header with only `opcode` and `lane` set.
    pub const fn new(opcode: Opcode, lane: u8) -> Header {
        Header {
            opcode,
            lane,
            arg: 0,
            len: 0,
            seq: 0,
            key: 0,
            status: 0,
            secret: 0,
            addr: 0,
            operand: 0,
            operand2: 0,
        }
    }

    /// The header's bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        let fields: [(usize, &[u8]); 11] = [
            (0, &[VERSION]),
            (1, &[self.opcode as u8]),
            (2, &[self.lane]),
            (3, &[self.arg]),
            (4, &self.len.to_le_bytes()),
            (8, &self.seq.to_le_bytes()),
            (16, &self.key.to_le_bytes()),
            (20, &self.status.to_le_bytes()),
            (24, &self.secret.to_le_bytes()),
            (32, &self.addr.to_le_bytes()),
            (40, &self.operand.to_le_bytes()),
        ];
        for (at, bytes) in fields {
            if let Some(dst) = b.get_mut(at..at + bytes.len()) {
                dst.copy_from_slice(bytes);
            }
        }
        if let Some(dst) = b.get_mut(48..56) {
            dst.copy_from_slice(&self.operand2.to_le_bytes());
        }
        b
    }

    /// Decodes and checks a header; `max_len` is the largest payload or GET
    /// this receiver takes.
    ///
    /// # Errors
    /// The frame is malformed (see [`FrameError`]).
    pub fn decode(b: &[u8; HEADER_LEN], max_len: u32) -> Result<Header, FrameError> {
        let [version, opcode, lane, arg] = le::<4>(b, 0);
        if version != VERSION {
            return Err(FrameError::Version(version));
        }
        let opcode = Opcode::from_raw(opcode).ok_or(FrameError::Opcode(opcode))?;
        let h = Header {
            opcode,
            lane,
            arg,
            len: u32::from_le_bytes(le(b, 4)),
            seq: u64::from_le_bytes(le(b, 8)),
            key: u32::from_le_bytes(le(b, 16)),
            status: i32::from_le_bytes(le(b, 20)),
            secret: u64::from_le_bytes(le(b, 24)),
            addr: u64::from_le_bytes(le(b, 32)),
            operand: u64::from_le_bytes(le(b, 40)),
            operand2: u64::from_le_bytes(le(b, 48)),
        };
        if lane >= ringfence::MAX_LANES {
            return Err(FrameError::Lane(lane));
        }
        h.check(max_len)?;
        Ok(h)
    }

    /// The per-opcode checks: lengths, and zero in every unused field.
    fn check(&self, max_len: u32) -> Result<(), FrameError> {
        let zero = |field: &'static str, value: u64| {
            if value == 0 {
                Ok(())
            } else {
                Err(FrameError::Reserved {
                    opcode: self.opcode,
                    field,
                })
            }
        };
        let length = |ok: bool| {
            if ok {
                Ok(())
            } else {
                Err(FrameError::Length {
                    opcode: self.opcode,
                    len: self.len,
                })
            }
        };
        let status = u64::from(self.status as u32);
        match self.opcode {
            Opcode::Hello => {
                length(self.len == 0)?;
                zero("key", u64::from(self.key))?;
                zero("status", status)?;
                zero("secret", self.secret)?;
                zero("operand2", self.operand2)
            }
            Opcode::HelloAck => {
                length(self.len == 0)?;
                zero("arg", u64::from(self.arg))?;
                zero("key", u64::from(self.key))?;
                zero("secret", self.secret)?;
                // A NOTIFY length: 32 bits.
                zero("addr", self.addr >> 32)?;
                zero("operand2", self.operand2)?;
                self.status_not_positive()
            }
            Opcode::Put | Opcode::Get => {
                length(self.len <= max_len)?;
                zero("arg", u64::from(self.arg))?;
                zero("status", status)?;
                zero("operand", self.operand)?;
                zero("operand2", self.operand2)
            }
            Opcode::Atomic => {
                length(self.len == 8)?;
                zero("status", status)?;
                // The sub-operation is checked by the target, which answers
                // an unknown one with its own status (the frame is sound).
                if AtomicOp::try_from(self.arg).is_ok_and(|op| op != AtomicOp::CSWAP) {
                    zero("operand2", self.operand2)?;
                }
                Ok(())
            }
            Opcode::Notify => {
                length(self.len <= max_len)?;
                zero("arg", u64::from(self.arg))?;
                zero("key", u64::from(self.key))?;
                zero("status", status)?;
                zero("secret", self.secret)?;
                zero("addr", self.addr)?;
                zero("operand2", self.operand2)
            }
            Opcode::Ack => {
                length(self.len == 0)?;
                zero("arg", u64::from(self.arg))?;
                self.response_fields()
            }
            Opcode::GetData => {
                length(self.len <= max_len && (self.status == 0 || self.len == 0))?;
                if self.arg > LAST {
                    return Err(FrameError::Reserved {
                        opcode: self.opcode,
                        field: "arg",
                    });
                }
                self.response_fields()
            }
            Opcode::AtomicData => {
                length(self.len == 0)?;
                zero("arg", u64::from(self.arg))?;
                zero("key", u64::from(self.key))?;
                zero("secret", self.secret)?;
                zero("addr", self.addr)?;
                zero("operand2", self.operand2)?;
                self.status_not_positive()
            }
            Opcode::Bye => {
                length(self.len == 0)?;
                zero("arg", u64::from(self.arg))?;
                zero("seq", self.seq)?;
                zero("key", u64::from(self.key))?;
                zero("status", status)?;
                zero("secret", self.secret)?;
                zero("addr", self.addr)?;
                zero("operand", self.operand)?;
                zero("operand2", self.operand2)
            }
        }
    }

    /// A response's status: 0 or a negative status.
    fn status_not_positive(&self) -> Result<(), FrameError> {
        if self.status > 0 {
            return Err(FrameError::Reserved {
                opcode: self.opcode,
                field: "status",
            });
        }
        Ok(())
    }

    /// ACK and GET_DATA: a status of 0 or below, and no request fields.
    fn response_fields(&self) -> Result<(), FrameError> {
        let reserved = |field| {
            Err(FrameError::Reserved {
                opcode: self.opcode,
                field,
            })
        };
        self.status_not_positive()?;
        if self.key != 0 {
            return reserved("key");
        }
        if self.secret != 0 {
            return reserved("secret");
        }
        if self.addr != 0 {
            return reserved("addr");
        }
        if self.operand != 0 {
            return reserved("operand");
        }
        if self.operand2 != 0 {
            return reserved("operand2");
        }
        Ok(())
    }

    /// A response's status as a result; an unknown status reads as a
    /// transport error.
    pub fn result(&self) -> Result<(), Status> {
        if self.status == 0 {
            Ok(())
        } else {
            Err(Status::try_from(self.status).unwrap_or(Status::Transport))
        }
    }
}

/// Encodes a failure as a response status.
pub fn status_code(status: Status) -> i32 {
    status.as_raw()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]
mod tests;
