//! The `Driver` implementation: its types and the trait's methods, with
//! the work in one file per concern: `connection.rs` (the connection
//! table, endpoints, connect), `events.rs` (the completion queue and the
//! frames it carries), `posting.rs` (operations, flushes, the round's
//! doorbell), `memory.rs` (windows and keys), `teardown.rs` (quiesce).

use crate::lane::Lane;
use crate::send::SendQueue;
use crate::stream::Reader;
use crate::target::{TargetSide, Window};
use crate::uring::Uring;
use crate::wire::{Address, DUPLEX_DEPTH, HEADER_LEN};
use crate::{Config, MAX_LEN};
use nix::sys::socket::{self, SockaddrStorage, sockopt};
use ringfence::{
    Capabilities, Completion, Connect, Driver, DriverContext, DriverEp, DriverError, DriverMemKey,
    DriverRkey, KeyPart, LaneMask, MemDesc, NotifyPool, Op, PeerLimits, Posted, Prepared, Quiesce,
    Quiesced, Registered, Sleep, Token, Unpacked,
};
use ringfence_ring::Status;
use std::collections::VecDeque;
use std::mem::ManuallyDrop;
use std::net::SocketAddr;
use std::os::fd::{BorrowedFd, OwnedFd};
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

// After the macro: the files below use it.
mod connection;
mod events;
mod memory;
mod posting;
mod teardown;

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
/// endpoints (`our_lane`), and the peer's requests once the peer greeted on it
/// (`serve`); both at once when one side adopted the other's connection
/// (see [`wire`](crate::wire), "Both ways on one connection").
struct Conn {
    fd: OwnedFd,
    generation: u32,
    /// Lane `.1` of our endpoint `.0` sends its requests here.
    our_lane: Option<(u32, u8)>,
    /// Some lane of ours used it: answers that still come after it let go
    /// are dropped, not a protocol error.
    served_our_lane: bool,
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
    gets_from_window: bool,
    /// The peer's address, for an accepted connection (an adopted lane
    /// must lead to the address the endpoint names).
    peer_ip: Option<std::net::IpAddr>,
    reader: Reader,
    send: SendQueue,
    /// The peer's address, for the connect request.
    peer: SockaddrStorage,
    /// Requests in flight that name this connection (connect, send,
    /// multishot receive).
    in_flight: u32,
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
    on_send_list: bool,
    closing: bool,
    /// Received buffers not yet (fully) taken by the reader: (buffer id,
    /// length, bytes taken).
    backlog: VecDeque<(u16, u32, u32)>,
    serve: TargetSide,
    /// A large PUT's payload received straight into its window.
    direct: Direct,
    /// Bytes a direct receive placed that the reader has not moved past.
    direct_unread: u32,
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
            .field("our_lane", &self.our_lane)
            .field("accepted", &self.accepted)
            .field("duplex", &self.duplex)
            .field("in_flight", &self.in_flight)
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
    on_send_list: bool,
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
    regs: Vec<Option<Window>>,
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
        self.connect_peer(peer, lanes, token)
    }

    fn disconnect(&mut self, ep: DriverEp) {
        self.disconnect_ep(ep);
    }

    fn register(&mut self, mem: &MemDesc, prepared: Prepared) -> Result<Registered, DriverError> {
        self.register_window(mem, prepared)
    }

    fn deregister(&mut self, key: DriverMemKey) {
        self.deregister_window(key);
    }

    fn pack_rkey(&self, key: DriverMemKey) -> Result<Vec<u8>, DriverError> {
        self.pack_key(key)
    }

    fn unpack_rkey(
        &mut self,
        ep: DriverEp,
        part: &KeyPart<'_>,
        prepared: Prepared,
    ) -> Result<Unpacked, DriverError> {
        self.unpack_key(ep, part, prepared)
    }

    fn release_rkey(&mut self, ep: DriverEp, rkey: DriverRkey) {
        self.release_key(ep, rkey);
    }

    unsafe fn post(&mut self, ep: DriverEp, op: &Op, token: Token) -> Posted {
        // SAFETY: the engine's guarantee for `post` is `post_op`'s.
        unsafe { self.post_op(ep, op, token) }
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
        self.flush_lanes(ep, lanes, token)
    }

    fn commit(&mut self) {
        self.commit_round();
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
        self.quiesce_scope(scope)
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
