//! The initiator side of a lane: the requests it has sent, in order, and
//! the target's answers to them.
//!
//! A lane is one TCP connection, and the target answers its requests in
//! the order they were sent, so the requests waiting for an answer form a
//! FIFO with consecutive sequence numbers. An answer that does not fit
//! the FIFO's head (a sequence number out of order, an ACK for a GET, data
//! for a PUT, more or fewer GET bytes than asked) is a protocol error that
//! fails the endpoint.

use crate::stream::{Broken, Handler, Stop};
use crate::sys::mem::Local;
use crate::wire::{DUPLEX_DEPTH, Header, LAST, Opcode};
use ringfence::{Completion, Token};
use ringfence_ring::Status;
use std::collections::VecDeque;

/// What a request waits for.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Awaits {
    /// An ACK (PUT, NOTIFY) for `len` bytes.
    Ack { len: u32 },
    /// GET data into `dst` (all of it); `got` bytes so far.
    Data { dst: Local, got: u32 },
    /// An atomic's old value, written to `dst` if it fetches.
    Fetch { dst: Option<Local> },
}

/// A request sent on the lane: it holds the operation's local memory
/// ([`Local`]) until its completion is reported.
#[derive(Debug)]
pub(crate) struct Pending {
    pub(crate) token: Token,
    pub(crate) awaits: Awaits,
    /// Its outcome once answered.
    pub(crate) result: Option<Result<u32, Status>>,
}

/// One lane of an endpoint.
#[derive(Debug)]
pub(crate) struct Lane {
    /// The connection (slot in the driver's table).
    pub(crate) conn: u32,
    /// Sequence number of `pending[0]`.
    pub(crate) head_seq: u64,
    /// Requests not yet reported, oldest first; those with a result are
    /// answered.
    pub(crate) pending: VecDeque<Pending>,
    /// How many of `pending` (from the front) are answered.
    pub(crate) answered: usize,
    /// The HELLO_ACK came.
    pub(crate) up: bool,
    /// The longest NOTIFY payload the target accepts (its HELLO_ACK said).
    pub(crate) peer_notify_len: u32,
    /// Flushes waiting on this lane: (flush slot, sequence number of the
    /// last request they cover).
    pub(crate) marks: VecDeque<(u32, u64)>,
    /// Requests in flight at most (the depth; [`DUPLEX_DEPTH`] at most once
    /// the connection carries requests both ways).
    limit: usize,
    /// Whether the connection carries requests both ways (see [`wire`]).
    ///
    /// [`wire`]: crate::wire
    pub(crate) duplex: bool,
    /// Sequence number of the last GET sent, if any.
    last_get: Option<u64>,
}

impl Lane {
    /// A lane on connection `conn` with room for `depth` requests in
    /// flight.
    pub(crate) fn new(conn: u32, depth: usize) -> Lane {
        Lane {
            conn,
            head_seq: 0,
            pending: VecDeque::with_capacity(depth),
            answered: 0,
            up: false,
            peer_notify_len: 0,
            marks: VecDeque::with_capacity(depth.min(64)),
            limit: depth,
            duplex: false,
            last_get: None,
        }
    }

    /// The connection now carries requests both ways: at most
    /// [`DUPLEX_DEPTH`] requests in flight from now on, and writes wait
    /// for the GETs before them ([`Lane::write_waits`]).
    pub(crate) fn make_duplex(&mut self) {
        self.duplex = true;
        self.limit = self.limit.min(DUPLEX_DEPTH);
    }

    /// Whether a PUT, NOTIFY or ATOMIC must wait: on a lane that carries
    /// requests both ways, a GET before it is unanswered (the target sends
    /// GET data from its window as it goes; see [`wire`]).
    ///
    /// [`wire`]: crate::wire
    pub(crate) fn write_waits(&self) -> bool {
        self.duplex
            && self
                .last_get
                .is_some_and(|seq| seq >= self.head_seq + self.answered as u64)
    }

    /// The sequence number the next request gets.
    pub(crate) fn next_seq(&self) -> u64 {
        self.head_seq + self.pending.len() as u64
    }

    /// Whether a request more fits.
    pub(crate) fn has_room(&self) -> bool {
        self.pending.len() < self.limit
    }

    /// Records a sent request; returns its sequence number.
    pub(crate) fn push(&mut self, token: Token, awaits: Awaits) -> u64 {
        let seq = self.next_seq();
        if matches!(awaits, Awaits::Data { .. }) {
            self.last_get = Some(seq);
        }
        self.pending.push_back(Pending {
            token,
            awaits,
            result: None,
        });
        seq
    }

    /// Answers every unanswered request with `status` (the connection is
    /// gone).
    pub(crate) fn fail_all(&mut self, status: Status) {
        for p in self.pending.iter_mut().skip(self.answered) {
            p.result = Some(Err(status));
        }
        self.answered = self.pending.len();
    }

    /// Moves answered requests into `out` from index `n`; returns the new
    /// `n`. Sequence numbers advance with them.
    pub(crate) fn emit(&mut self, out: &mut [Completion], mut n: usize) -> usize {
        while n < out.len() && self.answered > 0 {
            let Some(p) = self.pending.pop_front() else {
                break;
            };
            self.answered -= 1;
            self.head_seq += 1;
            out[n] = Completion::new(p.token, p.result.unwrap_or(Err(Status::Transport)));
            n += 1;
        }
        n
    }

    /// Whether every request up to and including `seq` has been reported.
    pub(crate) fn reported(&self, seq: u64) -> bool {
        self.head_seq > seq
    }

    /// The first unanswered request, which `seq` must name.
    fn next_unanswered(&mut self, seq: u64) -> Result<&mut Pending, Stop> {
        let expect = self.head_seq + self.answered as u64;
        if seq != expect {
            return Err(protocol("an answer out of order"));
        }
        self.pending
            .get_mut(self.answered)
            .ok_or_else(|| protocol("an answer to nothing"))
    }
}

fn protocol(what: &'static str) -> Stop {
    Stop::Fail(Broken::Protocol(what))
}

/// The answers arriving on one lane's connection.
pub(crate) struct Answers<'a> {
    pub(crate) lane: &'a mut Lane,
    /// The target's instance, which HELLO_ACK must carry.
    pub(crate) instance: u64,
    /// Set when a HELLO_ACK refused the connection.
    pub(crate) refused: &'a mut Option<Status>,
    /// Set when anything became answered.
    pub(crate) progressed: &'a mut bool,
}

impl Handler for Answers<'_> {
    fn header(&mut self, h: &Header) -> Result<(), Stop> {
        if h.opcode.is_request() {
            return Err(protocol("a request on an initiator's connection"));
        }
        if h.opcode == Opcode::HelloAck {
            if self.lane.up {
                return Err(protocol("a second HELLO_ACK"));
            }
            if let Err(status) = h.result() {
                *self.refused = Some(status);
            } else if h.operand != self.instance {
                *self.refused = Some(Status::PeerUnreachable);
            } else {
                self.lane.up = true;
                // Checked to fit 32 bits by the frame's decoding.
                self.lane.peer_notify_len = u32::try_from(h.addr).unwrap_or(u32::MAX);
                *self.progressed = true;
            }
            return Ok(());
        }
        if !self.lane.up {
            return Err(protocol("an answer before HELLO_ACK"));
        }
        match h.opcode {
            Opcode::Ack => {
                if let Err(status) = h.result() {
                    let p = self.lane.next_unanswered(h.seq)?;
                    p.result = Some(Err(status));
                    self.lane.answered += 1;
                } else {
                    // Everything up to `seq` not answered otherwise.
                    let first = self.lane.head_seq + self.lane.answered as u64;
                    if h.seq < first || h.seq >= self.lane.next_seq() {
                        return Err(protocol("an ACK out of order"));
                    }
                    for _ in first..=h.seq {
                        let i = self.lane.answered;
                        let p = &mut self.lane.pending[i];
                        let Awaits::Ack { len } = p.awaits else {
                            return Err(protocol("an ACK for a GET or an atomic"));
                        };
                        p.result = Some(Ok(len));
                        self.lane.answered += 1;
                    }
                }
                *self.progressed = true;
                Ok(())
            }
            Opcode::GetData => {
                let p = self.lane.next_unanswered(h.seq)?;
                let Awaits::Data { ref dst, got } = p.awaits else {
                    return Err(protocol("data for a PUT or an atomic"));
                };
                let len = dst.len();
                if let Err(status) = h.result() {
                    if h.arg != LAST {
                        return Err(protocol("a failed GET piece that is not the last"));
                    }
                    p.result = Some(Err(status));
                    self.lane.answered += 1;
                    *self.progressed = true;
                    return Ok(());
                }
                if u64::from(got) + u64::from(h.len) > u64::from(len) {
                    return Err(protocol("more GET data than asked for"));
                }
                Ok(())
            }
            Opcode::AtomicData => {
                let p = self.lane.next_unanswered(h.seq)?;
                let Awaits::Fetch { ref dst } = p.awaits else {
                    return Err(protocol("an atomic result for a PUT or a GET"));
                };
                p.result = Some(match h.result() {
                    Ok(()) => {
                        // The engine checked that the result word is 8
                        // aligned inside a live registration.
                        if let Some(dst) = dst {
                            let stored = dst.store_u64(h.operand);
                            debug_assert!(stored, "an aligned result word");
                        }
                        Ok(8)
                    }
                    Err(status) => Err(status),
                });
                self.lane.answered += 1;
                *self.progressed = true;
                Ok(())
            }
            _ => Err(protocol("unexpected answer")),
        }
    }

    fn payload(&mut self, h: &Header, at: u32, bytes: &[u8]) -> Result<(), Stop> {
        // A GET_DATA piece (the only answer with a payload), checked in
        // `header` to fit what was asked.
        let i = self.lane.answered;
        let Some(p) = self.lane.pending.get_mut(i) else {
            return Err(protocol("GET data for nothing"));
        };
        let Awaits::Data { ref dst, got } = p.awaits else {
            return Err(protocol("data for a PUT or an atomic"));
        };
        let _ = h;
        // `got + at + bytes.len() <= len` (checked in `header`, and the
        // reader's contract).
        if !dst.write(u64::from(got) + u64::from(at), bytes) {
            return Err(protocol("more GET data than asked for"));
        }
        Ok(())
    }

    fn end(&mut self, h: &Header) -> Result<(), Stop> {
        if h.opcode != Opcode::GetData || h.result().is_err() {
            return Ok(());
        }
        let i = self.lane.answered;
        let Some(p) = self.lane.pending.get_mut(i) else {
            return Err(protocol("GET data for nothing"));
        };
        let Awaits::Data {
            ref dst,
            ref mut got,
        } = p.awaits
        else {
            return Err(protocol("data for a PUT or an atomic"));
        };
        let len = dst.len();
        *got += h.len;
        let got = *got;
        if h.arg == LAST {
            if got != len {
                return Err(protocol("fewer GET bytes than asked for"));
            }
            p.result = Some(Ok(len));
            self.lane.answered += 1;
            *self.progressed = true;
        }
        Ok(())
    }
}
