//! Connections and the endpoints over them: accepting, opening a lane's
//! connection or adopting the peer's, greeting, closing, releasing and
//! freeing connections, and failing endpoints.

use crate::MAX_LEN;
use crate::lane::Lane;
use crate::stream::Reader;
use crate::sys::requests::{self, Tag};
use crate::sys::send::SendQueue;
use crate::target::TargetSide;
use crate::wire::{Address, HEADER_LEN, Header, Opcode};
use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, SockaddrStorage};
use ringfence::{Connect, DriverEp, DriverError, Token};
use ringfence_ring::Status;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use super::conn::AckHold;
use super::*;

impl Tcp {
    pub(super) fn arm_accept(&mut self) {
        if self.accept_armed {
            return;
        }
        // The listener lives as long as the driver, whose teardown waits
        // for this request to end.
        let user_data = requests::user_data(Tag::Accept, 0, 0);
        if self.uring.accept_multi(self.listener.as_fd(), user_data) {
            self.accept_armed = true;
        }
    }

    /// Puts a new connection in a free slot; returns the slot.
    pub(super) fn add_conn(
        &mut self,
        fd: OwnedFd,
        our_lane: Option<(u32, u8)>,
        connect_to: SockaddrStorage,
    ) -> u32 {
        let notify_size = self.notify.as_ref().map_or(0, |p| p.buffer_size() as usize);
        let send_buffer = self.config.send_buffer;
        let uring = &mut self.uring;
        // A lane's own connection connects first; an accepted one is open.
        let (state, lane) = match our_lane {
            Some((ep, lane)) => (ConnState::Connecting, OurLane::Sending { ep, lane }),
            None => (ConnState::Open, OurLane::Never),
        };
        self.conns.insert(|slot, generation| Conn {
            fixed_file: uring.fix(slot, fd.as_raw_fd()),
            fd,
            generation,
            state,
            our_lane: lane,
            accepted: our_lane.is_none(),
            duplex: false,
            gets_from_window: false,
            accepted_from: None,
            reader: Reader::new(MAX_LEN),
            send: SendQueue::new(send_buffer, 1024),
            connect_to,
            in_flight: 0,
            recv: Receive::Idle,
            recv_mode: RecvMode::Multishot,
            on_send_list: false,
            backlog: VecDeque::with_capacity(usize::from(uring.buffer_count())),
            serve: TargetSide::new(notify_size),
            direct_unread: 0,
            ack_hold: AckHold::None,
        })
    }

    /// Starts closing a connection: the kernel's requests on it end
    /// (shutdown, then cancel), and the slot is freed when the last one
    /// has completed. A lane's endpoint fails with `status`, except a lane
    /// on an adopted connection that is not up yet: it opens a connection
    /// of its own instead (the peer closed its side before it saw our
    /// HELLO).
    pub(super) fn close_conn(&mut self, slot: u32, status: Status) {
        let Some(conn) = self.conns.live(slot) else {
            return;
        };
        if conn.closing() {
            return;
        }
        conn.state = ConnState::Closing;
        conn.send.discard();
        let our_lane = conn.our_lane.let_go();
        // A lane of ours on a connection we accepted adopted it.
        let adopted = conn.accepted;
        let generation = conn.generation;
        let fd = conn.fd.as_raw_fd();
        // Ends a receive and a send in progress at once.
        let _ = socket::shutdown(fd, socket::Shutdown::Both);
        if conn.in_flight > 0 {
            let user_data = requests::user_data(Tag::Cancel, slot, generation);
            let _ = self.uring.cancel_fd(fd, user_data);
        }
        self.recycle_backlog(slot);
        if let Some((ep, lane)) = our_lane
            && !(adopted && self.reopen_lane(ep, lane))
        {
            self.fail_ep(ep, status);
        }
        self.maybe_free(slot);
    }

    /// Lane `lane` of connecting endpoint `e` lost the adopted connection
    /// before its HELLO was answered: it opens its own. `false` if the lane
    /// was up already, or the endpoint is not connecting, or no socket.
    pub(super) fn reopen_lane(&mut self, e: u32, lane: u8) -> bool {
        let Some(ep) = self.eps.get(e) else {
            return false;
        };
        let up = ep.lanes.get(usize::from(lane)).is_none_or(|l| l.up);
        let tearing_down = self.teardown.is_some();
        if up || tearing_down || !matches!(ep.state, EpState::Connecting(_)) {
            return false;
        }
        let (peer, lanes) = (ep.peer, ep.lanes.len() as u8);
        match self.open_lane(e, lane, lanes, &peer) {
            Ok(slot) => {
                tracing::debug!(
                    ep = e,
                    lane,
                    "tcp: adopted connection lost; lane reconnects"
                );
                let depth = self.config.depth;
                if let Some(l) = self.eps.lane_mut(e, lane) {
                    *l = Lane::new(slot, depth);
                }
                true
            }
            Err(_) => false,
        }
    }

    /// Opens connection `lane` of endpoint `e` (of `lanes`) to `peer`: the
    /// socket, the connect, and the HELLO that follows it.
    pub(super) fn open_lane(
        &mut self,
        e: u32,
        lane: u8,
        lanes: u8,
        peer: &Address,
    ) -> Result<u32, DriverError> {
        let family = match peer.socket {
            SocketAddr::V4(_) => AddressFamily::Inet,
            SocketAddr::V6(_) => AddressFamily::Inet6,
        };
        let fd = socket::socket(family, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)
            .map_err(|e| io_err("socket", e))?;
        tune(&fd, self.config.timeout)?;
        let slot = self.add_conn(fd, Some((e, lane)), SockaddrStorage::from(peer.socket));
        self.queue_hello(slot, e, lane, lanes, peer.instance);
        let conn = self.conns.live(slot).expect("just added");
        // The address lives in the boxed connection, which is freed only
        // after this request completes (`in_flight`).
        let user_data = requests::user_data(Tag::Connect, slot, conn.generation);
        if self
            .uring
            .connect(conn.socket(), &conn.connect_to, user_data)
        {
            conn.in_flight += 1;
        }
        Ok(slot)
    }

    /// An accepted connection from the worker at `peer` that a new lane
    /// can carry its requests on (see [`wire`](crate::wire), "Both ways
    /// on one connection"): greeted by that instance, from that address,
    /// not a lane of ours already, and not paused answering.
    pub(super) fn adoptable(&self, peer: &Address) -> Option<u32> {
        let fits = |c: &Conn| {
            c.accepted
                && c.our_lane == OurLane::Never
                && !c.closing()
                && c.serve.serving()
                && c.serve.peer_instance == peer.instance
                && c.accepted_from == Some(peer.socket.ip())
                && !c.serve.answering_get()
                && c.backlog.is_empty()
                // Nothing queued or in flight: our HELLO fits, and the room
                // kept for answers is free from the first batch on.
                && c.send.queued() == 0
                && !c.send.is_sending()
        };
        self.conns
            .iter()
            .find(|&(_, c)| fits(c))
            .map(|(slot, _)| slot)
    }

    /// Queues the HELLO of lane `lane` (of `lanes`) of endpoint `e` on
    /// `slot`, sent once the connection is established.
    pub(super) fn queue_hello(&mut self, slot: u32, e: u32, lane: u8, lanes: u8, instance: u64) {
        let hello = Header {
            arg: lanes,
            seq: self.address.instance,
            addr: u64::from(e),
            operand: instance,
            ..Header::new(Opcode::Hello, lane)
        };
        let Some(conn) = self.conns.live(slot) else {
            return;
        };
        // A new connection is empty, and an adopted one has nothing queued
        // (`adoptable`).
        let queued = conn.send.push_copy(&[&hello.encode()]);
        debug_assert!(queued, "a HELLO fits");
        self.round.want_send(slot, conn);
    }

    /// Lets go of `slot` as a lane of ours (its endpoint failed or was
    /// released): if the peer still sends requests on it, we say BYE and
    /// go on serving; else it closes. It closes too while a batch still
    /// reads our requests' local memory: they are reported failed at the
    /// next `poll`, after which the application may reuse that memory, and
    /// only a socket shut down for writing stops the kernel from reading
    /// it (a released endpoint has nothing in flight: only a failed one
    /// can).
    pub(super) fn release_conn(&mut self, slot: u32, status: Status) {
        let Some(conn) = self.conns.live(slot) else {
            return;
        };
        if conn.closing() {
            return;
        }
        if conn.our_lane.let_go().is_none() {
            return;
        }
        let bye = Header::new(Opcode::Bye, 0).encode();
        if conn.serve.serving() && !conn.send.holds_local() && conn.send.push_copy(&[&bye]) {
            self.round.want_send(slot, conn);
        } else {
            self.close_conn(slot, status);
        }
    }

    /// After a change on `slot`: the duplex rules come into force once it
    /// carries requests both ways, and a connection that carries none any
    /// more closes.
    pub(super) fn settle(&mut self, slot: u32) {
        let Some(conn) = self.conns.live(slot) else {
            return;
        };
        if conn.closing() {
            return;
        }
        match conn.our_lane {
            OurLane::Sending { ep: e, lane } if conn.serve.greeted() && !conn.duplex => {
                conn.duplex = true;
                conn.send.reserve_answers(ANSWER_ROOM, HEADER_LEN);
                if let Some(lane) = self.eps.lane_mut(e, lane) {
                    lane.make_duplex();
                }
                tracing::debug!(slot, "tcp: connection carries requests both ways");
            }
            OurLane::Never if conn.serve.ended() => {
                // The peer sends no more requests, and we never did.
                self.close_conn(slot, Status::Canceled);
                return;
            }
            OurLane::LetGo if !conn.serve.serving() => {
                // Neither side sends requests on it any more.
                self.close_conn(slot, Status::Canceled);
                return;
            }
            _ => {}
        }
        // A held HELLO_ACK goes once the answer room is free, whether or
        // not a lane of ours still sends here (the peer's lane waits for it).
        if conn.serve.release_hello_ack(&mut conn.send) {
            self.round.want_send(slot, conn);
        }
    }

    pub(super) fn recycle_backlog(&mut self, slot: u32) {
        let Some(conn) = self.conns.live(slot) else {
            return;
        };
        let bids = conn.backlog.drain(..).map(|(bid, _, _)| bid);
        self.uring.recycle(bids);
    }

    /// Frees a closing connection once nothing in flight names it.
    pub(super) fn maybe_free(&mut self, slot: u32) {
        if let Some(conn) = self.conns.take_finished(slot)
            && let Some(index) = conn.fixed_file
        {
            self.uring.unfix(index);
        }
    }

    /// Fails endpoint `e`: every request not yet answered completes with
    /// `status`, so do its flushes and a connect in progress, and its
    /// connections close.
    pub(super) fn fail_ep(&mut self, e: u32, status: Status) {
        let Some(conns) = self.eps.fail(e, status) else {
            return;
        };
        // The failing connection is closing already; the others close, or
        // go on carrying the peer's requests (BYE).
        for slot in conns {
            self.release_conn(slot, status);
        }
    }

    /// Opens `lanes` connections, or takes the peer's own (`adoptable`),
    /// and greets the peer on each; the endpoint is up when every HELLO is
    /// answered (reported through `poll`).
    pub(super) fn connect_peer(
        &mut self,
        peer: &[u8],
        lanes: u8,
        token: Token,
    ) -> Result<Connect, DriverError> {
        let address = Address::decode(peer)
            .ok_or_else(|| err(Status::InvalidArgument, "malformed tcp address"))?;
        if lanes == 0 || lanes > self.config.max_lanes {
            return Err(err(Status::InvalidArgument, "lanes out of range"));
        }
        let e = self.eps.free_handle();
        let mut slots = Vec::with_capacity(usize::from(lanes));
        for lane in 0..lanes {
            if let Some(slot) = self.adoptable(&address) {
                let conn = self.conns.live(slot).expect("adoptable");
                conn.our_lane = OurLane::Sending { ep: e, lane };
                self.queue_hello(slot, e, lane, lanes, address.instance);
                slots.push(slot);
                continue;
            }
            match self.open_lane(e, lane, lanes, &address) {
                Ok(slot) => slots.push(slot),
                Err(error) => {
                    // Nothing of the endpoint stays: opened connections
                    // close; adopted ones, whose HELLO is queued, say BYE
                    // after it and go back to serving only.
                    for slot in slots {
                        self.release_conn(slot, Status::Canceled);
                    }
                    return Err(error);
                }
            }
        }
        let depth = self.config.depth;
        self.eps.insert(
            e,
            Ep {
                peer: address,
                state: EpState::Connecting(token),
                lanes: slots.iter().map(|&s| Lane::new(s, depth)).collect(),
                flushes: (0..MAX_FLUSHES).map(|_| None).collect(),
                on_report_list: false,
            },
        );
        for &slot in &slots {
            self.settle(slot);
        }
        self.uring
            .submit()
            .map_err(|e| io_err("io_uring submit", e))?;
        tracing::debug!(ep = e, peer = %address.socket, lanes, "tcp connecting");
        Ok(Connect::InFlight(DriverEp(e)))
    }

    pub(super) fn disconnect_ep(&mut self, ep: DriverEp) {
        let Some(endpoint) = self.eps.get(ep.0) else {
            return;
        };
        if endpoint.state.failed().is_none() {
            self.fail_ep(ep.0, Status::Canceled);
        } else {
            self.eps.report(ep.0);
        }
        // Failed by now: the slot goes once everything is reported.
        self.eps.release(ep.0);
    }
}
