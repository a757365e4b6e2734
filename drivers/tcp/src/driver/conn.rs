//! One TCP connection's state: what it is doing (connecting, open,
//! closing), whose requests it carries, how it receives, and where its
//! held ACK is.

use crate::stream::Reader;
use crate::sys::requests::Socket;
use crate::sys::send::SendQueue;
use crate::target::TargetSide;
use nix::sys::socket::SockaddrStorage;
use std::collections::VecDeque;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd};

/// Busy receives that may find nothing in a row before a connection goes
/// back to its multishot receive.
///
/// A connection that a lane of ours has just posted on awaits an answer.
/// Until it comes, each commit submits one nonblocking `RECV` on it
/// (`MSG_DONTWAIT`, a provided buffer) in the round's `io_uring_enter`,
/// which takes what has arrived or fails with EAGAIN at once. The
/// multishot receive instead arms a poll: the answer's arrival queues task
/// work, the ring flags it, and only the next `io_uring_enter` receives
/// it, which cost about a quarter of a 64-byte loopback ping-pong's
/// one-way time (`cargo bench -p ringfence-benches --bench tcp_floor`:
/// `io_uring_spin` against `io_uring`). The round has its enter anyway
/// while something is to be sent; waiting, it is the one enter the round
/// may make, for a request that is pending. After this many empty ones (a
/// peer slow to answer) or one that fills a whole buffer (a stream, which
/// the multishot receive takes many buffers at a time), the multishot
/// receive comes back. While any connection busy-receives, the driver
/// answers `Sleep::NotNow` to a core thread about to sleep: nothing would
/// signal what arrives.
pub(super) const SPIN_ROUNDS: u16 = 64;

/// One TCP connection. Boxed: the kernel holds pointers into it (the
/// connect address, the send batches' msghdrs) while requests are in
/// flight, and it is freed only once none is (`in_flight`; see
/// [`sys`](crate::sys)).
///
/// A connection carries our requests when it is a lane of one of our
/// endpoints ([`OurLane::Sending`]), and the peer's requests once the peer
/// greeted on it (`serve`); both at once when one side adopted the other's
/// connection (see [`wire`](crate::wire), "Both ways on one connection").
pub(super) struct Conn {
    /// The socket.
    pub(super) fd: OwnedFd,
    /// Which use of its slot this is: completions of an earlier
    /// connection in the same slot carry another generation.
    pub(super) generation: u32,
    /// Where it is in its life: connecting, open, or closing.
    pub(super) state: ConnState,
    /// Whether a lane of ours sends requests here, or did.
    pub(super) our_lane: OurLane,
    /// The peer opened it (we accepted it); a lane of ours on it adopted
    /// it.
    pub(super) accepted: bool,
    /// The duplex rules are in force: it carries requests both ways, so
    /// room for answers is kept in every send batch and our lane's depth
    /// is capped. Set once, never cleared.
    pub(super) duplex: bool,
    /// GET data is sent straight from the window: every request the peer
    /// sends from now on comes under the duplex rules. Set by the first
    /// drain that finds our lane on it up: on an adopted connection that is
    /// once our HELLO is answered (the peer's requests before its HELLO_ACK
    /// may predate its knowing, a GET and a later PUT over its bytes among
    /// them); on our own, at once (the peer's first request is its HELLO).
    pub(super) gets_from_window: bool,
    /// The address an accepted connection comes from (an adopted lane
    /// must lead to the address the endpoint names).
    pub(super) accepted_from: Option<IpAddr>,
    /// Cuts the received bytes into frames.
    pub(super) reader: Reader,
    /// The outgoing bytes: two batches, one in the kernel.
    pub(super) send: SendQueue,
    /// The address a lane's connection connects to (the connect request
    /// points at it).
    pub(super) connect_to: SockaddrStorage,
    /// Requests in flight that name this connection (connect, send,
    /// receives); its slot is freed only once none is.
    pub(super) in_flight: u32,
    /// Its index in the ring's fixed-file table, if it has one.
    pub(super) fixed_file: Option<u32>,
    /// What receive the kernel holds for it.
    pub(super) recv: Receive,
    /// How it receives: by the multishot receive, or by busy receives
    /// while an answer is awaited.
    pub(super) recv_mode: RecvMode,
    /// It is on the driver's list of connections with bytes to send.
    pub(super) on_send_list: bool,
    /// Received buffers not yet (fully) taken by the reader: (buffer id,
    /// length, bytes taken).
    pub(super) backlog: VecDeque<(u16, u32, u32)>,
    /// The peer's requests: checked, executed, answered.
    pub(super) serve: TargetSide,
    /// Bytes a direct receive wrote into the window that the reader has
    /// not moved past yet.
    pub(super) direct_unread: u32,
    /// Where the pending cumulative ACK of an accepted connection is (see
    /// [`AckHold`]).
    pub(super) ack_hold: AckHold,
}

impl Conn {
    /// Whether it is closing (its slot goes once nothing is in flight).
    pub(super) fn closing(&self) -> bool {
        self.state == ConnState::Closing
    }

    /// Its socket as requests name it: by its fixed file when it has one
    /// (no descriptor lookup per request), else by its descriptor.
    pub(super) fn socket(&self) -> Socket {
        match self.fixed_file {
            Some(index) => Socket::Fixed(index),
            None => Socket::Fd(self.fd.as_raw_fd()),
        }
    }
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("fd", &self.fd)
            .field("state", &self.state)
            .field("our_lane", &self.our_lane)
            .field("accepted", &self.accepted)
            .field("duplex", &self.duplex)
            .field("in_flight", &self.in_flight)
            .field("recv", &self.recv)
            .field("recv_mode", &self.recv_mode)
            .finish_non_exhaustive()
    }
}

/// Where a connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ConnState {
    /// A lane's connect is in flight: its first bytes (the HELLO) wait.
    Connecting,
    /// Established: bytes go both ways.
    Open,
    /// Shut down, its requests canceled: the slot is freed once the last
    /// one has completed. Nothing is sent or taken from it any more.
    Closing,
}

/// Whether a lane of ours sends its requests on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OurLane {
    /// None ever did: a connection the peer opened, not adopted (yet).
    Never,
    /// Lane `lane` of our endpoint `ep` sends its requests here.
    Sending { ep: u32, lane: u8 },
    /// A lane of ours did, and let go (its endpoint failed or was
    /// released): answers that still come are dropped, not a protocol
    /// error.
    LetGo,
}

impl OurLane {
    /// The endpoint and lane that send here, if one does.
    pub(super) fn sending(self) -> Option<(u32, u8)> {
        match self {
            OurLane::Sending { ep, lane } => Some((ep, lane)),
            _ => None,
        }
    }

    /// The lane lets go; returns the endpoint and lane that sent here, if
    /// one did until now.
    pub(super) fn let_go(&mut self) -> Option<(u32, u8)> {
        let sending = self.sending();
        if sending.is_some() {
            *self = OurLane::LetGo;
        }
        sending
    }
}

/// How a connection receives (see [`SPIN_ROUNDS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RecvMode {
    /// By the multishot receive.
    Multishot,
    /// By the multishot receive until the commit, which starts busy
    /// receives: a lane posted a request here this round (the connection
    /// is on the round's `to_spin` list once).
    BusyAtCommit,
    /// By one nonblocking receive per commit: `empty_left` more may find
    /// nothing before the multishot receive comes back (at 0, the next
    /// arming brings it back).
    Busy { empty_left: u16 },
}

impl RecvMode {
    /// Whether the connection busy-receives.
    pub(super) fn busy(self) -> bool {
        matches!(self, RecvMode::Busy { .. })
    }
}

/// The receive the kernel holds for a connection, and where it is in
/// receiving a large PUT's payload straight into its window (no copy
/// through the receive buffers): the buffer receive is stopped, a receive
/// of exactly the rest of the payload into the window runs, then the
/// buffer receive is armed again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Receive {
    /// None: one is armed at the next commit (the connection is on the
    /// round's `rearm` list) or once its connect completes.
    Idle,
    /// A receive into the provided buffers is in flight: the multishot one
    /// or a busy one (or the multishot one, canceled, ending so that busy
    /// receives start).
    Buffers,
    /// The buffer receive in flight is being canceled for a direct
    /// receive; what it still delivers is taken as usual.
    StoppingForDirect,
    /// A direct receive is to start where the next buffer receive would
    /// (asked for while busy receiving, with none in flight).
    DirectNext,
    /// A receive into the window of registration `key` was started: in
    /// flight until its completion, after which the next receive replaces
    /// it (on a closing connection it stays, and counts only while
    /// anything is in flight: `holds_key`).
    Direct { key: u32 },
}

impl Receive {
    /// Whether a direct receive is asked for or in flight.
    pub(super) fn is_direct(self) -> bool {
        !matches!(self, Receive::Idle | Receive::Buffers)
    }

    /// Whether a direct receive is asked for but not started yet.
    pub(super) fn stopping(self) -> bool {
        matches!(self, Receive::StoppingForDirect | Receive::DirectNext)
    }

    /// The buffer receive in flight has ended (its last completion).
    pub(super) fn buffer_receive_ended(&mut self) {
        *self = match *self {
            Receive::Buffers => Receive::Idle,
            Receive::StoppingForDirect => Receive::DirectNext,
            other => other,
        };
    }

    /// No direct receive after all: back to the buffer receive (in flight
    /// or not).
    pub(super) fn direct_off(&mut self) {
        *self = match *self {
            Receive::StoppingForDirect => Receive::Buffers,
            Receive::DirectNext | Receive::Direct { .. } => Receive::Idle,
            other => other,
        };
    }
}

/// An accepted connection's pending ACK, held back one round.
///
/// The round whose `poll` executes a PUT returns without sending its ACK;
/// the next round's `commit` sends it, after that round's own requests.
/// Why: a peer that polls the PUT's window (a ping-pong, a flag word) sees
/// the data as soon as `progress` returns, instead of after an
/// `io_uring_enter` that pushes the ACK through the kernel's TCP stack
/// (about 4 µs of an 11 µs one-way latency on loopback). The ACK then
/// travels in the same `io_uring_enter` as the answer the application
/// sends, behind it. ACKs are cumulative, so those of several rounds'
/// PUTs go as one. Answers that carry data (GET data, atomic results) and
/// failures are not held, and take a held ACK with them (answers keep
/// their order).
///
/// No ACK is left behind by a sleeping core thread: while one is held the
/// driver answers `Sleep::NotNow` to `prepare_sleep`, so the core thread
/// runs the round that sends it before it sleeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AckHold {
    /// No ACK pending, or one the reader is to queue itself.
    None,
    /// Produced in this round: kept by this round's `commit`.
    Fresh,
    /// Kept by one `commit`: the next one sends it.
    Aged,
}
