//! Posting: operations and flushes queued on their lane's connection,
//! the round's doorbell (`commit`: every connection's sends in one
//! submission), and held acknowledgements.

use crate::lane::Awaits;
use crate::sys::mem::Local;
use crate::sys::requests::{self, Tag};
use crate::wire::{HEADER_LEN, Header, Opcode};
use ringfence::{DriverEp, LaneMask, Op, OpKind, Posted, Token};
use ringfence_ring::{AtomicOp, Status};

use super::*;

impl Tcp {
    /// Starts a send on every listed connection that can take one:
    /// requests first, then answers, so that held ACKs go behind what the
    /// application sent this round.
    pub(super) fn start_sends(&mut self) {
        let conns = &mut self.conns;
        let to_send = &mut self.round.to_send;
        to_send.sort_unstable_by_key(|&slot| {
            conns
                .get(slot)
                .is_some_and(|c| c.our_lane.sending().is_none())
        });
        to_send.retain(|&slot| {
            let Some(conn) = conns.live(slot) else {
                return false;
            };
            if conn.closing() {
                conn.on_send_list = false;
                return false;
            }
            // A lane's first bytes (its HELLO) wait for its connect.
            if conn.state == ConnState::Connecting || conn.send.is_sending() {
                return true;
            }
            let user_data = requests::user_data(Tag::Send, slot, conn.generation);
            if self.uring.send(conn.socket(), &mut conn.send, user_data) {
                conn.in_flight += 1;
            }
            conn.on_send_list = false;
            false
        });
    }

    /// At teardown: every held ACK is sent, as far as the socket takes it
    /// at once (a PUT the target executed is then acknowledged, as it would
    /// have been before the hold); nothing here waits for the peer.
    pub(super) fn send_held_acks(&mut self) {
        self.round.release_held_acks(&mut self.conns);
        self.start_sends();
        // A small send into a socket with room completes inside the
        // submission; its completion is taken with the others below.
        let _ = self.uring.submit();
        while let Some(cqe) = self.uring.next() {
            self.handle_teardown(cqe);
        }
    }

    /// `Driver::post`, with the operation's local memory (`None` for an
    /// atomic that does not fetch).
    pub(super) fn post_op(
        &mut self,
        ep: DriverEp,
        op: &Op,
        local: Option<Local>,
        token: Token,
    ) -> Posted {
        let rkey = match op.remote {
            Some((rkey, addr)) => match self.rkeys.get(rkey.0 as usize) {
                Some(k) if k.ep == ep.0 => Some((*k, addr)),
                _ => return Posted::Done(Err(Status::InvalidRkey)),
            },
            None => None,
        };
        let Some(endpoint) = self.eps.get_mut(ep.0) else {
            return Posted::Done(Err(Status::InvalidEndpoint));
        };
        match endpoint.state {
            EpState::Up => {}
            EpState::Failed(status) | EpState::Released(status) => {
                return Posted::Done(Err(status));
            }
            EpState::Connecting(_) => return Posted::Done(Err(Status::EndpointFailed)),
        }
        let Some(lane) = endpoint.lanes.get_mut(usize::from(op.lane)) else {
            return Posted::Done(Err(Status::InvalidArgument));
        };
        if !lane.has_room() {
            return Posted::NoResource;
        }
        // Both ways on one connection: a write waits for the GETs before
        // it, and leaves the room kept for answers (see `wire`).
        if op.kind != OpKind::Get && lane.write_waits() {
            return Posted::NoResource;
        }
        let Some(conn) = self.conns.live(lane.conn) else {
            return Posted::Done(Err(Status::PeerUnreachable));
        };
        let staged = match op.kind {
            OpKind::Put if op.len <= COPY_MAX => op.len as usize,
            OpKind::Notify => op.len as usize,
            _ => 0,
        };
        if conn.duplex && !conn.send.request_room(HEADER_LEN + staged) {
            return Posted::NoResource;
        }
        let mut h = Header {
            len: op.len,
            seq: lane.next_seq(),
            ..Header::new(Opcode::Put, op.lane)
        };
        if let Some((k, addr)) = rkey {
            h.key = k.key;
            h.secret = k.secret;
            h.addr = addr;
        }
        let (queued, awaits) = match (op.kind, local) {
            (OpKind::Put, Some(src)) if op.len <= COPY_MAX => {
                let len = op.len as usize;
                let queued = conn
                    .send
                    .push_filled(&h.encode(), len, |dst| src.copy_to(dst));
                (queued, Awaits::Ack { len: op.len })
            }
            (OpKind::Put, Some(src)) => {
                // Sent from where it is (see `push_local` for how long the
                // kernel reads it).
                let queued = conn.send.push_local(&h.encode(), &src);
                (queued, Awaits::Ack { len: op.len })
            }
            (OpKind::Get, Some(dst)) => {
                h.opcode = Opcode::Get;
                let awaits = Awaits::Data { dst, got: 0 };
                (conn.send.push_copy(&[&h.encode()]), awaits)
            }
            (OpKind::Atomic(aop), dst) => {
                h.opcode = Opcode::Atomic;
                h.arg = aop.as_raw();
                h.len = 8;
                h.operand = op.operand;
                if aop == AtomicOp::CSWAP {
                    h.operand2 = op.operand2;
                }
                (conn.send.push_copy(&[&h.encode()]), Awaits::Fetch { dst })
            }
            (OpKind::Notify, Some(src)) => {
                h = Header {
                    len: op.len,
                    seq: h.seq,
                    operand: op.operand,
                    ..Header::new(Opcode::Notify, op.lane)
                };
                let len = op.len as usize;
                let queued = conn
                    .send
                    .push_filled(&h.encode(), len, |dst| src.copy_to(dst));
                (queued, Awaits::Ack { len: op.len })
            }
            // `Local::of` gives every other operation its memory.
            (OpKind::Put | OpKind::Get | OpKind::Notify, None) => {
                return Posted::Done(Err(Status::InvalidArgument));
            }
        };
        if !queued {
            return Posted::NoResource;
        }
        lane.push(token, awaits);
        let slot = lane.conn;
        self.round.want_send(slot, conn);
        // The answer is awaited: busy receives from the commit on, or on
        // (the count starts again). Listed once per connection until the
        // commit takes the list.
        match conn.recv_mode {
            RecvMode::Multishot => {
                self.round.to_spin.push(slot);
                conn.recv_mode = RecvMode::BusyAtCommit;
            }
            RecvMode::BusyAtCommit => {}
            RecvMode::Busy { .. } => {
                conn.recv_mode = RecvMode::Busy {
                    empty_left: SPIN_ROUNDS,
                };
            }
        }
        Posted::InFlight
    }

    pub(super) fn flush_lanes(&mut self, ep: DriverEp, lanes: LaneMask, token: Token) -> Posted {
        let Some(endpoint) = self.eps.get_mut(ep.0) else {
            return Posted::Done(Err(Status::InvalidEndpoint));
        };
        if let Some(status) = endpoint.state.failed() {
            return Posted::Done(Err(status));
        }
        let Some(f) = endpoint.flushes.iter().position(Option::is_none) else {
            return Posted::NoResource;
        };
        let mut remaining = 0;
        for (i, lane) in endpoint.lanes.iter_mut().enumerate() {
            if lanes & (1 << i) == 0 || lane.pending.is_empty() {
                continue;
            }
            if lane.marks.len() == lane.marks.capacity() {
                // Undo: a flush either waits on every lane or on none.
                for l in &mut endpoint.lanes {
                    if l.marks.back().is_some_and(|&(m, _)| m == f as u32) {
                        l.marks.pop_back();
                    }
                }
                return Posted::NoResource;
            }
            lane.marks.push_back((f as u32, lane.next_seq() - 1));
            remaining += 1;
        }
        if remaining == 0 {
            return Posted::Done(Ok(0));
        }
        endpoint.flushes[f] = Some(Flush { token, remaining });
        Posted::InFlight
    }

    pub(super) fn commit_round(&mut self) {
        if !self.accept_armed {
            self.arm_accept();
        }
        // ACKs held since the last commit go now; this round's wait one
        // more (AckHold).
        self.round.age_held_acks(&mut self.conns);
        // Sends first: the kernel runs the entries in order, and a busy
        // receive ahead of a send would delay it by a receive that cannot
        // find its answer yet (SPIN_ROUNDS).
        self.start_sends();
        let mut to_spin = std::mem::take(&mut self.round.to_spin);
        for &slot in &to_spin {
            self.start_spin(slot);
        }
        to_spin.clear();
        self.round.to_spin = to_spin;
        let mut rearm = std::mem::take(&mut self.round.rearm);
        for &slot in &rearm {
            self.arm_recv(slot);
        }
        rearm.clear();
        // For the next commit: what arming asked for again, and busy
        // receives that found data this round.
        rearm.append(&mut self.round.rearm);
        rearm.append(&mut self.round.spin_next);
        self.round.rearm = rearm;
        self.round.prune_spinners(&self.conns);
        if let Err(e) = self.uring.submit() {
            tracing::warn!(%e, "tcp: io_uring submit failed");
        }
    }
}
