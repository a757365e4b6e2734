//! The `Driver` implementation: connections, endpoints, registrations, and
//! the progress loop over the io_uring.

use crate::lane::{Answers, Lane, Wants};
use crate::send::{SendQueue, Sent};
use crate::stream::{Broken, Handler, Reader, Stop};
use crate::target::{Reg, Requests, Serve};
use crate::uring::{self, BUF_GROUP, Tag, Uring, libc_errno};
use crate::wire::{Address, DUPLEX_DEPTH, HEADER_LEN, Header, KeyBlob, Opcode};
use crate::{Config, MAX_LEN};
use io_uring::{cqueue, opcode, squeue, types};
use nix::libc;
use nix::sys::socket::{
    self, AddressFamily, SockFlag, SockType, SockaddrLike, SockaddrStorage, sockopt,
};
use ringfence::{
    Capabilities, Completion, Connect, Driver, DriverContext, DriverEp, DriverError, DriverMemKey,
    DriverRkey, KeyPart, LaneMask, MemDesc, MemKind, NotifyPool, Op, OpKind, PeerLimits, Posted,
    Prepared, Quiesce, Quiesced, Registered, Sleep, Token, Unpacked, peer_mem,
};
use ringfence_ring::{AtomicOp, Status};
use std::collections::VecDeque;
use std::mem::ManuallyDrop;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// PUT payloads up to this size are copied into the send batch; larger
/// ones are sent from the registered memory itself.
const COPY_MAX: u32 = 4096;
/// Answers whose room a connection that carries requests both ways keeps
/// in each send batch: one for every request the peer may keep in flight,
/// its HELLO_ACK, a held ACK and our BYE.
const ANSWER_ROOM: usize = DUPLEX_DEPTH + 3;
/// The smallest send batch: the answer room and, beside it, a staged PUT
/// with room to spare (below it a lane that carries requests both ways
/// could never post).
pub(crate) const MIN_SEND_BUFFER: usize =
    ANSWER_ROOM * HEADER_LEN + COPY_MAX as usize + 2 * HEADER_LEN;
/// Flushes in flight per endpoint.
const MAX_FLUSHES: usize = 64;
/// Completions handled per `poll` call at most, beyond what fits `out`
/// (a round stays bounded under a flood of incoming requests).
const CQES_PER_POLL: usize = 256;
/// How long the requests of connections closed for a quiesce (shutdown,
/// then canceled) may take to end before the memory they name is given up
/// as leaked: a canceled receive may write into its window until its own
/// completion comes back.
const CANCEL_WAIT: Duration = Duration::from_secs(10);

/// Builds a request on connection `$conn`'s socket: by its fixed file when
/// it has one (no descriptor lookup per request), else by its descriptor.
macro_rules! on_socket {
    ($conn:expr, |$fd:ident| $build:expr) => {
        match $conn.fixed {
            Some(index) => {
                let $fd = types::Fixed(index);
                $build
            }
            None => {
                let $fd = types::Fd($conn.fd.as_raw_fd());
                $build
            }
        }
    };
}

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
const SPIN_ROUNDS: u16 = 64;

/// One TCP connection. Boxed: the kernel holds pointers into it (the
/// connect address, the send batches' msghdrs) while requests are in
/// flight.
///
/// A connection carries our requests when it is a lane of one of our
/// endpoints (`ours`), and the peer's requests once the peer greeted on it
/// (`serve`); both at once when one side adopted the other's connection
/// (see [`wire`](crate::wire), "Both ways on one connection").
struct Conn {
    fd: OwnedFd,
    generation: u32,
    /// Lane `.1` of our endpoint `.0` sends its requests here.
    ours: Option<(u32, u8)>,
    /// Some lane of ours used it: answers that still come after it let go
    /// are dropped, not a protocol error.
    had_ours: bool,
    /// The peer opened it (we accepted it).
    accepted: bool,
    /// The duplex rules are in force (both ways: answer room kept, the
    /// lane's depth capped).
    duplex: bool,
    /// GET data is sent straight from the window: every request the peer
    /// sends from now on comes under the duplex rules. Set by the first
    /// drain that finds our lane on it up: on an adopted connection that is
    /// once our HELLO is answered (the peer's requests before its HELLO_ACK
    /// may predate its knowing, a GET and a later PUT over its bytes among
    /// them); on our own, at once (the peer's first request is its HELLO).
    by_ref: bool,
    /// The peer's address, for an accepted connection (an adopted lane
    /// must lead to the address the endpoint names).
    peer_ip: Option<std::net::IpAddr>,
    reader: Reader,
    send: SendQueue,
    /// The peer's address, for the connect request.
    peer: SockaddrStorage,
    /// Requests in flight that name this connection (connect, send,
    /// multishot receive).
    flying: u32,
    /// Its index in the ring's fixed-file table, if it has one.
    fixed: Option<u32>,
    /// The TCP connection is established (a lane's connect completed).
    connected: bool,
    /// A receive is in flight: the multishot one, or (while `spinning`) a
    /// one-shot busy receive whose completion is not taken yet.
    recv_armed: bool,
    /// Receiving by busy receives (see [`SPIN_ROUNDS`]) instead of the
    /// multishot receive.
    spinning: bool,
    /// Busy receives left that may find nothing before the multishot
    /// receive comes back.
    spin: u16,
    /// On the send list.
    listed: bool,
    closing: bool,
    /// Received buffers not yet (fully) taken by the reader: (buffer id,
    /// length, bytes taken).
    backlog: VecDeque<(u16, u32, u32)>,
    serve: Serve,
    /// A large PUT's payload received straight into its window.
    direct: Direct,
    /// Bytes a direct receive placed that the reader has not moved past.
    placed: u32,
    /// Where the pending cumulative ACK of an accepted connection is (see
    /// [`AckHold`]).
    ack: AckHold,
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
enum AckHold {
    /// No ACK pending, or one the reader is to queue itself.
    None,
    /// Produced in this round: kept by this round's `commit`.
    Fresh,
    /// Kept by one `commit`: the next one sends it.
    Aged,
}

/// Where a connection is in receiving a large PUT's payload straight into
/// its window (no copy through the receive buffers): the multishot receive
/// is stopped, a receive of exactly the rest of the payload into the
/// window runs, then the multishot receive is armed again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direct {
    /// Receiving through the multishot receive.
    Off,
    /// The multishot receive is being canceled; what it still delivers is
    /// taken as usual.
    Stopping,
    /// A receive into the window of registration `key` is in flight.
    Receiving { key: u32 },
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("fd", &self.fd)
            .field("ours", &self.ours)
            .field("accepted", &self.accepted)
            .field("duplex", &self.duplex)
            .field("flying", &self.flying)
            .field("closing", &self.closing)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EpState {
    Connecting(Token),
    Up,
    Failed(Status),
}

#[derive(Debug)]
struct Flush {
    token: Token,
    /// Lanes still to report everything the flush covers.
    remaining: u32,
}

#[derive(Debug)]
struct Ep {
    peer: Address,
    state: EpState,
    lanes: Vec<Lane>,
    flushes: Vec<Option<Flush>>,
    /// On the list of endpoints with answers to report.
    listed: bool,
    /// `disconnect` was called: the slot goes once everything is reported.
    released: bool,
}

/// A deregistered registration that a connection still reaches: GET
/// data sent from its window, a PUT whose payload is still arriving into
/// it (copied from the receive buffers or received straight into it).
#[derive(Debug, Clone, Copy)]
struct KeyQuiesce {
    key: u32,
    /// The first `quiesce` that found it held: the peer has the timeout
    /// from then to finish (take the GET data, send the rest of the PUT).
    since: Instant,
    /// When the connections still holding it were closed.
    closed: Option<Instant>,
}

#[derive(Debug, Clone, Copy)]
struct Rkey {
    /// The endpoint handle it was unpacked for; [`RELEASED`] once
    /// released (no endpoint has that handle).
    ep: u32,
    key: u32,
    secret: u64,
}

/// [`Rkey::ep`] of a released entry.
const RELEASED: u32 = u32::MAX;

/// The tcp driver: one-sided RMA between workers over TCP, every socket
/// operation through one io_uring. See the [crate](crate) documentation.
pub struct Tcp {
    /// Dropped by hand: only once the kernel holds no request that names
    /// its buffers (see `Drop`).
    uring: ManuallyDrop<Uring>,
    listener: OwnedFd,
    address: Address,
    config: Config,
    conns: Vec<Option<Box<Conn>>>,
    /// The generation of each connection slot (kept when it is freed).
    generations: Vec<u32>,
    free_conns: Vec<u32>,
    eps: Vec<Option<Ep>>,
    regs: Vec<Option<Reg>>,
    rkeys: Vec<Rkey>,
    /// Completions produced outside `poll`'s answers: flushes, connects.
    ready: VecDeque<Completion>,
    /// Endpoints with answers to report.
    answered: Vec<u32>,
    /// Connections with bytes to send.
    to_send: Vec<u32>,
    /// Accepted connections whose ACK is held (see [`AckHold`]).
    held_acks: Vec<u32>,
    /// Connections a request was posted on this round (`start_spin` at
    /// commit).
    to_spin: Vec<u32>,
    /// Connections that busy-receive (SPIN_ROUNDS).
    spinners: Vec<u32>,
    /// Busy receivers whose receive this round found data: armed again at
    /// the commit after this round's.
    spin_next: Vec<u32>,
    /// Connections whose multishot receive ended and must be re-armed.
    rearm: Vec<u32>,
    accept_armed: bool,
    /// `quiesce(All)` runs: a lane that loses its connection does not open
    /// another.
    tearing_down: bool,
    /// When `quiesce(All)` was first asked.
    teardown_since: Option<Instant>,
    /// Registrations whose `quiesce` answered `Pending` (see
    /// [`KeyQuiesce`]); their ids are not reused until it is over.
    quiescing: Vec<KeyQuiesce>,
    notify: Option<Arc<NotifyPool>>,
    /// Scratch: receive buffers to give back.
    recycled: Vec<u16>,
}

impl std::fmt::Debug for Tcp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tcp")
            .field("address", &self.address.socket)
            .field("uring", &self.uring)
            .finish_non_exhaustive()
    }
}

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

/// The connection in `slot` of `conns`, if there is one.
fn live(conns: &mut [Option<Box<Conn>>], slot: u32) -> Option<&mut Conn> {
    conns.get_mut(slot as usize)?.as_deref_mut()
}

/// The live connection in `slot` of `conns` if its generation is
/// `generation`.
fn conn_at(conns: &mut [Option<Box<Conn>>], slot: u32, generation: u32) -> Option<&mut Conn> {
    live(conns, slot).filter(|c| c.generation == generation)
}

fn err(status: Status, detail: impl Into<String>) -> DriverError {
    DriverError::new(status, detail)
}

fn io_err(what: &str, e: impl std::fmt::Display) -> DriverError {
    err(Status::Io, format!("tcp: {what}: {e}"))
}

/// Socket options every connection gets: no Nagle delay (frames are
/// batched per round already), and a dead peer or path noticed within
/// `timeout` (unacknowledged data: TCP_USER_TIMEOUT; an idle connection:
/// keepalive probes).
fn tune(fd: &OwnedFd, timeout: Duration) -> Result<(), DriverError> {
    let secs = timeout.as_secs().clamp(1, u64::from(u32::MAX / 1000)) as u32;
    let idle = (secs / 2).max(1);
    let probes = 3;
    let interval = ((secs - idle) / probes).max(1);
    socket::setsockopt(fd, sockopt::TcpNoDelay, &true)
        .and_then(|()| socket::setsockopt(fd, sockopt::KeepAlive, &true))
        .and_then(|()| socket::setsockopt(fd, sockopt::TcpKeepIdle, &idle))
        .and_then(|()| socket::setsockopt(fd, sockopt::TcpKeepInterval, &interval))
        .and_then(|()| socket::setsockopt(fd, sockopt::TcpKeepCount, &probes))
        .and_then(|()| socket::setsockopt(fd, sockopt::TcpUserTimeout, &(secs * 1000)))
        .map_err(|e| io_err("setsockopt", e))
}

impl Tcp {
    pub(crate) fn with_config(config: Config) -> Result<Tcp, DriverError> {
        let uring = Uring::new(
            config.ring_entries,
            config.recv_buffers,
            config.recv_buffer_size,
        )
        .map_err(|e| io_err("io_uring setup", e))?;
        let listener = std::net::TcpListener::bind(config.addr)
            .map_err(|e| io_err(&format!("listen on {}", config.addr), e))?;
        let local = listener
            .local_addr()
            .map_err(|e| io_err("listening address", e))?;
        let mut instance = [0u8; 8];
        getrandom::fill(&mut instance).map_err(|e| io_err("random instance", e))?;
        let listener = OwnedFd::from(listener);
        let mut tcp = Tcp {
            uring: ManuallyDrop::new(uring),
            listener,
            address: Address {
                socket: local,
                instance: u64::from_le_bytes(instance),
            },
            conns: Vec::new(),
            generations: Vec::new(),
            free_conns: Vec::new(),
            eps: Vec::new(),
            regs: Vec::new(),
            rkeys: Vec::new(),
            ready: VecDeque::with_capacity(4096),
            answered: Vec::with_capacity(64),
            to_send: Vec::with_capacity(64),
            held_acks: Vec::with_capacity(64),
            to_spin: Vec::with_capacity(64),
            spinners: Vec::with_capacity(64),
            spin_next: Vec::with_capacity(64),
            rearm: Vec::with_capacity(64),
            accept_armed: false,
            tearing_down: false,
            teardown_since: None,
            quiescing: Vec::new(),
            notify: None,
            recycled: Vec::with_capacity(usize::from(config.recv_buffers)),
            config,
        };
        tcp.arm_accept();
        tcp.uring
            .submit()
            .map_err(|e| io_err("io_uring submit", e))?;
        tracing::debug!(address = %tcp.address.socket, "tcp listening");
        Ok(tcp)
    }

    /// The address this driver listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.address.socket
    }

    fn arm_accept(&mut self) {
        if self.accept_armed {
            return;
        }
        let entry = opcode::AcceptMulti::new(types::Fd(self.listener.as_raw_fd()))
            .flags(libc::SOCK_CLOEXEC)
            .build()
            .user_data(uring::user_data(Tag::Accept, 0, 0));
        // SAFETY: the entry names only the listener, which lives as long as
        // the driver (whose teardown waits for this request to end).
        if unsafe { self.uring.push(&entry) }.is_ok() {
            self.accept_armed = true;
        }
    }

    /// Puts a new connection in a free slot; returns the slot.
    fn add_conn(&mut self, fd: OwnedFd, ours: Option<(u32, u8)>, peer: SockaddrStorage) -> u32 {
        let notify_size = self.notify.as_ref().map_or(0, |p| p.buffer_size() as usize);
        let slot = match self.free_conns.pop() {
            Some(slot) => slot,
            None => {
                self.conns.push(None);
                self.generations.push(0);
                self.conns.len() as u32 - 1
            }
        };
        let generation = self.generations[slot as usize].wrapping_add(1);
        self.generations[slot as usize] = generation;
        let fixed = self.uring.fix(slot, fd.as_raw_fd());
        self.conns[slot as usize] = Some(Box::new(Conn {
            fixed,
            fd,
            generation,
            ours,
            had_ours: ours.is_some(),
            accepted: ours.is_none(),
            duplex: false,
            by_ref: false,
            peer_ip: None,
            reader: Reader::new(MAX_LEN),
            send: SendQueue::new(self.config.send_buffer, 1024),
            peer,
            flying: 0,
            connected: ours.is_none(),
            recv_armed: false,
            spinning: false,
            spin: 0,
            listed: false,
            closing: false,
            backlog: VecDeque::with_capacity(usize::from(self.uring.buffer_count())),
            serve: Serve::new(notify_size),
            direct: Direct::Off,
            placed: 0,
            ack: AckHold::None,
        }));
        slot
    }

    /// The live connection in `slot` if its generation is `generation`.
    fn conn_mut(&mut self, slot: u32, generation: u32) -> Option<&mut Conn> {
        conn_at(&mut self.conns, slot, generation)
    }

    fn arm_recv(&mut self, slot: u32) {
        let Some(conn) = live(&mut self.conns, slot) else {
            return;
        };
        if conn.recv_armed || conn.closing || matches!(conn.direct, Direct::Receiving { .. }) {
            return;
        }
        if conn.direct == Direct::Stopping {
            // Asked for while busy receiving, with no receive in flight.
            self.start_direct(slot);
            return;
        }
        if conn.spinning && conn.spin == 0 {
            conn.spinning = false;
        }
        let user_data = uring::user_data(Tag::Recv, slot, conn.generation);
        let entry = if conn.spinning {
            // Nonblocking: it takes what is there or fails with EAGAIN
            // inside this round's `io_uring_enter`, and arms no poll.
            on_socket!(conn, |fd| opcode::Recv::new(fd, std::ptr::null_mut(), 0)
                .buf_group(BUF_GROUP)
                .flags(libc::MSG_DONTWAIT)
                .build())
            .flags(squeue::Flags::BUFFER_SELECT)
            .user_data(user_data)
        } else {
            on_socket!(conn, |fd| opcode::RecvMulti::new(fd, BUF_GROUP).build())
                .user_data(user_data)
        };
        // SAFETY: the receive writes only into provided buffers, which live
        // as long as the ring; the descriptor stays open while the request
        // is in flight (`flying`).
        if unsafe { self.uring.push(&entry) }.is_ok() {
            conn.recv_armed = true;
            conn.flying += 1;
        }
    }

    /// A lane of ours posted a request on connection `slot`: its answer is
    /// awaited, so the connection receives by busy receives from the next
    /// commit on (see [`SPIN_ROUNDS`]). The multishot receive, if armed, is
    /// canceled; its last completion arms the first busy receive.
    fn start_spin(&mut self, slot: u32) {
        let Some(conn) = live(&mut self.conns, slot) else {
            return;
        };
        conn.spin = SPIN_ROUNDS;
        if conn.spinning || conn.closing {
            return;
        }
        conn.spinning = true;
        self.spinners.push(slot);
        if conn.recv_armed && conn.direct == Direct::Off {
            let recv = uring::user_data(Tag::Recv, slot, conn.generation);
            let entry = opcode::AsyncCancel::new(recv)
                .build()
                .user_data(uring::user_data(Tag::Cancel, slot, conn.generation));
            // SAFETY: a cancellation names no memory.
            let _ = unsafe { self.uring.push(&entry) };
        }
    }

    /// Puts `slot` on the send list (sent at `commit`).
    fn want_send(to_send: &mut Vec<u32>, slot: u32, conn: &mut Conn) {
        if !conn.listed && conn.send.queued() > 0 {
            conn.listed = true;
            to_send.push(slot);
        }
    }

    /// Starts closing a connection: the kernel's requests on it end
    /// (shutdown, then cancel), and the slot is freed when the last one
    /// has completed. A lane's endpoint fails with `status`, except a lane
    /// on an adopted connection that is not up yet: it opens a connection
    /// of its own instead (the peer closed its side before it saw our
    /// HELLO).
    fn close_conn(&mut self, slot: u32, status: Status) {
        let Some(conn) = live(&mut self.conns, slot) else {
            return;
        };
        if conn.closing {
            return;
        }
        conn.closing = true;
        conn.send.discard();
        let ours = conn.ours.take();
        // A lane of ours on a connection we accepted adopted it.
        let adopted = conn.accepted;
        let generation = conn.generation;
        let fd = conn.fd.as_raw_fd();
        // Ends a receive and a send in progress at once.
        let _ = socket::shutdown(fd, socket::Shutdown::Both);
        if conn.flying > 0 {
            let entry = opcode::AsyncCancel2::new(types::CancelBuilder::fd(types::Fd(fd)).all())
                .build()
                .user_data(uring::user_data(Tag::Cancel, slot, generation));
            // SAFETY: a cancellation names no memory.
            let _ = unsafe { self.uring.push(&entry) };
        }
        self.recycle_backlog(slot);
        if let Some((ep, lane)) = ours {
            if !(adopted && self.reopen_lane(ep, lane)) {
                self.fail_ep(ep, status);
            }
        }
        self.maybe_free(slot);
    }

    /// Lane `lane` of connecting endpoint `e` lost the adopted connection
    /// before its HELLO was answered: it opens its own. `false` if the lane
    /// was up already, or the endpoint is not connecting, or no socket.
    fn reopen_lane(&mut self, e: u32, lane: u8) -> bool {
        let Some(ep) = self.eps.get(e as usize).and_then(Option::as_ref) else {
            return false;
        };
        let up = ep.lanes.get(usize::from(lane)).is_none_or(|l| l.up);
        if up || self.tearing_down || !matches!(ep.state, EpState::Connecting(_)) {
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
                if let Some(l) = self.ep_lane(e, lane) {
                    *l = Lane::new(slot, depth);
                }
                true
            }
            Err(_) => false,
        }
    }

    fn ep_lane(&mut self, e: u32, lane: u8) -> Option<&mut Lane> {
        self.eps
            .get_mut(e as usize)?
            .as_mut()?
            .lanes
            .get_mut(usize::from(lane))
    }

    /// Opens connection `lane` of endpoint `e` (of `lanes`) to `peer`: the
    /// socket, the connect, and the HELLO that follows it.
    fn open_lane(
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
        let conn = self.conns[slot as usize]
            .as_deref_mut()
            .expect("just added");
        let entry = on_socket!(conn, |fd| opcode::Connect::new(
            fd,
            conn.peer.as_ptr(),
            conn.peer.len(),
        )
        .build())
        .user_data(uring::user_data(Tag::Connect, slot, conn.generation));
        // SAFETY: the address lives in the boxed connection, which is
        // freed only after this request completes (`flying`).
        if unsafe { self.uring.push(&entry) }.is_ok() {
            conn.flying += 1;
        }
        Ok(slot)
    }

    /// An accepted connection from the worker at `peer` that a new lane
    /// can carry its requests on (see [`wire`](crate::wire), "Both ways
    /// on one connection"): greeted by that instance, from that address,
    /// not a lane of ours already, and not paused answering.
    fn adoptable(&self, peer: &Address) -> Option<u32> {
        let fits = |c: &Conn| {
            c.accepted
                && !c.had_ours
                && !c.closing
                && c.serve.serving()
                && c.serve.peer_instance == peer.instance
                && c.peer_ip == Some(peer.socket.ip())
                && !c.serve.answering_get()
                && c.backlog.is_empty()
                // Nothing queued or in flight: our HELLO fits, and the room
                // kept for answers is free from the first batch on.
                && c.send.queued() == 0
                && !c.send.is_flying()
        };
        self.conns
            .iter()
            .position(|c| c.as_deref().is_some_and(fits))
            .map(|slot| slot as u32)
    }

    /// Queues the HELLO of lane `lane` (of `lanes`) of endpoint `e` on
    /// `slot`, sent once the connection is established.
    fn queue_hello(&mut self, slot: u32, e: u32, lane: u8, lanes: u8, instance: u64) {
        let hello = Header {
            arg: lanes,
            seq: self.address.instance,
            addr: u64::from(e),
            operand: instance,
            ..Header::new(Opcode::Hello, lane)
        };
        let Some(conn) = self.conns[slot as usize].as_deref_mut() else {
            return;
        };
        // A new connection is empty, and an adopted one has nothing queued
        // (`adoptable`).
        let queued = conn.send.push_copy(&[&hello.encode()]);
        debug_assert!(queued, "a HELLO fits");
        Self::want_send(&mut self.to_send, slot, conn);
    }

    /// Lets go of `slot` as a lane of ours (its endpoint failed or was
    /// released): if the peer still sends requests on it, we say BYE and
    /// go on serving; else it closes.
    fn release_conn(&mut self, slot: u32, status: Status) {
        let Some(conn) = live(&mut self.conns, slot) else {
            return;
        };
        if conn.closing || conn.ours.is_none() {
            return;
        }
        conn.ours = None;
        let bye = Header::new(Opcode::Bye, 0).encode();
        if conn.serve.serving() && conn.send.push_copy(&[&bye]) {
            Self::want_send(&mut self.to_send, slot, conn);
        } else {
            self.close_conn(slot, status);
        }
    }

    /// After a change on `slot`: the duplex rules come into force once it
    /// carries requests both ways, and a connection that carries none any
    /// more closes.
    fn settle(&mut self, slot: u32) {
        let Tcp { conns, eps, .. } = self;
        let Some(conn) = live(conns, slot) else {
            return;
        };
        if conn.closing {
            return;
        }
        match conn.ours {
            Some((e, lane)) if conn.serve.greeted && !conn.duplex => {
                conn.duplex = true;
                conn.send.reserve_answers(ANSWER_ROOM, HEADER_LEN);
                let lane = eps
                    .get_mut(e as usize)
                    .and_then(Option::as_mut)
                    .and_then(|ep| ep.lanes.get_mut(usize::from(lane)));
                if let Some(lane) = lane {
                    lane.make_duplex();
                }
                tracing::debug!(slot, "tcp: connection carries requests both ways");
            }
            None if conn.serve.ended || (conn.had_ours && !conn.serve.serving()) => {
                // Neither side sends requests on it any more.
                self.close_conn(slot, Status::Canceled);
                return;
            }
            _ => {}
        }
        // A held HELLO_ACK goes once the answer room is free, whether or
        // not a lane of ours still sends here (the peer's lane waits for it).
        if conn.serve.release_hello_ack(&mut conn.send) {
            Self::want_send(&mut self.to_send, slot, conn);
        }
    }

    fn recycle_backlog(&mut self, slot: u32) {
        let Some(conn) = live(&mut self.conns, slot) else {
            return;
        };
        let bids = conn.backlog.drain(..).map(|(bid, _, _)| bid);
        self.uring.recycle(bids);
    }

    /// Frees a closing connection once nothing in flight names it.
    fn maybe_free(&mut self, slot: u32) {
        let free = self
            .conns
            .get(slot as usize)
            .and_then(|c| c.as_deref())
            .is_some_and(|c| c.closing && c.flying == 0);
        if free {
            if let Some(conn) = self.conns[slot as usize].take() {
                if let Some(index) = conn.fixed {
                    self.uring.unfix(index);
                }
            }
            self.free_conns.push(slot);
        }
    }

    /// Fails endpoint `e`: every request not yet answered completes with
    /// `status`, so do its flushes and a connect in progress, and its
    /// connections close.
    fn fail_ep(&mut self, e: u32, status: Status) {
        let Some(ep) = self.eps.get_mut(e as usize).and_then(Option::as_mut) else {
            return;
        };
        if matches!(ep.state, EpState::Failed(_)) {
            return;
        }
        if let EpState::Connecting(token) = ep.state {
            self.ready.push_back(Completion::new(token, Err(status)));
        }
        tracing::debug!(ep = e, %status, "tcp endpoint failed");
        ep.state = EpState::Failed(status);
        let conns: Vec<u32> = ep.lanes.iter().map(|l| l.conn).collect();
        for lane in &mut ep.lanes {
            lane.fail_all(status);
        }
        if !ep.listed {
            ep.listed = true;
            self.answered.push(e);
        }
        // The failing connection is closing already; the others close, or
        // go on carrying the peer's requests (BYE).
        for slot in conns {
            self.release_conn(slot, status);
        }
    }

    fn handle(&mut self, cqe: &cqueue::Entry) {
        let Some((tag, slot, generation)) = uring::parse_user_data(cqe.user_data()) else {
            return;
        };
        let (res, flags) = (cqe.result(), cqe.flags());
        match tag {
            Tag::Accept => self.on_accept(res, flags),
            Tag::Connect => self.on_connect(slot, generation, res),
            Tag::Send => self.on_send(slot, generation, res),
            Tag::Recv => self.on_recv(slot, generation, res, flags),
            Tag::Direct => self.on_direct(slot, generation, res),
            Tag::Cancel => {}
        }
    }

    fn on_accept(&mut self, res: i32, flags: u32) {
        if !cqueue::more(flags) {
            // Re-armed at the next commit (canceled when the submitting
            // thread exited, or out of resources).
            self.accept_armed = false;
        }
        if res < 0 {
            tracing::debug!(errno = -res, "tcp accept failed");
            return;
        }
        // SAFETY: a successful accept returns a new descriptor we own.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(res) };
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
        if let Some(conn) = self.conns[slot as usize].as_deref_mut() {
            conn.peer_ip = peer_ip;
        }
        self.arm_recv(slot);
    }

    fn on_connect(&mut self, slot: u32, generation: u32, res: i32) {
        let Some(conn) = self.conn_mut(slot, generation) else {
            return;
        };
        conn.flying -= 1;
        if conn.closing {
            self.maybe_free(slot);
            return;
        }
        if res < 0 {
            tracing::debug!(errno = -res, "tcp connect failed");
            self.close_conn(slot, Status::PeerUnreachable);
            return;
        }
        conn.connected = true;
        self.arm_recv(slot);
    }

    fn on_send(&mut self, slot: u32, generation: u32, res: i32) {
        let Some(conn) = conn_at(&mut self.conns, slot, generation) else {
            return;
        };
        conn.flying -= 1;
        if conn.closing {
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
            Sent::More(msg) => {
                let entry = Self::send_entry(conn, slot, msg);
                // SAFETY: as in `commit`.
                if unsafe { self.uring.push(&entry) }.is_ok() {
                    conn.flying += 1;
                }
                return;
            }
        }
        // Room freed: a paused reader (answers waiting for room) goes on.
        if conn.accepted || conn.serve.greeted {
            self.drain(slot);
        }
        if let Some(conn) = self.conns[slot as usize].as_deref_mut() {
            Self::want_send(&mut self.to_send, slot, conn);
        }
    }

    fn send_entry(conn: &Conn, slot: u32, msg: *const libc::msghdr) -> io_uring::squeue::Entry {
        on_socket!(conn, |fd| opcode::SendMsg::new(fd, msg)
            .flags((libc::MSG_NOSIGNAL | libc::MSG_WAITALL) as u32)
            .build())
        .user_data(uring::user_data(Tag::Send, slot, conn.generation))
    }

    fn on_recv(&mut self, slot: u32, generation: u32, res: i32, flags: u32) {
        let bid = cqueue::buffer_select(flags);
        let Some(conn) = conn_at(&mut self.conns, slot, generation) else {
            self.uring.recycle(bid);
            return;
        };
        let more = cqueue::more(flags);
        if !more {
            conn.recv_armed = false;
            conn.flying -= 1;
        }
        if conn.closing {
            self.uring.recycle(bid);
            self.maybe_free(slot);
            return;
        }
        match (res, bid) {
            (n, Some(bid)) if n > 0 => {
                if conn.spinning && n as u32 >= self.config.recv_buffer_size {
                    // A full buffer: a stream, which the multishot
                    // receive takes faster (many buffers per entry).
                    conn.spin = 0;
                }
                conn.backlog.push_back((bid, n as u32, 0));
                let spinning = conn.spinning;
                self.drain(slot);
                if !more {
                    if spinning
                        && live(&mut self.conns, slot).is_some_and(|c| c.direct == Direct::Off)
                    {
                        // Not in this round's commit: the application
                        // sees what came without waiting for another
                        // `io_uring_enter` (as AckHold).
                        self.spin_next.push(slot);
                    } else {
                        self.receive_again(slot);
                    }
                }
            }
            (n, _) if n == -libc_errno::EAGAIN && conn.spinning => {
                // A busy receive found nothing.
                conn.spin = conn.spin.saturating_sub(1);
                self.uring.recycle(bid);
                self.receive_again(slot);
            }
            (n, _) if n == -libc_errno::ENOBUFS || n == -libc_errno::ECANCELED => {
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
    fn receive_again(&mut self, slot: u32) {
        let Some(conn) = live(&mut self.conns, slot) else {
            return;
        };
        if conn.closing {
            return;
        }
        if conn.direct == Direct::Stopping {
            self.start_direct(slot);
        } else {
            self.rearm.push(slot);
        }
    }

    /// Receives the rest of the current PUT's payload straight into its
    /// window, if the reader is still inside it; else goes back to the
    /// multishot receive.
    fn start_direct(&mut self, slot: u32) {
        let Some(conn) = live(&mut self.conns, slot) else {
            return;
        };
        // Only a PUT's payload: the reader may have moved on to an answer's
        // (GET data for a lane of ours) since the multishot was stopped.
        let target = match (conn.reader.in_payload(), conn.serve.write_target()) {
            (Some((h, at)), Some(addr)) if conn.backlog.is_empty() && h.opcode == Opcode::Put => {
                Some((h, at, addr))
            }
            _ => None,
        };
        let Some((h, at, addr)) = target else {
            conn.direct = Direct::Off;
            self.rearm.push(slot);
            return;
        };
        let dst = (addr + u64::from(at)) as usize as *mut u8;
        let entry = on_socket!(conn, |fd| opcode::Recv::new(fd, dst, h.len - at)
            .flags(libc::MSG_WAITALL)
            .build())
        .user_data(uring::user_data(Tag::Direct, slot, conn.generation));
        // SAFETY: `[dst, dst + len)` is the rest of a PUT's range, checked
        // against a live registration when its header came; the memory
        // stays until this receive completes: `quiesce` of a deregistered
        // window answers `Pending` until it has (or `Leak`).
        if unsafe { self.uring.push(&entry) }.is_ok() {
            conn.flying += 1;
            conn.direct = Direct::Receiving { key: h.key };
        } else {
            conn.direct = Direct::Off;
            self.rearm.push(slot);
        }
    }

    fn on_direct(&mut self, slot: u32, generation: u32, res: i32) {
        let Some(conn) = conn_at(&mut self.conns, slot, generation) else {
            return;
        };
        conn.flying -= 1;
        if conn.closing {
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
        conn.placed = res as u32;
        // Moves the reader past the placed bytes (answering the PUT if they
        // were its last), then takes whatever else is queued.
        self.drain(slot);
        let Some(conn) = live(&mut self.conns, slot) else {
            return;
        };
        if conn.closing {
            return;
        }
        // A short receive (a signal): the rest, straight again.
        self.start_direct(slot);
    }

    /// Feeds connection `slot`'s received bytes to its reader, as far as
    /// the reader takes them.
    fn drain(&mut self, slot: u32) {
        let Tcp {
            uring,
            conns,
            eps,
            regs,
            notify,
            address,
            answered,
            recycled,
            to_send,
            held_acks,
            config,
            ..
        } = self;
        let Some(conn) = live(conns, slot) else {
            return;
        };
        let mut broken: Option<Broken> = None;
        let mut refused = None;
        let mut progressed = false;
        // Our lane's answers, if a lane of ours sends on this connection.
        let ours = conn.ours.and_then(|(e, lane)| {
            let endpoint = eps.get_mut(e as usize)?.as_mut()?;
            let instance = endpoint.peer.instance;
            Some((e, endpoint.lanes.get_mut(usize::from(lane))?, instance))
        });
        let ours_ep = ours.as_ref().map(|&(e, _, _)| e);
        if ours.as_ref().is_some_and(|(_, lane, _)| lane.up) {
            conn.by_ref = true;
        }
        let mut handler = Frames {
            requests: Requests {
                serve: &mut conn.serve,
                send: &mut conn.send,
                regs,
                notify: notify.as_deref(),
                instance: address.instance,
                duplex: conn.by_ref,
                hold_hello_ack: conn.ours.is_some(),
            },
            answers: ours.map(|(_, lane, instance)| Answers {
                lane,
                instance,
                refused: &mut refused,
                progressed: &mut progressed,
            }),
            drop_answers: conn.had_ours,
        };
        let placed = std::mem::take(&mut conn.placed);
        if placed > 0 {
            if let Err(b) = conn.reader.advance(placed, &mut handler) {
                broken = Some(b);
            }
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
            let data = uring.buffer(bid, len as usize).unwrap_or_default();
            let rest = data.get(*taken as usize..).unwrap_or_default();
            match conn.reader.feed(rest, &mut handler) {
                Ok(n) => {
                    *taken += n as u32;
                    if *taken >= len {
                        conn.backlog.pop_front();
                        recycled.push(bid);
                    } else {
                        go = false; // paused: waits for send room
                    }
                }
                Err(b) => broken = Some(b),
            }
        }
        // Answers with data are queued already; the ACK of what this round
        // took waits for the next round's commit (AckHold).
        if conn.serve.ack_pending() && conn.ack == AckHold::None {
            conn.ack = AckHold::Fresh;
            held_acks.push(slot);
        }
        // Inside a large PUT's payload: the rest goes straight into the
        // window once the multishot receive has stopped.
        if let Some((h, at)) = conn.reader.in_payload() {
            let big = h.opcode == Opcode::Put && h.len - at >= config.direct_min;
            if big
                && conn.direct == Direct::Off
                && (conn.recv_armed || conn.spinning)
                && conn.serve.write_target().is_some()
            {
                if conn.recv_armed {
                    let recv = uring::user_data(Tag::Recv, slot, conn.generation);
                    let entry = opcode::AsyncCancel::new(recv)
                        .build()
                        .user_data(uring::user_data(Tag::Cancel, slot, conn.generation));
                    // SAFETY: a cancellation names no memory.
                    if unsafe { uring.push(&entry) }.is_ok() {
                        conn.direct = Direct::Stopping;
                    }
                } else {
                    // Busy receiving, none in flight: the direct receive
                    // starts where the next one would (`arm_recv`).
                    conn.direct = Direct::Stopping;
                }
            }
        }
        if let Some(e) = ours_ep {
            let endpoint = eps.get_mut(e as usize).and_then(Option::as_mut);
            // A failed endpoint was listed when it failed.
            if let Some(endpoint) = endpoint {
                if progressed && !endpoint.listed && !matches!(endpoint.state, EpState::Failed(_)) {
                    endpoint.listed = true;
                    answered.push(e);
                }
            }
        }
        Self::want_send(to_send, slot, conn);
        uring.recycle(recycled.drain(..));
        if let Some(b) = broken {
            tracing::debug!(?b, "tcp: connection closed: broken stream");
            self.close_conn(slot, Status::Transport);
        } else if let Some(status) = refused {
            self.close_conn(slot, status);
        } else {
            self.settle(slot);
        }
    }

    /// Reports answered requests, finished flushes and finished connects
    /// into `out` from index `n`; returns the new `n`.
    fn emit(&mut self, out: &mut [Completion], mut n: usize) -> usize {
        let mut i = 0;
        while i < self.answered.len() && n < out.len() {
            let e = self.answered[i];
            let Some(ep) = self.eps.get_mut(e as usize).and_then(Option::as_mut) else {
                self.answered.swap_remove(i);
                continue;
            };
            if let EpState::Connecting(token) = ep.state {
                if ep.lanes.iter().all(|l| l.up) {
                    ep.state = EpState::Up;
                    self.ready.push_back(Completion::new(token, Ok(0)));
                }
            }
            let failed = match ep.state {
                EpState::Failed(status) => Some(status),
                _ => None,
            };
            let mut done = true;
            for lane in &mut ep.lanes {
                n = lane.emit(out, n);
                while let Some(&(f, seq)) = lane.marks.front() {
                    if !lane.reported(seq) {
                        break;
                    }
                    lane.marks.pop_front();
                    let Some(flush) = ep.flushes.get_mut(f as usize).and_then(Option::as_mut)
                    else {
                        continue;
                    };
                    flush.remaining -= 1;
                    if flush.remaining == 0 {
                        self.ready
                            .push_back(Completion::new(flush.token, failed.map_or(Ok(0), Err)));
                        ep.flushes[f as usize] = None;
                    }
                }
                done &= lane.answered == 0;
            }
            if done {
                ep.listed = false;
                self.answered.swap_remove(i);
                if ep.released && ep.lanes.iter().all(|l| l.pending.is_empty()) {
                    self.eps[e as usize] = None;
                }
            } else {
                i += 1;
            }
        }
        while n < out.len() {
            let Some(c) = self.ready.pop_front() else {
                break;
            };
            out[n] = c;
            n += 1;
        }
        n
    }

    /// Cancels everything; `Done` once the kernel holds no request that
    /// names this driver's memory (or any memory registered with it).
    /// Never waits: what was canceled ends through the next asks (which
    /// take its completions) and the engine's polls between them. Requests
    /// that have not ended `CANCEL_WAIT` after the first ask may still
    /// write into windows: `Leak`.
    fn quiesce_all(&mut self) -> Quiesced {
        let now = Instant::now();
        let first = self.teardown_since.is_none();
        let since = *self.teardown_since.get_or_insert(now);
        if !self.tearing_down {
            self.tearing_down = true;
            self.send_held_acks();
        }
        self.quiescing.clear();
        // Every ask: a connection accepted since the last one closes too.
        for slot in 0..self.conns.len() as u32 {
            self.close_conn(slot, Status::Canceled);
        }
        if self.accept_armed && first {
            let entry = opcode::AsyncCancel2::new(
                types::CancelBuilder::fd(types::Fd(self.listener.as_raw_fd())).all(),
            )
            .build()
            .user_data(uring::user_data(Tag::Cancel, 0, 0));
            // SAFETY: a cancellation names no memory.
            let _ = unsafe { self.uring.push(&entry) };
        }
        if let Err(e) = self.uring.submit() {
            tracing::debug!(%e, "tcp: io_uring submit failed at teardown");
        }
        while let Some(cqe) = self.uring.next() {
            self.handle_teardown(&cqe);
        }
        if !self.accept_armed && self.conns.iter().all(Option::is_none) {
            return Quiesced::Done;
        }
        if now.duration_since(since) >= CANCEL_WAIT {
            tracing::error!(
                "tcp: requests still in flight {CANCEL_WAIT:?} into teardown: the kernel may \
                 still write registered memory"
            );
            return Quiesced::Leak;
        }
        Quiesced::Pending
    }

    /// Whether connection `c` still reaches registration `key`'s window:
    /// GET data from it is queued or being sent, a PUT's payload is still
    /// to be written into it (copied from the receive buffers, or about to
    /// be received straight into it), or a receive straight into it has
    /// not completed (closed or not).
    fn holds_key(c: &Conn, key: u32) -> bool {
        let sending = c.send.holds_window(key) && (c.flying > 0 || !c.closing);
        let writing = !c.closing
            && c.serve.write_target().is_some()
            && c.reader
                .in_payload()
                .is_some_and(|(h, _)| h.opcode == Opcode::Put && h.key == key);
        let receiving = c.direct == Direct::Receiving { key } && c.flying > 0;
        sending || writing || receiving
    }

    /// Whether any connection still reaches registration `key`'s window
    /// ([`Tcp::holds_key`]); it was deregistered already, so no new access
    /// to it starts. The peer has the timeout from the first ask to finish
    /// what it started (take its GET data, send the rest of its PUT): until
    /// then `Pending`. After it, the connections that still hold the window
    /// close (shutdown, then their requests are canceled), and it is
    /// `Pending` until those requests have completed, which the engine's
    /// polls take; `Leak` if they have not `CANCEL_WAIT` later (the
    /// kernel may still write into the window). Never waits.
    fn quiesce_key(&mut self, key: u32) -> Quiesced {
        let held = |c: &Option<Box<Conn>>| c.as_deref().is_some_and(|c| Self::holds_key(c, key));
        let at = self.quiescing.iter().position(|q| q.key == key);
        if !self.conns.iter().any(held) {
            if let Some(i) = at {
                self.quiescing.swap_remove(i);
            }
            return Quiesced::Done;
        }
        let now = Instant::now();
        let i = at.unwrap_or_else(|| {
            self.quiescing.push(KeyQuiesce {
                key,
                since: now,
                closed: None,
            });
            self.quiescing.len() - 1
        });
        let q = self.quiescing[i];
        match q.closed {
            None if now.duration_since(q.since) >= self.config.timeout => {
                let slots: Vec<u32> = (0..self.conns.len() as u32)
                    .filter(|&s| held(&self.conns[s as usize]))
                    .collect();
                for slot in slots {
                    tracing::debug!(
                        slot,
                        key,
                        "tcp: a deregistered window's peer did not finish; connection closed"
                    );
                    self.close_conn(slot, Status::Transport);
                }
                self.quiescing[i].closed = Some(now);
                // The cancellations go in now; their completions come
                // through the polls.
                if let Err(e) = self.uring.submit() {
                    tracing::debug!(%e, "tcp: io_uring submit failed");
                }
                Quiesced::Pending
            }
            Some(closed) if now.duration_since(closed) >= CANCEL_WAIT => {
                tracing::error!(
                    key,
                    "tcp: a closed connection's request on a deregistered window did not end: \
                     the window is leaked"
                );
                self.quiescing.swap_remove(i);
                Quiesced::Leak
            }
            _ => Quiesced::Pending,
        }
    }

    /// A completion during teardown: only the bookkeeping of what is in
    /// flight.
    fn handle_teardown(&mut self, cqe: &cqueue::Entry) {
        let Some((tag, slot, generation)) = uring::parse_user_data(cqe.user_data()) else {
            return;
        };
        let flags = cqe.flags();
        match tag {
            Tag::Accept => {
                if cqe.result() >= 0 {
                    // SAFETY: a new descriptor we own; closed at once.
                    drop(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(cqe.result()) });
                }
                if !cqueue::more(flags) {
                    self.accept_armed = false;
                }
            }
            Tag::Recv => {
                self.uring.recycle(cqueue::buffer_select(flags));
                if let Some(conn) = self.conn_mut(slot, generation) {
                    if !cqueue::more(flags) {
                        conn.flying -= 1;
                    }
                }
                self.maybe_free(slot);
            }
            Tag::Send | Tag::Connect | Tag::Direct => {
                if let Some(conn) = self.conn_mut(slot, generation) {
                    conn.flying -= 1;
                }
                self.maybe_free(slot);
            }
            Tag::Cancel => {}
        }
    }

    fn ep_mut(&mut self, ep: DriverEp) -> Option<&mut Ep> {
        self.eps.get_mut(ep.0 as usize).and_then(Option::as_mut)
    }

    /// Starts a send on every listed connection that can take one:
    /// requests first, then answers, so that held ACKs go behind what the
    /// application sent this round.
    fn start_sends(&mut self) {
        let Tcp {
            uring,
            conns,
            to_send,
            ..
        } = self;
        to_send.sort_unstable_by_key(|&slot| {
            conns
                .get(slot as usize)
                .and_then(|c| c.as_deref())
                .is_some_and(|c| c.ours.is_none())
        });
        to_send.retain(|&slot| {
            let Some(conn) = live(conns, slot) else {
                return false;
            };
            if conn.closing {
                conn.listed = false;
                return false;
            }
            // A lane's first bytes (its HELLO) wait for its connect.
            if !conn.connected || conn.send.is_flying() {
                return true;
            }
            if let Some(msg) = conn.send.start() {
                let entry = Self::send_entry(conn, slot, msg);
                // SAFETY: the msghdr, its iovecs and the staging they point
                // into live in the boxed connection's batch, untouched until
                // this send completes; iovecs over registered memory stay
                // valid until the operation completes (the `post` contract),
                // which is after this send completed.
                if unsafe { uring.push(&entry) }.is_ok() {
                    conn.flying += 1;
                }
            }
            conn.listed = false;
            false
        });
    }

    /// At teardown: every held ACK is sent, as far as the socket takes it
    /// at once (a PUT the target executed is then acknowledged, as it would
    /// have been before the hold); nothing here waits for the peer.
    fn send_held_acks(&mut self) {
        for slot in std::mem::take(&mut self.held_acks) {
            let Some(conn) = live(&mut self.conns, slot) else {
                continue;
            };
            conn.ack = AckHold::None;
            if !conn.closing && conn.serve.queue_ack(&mut conn.send) {
                Self::want_send(&mut self.to_send, slot, conn);
            }
        }
        self.start_sends();
        // A small send into a socket with room completes inside the
        // submission; its completion is taken with the others below.
        let _ = self.uring.submit();
        while let Some(cqe) = self.uring.next() {
            self.handle_teardown(&cqe);
        }
    }
}

impl Drop for Tcp {
    /// Finishes the teardown (the engine asked `quiesce(All)` already,
    /// unless the driver never served a worker), waiting for the kernel's
    /// completions, within `CANCEL_WAIT` of the first ask.
    fn drop(&mut self) {
        loop {
            match self.quiesce_all() {
                Quiesced::Done => break,
                Quiesced::Pending => {
                    let _ = self.uring.submit_and_wait_for(Duration::from_millis(100));
                }
                Quiesced::Leak => {
                    // The kernel may still write into the receive buffers
                    // or read the send batches: leak them rather than free
                    // memory it uses.
                    std::mem::forget(std::mem::take(&mut self.conns));
                    return;
                }
            }
        }
        // SAFETY: dropped once, here, with nothing in flight.
        unsafe { ManuallyDrop::drop(&mut self.uring) };
    }
}

impl Driver for Tcp {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn capabilities(&self) -> Capabilities {
        // Every operation on ordered lanes (one TCP stream each, answered
        // in order), over host memory.
        Capabilities::host_rma(self.config.max_lanes, MAX_LEN)
    }

    fn attach(&mut self, ctx: DriverContext) {
        self.notify = Some(ctx.notify);
    }

    fn address(&self) -> Vec<u8> {
        self.address.encode()
    }

    /// Opens `lanes` connections, or takes the peer's own (`adoptable`),
    /// and greets the peer on each; the endpoint is up when every HELLO is
    /// answered (reported through `poll`).
    fn connect(&mut self, peer: &[u8], lanes: u8, token: Token) -> Result<Connect, DriverError> {
        let address = Address::decode(peer)
            .ok_or_else(|| err(Status::InvalidArgument, "malformed tcp address"))?;
        if lanes == 0 || lanes > self.config.max_lanes {
            return Err(err(Status::InvalidArgument, "lanes out of range"));
        }
        let e = match self.eps.iter().position(Option::is_none) {
            Some(e) => e,
            None => {
                self.eps.push(None);
                self.eps.len() - 1
            }
        } as u32;
        let mut slots = Vec::with_capacity(usize::from(lanes));
        for lane in 0..lanes {
            if let Some(slot) = self.adoptable(&address) {
                let conn = self.conns[slot as usize].as_deref_mut().expect("adoptable");
                conn.ours = Some((e, lane));
                conn.had_ours = true;
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
        self.eps[e as usize] = Some(Ep {
            peer: address,
            state: EpState::Connecting(token),
            lanes: slots.iter().map(|&s| Lane::new(s, depth)).collect(),
            flushes: (0..MAX_FLUSHES).map(|_| None).collect(),
            listed: false,
            released: false,
        });
        for &slot in &slots {
            self.settle(slot);
        }
        self.uring
            .submit()
            .map_err(|e| io_err("io_uring submit", e))?;
        tracing::debug!(ep = e, peer = %address.socket, lanes, "tcp connecting");
        Ok(Connect::InFlight(DriverEp(e)))
    }

    fn disconnect(&mut self, ep: DriverEp) {
        let Some(endpoint) = self.ep_mut(ep) else {
            return;
        };
        endpoint.released = true;
        let listed = endpoint.listed;
        if !matches!(endpoint.state, EpState::Failed(_)) {
            self.fail_ep(ep.0, Status::Canceled);
        } else if !listed {
            if let Some(endpoint) = self.ep_mut(ep) {
                endpoint.listed = true;
            }
            self.answered.push(ep.0);
        }
    }

    fn register(&mut self, mem: &MemDesc, _prepared: Prepared) -> Result<Registered, DriverError> {
        if mem.kind != MemKind::Host {
            return Err(err(Status::Unsupported, "tcp registers host memory only"));
        }
        mem.addr
            .checked_add(mem.len)
            .ok_or_else(|| err(Status::InvalidArgument, "range wraps"))?;
        let reg = Reg {
            base: mem.addr,
            len: mem.len,
            secret: mem.secret,
        };
        // An id whose old window a connection may still reach is not
        // reused: its PUTs and GETs must not be taken for the new one's.
        let quiescing = &self.quiescing;
        let free = |(id, r): (usize, &Option<Reg>)| {
            r.is_none() && !quiescing.iter().any(|q| q.key as usize == id)
        };
        let id = match self.regs.iter().enumerate().position(free) {
            Some(id) => id,
            None => {
                self.regs.push(None);
                self.regs.len() - 1
            }
        };
        self.regs[id] = Some(reg);
        Ok(Registered::Shared(DriverMemKey(id as u64)))
    }

    fn deregister(&mut self, key: DriverMemKey) {
        if let Some(slot) = self.regs.get_mut(key.0 as usize) {
            *slot = None;
        }
    }

    fn pack_rkey(&self, key: DriverMemKey) -> Result<Vec<u8>, DriverError> {
        let reg = self
            .regs
            .get(key.0 as usize)
            .and_then(Option::as_ref)
            .ok_or_else(|| err(Status::InvalidMemHandle, "not registered"))?;
        Ok(KeyBlob {
            instance: self.address.instance,
            key: key.0 as u32,
            secret: reg.secret,
            base: reg.base,
            len: reg.len,
        }
        .encode())
    }

    fn unpack_rkey(
        &mut self,
        ep: DriverEp,
        part: &KeyPart<'_>,
        _prepared: Prepared,
    ) -> Result<Unpacked, DriverError> {
        let key = KeyBlob::decode(part.blob)
            .ok_or_else(|| err(Status::InvalidArgument, "malformed tcp key"))?;
        let endpoint = self
            .ep_mut(ep)
            .ok_or_else(|| err(Status::InvalidEndpoint, "not connected"))?;
        if key.instance != endpoint.peer.instance {
            return Err(err(Status::InvalidRkey, "the key belongs to another peer"));
        }
        let entry = Rkey {
            ep: ep.0,
            key: key.key,
            secret: key.secret,
        };
        // A released entry is reused (control path: a scan is fine).
        if let Some(i) = self.rkeys.iter().position(|k| k.ep == RELEASED) {
            self.rkeys[i] = entry;
            return Ok(Unpacked::Key(DriverRkey(i as u32)));
        }
        self.rkeys.push(entry);
        Ok(Unpacked::Key(DriverRkey(self.rkeys.len() as u32 - 1)))
    }

    fn release_rkey(&mut self, ep: DriverEp, rkey: DriverRkey) {
        if let Some(k) = self.rkeys.get_mut(rkey.0 as usize).filter(|k| k.ep == ep.0) {
            k.ep = RELEASED;
        }
    }

    unsafe fn post(&mut self, ep: DriverEp, op: &Op, token: Token) -> Posted {
        let rkey = match op.remote {
            Some((rkey, addr)) => match self.rkeys.get(rkey.0 as usize) {
                Some(k) if k.ep == ep.0 => Some((*k, addr)),
                _ => return Posted::Done(Err(Status::InvalidRkey)),
            },
            None => None,
        };
        let Tcp {
            eps,
            conns,
            to_send,
            to_spin,
            ..
        } = self;
        let Some(endpoint) = eps.get_mut(ep.0 as usize).and_then(Option::as_mut) else {
            return Posted::Done(Err(Status::InvalidEndpoint));
        };
        match endpoint.state {
            EpState::Up => {}
            EpState::Failed(status) => return Posted::Done(Err(status)),
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
        let Some(conn) = live(conns, lane.conn) else {
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
        let (queued, wants) = match op.kind {
            OpKind::Put if op.len <= COPY_MAX => {
                let src = op.local_addr;
                let len = op.len as usize;
                let queued = conn.send.push_filled(&h.encode(), len, |dst| {
                    // SAFETY: the engine vouches for `[src, src + len)` (the
                    // `post` contract); `dst` is `len` bytes of staging.
                    unsafe { peer_mem::copy(src, dst as u64, len) }
                });
                (queued, Wants::Ack { len: op.len })
            }
            OpKind::Put => {
                // SAFETY: the engine keeps the source registered until this
                // operation completes, which is after its send completed
                // (the target answers only what it received).
                let queued = unsafe {
                    conn.send
                        .push_ref(&h.encode(), op.local_addr, op.len as usize)
                };
                (queued, Wants::Ack { len: op.len })
            }
            OpKind::Get => {
                h.opcode = Opcode::Get;
                let wants = Wants::Data {
                    dst: op.local_addr,
                    len: op.len,
                    got: 0,
                };
                (conn.send.push_copy(&[&h.encode()]), wants)
            }
            OpKind::Atomic(aop) => {
                h.opcode = Opcode::Atomic;
                h.arg = aop.as_raw();
                h.len = 8;
                h.operand = op.operand;
                if aop == AtomicOp::CSWAP {
                    h.operand2 = op.operand2;
                }
                let dst = aop.is_fetching().then_some(op.local_addr);
                (conn.send.push_copy(&[&h.encode()]), Wants::Fetch { dst })
            }
            OpKind::Notify => {
                h = Header {
                    len: op.len,
                    seq: h.seq,
                    operand: op.operand,
                    ..Header::new(Opcode::Notify, op.lane)
                };
                let src = op.local_addr;
                let len = op.len as usize;
                let queued = conn.send.push_filled(&h.encode(), len, |dst| {
                    // SAFETY: as for a small PUT.
                    unsafe { peer_mem::copy(src, dst as u64, len) }
                });
                (queued, Wants::Ack { len: op.len })
            }
        };
        if !queued {
            return Posted::NoResource;
        }
        lane.push(token, wants);
        let slot = lane.conn;
        Self::want_send(to_send, slot, conn);
        // Once per connection until the commit takes the list.
        if !conn.spinning && conn.spin != SPIN_ROUNDS {
            to_spin.push(slot);
        }
        conn.spin = SPIN_ROUNDS;
        Posted::InFlight
    }

    /// What the driver knows without a round trip: a connection that
    /// failed (a reset, a hang-up, a peer's error) says so.
    fn check_alive(&mut self, ep: DriverEp) -> Result<(), Status> {
        match self.ep_mut(ep) {
            None => Err(Status::InvalidEndpoint),
            Some(endpoint) => match endpoint.state {
                EpState::Failed(status) => Err(status),
                _ => Ok(()),
            },
        }
    }

    fn flush(&mut self, ep: DriverEp, lanes: LaneMask, token: Token) -> Posted {
        let Some(endpoint) = self.ep_mut(ep) else {
            return Posted::Done(Err(Status::InvalidEndpoint));
        };
        if let EpState::Failed(status) = endpoint.state {
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

    fn commit(&mut self) {
        if !self.accept_armed {
            self.arm_accept();
        }
        let Tcp {
            conns,
            to_send,
            held_acks,
            ..
        } = self;
        // ACKs held since the last commit go now; this round's wait one
        // more (AckHold).
        held_acks.retain(|&slot| {
            let Some(conn) = live(conns, slot) else {
                return false;
            };
            match conn.ack {
                AckHold::Fresh if !conn.closing => {
                    conn.ack = AckHold::Aged;
                    return true;
                }
                AckHold::Aged if !conn.closing => {
                    // No room: the batch in flight makes room, and the ACK
                    // goes at a later commit.
                    if !conn.serve.queue_ack(&mut conn.send) {
                        return true;
                    }
                    Self::want_send(to_send, slot, conn);
                }
                _ => {}
            }
            conn.ack = AckHold::None;
            false
        });
        // Sends first: the kernel runs the entries in order, and a busy
        // receive ahead of a send would delay it by a receive that cannot
        // find its answer yet (SPIN_ROUNDS).
        self.start_sends();
        let mut to_spin = std::mem::take(&mut self.to_spin);
        for &slot in &to_spin {
            self.start_spin(slot);
        }
        to_spin.clear();
        self.to_spin = to_spin;
        let mut rearm = std::mem::take(&mut self.rearm);
        for &slot in &rearm {
            self.arm_recv(slot);
        }
        rearm.clear();
        // For the next commit: what arming asked for again, and busy
        // receives that found data this round.
        rearm.append(&mut self.rearm);
        rearm.append(&mut self.spin_next);
        self.rearm = rearm;
        self.spinners
            .retain(|&slot| live(&mut self.conns, slot).is_some_and(|c| c.spinning && !c.closing));
        if let Err(e) = self.uring.submit() {
            tracing::warn!(%e, "tcp: io_uring submit failed");
        }
    }

    fn poll(&mut self, out: &mut [Completion]) -> usize {
        let mut n = self.emit(out, 0);
        let mut budget = CQES_PER_POLL.max(out.len());
        while n < out.len() && budget > 0 {
            let Some(cqe) = self.uring.next() else {
                break;
            };
            budget -= 1;
            self.handle(&cqe);
            n = self.emit(out, n);
        }
        n
    }

    fn wake_fds(&self) -> Vec<BorrowedFd<'_>> {
        vec![self.uring.eventfd()]
    }

    /// Not now while the next round has work of its own: a held ACK to
    /// send (AckHold), a connection that busy-receives (what arrives for
    /// it signals nothing, SPIN_ROUNDS), or receives to arm again. Else the
    /// CQ eventfd is armed (read to zero, then the CQ looked at once more;
    /// not now if a completion or task work is already there).
    fn prepare_sleep(&mut self) -> Sleep {
        if !self.held_acks.is_empty() || !self.spinners.is_empty() || !self.rearm.is_empty() {
            return Sleep::NotNow;
        }
        if self.uring.prepare_sleep() {
            Sleep::Ready
        } else {
            Sleep::NotNow
        }
    }

    fn quiesce(&mut self, scope: Quiesce) -> Quiesced {
        match scope {
            // Accesses to registered memory happen inside `poll` (copies
            // out of the receive buffers), but a connection may still
            // reach a deregistered window: the rest of a PUT's payload
            // (copied, or received straight into it) and GET data sent
            // from it. `Pending` while the peer may finish, closed after
            // the timeout, and `Pending` until the kernel has let go.
            Quiesce::Memory(key) => self.quiesce_key(key.0 as u32),
            Quiesce::All => self.quiesce_all(),
        }
    }

    fn lane_ordered(&self, _ep: DriverEp, _lane: u8) -> bool {
        true
    }

    /// The target's NOTIFY storage, from the HELLO_ACKs of the endpoint's
    /// lanes (one target: every lane's says the same).
    fn peer_limits(&self, ep: DriverEp) -> Option<PeerLimits> {
        let endpoint = self.eps.get(ep.0 as usize)?.as_ref()?;
        let len = endpoint
            .lanes
            .iter()
            .filter(|l| l.up)
            .map(|l| l.peer_notify_len)
            .min()?;
        Some(PeerLimits::new(len))
    }
}
