//! The completion queue: what each io_uring completion means (an accept,
//! a connect, a send, a receive into the ring of buffers or straight into
//! registered memory), the frames a receive carries, and the completions
//! handed to the engine.

use crate::lane::Answers;
use crate::stream::{Broken, Handler, Stop};
use crate::sys::requests::{self, Cqe, Tag};
use crate::sys::send::Sent;
use crate::target::Requests;
use crate::wire::{Header, Opcode};
use io_uring::cqueue;
use nix::libc::{EAGAIN, ECANCELED, ENOBUFS};
use nix::sys::socket::{self, SockaddrStorage};
use ringfence_ring::Status;
use std::os::fd::AsRawFd;

use super::*;

/// The frames of one connection: the peer's requests go to the target
/// side, answers to our lane's requests to the lane (dropped once our lane
/// has let go of the connection).
struct Frames<'a, 'b> {
    requests: Requests<'a>,
    answers: Option<Answers<'b>>,
    /// A lane of ours used this connection: answers without a lane are
    /// late ones, not a protocol error.
    drop_answers: bool,
}

impl Frames<'_, '_> {
    /// Where frame `h` goes: the target side, our lane, or nowhere (a late
    /// answer).
    fn to(&mut self, h: &Header) -> Result<Option<&mut dyn Handler>, Stop> {
        if h.opcode.is_request() {
            return Ok(Some(&mut self.requests));
        }
        match &mut self.answers {
            Some(a) => Ok(Some(a)),
            None if self.drop_answers => Ok(None),
            None => Err(Stop::Fail(Broken::Protocol(
                "a response on a target's connection",
            ))),
        }
    }
}

impl Handler for Frames<'_, '_> {
    fn header(&mut self, h: &Header) -> Result<(), Stop> {
        self.to(h)?.map_or(Ok(()), |to| to.header(h))
    }

    fn payload(&mut self, h: &Header, at: u32, bytes: &[u8]) -> Result<(), Stop> {
        self.to(h)?.map_or(Ok(()), |to| to.payload(h, at, bytes))
    }

    fn end(&mut self, h: &Header) -> Result<(), Stop> {
        self.to(h)?.map_or(Ok(()), |to| to.end(h))
    }
}

impl Tcp {
    pub(super) fn handle(&mut self, cqe: Cqe) {
        let Some((tag, slot, generation)) = requests::parse_user_data(cqe.user_data()) else {
            return;
        };
        let (res, flags) = (cqe.result(), cqe.flags());
        match tag {
            Tag::Accept => self.on_accept(cqe),
            Tag::Connect => self.on_connect(slot, generation, res),
            Tag::Send => self.on_send(slot, generation, res),
            Tag::Recv => self.on_recv(slot, generation, res, flags),
            Tag::Direct => self.on_direct(slot, generation, res),
            Tag::Cancel => {}
        }
    }

    pub(super) fn on_accept(&mut self, cqe: Cqe) {
        let (res, flags) = (cqe.result(), cqe.flags());
        if !cqueue::more(flags) {
            // Re-armed at the next commit (canceled when the submitting
            // thread exited, or out of resources).
            self.accept_armed = false;
        }
        // A successful accept returns a new descriptor, ours from now on.
        let Some(fd) = cqe.into_accepted() else {
            tracing::debug!(errno = -res, "tcp accept failed");
            return;
        };
        if let Err(e) = tune(&fd, self.config.timeout) {
            tracing::debug!(%e, "tcp: accepted connection dropped");
            return;
        }
        let peer_ip = socket::getpeername::<SockaddrStorage>(fd.as_raw_fd())
            .ok()
            .and_then(|a| {
                a.as_sockaddr_in()
                    .map(|v4| std::net::IpAddr::V4(v4.ip()))
                    .or_else(|| a.as_sockaddr_in6().map(|v6| std::net::IpAddr::V6(v6.ip())))
            });
        let peer = SockaddrStorage::from(std::net::SocketAddr::from(([0, 0, 0, 0], 0)));
        let slot = self.add_conn(fd, None, peer);
        if let Some(conn) = self.conns.live(slot) {
            conn.accepted_from = peer_ip;
        }
        self.arm_recv(slot);
    }

    pub(super) fn on_connect(&mut self, slot: u32, generation: u32, res: i32) {
        let Some(conn) = self.conns.at(slot, generation) else {
            return;
        };
        conn.in_flight -= 1;
        if conn.closing() {
            self.maybe_free(slot);
            return;
        }
        if res < 0 {
            tracing::debug!(errno = -res, "tcp connect failed");
            self.close_conn(slot, Status::PeerUnreachable);
            return;
        }
        conn.state = ConnState::Open;
        self.arm_recv(slot);
    }

    pub(super) fn on_send(&mut self, slot: u32, generation: u32, res: i32) {
        let Some(conn) = self.conns.at(slot, generation) else {
            return;
        };
        conn.in_flight -= 1;
        if conn.closing() {
            self.maybe_free(slot);
            return;
        }
        if res < 0 {
            tracing::debug!(errno = -res, "tcp send failed");
            self.close_conn(slot, Status::PeerUnreachable);
            return;
        }
        match conn.send.sent(res as usize) {
            Sent::Done => {}
            Sent::More => {
                let user_data = requests::user_data(Tag::Send, slot, conn.generation);
                if self
                    .uring
                    .send_rest(conn.socket(), &mut conn.send, user_data)
                {
                    conn.in_flight += 1;
                }
                return;
            }
        }
        // Room freed: a paused reader (answers waiting for room) goes on.
        if conn.accepted || conn.serve.greeted() {
            self.drain(slot);
        }
        if let Some(conn) = self.conns.live(slot) {
            self.round.want_send(slot, conn);
        }
    }

    pub(super) fn on_recv(&mut self, slot: u32, generation: u32, res: i32, flags: u32) {
        let bid = cqueue::buffer_select(flags);
        let Some(conn) = self.conns.at(slot, generation) else {
            self.uring.recycle(bid);
            return;
        };
        let more = cqueue::more(flags);
        if !more {
            conn.recv.buffer_receive_ended();
            conn.in_flight -= 1;
        }
        if conn.closing() {
            self.uring.recycle(bid);
            self.maybe_free(slot);
            return;
        }
        match (res, bid) {
            (n, Some(bid)) if n > 0 => {
                if let RecvMode::Busy { empty_left } = &mut conn.recv_mode
                    && n as u32 >= self.config.recv_buffer_size
                {
                    // A full buffer: a stream, which the multishot
                    // receive takes faster (many buffers per entry).
                    *empty_left = 0;
                }
                conn.backlog.push_back((bid, n as u32, 0));
                let busy = conn.recv_mode.busy();
                self.drain(slot);
                if !more {
                    if busy && self.conns.live(slot).is_some_and(|c| !c.recv.is_direct()) {
                        // Not in this round's commit: the application
                        // sees what came without waiting for another
                        // `io_uring_enter` (as AckHold).
                        self.round.spin_next.push(slot);
                    } else {
                        self.receive_again(slot);
                    }
                }
            }
            (n, _) if n == -EAGAIN && conn.recv_mode.busy() => {
                // A busy receive found nothing.
                if let RecvMode::Busy { empty_left } = &mut conn.recv_mode {
                    *empty_left = empty_left.saturating_sub(1);
                }
                self.uring.recycle(bid);
                self.receive_again(slot);
            }
            (n, _) if n == -ENOBUFS || n == -ECANCELED => {
                // Out of receive buffers, canceled when the thread that
                // armed it exited, or stopped for a direct receive.
                self.uring.recycle(bid);
                self.receive_again(slot);
            }
            (0, _) => {
                self.uring.recycle(bid);
                let clean = conn.reader.eof().is_ok();
                let status = if clean {
                    Status::PeerUnreachable
                } else {
                    tracing::debug!("tcp: peer closed inside a frame");
                    Status::Transport
                };
                self.close_conn(slot, status);
            }
            (n, _) => {
                self.uring.recycle(bid);
                tracing::debug!(errno = -n, "tcp receive failed");
                self.close_conn(slot, Status::PeerUnreachable);
            }
        }
    }

    /// The multishot receive of `slot` ended: a direct receive starts if
    /// one was asked for, else the multishot receive is armed again at the
    /// next commit.
    pub(super) fn receive_again(&mut self, slot: u32) {
        let Some(conn) = self.conns.live(slot) else {
            return;
        };
        if conn.closing() {
            return;
        }
        if conn.recv.stopping() {
            self.start_direct(slot);
        } else {
            self.round.rearm.push(slot);
        }
    }

    /// Receives the rest of the current PUT's payload straight into its
    /// window, if the reader is still inside it; else goes back to the
    /// multishot receive.
    pub(super) fn start_direct(&mut self, slot: u32) {
        let Some(conn) = self.conns.live(slot) else {
            return;
        };
        // Called once the buffer receive has ended (`receive_again`,
        // `on_direct`) or when none is in flight (`arm_recv`).
        debug_assert!(
            !matches!(conn.recv, Receive::Buffers | Receive::StoppingForDirect),
            "a direct receive beside a buffer receive"
        );
        // Only a PUT's payload: the reader may have moved on to an answer's
        // (GET data for a lane of ours) since the multishot was stopped.
        let target = match (conn.reader.in_payload(), conn.serve.write_target()) {
            (Some((h, at)), Some(span)) if conn.backlog.is_empty() && h.opcode == Opcode::Put => {
                span.from(at).map(|rest| (h, rest))
            }
            _ => None,
        };
        let Some((h, rest)) = target else {
            conn.recv.direct_off();
            self.round.rearm.push(slot);
            return;
        };
        // The rest of the PUT's range, checked when its header came; the
        // memory stays until this receive completes: `quiesce` of a
        // deregistered window answers `Pending` until it has (or `Leak`).
        let user_data = requests::user_data(Tag::Direct, slot, conn.generation);
        if self.uring.recv_direct(conn.socket(), rest, user_data) {
            conn.in_flight += 1;
            conn.recv = Receive::Direct { key: h.key };
        } else {
            conn.recv.direct_off();
            self.round.rearm.push(slot);
        }
    }

    pub(super) fn on_direct(&mut self, slot: u32, generation: u32, res: i32) {
        let Some(conn) = self.conns.at(slot, generation) else {
            return;
        };
        conn.in_flight -= 1;
        if conn.closing() {
            self.maybe_free(slot);
            return;
        }
        if res <= 0 {
            let status = if res == 0 {
                Status::Transport
            } else {
                Status::PeerUnreachable
            };
            tracing::debug!(errno = -res, "tcp direct receive ended");
            self.close_conn(slot, status);
            return;
        }
        conn.direct_unread = res as u32;
        // Moves the reader past the bytes received into the window
        // (answering the PUT if they were its last), then takes whatever
        // else is queued.
        self.drain(slot);
        let Some(conn) = self.conns.live(slot) else {
            return;
        };
        if conn.closing() {
            return;
        }
        // A short receive (a signal): the rest, straight again.
        self.start_direct(slot);
    }

    /// Feeds connection `slot`'s received bytes to its reader, as far as
    /// the reader takes them.
    pub(super) fn drain(&mut self, slot: u32) {
        // The connection, our lane, the windows and the ring's buffers are
        // borrowed together: each through its own field, not through a
        // method of `self`, until the connection closes or settles below.
        let Some(conn) = self.conns.live(slot) else {
            return;
        };
        let mut broken: Option<Broken> = None;
        let mut refused = None;
        let mut progressed = false;
        // Our lane's answers, if a lane of ours sends on this connection.
        let our_lane = conn.our_lane.sending().and_then(|(e, lane)| {
            let endpoint = self.eps.get_mut(e)?;
            let instance = endpoint.peer.instance;
            Some((e, endpoint.lanes.get_mut(usize::from(lane))?, instance))
        });
        let our_ep = our_lane.as_ref().map(|&(e, _, _)| e);
        if our_lane.as_ref().is_some_and(|(_, lane, _)| lane.up) {
            conn.gets_from_window = true;
        }
        let mut handler = Frames {
            requests: Requests {
                serve: &mut conn.serve,
                send: &mut conn.send,
                regs: &self.regs,
                notify: self.notify.as_deref(),
                instance: self.address.instance,
                gets_from_window: conn.gets_from_window,
                hold_hello_ack: conn.our_lane.sending().is_some(),
            },
            answers: our_lane.map(|(_, lane, instance)| Answers {
                lane,
                instance,
                refused: &mut refused,
                progressed: &mut progressed,
            }),
            drop_answers: conn.our_lane != OurLane::Never,
        };
        let direct_unread = std::mem::take(&mut conn.direct_unread);
        if direct_unread > 0
            && let Err(b) = conn.reader.advance(direct_unread, &mut handler)
        {
            broken = Some(b);
        }
        // A frame paused earlier goes first.
        let mut go = broken.is_none() && handler.requests.pump_get();
        if go {
            match conn.reader.feed(&[], &mut handler) {
                Ok(_) => {}
                Err(b) => broken = Some(b),
            }
        }
        while go && broken.is_none() {
            let Some(&mut (bid, len, ref mut taken)) = conn.backlog.front_mut() else {
                break;
            };
            let data = self.uring.buffer(bid, len as usize).unwrap_or_default();
            let rest = data.get(*taken as usize..).unwrap_or_default();
            match conn.reader.feed(rest, &mut handler) {
                Ok(n) => {
                    *taken += n as u32;
                    if *taken >= len {
                        conn.backlog.pop_front();
                        self.uring.recycle_later(bid);
                    } else {
                        go = false; // paused: waits for send room
                    }
                }
                Err(b) => broken = Some(b),
            }
        }
        // Answers with data are queued already; the ACK of what this round
        // took waits for the next round's commit (AckHold).
        self.round.hold_ack(slot, conn);
        // Inside a large PUT's payload: the rest goes straight into the
        // window once the multishot receive has stopped.
        if let Some((h, at)) = conn.reader.in_payload() {
            let big = h.opcode == Opcode::Put && h.len - at >= self.config.direct_min;
            // A buffer receive in flight is stopped; busy receiving with
            // none in flight, the direct receive starts where the next one
            // would.
            let can_stop = match conn.recv {
                Receive::Buffers => true,
                Receive::Idle => conn.recv_mode.busy(),
                _ => false,
            };
            if big && can_stop && conn.serve.write_target().is_some() {
                if conn.recv == Receive::Buffers {
                    let recv = requests::user_data(Tag::Recv, slot, conn.generation);
                    let cancel = requests::user_data(Tag::Cancel, slot, conn.generation);
                    if self.uring.cancel(recv, cancel) {
                        conn.recv = Receive::StoppingForDirect;
                    }
                } else {
                    // Started by the next `arm_recv`.
                    conn.recv = Receive::DirectNext;
                }
            }
        }
        if let Some(e) = our_ep {
            // A failed endpoint was put on the report list when it failed.
            let failed = self.eps.get(e).is_none_or(|ep| ep.state.failed().is_some());
            if progressed && !failed {
                self.eps.report(e);
            }
        }
        self.round.want_send(slot, conn);
        self.uring.recycle_taken();
        if let Some(b) = broken {
            tracing::debug!(?b, "tcp: connection closed: broken stream");
            self.close_conn(slot, Status::Transport);
        } else if let Some(status) = refused {
            self.close_conn(slot, status);
        } else {
            self.settle(slot);
        }
    }

    pub(super) fn arm_recv(&mut self, slot: u32) {
        let Some(conn) = self.conns.live(slot) else {
            return;
        };
        if conn.closing() {
            return;
        }
        match conn.recv {
            Receive::Buffers | Receive::StoppingForDirect | Receive::Direct { .. } => return,
            Receive::DirectNext => {
                // Asked for while busy receiving, with no receive in flight.
                self.start_direct(slot);
                return;
            }
            Receive::Idle => {}
        }
        if conn.recv_mode == (RecvMode::Busy { empty_left: 0 }) {
            conn.recv_mode = RecvMode::Multishot;
        }
        let user_data = requests::user_data(Tag::Recv, slot, conn.generation);
        let armed = if conn.recv_mode.busy() {
            // Nonblocking: it takes what is there or fails with EAGAIN
            // inside this round's `io_uring_enter`, and arms no poll.
            self.uring.recv_busy(conn.socket(), user_data)
        } else {
            self.uring.recv_multi(conn.socket(), user_data)
        };
        // The descriptor stays open while the request is in flight
        // (`in_flight`).
        if armed {
            conn.recv = Receive::Buffers;
            conn.in_flight += 1;
        }
    }

    /// A lane of ours posted a request on connection `slot`: its answer is
    /// awaited, so the connection receives by busy receives from the next
    /// commit on (see [`SPIN_ROUNDS`]). The multishot receive, if armed, is
    /// canceled; its last completion arms the first busy receive.
    pub(super) fn start_spin(&mut self, slot: u32) {
        let Some(conn) = self.conns.live(slot) else {
            return;
        };
        let busy = RecvMode::Busy {
            empty_left: SPIN_ROUNDS,
        };
        if conn.recv_mode.busy() {
            // Busy receiving already: the count starts again.
            conn.recv_mode = busy;
            return;
        }
        if conn.closing() {
            return;
        }
        conn.recv_mode = busy;
        self.round.spinners.push(slot);
        if conn.recv == Receive::Buffers {
            let recv = requests::user_data(Tag::Recv, slot, conn.generation);
            let cancel = requests::user_data(Tag::Cancel, slot, conn.generation);
            let _ = self.uring.cancel(recv, cancel);
        }
    }
}
