//! The control messages on the connection socket (`SOCK_SEQPACKET`, so each
//! message arrives whole or not at all).
//!
//! Every message starts with `"RFSC"`, its kind, the protocol version and a
//! sequence number that a reply echoes (a late reply to a request that timed
//! out is recognized and skipped). All integers are little-endian. Messages
//! come from another process and are untrusted: [`Message::decode`] checks
//! the exact length of each kind and refuses anything else.
//!
//! | kind | direction | body | descriptor |
//! |---|---|---|---|
//! | `HELLO` | initiator → target | lanes, channel capacity, instance | the connection page |
//! | `WELCOME` | target → initiator | status, notification buffer size and count, export slots, instance | the export status page (on success) |
//! | `MAP` | initiator → target | slot, generation, secret | |
//! | `MAPPED` | target → initiator | status, path, base, length, offset in the memfd | the region's memfd (memfd path, on success) |
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use ringfence_ring::Status;

const MAGIC: &[u8; 4] = b"RFSC";
/// The protocol version this build speaks.
pub(crate) const VERSION: u8 = 1;
const HEADER: usize = 12;
/// The largest message, for receive buffers (one more byte detects longer
/// messages).
pub(crate) const MAX_MESSAGE: usize = 64;

const KIND_HELLO: u8 = 1;
const KIND_WELCOME: u8 = 2;
const KIND_MAP: u8 = 3;
const KIND_MAPPED: u8 = 4;

/// How a key's region is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyPath {
    /// The region is a sealed memfd that the peer maps: PUT, GET and
    /// ATOMIC are loads, stores and atomics with no system call.
    Memfd,
    /// Arbitrary memory of the target process: PUT and GET are
    /// `process_vm_writev`/`process_vm_readv` (one system call each);
    /// ATOMIC is unsupported.
    CrossMemoryAttach,
}

impl KeyPath {
    pub(crate) fn as_raw(self) -> u8 {
        match self {
            KeyPath::Memfd => 1,
            KeyPath::CrossMemoryAttach => 2,
        }
    }

    pub(crate) fn from_raw(raw: u8) -> Option<KeyPath> {
        match raw {
            1 => Some(KeyPath::Memfd),
            2 => Some(KeyPath::CrossMemoryAttach),
            _ => None,
        }
    }
}

/// A decoded control message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Message {
    /// Opens a connection; carries the connection page.
    Hello {
        /// Lanes of the endpoint.
        lanes: u8,
        /// Notification channel bytes in the connection page.
        capacity: u32,
        /// The initiator driver's random instance id.
        instance: u64,
    },
    /// Accepts (status 0) or refuses a connection.
    Welcome {
        /// 0 or a negative [`Status`] value.
        status: i32,
        /// Bytes per notification buffer of the target.
        notify_size: u32,
        /// Notification buffers of the target.
        notify_count: u32,
        /// Export slots in the status page.
        export_slots: u32,
        /// The target driver's random instance id.
        instance: u64,
    },
    /// Asks for access to an export.
    Map {
        /// Export slot.
        slot: u32,
        /// Its generation.
        generation: u32,
        /// The key's secret.
        secret: u64,
    },
    /// Grants (status 0) or refuses access.
    Mapped {
        /// 0 or a negative [`Status`] value.
        status: i32,
        /// How the region is reached ([`KeyPath::as_raw`]).
        path: u8,
        /// The region's start in the target's address space.
        base: u64,
        /// The region's length.
        len: u64,
        /// Where the region starts in the memfd.
        fd_offset: u64,
    },
}

/// Why a message was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum WireError {
    /// Wrong magic or version, unknown kind, or wrong length for its kind.
    #[error("malformed control message")]
    Malformed,
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn bytes<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let end = self.at.checked_add(N).ok_or(WireError::Malformed)?;
        let slice = self.buf.get(self.at..end).ok_or(WireError::Malformed)?;
        self.at = end;
        <[u8; N]>::try_from(slice).map_err(|_| WireError::Malformed)
    }
    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(u8::from_le_bytes(self.bytes()?))
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }
    fn i32(&mut self) -> Result<i32, WireError> {
        Ok(i32::from_le_bytes(self.bytes()?))
    }
    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }
}

impl Message {
    fn kind(&self) -> u8 {
        match self {
            Message::Hello { .. } => KIND_HELLO,
            Message::Welcome { .. } => KIND_WELCOME,
            Message::Map { .. } => KIND_MAP,
            Message::Mapped { .. } => KIND_MAPPED,
        }
    }

    /// The message with sequence number `seq`, encoded.
    pub(crate) fn encode(&self, seq: u32) -> Vec<u8> {
        let mut out = Vec::with_capacity(MAX_MESSAGE);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&[self.kind(), VERSION, 0, 0]);
        out.extend_from_slice(&seq.to_le_bytes());
        match *self {
            Message::Hello {
                lanes,
                capacity,
                instance,
            } => {
                out.extend_from_slice(&[lanes, 0, 0, 0]);
                out.extend_from_slice(&capacity.to_le_bytes());
                out.extend_from_slice(&instance.to_le_bytes());
            }
            Message::Welcome {
                status,
                notify_size,
                notify_count,
                export_slots,
                instance,
            } => {
                out.extend_from_slice(&status.to_le_bytes());
                out.extend_from_slice(&notify_size.to_le_bytes());
                out.extend_from_slice(&notify_count.to_le_bytes());
                out.extend_from_slice(&export_slots.to_le_bytes());
                out.extend_from_slice(&instance.to_le_bytes());
            }
            Message::Map {
                slot,
                generation,
                secret,
            } => {
                out.extend_from_slice(&slot.to_le_bytes());
                out.extend_from_slice(&generation.to_le_bytes());
                out.extend_from_slice(&secret.to_le_bytes());
            }
            Message::Mapped {
                status,
                path,
                base,
                len,
                fd_offset,
            } => {
                out.extend_from_slice(&status.to_le_bytes());
                out.extend_from_slice(&[path, 0, 0, 0]);
                out.extend_from_slice(&base.to_le_bytes());
                out.extend_from_slice(&len.to_le_bytes());
                out.extend_from_slice(&fd_offset.to_le_bytes());
            }
        }
        out
    }

    /// Decodes one message and its sequence number.
    ///
    /// # Errors
    /// [`WireError::Malformed`] for anything but an exact message of a
    /// known kind.
    pub(crate) fn decode(buf: &[u8]) -> Result<(u32, Message), WireError> {
        let mut r = Reader { buf, at: 0 };
        let magic: [u8; 4] = r.bytes()?;
        let (kind, version, _, _) = (r.u8()?, r.u8()?, r.u8()?, r.u8()?);
        let seq = r.u32()?;
        if &magic != MAGIC || version != VERSION {
            return Err(WireError::Malformed);
        }
        let (message, body) = match kind {
            KIND_HELLO => {
                let lanes = r.u8()?;
                let _: [u8; 3] = r.bytes()?;
                let message = Message::Hello {
                    lanes,
                    capacity: r.u32()?,
                    instance: r.u64()?,
                };
                (message, 16)
            }
            KIND_WELCOME => (
                Message::Welcome {
                    status: r.i32()?,
                    notify_size: r.u32()?,
                    notify_count: r.u32()?,
                    export_slots: r.u32()?,
                    instance: r.u64()?,
                },
                24,
            ),
            KIND_MAP => (
                Message::Map {
                    slot: r.u32()?,
                    generation: r.u32()?,
                    secret: r.u64()?,
                },
                16,
            ),
            KIND_MAPPED => {
                let status = r.i32()?;
                let path = r.u8()?;
                let _: [u8; 3] = r.bytes()?;
                let message = Message::Mapped {
                    status,
                    path,
                    base: r.u64()?,
                    len: r.u64()?,
                    fd_offset: r.u64()?,
                };
                (message, 32)
            }
            _ => return Err(WireError::Malformed),
        };
        if buf.len() != HEADER + body {
            return Err(WireError::Malformed);
        }
        Ok((seq, message))
    }
}

/// A status for the wire: 0 for success.
pub(crate) fn status_to_wire(result: Result<(), Status>) -> i32 {
    match result {
        Ok(()) => 0,
        Err(status) => status.as_raw(),
    }
}

/// A status from the wire; an unknown negative value is a transport error.
pub(crate) fn status_from_wire(raw: i32) -> Result<(), Status> {
    if raw == 0 {
        return Ok(());
    }
    Err(Status::try_from(raw).unwrap_or(Status::Transport))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    fn all() -> [Message; 4] {
        [
            Message::Hello {
                lanes: 3,
                capacity: 1 << 18,
                instance: 0x1122_3344_5566_7788,
            },
            Message::Welcome {
                status: Status::AccessDenied.as_raw(),
                notify_size: 4096,
                notify_count: 64,
                export_slots: 1 << 16,
                instance: 9,
            },
            Message::Map {
                slot: 7,
                generation: 2,
                secret: u64::MAX,
            },
            Message::Mapped {
                status: 0,
                path: 1,
                base: 0x7f00_0000_0000,
                len: 4096,
                fd_offset: 0,
            },
        ]
    }

    #[test]
    fn every_kind_round_trips_and_every_damage_is_refused() {
        for (seq, m) in all().into_iter().enumerate() {
            let bytes = m.encode(seq as u32);
            assert!(bytes.len() <= MAX_MESSAGE);
            assert_eq!(Message::decode(&bytes), Ok((seq as u32, m)));
            for cut in 0..bytes.len() {
                assert!(
                    Message::decode(&bytes[..cut]).is_err(),
                    "{m:?} cut at {cut}"
                );
            }
            let mut long = bytes.clone();
            long.push(0);
            assert!(Message::decode(&long).is_err());
            for at in [0, 4, 5] {
                let mut bad = bytes.clone();
                bad[at] ^= 0x80;
                assert!(Message::decode(&bad).is_err(), "byte {at}");
            }
        }
        assert!(Message::decode(&[0xff; MAX_MESSAGE]).is_err());
        assert!(Message::decode(&[]).is_err());
    }

    #[test]
    fn statuses_cross_the_wire() {
        assert_eq!(status_from_wire(status_to_wire(Ok(()))), Ok(()));
        let denied = status_to_wire(Err(Status::AccessDenied));
        assert_eq!(status_from_wire(denied), Err(Status::AccessDenied));
        assert_eq!(status_from_wire(-9999), Err(Status::Transport));
        assert_eq!(status_from_wire(5), Err(Status::Transport));
        assert_eq!(
            KeyPath::from_raw(KeyPath::Memfd.as_raw()),
            Some(KeyPath::Memfd)
        );
        assert_eq!(KeyPath::from_raw(0), None);
    }
}
