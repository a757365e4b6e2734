//! The `Driver` implementation: its types and the trait's methods, with
//! the parts of the driver's state that are borrowed apart in files of
//! their own, `conn.rs` (one connection's state), `conn_table.rs` (the
//! connection table), `endpoint.rs` (the endpoint table and what is
//! reported of it), `round.rs` (what the next commit does, and whether a
//! core thread may sleep), and the work in one file per concern:
//! `connection.rs` (accepting, opening, adopting, closing connections;
//! endpoints over them), `events.rs` (the completion queue and the frames
//! it carries), `posting.rs` (operations, flushes, the round's doorbell),
//! `memory.rs` (windows and keys), `teardown.rs` (quiesce).

use crate::sys::mem::{Local, Window};
use crate::sys::uring::Uring;
use crate::wire::{Address, DUPLEX_DEPTH, HEADER_LEN};
use crate::{Config, MAX_LEN};
use nix::sys::socket::{self, sockopt};
use ringfence::{
    Capabilities, Completion, Connect, Driver, DriverContext, DriverEp, DriverError, DriverMemKey,
    DriverRkey, KeyPart, LaneMask, MemDesc, NotifyPool, Op, PeerLimits, Posted, Prepared, Quiesce,
    Quiesced, Registered, Sleep, Token, Unpacked,
};
use ringfence_ring::Status;
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
/// Completions handled per `poll` call at most, beyond what fits `out`
/// (a round stays bounded under a flood of incoming requests).
const CQES_PER_POLL: usize = 256;
/// How long the requests of connections closed for a quiesce (shutdown,
/// then canceled) may take to end before the memory they name is given up
/// as leaked: a canceled receive may write into its window until its own
/// completion comes back.
const CANCEL_WAIT: Duration = Duration::from_secs(10);

mod conn;
mod conn_table;
mod connection;
mod endpoint;
mod events;
mod memory;
mod posting;
mod round;
mod teardown;

use conn::{Conn, ConnState, OurLane, Receive, RecvMode, SPIN_ROUNDS};
use conn_table::Conns;
use endpoint::{Endpoints, Ep, EpState, Flush, MAX_FLUSHES};
use round::Round;

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
/// operation through one io_uring. See the [crate] documentation.
pub struct Tcp {
    /// The io_uring and its receive buffers: dropped with the driver once
    /// the kernel holds no request, else leaked (see `Drop`).
    uring: Uring,
    listener: OwnedFd,
    address: Address,
    config: Config,
    /// Every connection, by slot.
    conns: Conns,
    /// Every endpoint, by handle, and what is to be reported of them.
    eps: Endpoints,
    /// Registered windows, by registration id.
    regs: Vec<Option<Window>>,
    /// Remote keys unpacked for our endpoints, by driver key handle.
    rkeys: Vec<Rkey>,
    /// What the next commit does, and who busy-receives.
    round: Round,
    /// The listener's multishot accept is in flight.
    accept_armed: bool,
    /// When `quiesce(All)` was first asked: from then on a lane that loses
    /// its connection does not open another.
    teardown: Option<Instant>,
    /// Registrations whose `quiesce` answered `Pending` (see
    /// [`KeyQuiesce`]); their ids are not reused until it is over.
    quiescing: Vec<KeyQuiesce>,
    /// Where incoming notifications go (from `attach`).
    notify: Option<Arc<NotifyPool>>,
}

impl std::fmt::Debug for Tcp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tcp")
            .field("address", &self.address.socket)
            .field("uring", &self.uring)
            .finish_non_exhaustive()
    }
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
            uring,
            listener,
            address: Address {
                socket: local,
                instance: u64::from_le_bytes(instance),
            },
            conns: Conns::default(),
            eps: Endpoints::new(),
            regs: Vec::new(),
            rkeys: Vec::new(),
            round: Round::new(),
            accept_armed: false,
            teardown: None,
            quiescing: Vec::new(),
            notify: None,
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
                    self.conns.leak();
                    self.uring.leak();
                    return;
                }
            }
        }
        // Nothing in flight: the ring and its buffers go with the fields.
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

    // The trait declares `post` unsafe (its contract is the engine's
    // promise about the operation's local memory): the one item outside
    // `sys` allowed unsafe code, to turn that promise into the `Local`
    // that `sys` reads and writes through.
    #[allow(unsafe_code)]
    unsafe fn post(&mut self, ep: DriverEp, op: &Op, token: Token) -> Posted {
        // SAFETY: `op` comes with the `post` contract, `Local::of`'s.
        let local = unsafe { Local::of(op) };
        self.post_op(ep, op, local, token)
    }

    /// What the driver knows without a round trip: a connection that
    /// failed (a reset, a hang-up, a peer's error) says so.
    fn check_alive(&mut self, ep: DriverEp) -> Result<(), Status> {
        match self.eps.get(ep.0) {
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
        let mut n = self.eps.emit(out, 0);
        let mut budget = CQES_PER_POLL.max(out.len());
        while n < out.len() && budget > 0 {
            let Some(cqe) = self.uring.next() else {
                break;
            };
            budget -= 1;
            self.handle(cqe);
            n = self.eps.emit(out, n);
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
        if self.round.keeps_awake() {
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
        let endpoint = self.eps.get(ep.0)?;
        let len = endpoint
            .lanes
            .iter()
            .filter(|l| l.up)
            .map(|l| l.peer_notify_len)
            .min()?;
        Some(PeerLimits::new(len))
    }
}
