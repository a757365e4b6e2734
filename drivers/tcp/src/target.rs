//! The target side: executing a peer's requests against this worker's
//! registered memory, from this worker's own progress, and answering them.
//!
//! Every request is checked before a byte moves: the registration id must
//! name a live registration, the secret must be its secret, and the whole
//! range must lie inside it. A request that fails the checks is answered
//! with its own status (a PUT's payload is read and dropped); the stream
//! stays in sync. Answers go out in request order on the request's
//! connection; successful PUTs and NOTIFYs share one cumulative ACK.

use crate::stream::{Broken, Handler, Stop};
use crate::sys::mem::{self, Span, Window};
use crate::sys::send::SendQueue;
use crate::wire::{HEADER_LEN, Header, LAST, Opcode};
use ringfence::NotifyPool;
use ringfence_ring::{AtomicOp, Status};

/// Registrations by id (the index).
pub(crate) type Windows = [Option<Window>];

/// Checks `[addr, addr + len)` of registration `key` with `secret`: the
/// span of its window the request may reach. A registration that is not
/// there (withdrawn, or never made) is refused as a wrong secret is, with
/// [`Status::AccessDenied`]: the initiator's key was valid when unpacked,
/// the target no longer grants it (`InvalidRkey` is the engine's answer to
/// a key id the application never unpacked).
fn check(regs: &Windows, h: &Header) -> Result<Span, Status> {
    let reg = regs
        .get(h.key as usize)
        .and_then(Option::as_ref)
        .ok_or(Status::AccessDenied)?;
    if reg.secret() != h.secret {
        return Err(Status::AccessDenied);
    }
    reg.span(h.addr, h.len).ok_or(Status::OutOfBounds)
}

/// A GET being answered in pieces, as send room allows.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GetJob {
    request: Header,
    /// Bytes sent so far.
    done: u32,
}

/// Where the current request's payload goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sink {
    /// A checked registered range: the whole PUT's.
    Write(Span),
    /// Read and dropped; the request fails with this status.
    Drop(Status),
    /// Collected for a notification.
    Assemble,
}

/// Whether the peer sends requests on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ServeState {
    /// No HELLO accepted yet: a request is a protocol error.
    AwaitingHello,
    /// The peer's HELLO was accepted (its HELLO_ACK queued or held): its
    /// requests are served.
    Serving,
    /// The peer sent BYE: it sends no more requests.
    Ended,
}

/// One connection's serving state: the peer's requests on it.
#[derive(Debug)]
pub(crate) struct TargetSide {
    /// Greeted, serving, or ended.
    pub(crate) state: ServeState,
    /// The peer's instance, from its HELLO.
    pub(crate) peer_instance: u64,
    /// The HELLO_ACK of a HELLO that made this connection carry requests
    /// both ways, held until the room kept for answers is free in the
    /// filling batch ([`TargetSide::release_hello_ack`]): the peer sends no
    /// request before it, so every answer to its requests finds room.
    held_hello_ack: Option<Header>,
    sink: Sink,
    /// The highest successful PUT/NOTIFY not yet acknowledged: (lane, seq).
    ack: Option<(u8, u64)>,
    get: Option<GetJob>,
    /// Where a notification's payload is put together as its pieces come
    /// (one receive buffer each, or less): the pool's buffer size, so that
    /// any notification the pool can hold fits. Allocated once, when the
    /// connection is set up, and never resized: the data path allocates
    /// nothing. Each piece lands at its offset in the payload (`payload`);
    /// a NOTIFY longer than this is refused when its header comes.
    ///
    /// It is not a notification buffer itself: one is claimed only once
    /// the whole payload is here (`NotifyPool::deliver`), so a payload
    /// that is cut off with the connection never holds one, and a full
    /// pool is known at the end, where the NOTIFY is answered.
    assembly: Box<[u8]>,
}

impl TargetSide {
    /// Serving state for a new connection; notifications of up to
    /// `notify_size` bytes.
    pub(crate) fn new(notify_size: usize) -> TargetSide {
        TargetSide {
            state: ServeState::AwaitingHello,
            peer_instance: 0,
            held_hello_ack: None,
            sink: Sink::Drop(Status::InvalidArgument),
            ack: None,
            get: None,
            assembly: vec![0; notify_size].into_boxed_slice(),
        }
    }
}

impl TargetSide {
    /// Whether the peer sends requests on this connection (it greeted and
    /// has not said BYE).
    pub(crate) fn serving(&self) -> bool {
        self.state == ServeState::Serving
    }

    /// Whether the peer's HELLO was accepted (BYE since or not).
    pub(crate) fn greeted(&self) -> bool {
        self.state != ServeState::AwaitingHello
    }

    /// Whether the peer said BYE.
    pub(crate) fn ended(&self) -> bool {
        self.state == ServeState::Ended
    }

    /// Queues a held HELLO_ACK once the room kept for answers is free in
    /// `send`'s filling batch; `true` if it went (or none was held).
    pub(crate) fn release_hello_ack(&mut self, send: &mut SendQueue) -> bool {
        let Some(ack) = self.held_hello_ack else {
            return true;
        };
        if !send.reserve_is_free() || !send.push_copy(&[&ack.encode()]) {
            return false;
        }
        self.held_hello_ack = None;
        true
    }

    /// Whether a GET is being answered in pieces (through staging).
    pub(crate) fn answering_get(&self) -> bool {
        self.get.is_some()
    }

    /// Where the current PUT's payload is written, if it passed the checks:
    /// the whole PUT's range.
    pub(crate) fn write_target(&self) -> Option<Span> {
        match self.sink {
            Sink::Write(span) => Some(span),
            _ => None,
        }
    }
}

/// Bytes of GET data per GET_DATA frame at most.
const GET_PIECE: u32 = 256 << 10;

/// The requests of one connection, handed to the stream reader.
pub(crate) struct Requests<'a> {
    pub(crate) serve: &'a mut TargetSide,
    pub(crate) send: &'a mut SendQueue,
    pub(crate) regs: &'a Windows,
    pub(crate) notify: Option<&'a NotifyPool>,
    /// This worker's instance (HELLO must name it).
    pub(crate) instance: u64,
    /// The connection carries requests both ways: GET data goes straight
    /// from the window, and room for answers is kept (see [`wire`]).
    ///
    /// [`wire`]: crate::wire
    pub(crate) gets_from_window: bool,
    /// A lane of ours sends on this connection: a HELLO makes it carry
    /// requests both ways, and its HELLO_ACK is held
    /// ([`TargetSide::release_hello_ack`]).
    pub(crate) hold_hello_ack: bool,
}

impl TargetSide {
    /// A successful PUT or NOTIFY waits for its (cumulative) ACK.
    pub(crate) fn ack_pending(&self) -> bool {
        self.ack.is_some()
    }

    /// Queues the pending cumulative ACK on `send`; `false` if there is
    /// no room (it stays pending).
    pub(crate) fn queue_ack(&mut self, send: &mut SendQueue) -> bool {
        let Some((lane, seq)) = self.ack else {
            return true;
        };
        let ack = Header {
            seq,
            ..Header::new(Opcode::Ack, lane)
        };
        if !send.push_copy(&[&ack.encode()]) {
            return false;
        }
        self.ack = None;
        true
    }
}

impl Requests<'_> {
    /// Queues the pending cumulative ACK; `false` if there is no room.
    fn flush_ack(&mut self) -> bool {
        self.serve.queue_ack(self.send)
    }

    /// Queues an answer to `h` (after the pending ACK); `false` if there is
    /// no room (nothing queued).
    fn answer(&mut self, answer: &Header) -> bool {
        if self.send.room() < 2 * HEADER_LEN {
            return false;
        }
        self.flush_ack() && self.send.push_copy(&[&answer.encode()])
    }

    /// Sends as much of the current GET as fits; `true` when it is done.
    pub(crate) fn pump_get(&mut self) -> bool {
        let Some(mut job) = self.serve.get else {
            return true;
        };
        if !self.flush_ack() {
            return false;
        }
        let r = job.request;
        loop {
            let left = r.len - job.done;
            let room = self.send.room().saturating_sub(HEADER_LEN);
            let n = left.min(GET_PIECE).min(room as u32);
            if n == 0 && left > 0 {
                self.serve.get = Some(job);
                return false;
            }
            // The registration may have gone since the last piece (nothing
            // deregisters during this call: the engine lock is held).
            let checked = check(self.regs, &r);
            let last = checked.is_err() || n == left;
            let piece = Header {
                seq: r.seq,
                len: if checked.is_ok() { n } else { 0 },
                arg: if last { LAST } else { 0 },
                status: checked.err().map_or(0, Status::as_raw),
                ..Header::new(Opcode::GetData, r.lane)
            };
            let len = piece.len as usize;
            let done = job.done;
            let queued = self.send.push_filled(&piece.encode(), len, |dst| {
                if let Ok(span) = checked {
                    let read = span.read(done, dst);
                    debug_assert!(read, "a piece inside the GET");
                }
            });
            if !queued {
                self.serve.get = Some(job);
                return false;
            }
            job.done += piece.len;
            if last {
                self.serve.get = None;
                return true;
            }
        }
    }

    /// Answers a GET (checked) with one GET_DATA frame whose data the
    /// kernel reads from the window as it sends: no staging, so the answer
    /// never waits for room beyond a header (connections that carry
    /// requests both ways; see [`wire`]).
    ///
    /// [`wire`]: crate::wire
    fn get_by_reference(&mut self, h: &Header, span: Span) -> Result<(), Stop> {
        if !self.flush_ack() {
            return Err(Stop::Pause);
        }
        let piece = Header {
            seq: h.seq,
            len: h.len,
            arg: LAST,
            ..Header::new(Opcode::GetData, h.lane)
        };
        // Deregistering the window waits until no queued or in-flight
        // batch sends from it (`holds_window`, the driver's `quiesce`),
        // closing the connection if the peer does not take the data in
        // time, and waiting out the canceled send.
        let queued = self.send.push_window(&piece.encode(), span, h.key);
        if queued { Ok(()) } else { Err(Stop::Pause) }
    }

    /// Answers an ATOMIC.
    fn atomic(&mut self, h: &Header) -> Result<(), Stop> {
        if self.send.room() < 2 * HEADER_LEN {
            return Err(Stop::Pause);
        }
        let result = AtomicOp::try_from(h.arg)
            .map_err(|_| Status::InvalidSubop)
            .and_then(|op| check(self.regs, h)?.atomic(op, h.operand, h.operand2));
        let answer = Header {
            seq: h.seq,
            status: result.err().map_or(0, Status::as_raw),
            operand: result.unwrap_or(0),
            ..Header::new(Opcode::AtomicData, h.lane)
        };
        let queued = self.answer(&answer);
        debug_assert!(queued, "room was checked");
        Ok(())
    }

    /// Answers a PUT or NOTIFY that ended with `result`.
    fn finish(&mut self, h: &Header, result: Result<(), Status>) -> Result<(), Stop> {
        match result {
            Ok(()) => {
                self.serve.ack = Some((h.lane, h.seq));
                Ok(())
            }
            Err(status) => {
                let answer = Header {
                    seq: h.seq,
                    status: status.as_raw(),
                    ..Header::new(Opcode::Ack, h.lane)
                };
                // Room for this answer was checked when the header came.
                if self.answer(&answer) {
                    Ok(())
                } else {
                    Err(Stop::Fail(Broken::Protocol("no room to answer")))
                }
            }
        }
    }
}

impl Handler for Requests<'_> {
    fn header(&mut self, h: &Header) -> Result<(), Stop> {
        if !h.opcode.is_request() {
            return Err(Stop::Fail(Broken::Protocol(
                "a response on a target's connection",
            )));
        }
        if h.opcode == Opcode::Bye {
            return match self.serve.state {
                ServeState::AwaitingHello => {
                    Err(Stop::Fail(Broken::Protocol("a BYE before HELLO")))
                }
                ServeState::Ended => Err(Stop::Fail(Broken::Protocol("a second BYE"))),
                ServeState::Serving => {
                    // Answers already queued keep their order; a held ACK
                    // goes at the next commit as usual.
                    self.serve.state = ServeState::Ended;
                    Ok(())
                }
            };
        }
        if self.serve.ended() {
            return Err(Stop::Fail(Broken::Protocol("a request after BYE")));
        }
        if h.opcode == Opcode::Hello {
            if self.serve.greeted() {
                return Err(Stop::Fail(Broken::Protocol("a second HELLO")));
            }
            let status = if h.operand != self.instance {
                // The address named another worker (this one restarted on
                // the same port, say).
                Status::PeerUnreachable.as_raw()
            } else if h.arg == 0 || h.lane >= h.arg {
                Status::InvalidArgument.as_raw()
            } else {
                0
            };
            let ack = Header {
                status,
                operand: self.instance,
                // What `notify` refuses beyond (`TargetSide::new`).
                addr: self.serve.assembly.len() as u64,
                ..Header::new(Opcode::HelloAck, h.lane)
            };
            if status == 0 && self.hold_hello_ack {
                // Sent by the driver once the answer room is free; the
                // reader goes on meanwhile (it never waits for room here).
                self.serve.held_hello_ack = Some(ack);
                self.serve.state = ServeState::Serving;
                self.serve.peer_instance = h.seq;
                return Ok(());
            }
            if !self.send.push_copy(&[&ack.encode()]) {
                return Err(Stop::Pause);
            }
            // A refused HELLO leaves it awaiting one.
            if status == 0 {
                self.serve.state = ServeState::Serving;
                self.serve.peer_instance = h.seq;
            }
            return Ok(());
        }
        if !self.serve.greeted() {
            return Err(Stop::Fail(Broken::Protocol("a request before HELLO")));
        }
        // Answers go out in order: a GET still being sent comes first, and
        // every request needs room for its answer.
        if !self.pump_get() || self.send.room() < 2 * HEADER_LEN {
            return Err(Stop::Pause);
        }
        match h.opcode {
            Opcode::Put => {
                self.serve.sink = match check(self.regs, h) {
                    Ok(span) => Sink::Write(span),
                    Err(status) => Sink::Drop(status),
                };
                Ok(())
            }
            Opcode::Notify => {
                self.serve.sink = match self.notify {
                    Some(pool)
                        if h.len <= pool.buffer_size()
                            && h.len as usize <= self.serve.assembly.len() =>
                    {
                        Sink::Assemble
                    }
                    Some(_) => Sink::Drop(Status::InvalidLength),
                    None => Sink::Drop(Status::Unsupported),
                };
                Ok(())
            }
            Opcode::Get => {
                let span = match check(self.regs, h) {
                    Ok(span) => span,
                    Err(status) => {
                        let answer = Header {
                            seq: h.seq,
                            arg: LAST,
                            status: status.as_raw(),
                            ..Header::new(Opcode::GetData, h.lane)
                        };
                        let queued = self.answer(&answer);
                        debug_assert!(queued, "room was checked");
                        return Ok(());
                    }
                };
                if self.gets_from_window {
                    return self.get_by_reference(h, span);
                }
                self.serve.get = Some(GetJob {
                    request: *h,
                    done: 0,
                });
                self.pump_get();
                Ok(())
            }
            Opcode::Atomic => self.atomic(h),
            _ => Err(Stop::Fail(Broken::Protocol("unexpected request"))),
        }
    }

    fn payload(&mut self, _h: &Header, at: u32, bytes: &[u8]) -> Result<(), Stop> {
        match self.serve.sink {
            Sink::Write(span) => {
                // `at + bytes.len() <= h.len` (the reader's contract); a
                // piece out of range all the same fails the PUT.
                if !span.write(at, bytes) {
                    self.serve.sink = Sink::Drop(Status::OutOfBounds);
                }
            }
            Sink::Assemble => {
                // `at + bytes.len() <= h.len <= assembly.len()` (the
                // reader's contract and the header's check); a piece out
                // of range all the same fails the NOTIFY, never grows it.
                let at = at as usize;
                let dst = at
                    .checked_add(bytes.len())
                    .and_then(|end| self.serve.assembly.get_mut(at..end));
                match dst {
                    Some(dst) => dst.copy_from_slice(bytes),
                    None => self.serve.sink = Sink::Drop(Status::InvalidLength),
                }
            }
            Sink::Drop(_) => {}
        }
        Ok(())
    }

    fn end(&mut self, h: &Header) -> Result<(), Stop> {
        match h.opcode {
            Opcode::Put => {
                let result = match self.serve.sink {
                    Sink::Write(_) => Ok(()),
                    Sink::Drop(status) => Err(status),
                    Sink::Assemble => Err(Status::InvalidArgument),
                };
                self.finish(h, result)
            }
            Opcode::Notify => {
                let result = match (self.serve.sink, self.notify) {
                    (Sink::Assemble, Some(pool)) => {
                        // `h.len` bytes (at most the pool's buffer size,
                        // checked), every one of them written by this
                        // NOTIFY's pieces.
                        match self.serve.assembly.get(..h.len as usize) {
                            Some(data) => mem::deliver(pool, data, h.operand),
                            None => Err(Status::InvalidLength),
                        }
                    }
                    (Sink::Drop(status), _) => Err(status),
                    _ => Err(Status::Unsupported),
                };
                self.finish(h, result)
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::Reader;

    /// The bytes of NOTIFY `seq` of `len` bytes, tagged `seq`: a header,
    /// then a payload that differs for each `seq`.
    fn notify_frame(seq: u64, len: u32) -> Vec<u8> {
        let h = Header {
            len,
            seq,
            operand: seq,
            ..Header::new(Opcode::Notify, 0)
        };
        let mut frame = h.encode().to_vec();
        frame.extend((0..len).map(|i| (i as u64 ^ seq.wrapping_mul(131)) as u8));
        frame
    }

    /// Feeds `frame` to a greeted connection's requests in pieces of
    /// `piece` bytes (the header split too), as receive buffers smaller
    /// than the frame would hand it over.
    fn feed(
        serve: &mut TargetSide,
        send: &mut SendQueue,
        pool: &NotifyPool,
        frame: &[u8],
        piece: usize,
    ) {
        let mut reader = Reader::new(1 << 20);
        let mut requests = Requests {
            serve,
            send,
            regs: &[],
            notify: Some(pool),
            instance: 1,
            gets_from_window: false,
            hold_hello_ack: false,
        };
        for chunk in frame.chunks(piece) {
            assert_eq!(reader.feed(chunk, &mut requests), Ok(chunk.len()));
        }
        assert!(reader.at_boundary());
    }

    /// A thousand notifications, each cut into pieces of 97 bytes (the
    /// header too), are each assembled and delivered, and the storage
    /// they are put together in is the same allocation of the same length
    /// throughout: nothing on the way allocates or grows.
    #[test]
    fn notifications_in_pieces_are_assembled_in_storage_that_never_grows() {
        let pool = NotifyPool::new(1000, 4096).unwrap();
        let mut serve = TargetSide::new(pool.buffer_size() as usize);
        serve.state = ServeState::Serving;
        let mut send = SendQueue::new(64 << 10, 64);
        let storage = (serve.assembly.as_ptr(), serve.assembly.len());
        for seq in 0..1000u64 {
            let len = 1 + (seq as u32 * 37) % 4096;
            feed(&mut serve, &mut send, &pool, &notify_frame(seq, len), 97);
            assert_eq!(serve.ack, Some((0, seq)), "NOTIFY {seq} delivered");
            assert_eq!((serve.assembly.as_ptr(), serve.assembly.len()), storage);
        }
        assert_eq!(send.queued(), 0, "no failure answered");
        // The pool is full now: the next one is answered with NoResource,
        // still without growing anything.
        feed(&mut serve, &mut send, &pool, &notify_frame(1000, 64), 7);
        assert_eq!(serve.ack, None, "the ACK before it went out first");
        assert!(send.queued() > 0, "a failure answered");
        assert_eq!((serve.assembly.as_ptr(), serve.assembly.len()), storage);
    }

    /// A NOTIFY longer than the storage set up for the connection is
    /// refused (answered with InvalidLength), never assembled by growing
    /// it, even where the pool's buffers would hold it.
    #[test]
    fn a_notification_longer_than_the_storage_is_refused_not_grown() {
        let pool = NotifyPool::new(4, 4096).unwrap();
        let mut serve = TargetSide::new(1000);
        serve.state = ServeState::Serving;
        let mut send = SendQueue::new(64 << 10, 64);
        let storage = (serve.assembly.as_ptr(), serve.assembly.len());
        feed(&mut serve, &mut send, &pool, &notify_frame(0, 1000), 300);
        assert_eq!(serve.ack, Some((0, 0)), "1000 bytes fit");
        feed(&mut serve, &mut send, &pool, &notify_frame(1, 4000), 300);
        assert_eq!(serve.ack, None, "4000 bytes are refused");
        assert!(send.queued() > 0, "answered with its failure");
        assert_eq!((serve.assembly.as_ptr(), serve.assembly.len()), storage);
    }
}
