//! The `Driver` implementation: its types and the trait's methods, with
//! the work in one file per concern: `conn.rs` (one connection's state),
//! `connection.rs` (the connection table, endpoints, connect), `events.rs`
//! (the completion queue and the
//! frames it carries), `posting.rs` (operations, flushes, the round's
//! doorbell), `memory.rs` (windows and keys), `teardown.rs` (quiesce).

use crate::lane::Lane;
use crate::target::Window;
use crate::uring::Uring;
use crate::wire::{Address, DUPLEX_DEPTH, HEADER_LEN};
use crate::{Config, MAX_LEN};
use nix::sys::socket::{self, sockopt};
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
        match $conn.fixed_file {
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
mod conn;
mod connection;
mod events;
mod memory;
mod posting;
mod teardown;

use conn::{AckHold, Conn, ConnState, OurLane, Receive, RecvMode, SPIN_ROUNDS};

/// Where an endpoint is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EpState {
    /// Greeting the peer on every lane; the connect's completion (this
    /// token) comes once every HELLO is answered.
    Connecting(Token),
    /// Every lane is up: operations may be posted.
    Up,
    /// Failed: every request on it completes with this status.
    Failed(Status),
    /// Released by `disconnect` (failed, with this status, first): the
    /// slot goes once everything is reported.
    Released(Status),
}

impl EpState {
    /// The status its requests fail with, once it failed (released or
    /// not).
    fn failed(self) -> Option<Status> {
        match self {
            EpState::Failed(status) | EpState::Released(status) => Some(status),
            EpState::Connecting(_) | EpState::Up => None,
        }
    }
}

#[derive(Debug)]
struct Flush {
    token: Token,
    /// Lanes still to report everything the flush covers.
    remaining: u32,
}

/// One endpoint: a connection to a peer worker over `lanes.len()` TCP
/// connections.
#[derive(Debug)]
struct Ep {
    /// The peer's listening address and instance.
    peer: Address,
    state: EpState,
    /// One per lane, each on its own connection.
    lanes: Vec<Lane>,
    /// Flushes in flight, by slot (a lane's marks name the slot).
    flushes: Vec<Option<Flush>>,
    /// It is on the driver's list of endpoints with answers to report
    /// (`to_report`).
    on_report_list: bool,
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
    /// Endpoints with answers to report (each once: `Ep::on_report_list`).
    to_report: Vec<u32>,
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
    /// The listener's multishot accept is in flight.
    accept_armed: bool,
    /// When `quiesce(All)` was first asked: from then on a lane that loses
    /// its connection does not open another.
    teardown: Option<Instant>,
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
            to_report: Vec::with_capacity(64),
            to_send: Vec::with_capacity(64),
            held_acks: Vec::with_capacity(64),
            to_spin: Vec::with_capacity(64),
            spinners: Vec::with_capacity(64),
            spin_next: Vec::with_capacity(64),
            rearm: Vec::with_capacity(64),
            accept_armed: false,
            teardown: None,
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
            Some(endpoint) => match endpoint.state.failed() {
                Some(status) => Err(status),
                None => Ok(()),
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
