//! Cutting a lane's byte stream into frames.
//!
//! TCP delivers bytes in chunks of any size: a header may arrive split
//! over several receives, and one receive may hold many frames. A
//! [`Reader`] keeps the bytes of an unfinished header and where it is inside
//! a payload, and hands each frame to a [`Handler`]: the decoded header,
//! then the payload in pieces, then the end. The handler can pause the
//! stream (it has no room to answer yet); the reader then keeps the header
//! and offers it again on the next [`Reader::feed`].
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use crate::wire::{FrameError, HEADER_LEN, Header};

/// Why a handler stopped the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// No room to go on now: offer this frame again later.
    Pause,
    /// The stream is unusable: close the connection.
    Fail(Broken),
}

/// Why a connection's stream is unusable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Broken {
    /// A malformed frame.
    Frame(FrameError),
    /// A well-formed frame that breaks the protocol (a response nobody
    /// asked for, a request on an initiator's connection, …).
    Protocol(&'static str),
}

impl From<FrameError> for Stop {
    fn from(e: FrameError) -> Stop {
        Stop::Fail(Broken::Frame(e))
    }
}

/// What the frames of one connection are handed to.
pub trait Handler {
    /// A decoded header. A payload (`len` bytes, for opcodes that carry
    /// one) follows through [`payload`](Handler::payload), then
    /// [`end`](Handler::end). `Err(Stop::Pause)` keeps the header for the
    /// next feed; nothing of it was taken.
    fn header(&mut self, h: &Header) -> Result<(), Stop>;
    /// `bytes` of the current frame's payload, starting at offset `at`.
    fn payload(&mut self, h: &Header, at: u32, bytes: &[u8]) -> Result<(), Stop>;
    /// The current frame is complete.
    fn end(&mut self, h: &Header) -> Result<(), Stop>;
}

#[derive(Debug, Clone, Copy)]
enum State {
    /// Collecting a header: `have` bytes of it so far.
    Header { have: usize },
    /// Inside `h`'s payload, `at` bytes in.
    Payload { h: Header, at: u32 },
}

/// One connection's receive position.
#[derive(Debug, Clone)]
pub struct Reader {
    max_len: u32,
    header: [u8; HEADER_LEN],
    state: State,
}

impl Reader {
    /// A reader at the start of a stream whose frames carry at most
    /// `max_len` bytes.
    pub fn new(max_len: u32) -> Reader {
        Reader {
            max_len,
            header: [0; HEADER_LEN],
            state: State::Header { have: 0 },
        }
    }

    /// Whether the stream is between frames (an end of stream here is a
    /// clean close).
    pub fn at_boundary(&self) -> bool {
        matches!(self.state, State::Header { have: 0 })
    }

    /// Takes frames out of `data`; returns how many bytes were consumed:
    /// all of them, unless the handler paused (then the rest is for the next
    /// call, which may also pass an empty slice to retry a kept header).
    ///
    /// # Errors
    /// The stream is broken (a malformed frame, or the handler's verdict).
    pub fn feed(&mut self, data: &[u8], handler: &mut impl Handler) -> Result<usize, Broken> {
        let mut used = 0;
        loop {
            match self.state {
                State::Header { have } => {
                    if have < HEADER_LEN {
                        let rest = data.get(used..).unwrap_or_default();
                        let n = rest.len().min(HEADER_LEN - have);
                        if n == 0 {
                            return Ok(used);
                        }
                        if let (Some(dst), Some(src)) =
                            (self.header.get_mut(have..have + n), rest.get(..n))
                        {
                            dst.copy_from_slice(src);
                        }
                        used += n;
                        self.state = State::Header { have: have + n };
                        continue;
                    }
                    let h = Header::decode(&self.header, self.max_len).map_err(Broken::Frame)?;
                    match handler.header(&h) {
                        Ok(()) => {}
                        Err(Stop::Pause) => return Ok(used),
                        Err(Stop::Fail(b)) => return Err(b),
                    }
                    self.state = if h.opcode.has_payload() && h.len > 0 {
                        State::Payload { h, at: 0 }
                    } else {
                        Self::finish(handler, &h)?;
                        State::Header { have: 0 }
                    };
                }
                State::Payload { h, at } => {
                    let rest = data.get(used..).unwrap_or_default();
                    let n = rest.len().min((h.len - at) as usize);
                    if n == 0 {
                        return Ok(used);
                    }
                    let piece = rest.get(..n).unwrap_or_default();
                    match handler.payload(&h, at, piece) {
                        Ok(()) | Err(Stop::Pause) => {}
                        Err(Stop::Fail(b)) => return Err(b),
                    }
                    used += n;
                    let at = at + n as u32;
                    self.state = if at == h.len {
                        Self::finish(handler, &h)?;
                        State::Header { have: 0 }
                    } else {
                        State::Payload { h, at }
                    };
                }
            }
        }
    }

    /// The frame whose payload is being read, and how far in: `None`
    /// between payloads.
    pub fn in_payload(&self) -> Option<(Header, u32)> {
        match self.state {
            State::Payload { h, at } => Some((h, at)),
            State::Header { .. } => None,
        }
    }

    /// `n` bytes of the current payload were placed where they belong
    /// without passing through [`feed`](Reader::feed) (received straight
    /// into their destination): moves past them, and ends the frame if
    /// they were its last.
    ///
    /// # Errors
    /// Not inside a payload, `n` beyond its end, or the handler's verdict
    /// at the end of the frame.
    pub fn advance(&mut self, n: u32, handler: &mut impl Handler) -> Result<(), Broken> {
        let State::Payload { h, at } = self.state else {
            return Err(Broken::Protocol("bytes placed outside a payload"));
        };
        if n > h.len - at {
            return Err(Broken::Protocol("bytes placed beyond a payload"));
        }
        let at = at + n;
        self.state = if at == h.len {
            Self::finish(handler, &h)?;
            State::Header { have: 0 }
        } else {
            State::Payload { h, at }
        };
        Ok(())
    }

    fn finish(handler: &mut impl Handler, h: &Header) -> Result<(), Broken> {
        match handler.end(h) {
            Ok(()) | Err(Stop::Pause) => Ok(()),
            Err(Stop::Fail(b)) => Err(b),
        }
    }

    /// The stream ended (EOF): fine between frames, a truncated frame
    /// otherwise.
    ///
    /// # Errors
    /// [`FrameError::Truncated`] inside a frame.
    pub fn eof(&self) -> Result<(), Broken> {
        if self.at_boundary() {
            Ok(())
        } else {
            Err(Broken::Frame(FrameError::Truncated))
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]
mod tests {
    use super::*;
    use crate::wire::Opcode;

    /// Records what it sees; pauses the first `pauses` headers once each.
    #[derive(Default)]
    struct Log {
        frames: Vec<(Header, Vec<u8>)>,
        pauses: usize,
    }

    impl Handler for Log {
        fn header(&mut self, h: &Header) -> Result<(), Stop> {
            if self.pauses > 0 {
                self.pauses -= 1;
                return Err(Stop::Pause);
            }
            self.frames.push((*h, Vec::new()));
            Ok(())
        }
        fn payload(&mut self, h: &Header, at: u32, bytes: &[u8]) -> Result<(), Stop> {
            let (fh, data) = self.frames.last_mut().unwrap();
            assert_eq!(fh, h);
            assert_eq!(data.len(), at as usize);
            assert!(at as usize + bytes.len() <= h.len as usize);
            data.extend_from_slice(bytes);
            Ok(())
        }
        fn end(&mut self, h: &Header) -> Result<(), Stop> {
            let (fh, data) = self.frames.last().unwrap();
            assert_eq!(fh, h);
            assert_eq!(
                data.len(),
                if h.opcode.has_payload() { h.len } else { 0 } as usize
            );
            Ok(())
        }
    }

    fn stream() -> (Vec<u8>, Vec<(Header, Vec<u8>)>) {
        let mut bytes = Vec::new();
        let mut frames = Vec::new();
        for i in 0..20u32 {
            let len = (i * 37) % 300;
            let h = Header {
                len,
                seq: u64::from(i),
                key: 1,
                secret: 2,
                addr: 4096,
                ..Header::new(Opcode::Put, (i % 4) as u8)
            };
            let payload: Vec<u8> = (0..len).map(|b| (b ^ i) as u8).collect();
            bytes.extend_from_slice(&h.encode());
            bytes.extend_from_slice(&payload);
            frames.push((h, payload));
            let ack = Header {
                seq: u64::from(i),
                ..Header::new(Opcode::Get, 0)
            };
            bytes.extend_from_slice(&ack.encode());
            frames.push((ack, Vec::new()));
        }
        (bytes, frames)
    }

    #[test]
    fn any_chunking_yields_the_same_frames() {
        let (bytes, frames) = stream();
        for chunk in [1, 2, 7, 55, 56, 57, 100, 4096] {
            let mut r = Reader::new(1 << 20);
            let mut log = Log::default();
            for piece in bytes.chunks(chunk) {
                assert_eq!(r.feed(piece, &mut log), Ok(piece.len()));
            }
            assert!(r.at_boundary());
            assert_eq!(r.eof(), Ok(()));
            assert_eq!(log.frames, frames, "chunk {chunk}");
        }
    }

    #[test]
    fn a_paused_header_is_offered_again() {
        let (bytes, frames) = stream();
        let mut r = Reader::new(1 << 20);
        let mut log = Log {
            pauses: 3,
            ..Log::default()
        };
        let mut at = 0;
        let mut rounds = 0;
        while at < bytes.len() || !r.at_boundary() {
            at += r.feed(&bytes[at..], &mut log).unwrap();
            rounds += 1;
            assert!(rounds < 100);
        }
        assert_eq!(log.frames, frames);
    }

    #[test]
    fn a_malformed_header_breaks_the_stream() {
        let mut bytes = Header::new(Opcode::Ack, 0).encode().to_vec();
        bytes[1] = 99;
        let mut r = Reader::new(1 << 20);
        assert_eq!(
            r.feed(&bytes, &mut Log::default()),
            Err(Broken::Frame(FrameError::Opcode(99)))
        );
    }

    #[test]
    fn an_oversized_payload_breaks_the_stream_before_any_byte_of_it() {
        let h = Header {
            len: 1025,
            ..Header::new(Opcode::Notify, 0)
        };
        let mut r = Reader::new(1024);
        let mut log = Log::default();
        assert!(matches!(
            r.feed(&h.encode(), &mut log),
            Err(Broken::Frame(FrameError::Length { .. }))
        ));
        assert!(log.frames.is_empty());
    }

    #[test]
    fn payload_placed_elsewhere_is_skipped_and_ends_the_frame() {
        let (bytes, frames) = stream();
        // Frame 2 (the first with a payload): its header and 10 bytes of
        // its payload are fed; the rest of its payload is "placed" by
        // `advance`.
        let start = 2 * HEADER_LEN;
        let (put, payload) = &frames[2];
        assert!(put.len > 10);
        let mut r = Reader::new(1 << 20);
        let mut log = Log::default();
        let fed = start + HEADER_LEN + 10;
        assert_eq!(r.feed(&bytes[..fed], &mut log), Ok(fed));
        assert_eq!(r.in_payload(), Some((*put, 10)));
        let rest = put.len - 10;
        assert!(r.advance(rest + 1, &mut log).is_err(), "beyond the payload");
        // The log checks payload lengths at `end`: give it the bytes.
        log.frames[2].1.extend_from_slice(&payload[10..]);
        r.advance(rest, &mut log).unwrap();
        assert!(r.at_boundary());
        assert!(r.advance(1, &mut log).is_err(), "outside a payload");
        let after = fed + rest as usize;
        assert_eq!(r.feed(&bytes[after..], &mut log), Ok(bytes.len() - after));
        assert_eq!(log.frames, frames);
    }

    #[test]
    fn eof_inside_a_frame_is_truncation() {
        let h = Header {
            len: 10,
            ..Header::new(Opcode::Notify, 0)
        };
        let mut r = Reader::new(1024);
        let mut log = Log::default();
        r.feed(&h.encode()[..20], &mut log).unwrap();
        assert_eq!(r.eof(), Err(Broken::Frame(FrameError::Truncated)));
        r.feed(&h.encode()[20..], &mut log).unwrap();
        r.feed(&[0; 5], &mut log).unwrap();
        assert_eq!(r.eof(), Err(Broken::Frame(FrameError::Truncated)));
    }

    #[test]
    fn the_handler_can_break_the_stream() {
        struct Refuse;
        impl Handler for Refuse {
            fn header(&mut self, _: &Header) -> Result<(), Stop> {
                Err(Stop::Fail(Broken::Protocol("no requests here")))
            }
            fn payload(&mut self, _: &Header, _: u32, _: &[u8]) -> Result<(), Stop> {
                Ok(())
            }
            fn end(&mut self, _: &Header) -> Result<(), Stop> {
                Ok(())
            }
        }
        let mut r = Reader::new(1024);
        assert_eq!(
            r.feed(&Header::new(Opcode::Ack, 0).encode(), &mut Refuse),
            Err(Broken::Protocol("no requests here"))
        );
    }
}
