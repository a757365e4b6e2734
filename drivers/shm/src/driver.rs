//! [`Shm`]: the driver the engine calls.

use crate::ShmError;
use crate::channel::{self, Inbound, Producer};
use crate::control::{self, Liveness, Shared, Watch};
use crate::export::{self, Backing, Export, ExportTable, StatusPage};
use crate::key::KeyBlob;
use crate::layout::{
    CHANNEL_AT, CMA_ACTIVE_AT, EXPORT_SLOTS, MAX_CHANNEL, MIN_CHANNEL, liveness_at, status_page_len,
};
use crate::memfd;
use crate::sys::alloc::ShmAlloc;
use crate::sys::fdpass;
use crate::sys::hot::HotKey;
use crate::sys::region::SharedRegion;
use crate::sys::rma;
use crate::sys::robust::Word;
use crate::wire::{self, KeyPath, Message};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::socket::{
    AddressFamily, Backlog, Shutdown, SockFlag, SockType, UnixAddr, bind, connect, getsockopt,
    listen, shutdown, socket, sockopt,
};
use nix::unistd::Pid;
use ringfence::{
    Capabilities, Completion, Connect, DirectPath, Driver, DriverContext, DriverEp, DriverError,
    DriverMemKey, DriverMemory, DriverRkey, KeyPart, LaneMask, MemDesc, MemKind, NotifyPool, Op,
    OpKind, PeerLimits, Posted, Prepare, Prepared, Quiesce, Quiesced, Registered, Sleep, Token,
    Unpacked,
};
use ringfence_ring::Status;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The address part: `"SHM1"` then the abstract socket name.
const ADDRESS_MAGIC: &[u8; 4] = b"SHM1";
/// The longest abstract socket name accepted from a peer's address.
const MAX_NAME: usize = 100;
/// How long a control request may wait for its reply (only catches a
/// stuck or misbehaving peer: a live control thread answers at once).
const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `deregister` waits for a peer's cross-memory-attach access in
/// progress to end.
const REVOKE_WAIT: Duration = Duration::from_secs(1);
/// Default notification channel bytes per endpoint.
pub const DEFAULT_CHANNEL_BYTES: u32 = 256 << 10;
/// The largest PUT/GET.
const MAX_LEN: u32 = 1 << 30;

/// Builds an [`Shm`] driver.
#[derive(Debug, Clone)]
pub struct ShmBuilder {
    channel_bytes: u32,
}

impl Default for ShmBuilder {
    fn default() -> Self {
        ShmBuilder {
            channel_bytes: DEFAULT_CHANNEL_BYTES,
        }
    }
}

impl ShmBuilder {
    /// Bytes of the notification channel of each endpoint this driver
    /// connects (a power of two, 4 KiB to 64 MiB; default 256 KiB). A
    /// NOTIFY takes its payload rounded up to 16 bytes plus 16.
    pub fn channel_bytes(&mut self, bytes: u32) -> &mut Self {
        self.channel_bytes = bytes;
        self
    }

    /// Creates the driver: its socket (in the abstract namespace, named
    /// after the process and a random number), its export status page, and
    /// its control thread.
    ///
    /// # Errors
    /// [`ShmError::InvalidConfig`] for a bad channel size,
    /// [`ShmError::Os`] if a system call failed.
    pub fn build(&self) -> Result<Shm, ShmError> {
        if !self.channel_bytes.is_power_of_two()
            || !(MIN_CHANNEL..=MAX_CHANNEL).contains(&self.channel_bytes)
        {
            return Err(ShmError::InvalidConfig(format!(
                "channel_bytes must be a power of two in {MIN_CHANNEL}..={MAX_CHANNEL}, not {}",
                self.channel_bytes
            )));
        }
        let os = |op: &'static str| {
            move |e: nix::Error| ShmError::Os {
                op,
                source: e.into(),
            }
        };
        let random = || {
            getrandom::u64().map_err(|e| ShmError::Os {
                op: "getrandom",
                source: std::io::Error::other(e.to_string()),
            })
        };
        let instance = random()?;
        let name = format!("ringfence-shm.{}.{:016x}", std::process::id(), random()?);
        let listener = socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            None,
        )
        .map_err(os("socket"))?;
        bind(
            listener.as_raw_fd(),
            &UnixAddr::new_abstract(name.as_bytes()).map_err(os("socket name"))?,
        )
        .map_err(os("bind"))?;
        listen(&listener, Backlog::new(128).map_err(os("listen"))?).map_err(os("listen"))?;
        let status = StatusPage::new().map_err(|source| ShmError::Os {
            op: "export status page",
            source,
        })?;
        let shared = Arc::new(Shared {
            instance,
            exports: Mutex::new(ExportTable::default()),
            status,
            notify: OnceLock::new(),
            inbound: Mutex::new(Arc::from(Vec::new())),
            inbound_version: AtomicU64::new(0),
            watches: Mutex::new(Vec::new()),
            deaths: AtomicU64::new(0),
            wake: EventFd::new().map_err(os("eventfd"))?,
            doorbell: EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
                .map_err(os("eventfd"))?,
            polls: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let control = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("ringfence-shm".into())
                .spawn(move || control::run(&shared, &listener))
                .map_err(|source| ShmError::Os {
                    op: "spawn control thread",
                    source,
                })?
        };
        let mut address = ADDRESS_MAGIC.to_vec();
        address.extend_from_slice(name.as_bytes());
        tracing::debug!(name, "shm driver listening");
        Ok(Shm {
            shared,
            control: Some(control),
            address,
            channel_bytes: self.channel_bytes,
            notify: None,
            allocs: Vec::new(),
            conns: Vec::new(),
            peers: Peers::default(),
            rkeys: Vec::new(),
            inbound: Arc::from(Vec::new()),
            inbound_seen: 0,
            deaths_seen: 0,
            hot: None,
            revoked_cma: Vec::new(),
        })
    }
}

impl Conn {
    /// Whether the peer is alive now, as a flush must know it: its
    /// liveness word says so (one load); a peer whose word is not armed is
    /// asked through its socket instead (one system call, only then).
    fn peer_alive(&self) -> bool {
        // One look at the word: a mark it finds is remembered (`dead`).
        match self.liveness.state() {
            Word::Alive => true,
            Word::Gone => false,
            Word::Unarmed => socket_open(&self.control.socket),
        }
    }
}

/// A connection's control channel: requests to the peer's control thread
/// and their replies, one exchange at a time. Shared with the first phase
/// of unpacks ([`ShmPrepare`]), which asks the peer without the engine
/// lock.
#[derive(Debug)]
struct Control {
    /// Blocking; control requests and their replies.
    socket: OwnedFd,
    /// The last request's sequence number, held for a whole exchange.
    seq: Mutex<u32>,
}

/// What the first phase of an unpack needs of a connection that is up.
#[derive(Debug, Clone)]
struct PeerControl {
    control: Arc<Control>,
    liveness: Arc<Liveness>,
    instance: u64,
}

/// The connections that are up, by endpoint, for [`ShmPrepare`].
type Peers = Arc<Mutex<Vec<Option<PeerControl>>>>;

/// The first phase of [`Shm`]'s unpacks ([`Driver::prepare`]): the MAP
/// round trip to the peer's control thread, and mapping its memfd, run on
/// the application's thread without the engine lock. A peer that is slow
/// to answer (stopped, swapped out) then stalls only this unpack, for at
/// most the control timeout, not every endpoint of the worker.
#[derive(Debug)]
struct ShmPrepare {
    peers: Peers,
}

impl Prepare for ShmPrepare {
    fn unpack(&self, ep: DriverEp, part: &KeyPart<'_>) -> Result<Prepared, DriverError> {
        let peer = lock(&self.peers)
            .get(ep.0 as usize)
            .and_then(Option::clone)
            .ok_or_else(|| err(Status::InvalidEndpoint, "not connected"))?;
        Ok(Prepared::new(map_key(&peer, part.blob)?))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A peer's key, checked with the peer and mapped (the first phase of an
/// unpack).
#[derive(Debug)]
struct MappedKey {
    slot: u32,
    generation: u32,
    /// The region's true bounds, from the target (not from the blob).
    base: u64,
    len: u64,
    access: Access,
}

/// Asks `peer` for the region `blob` names (MAP) and maps it.
fn map_key(peer: &PeerControl, blob: &[u8]) -> Result<MappedKey, DriverError> {
    let key =
        KeyBlob::decode(blob).ok_or_else(|| err(Status::InvalidArgument, "malformed shm key"))?;
    if peer.liveness.gone() {
        return Err(err(Status::PeerUnreachable, "the shm peer is gone"));
    }
    if key.instance != peer.instance {
        return Err(err(Status::InvalidRkey, "the key belongs to another peer"));
    }
    let request = Message::Map {
        slot: key.slot,
        generation: key.generation,
        secret: key.secret,
    };
    let (reply, mut fds) = Shm::request(&peer.control, &peer.liveness, request, &[])?;
    let Message::Mapped {
        status,
        path,
        base,
        len,
        fd_offset,
    } = reply
    else {
        return Err(err(Status::Transport, "unexpected reply to MAP"));
    };
    wire::status_from_wire(status).map_err(|s| err(s, "the shm peer refused the key"))?;
    let path = KeyPath::from_raw(path).ok_or_else(|| err(Status::Transport, "unknown key path"))?;
    if base != key.base || len != key.len || path != key.path {
        return Err(err(
            Status::InvalidRkey,
            "the key's bounds disagree with the target's export",
        ));
    }
    let access = match path {
        KeyPath::Memfd => {
            let fd = match (fds.pop(), fds.is_empty()) {
                (Some(fd), true) => fd,
                _ => {
                    return Err(err(
                        Status::Transport,
                        "MAPPED needs exactly one descriptor",
                    ));
                }
            };
            let end = fd_offset
                .checked_add(len)
                .filter(|&end| usize::try_from(end).is_ok())
                .ok_or_else(|| err(Status::Transport, "region out of range"))?;
            memfd::check(&fd, end)
                .map_err(|e| err(Status::AccessDenied, format!("the peer's region: {e}")))?;
            let region = SharedRegion::map(fd.as_fd(), fd_offset, len as usize, true)
                .map_err(|e| err(Status::NoMemory, format!("mapping the peer's region: {e}")))?;
            Access::Mapped(Arc::new(region))
        }
        KeyPath::CrossMemoryAttach => {
            if !fds.is_empty() {
                return Err(err(Status::Transport, "unexpected descriptor with MAPPED"));
            }
            Access::CrossMemoryAttach
        }
    };
    Ok(MappedKey {
        slot: key.slot,
        generation: key.generation,
        base,
        len,
        access,
    })
}

/// An outgoing connection (one endpoint).
#[derive(Debug)]
struct Conn {
    control: Arc<Control>,
    liveness: Arc<Liveness>,
    lanes: u8,
    peer_pid: Pid,
    peer_instance: u64,
    /// The peer's notification buffer size: larger payloads are refused
    /// here with TRUNCATED.
    peer_notify_size: u32,
    /// The peer's memory; `None` once released after the peer died.
    maps: Option<ConnMaps>,
    /// The peer's doorbell (non-blocking): rung after a NOTIFY when the
    /// peer's worker does not poll.
    doorbell: Option<OwnedFd>,
}

#[derive(Debug)]
struct ConnMaps {
    channel: Producer,
    /// The peer's export status page, read-only (shared with the hot key).
    status: Arc<SharedRegion>,
}

/// How an unpacked key reaches its region.
#[derive(Debug)]
enum Access {
    /// The region's memfd, mapped here (exactly the region; shared with the
    /// hot key).
    Mapped(Arc<SharedRegion>),
    /// Cross memory attach into the peer process.
    CrossMemoryAttach,
}

#[derive(Debug)]
struct RemoteKey {
    ep: u32,
    slot: u32,
    generation: u32,
    /// The region's true bounds, from the target (not from the blob).
    base: u64,
    len: u64,
    access: Access,
}

/// The shared-memory driver. See the crate docs.
#[derive(Debug)]
pub struct Shm {
    shared: Arc<Shared>,
    control: Option<JoinHandle<()>>,
    address: Vec<u8>,
    channel_bytes: u32,
    notify: Option<Arc<NotifyPool>>,
    /// This driver's memfd allocations, to recognize them at `register`.
    allocs: Vec<Weak<ShmAlloc>>,
    conns: Vec<Option<Conn>>,
    /// The control side of the connections that are up, for unpacks'
    /// first phase.
    peers: Peers,
    rkeys: Vec<Option<RemoteKey>>,
    /// Incoming channels: the control thread's last snapshot.
    inbound: Arc<[Arc<Inbound>]>,
    inbound_seen: u64,
    deaths_seen: u64,
    /// The last mapped key a PUT or GET went through (see [`HotKey`]).
    /// `release_dead` and `disconnect` drop it with the mappings it holds.
    hot: Option<HotKey>,
    /// Cross-memory-attach exports revoked by `deregister` whose peers'
    /// accesses `quiesce` has not waited out yet, by slot.
    revoked_cma: Vec<u32>,
}

fn err(status: Status, detail: impl Into<String>) -> DriverError {
    DriverError::new(status, detail)
}

impl Shm {
    /// A driver with the default settings (see [`ShmBuilder`]).
    ///
    /// # Errors
    /// As [`ShmBuilder::build`].
    pub fn new() -> Result<Shm, ShmError> {
        ShmBuilder::default().build()
    }

    /// A builder.
    pub fn builder() -> ShmBuilder {
        ShmBuilder::default()
    }

    /// Sends a control request on `control` and waits for its reply (for
    /// at most `CONTROL_TIMEOUT`); a lost connection marks `liveness`
    /// dead.
    fn request(
        control: &Control,
        liveness: &Liveness,
        message: Message,
        fds: &[std::os::fd::BorrowedFd<'_>],
    ) -> Result<(Message, Vec<OwnedFd>), DriverError> {
        // One exchange at a time on a connection: replies come in order.
        let mut last = lock(&control.seq);
        *last = last.wrapping_add(1);
        let seq = *last;
        let socket = &control.socket;
        let unreachable = |what: &str| err(Status::PeerUnreachable, format!("shm peer: {what}"));
        fdpass::send(socket.as_fd(), &message.encode(seq), fds, true)
            .map_err(|e| unreachable(&format!("sending a request: {e}")))?;
        let deadline = Instant::now() + CONTROL_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(err(
                    Status::Timeout,
                    "shm peer did not answer a control request",
                ));
            }
            let mut pfd = [PollFd::new(socket.as_fd(), PollFlags::POLLIN)];
            let timeout = PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX);
            match poll(&mut pfd, timeout) {
                Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
                Ok(_) => {}
                Err(e) => return Err(unreachable(&format!("poll: {e}"))),
            }
            let mut buf = [0u8; wire::MAX_MESSAGE + 1];
            let received = match fdpass::recv(socket.as_fd(), &mut buf, true) {
                Ok(r) => r,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => {
                    liveness.dead.store(true, Ordering::Release);
                    return Err(unreachable(&format!("connection lost: {e}")));
                }
            };
            let decoded = (!received.truncated)
                .then(|| Message::decode(&buf[..received.len]).ok())
                .flatten();
            match decoded {
                Some((s, reply)) if s == seq => return Ok((reply, received.fds)),
                // A late reply to an earlier request that timed out.
                Some(_) => continue,
                None => return Err(err(Status::Transport, "malformed reply from the shm peer")),
            }
        }
    }

    /// Picks up the control thread's latest set of incoming channels.
    fn refresh_inbound(&mut self) {
        // Acquire: pairs with the Release in `control::publish`.
        let version = self.shared.inbound_version.load(Ordering::Acquire);
        if version != self.inbound_seen {
            self.inbound_seen = version;
            self.inbound = self.shared.inbound_snapshot();
        }
    }

    /// Unmaps the memory of peers found dead since the last call.
    fn release_dead(&mut self) {
        let deaths = self.shared.deaths.load(Ordering::Acquire);
        if deaths == self.deaths_seen {
            return;
        }
        self.deaths_seen = deaths;
        // Its mappings go with the others.
        self.hot = None;
        for (ep, slot) in self.conns.iter_mut().enumerate() {
            let Some(conn) = slot else { continue };
            if conn.maps.is_some() && conn.liveness.dead.load(Ordering::Acquire) {
                conn.maps = None;
                for key in &mut self.rkeys {
                    if key.as_ref().is_some_and(|k| k.ep == ep as u32) {
                        *key = None;
                    }
                }
                tracing::debug!(endpoint = ep, "dead shm peer's memory unmapped");
            }
        }
    }

    /// `execute` through the hot key, if `ep` and the run's first
    /// operation name it; `None` leaves the run to the full path. Stops
    /// before the first operation it does not take, as `execute` may.
    #[inline]
    fn execute_hot(
        &self,
        ep: DriverEp,
        ops: &[Op],
        results: &mut [Result<u32, Status>],
    ) -> Option<usize> {
        let hot = self.hot.as_ref().filter(|hot| hot.ep == ep.0)?;
        // Acquire: as in the full path, once per run; the full path
        // reports a dead peer.
        if hot.liveness.gone() {
            return None;
        }
        let n = ops.len().min(results.len());
        let mut ran = 0;
        while ran < n {
            let op = &ops[ran];
            let done = match op.remote {
                Some((rkey, addr)) if rkey == hot.rkey && op.lane < hot.lanes => {
                    hot.access(op, addr)
                }
                _ => None,
            };
            let Some(done) = done else { break };
            results[ran] = done;
            ran += 1;
            if done.is_err() {
                break;
            }
        }
        (ran > 0).then_some(ran)
    }

    /// `execute` with every lookup (the first run through a key, a dead
    /// peer, an ATOMIC, anything else the hot key does not take). Out of
    /// line: the hot path's caller stays small.
    #[inline(never)]
    fn execute_full(
        &mut self,
        ep: DriverEp,
        ops: &[Op],
        results: &mut [Result<u32, Status>],
    ) -> usize {
        let Some(first) = results.first_mut() else {
            return 0;
        };
        let Some(conn) = self.conns.get(ep.0 as usize).and_then(Option::as_ref) else {
            *first = Err(Status::EndpointClosed);
            return 1;
        };
        // Acquire: pairs with the control thread's store on hang-up. Once
        // per run (`post` runs a run of one): a peer that dies during the
        // run takes its mappings with it only when `poll` releases them,
        // after this call.
        let maps = match conn.maps.as_ref() {
            Some(maps) if !conn.liveness.gone() => maps,
            _ => {
                *first = Err(Status::PeerUnreachable);
                return 1;
            }
        };
        // A run names one remote key, as a rule: looked up once.
        let mut key: Option<(DriverRkey, &RemoteKey)> = None;
        for (i, (op, result)) in ops.iter().zip(results.iter_mut()).enumerate() {
            *result = match op.remote {
                _ if op.lane >= conn.lanes || op.kind == OpKind::Notify => {
                    Err(Status::InvalidArgument)
                }
                None => Err(Status::InvalidRkey),
                Some((rkey, addr)) => match key {
                    Some((id, key)) if id == rkey => Shm::access(key, conn, maps, op, addr),
                    _ => Shm::remote_key(&self.rkeys, ep, rkey).and_then(|k| {
                        key = Some((rkey, k));
                        Shm::access(k, conn, maps, op, addr)
                    }),
                },
            };
            if result.is_err() {
                return i + 1;
            }
        }
        // The key of a run of PUTs and GETs that went through a mapping
        // becomes the hot one.
        if let Some((rkey, k)) = key {
            let copies = ops
                .last()
                .is_some_and(|op| matches!(op.kind, OpKind::Put | OpKind::Get));
            if let (true, Access::Mapped(region)) = (copies, &k.access) {
                self.hot = HotKey::new(
                    (ep.0, rkey, conn.lanes),
                    (region.clone(), k.base),
                    (maps.status.clone(), k.slot, k.generation),
                    conn.liveness.clone(),
                );
            }
        }
        ops.len().min(results.len())
    }

    /// The unpacked key `rkey` of endpoint `ep`.
    fn remote_key(
        rkeys: &[Option<RemoteKey>],
        ep: DriverEp,
        rkey: DriverRkey,
    ) -> Result<&RemoteKey, Status> {
        rkeys
            .get(rkey.0 as usize)
            .and_then(Option::as_ref)
            .filter(|k| k.ep == ep.0)
            .ok_or(Status::InvalidRkey)
    }

    /// Runs PUT, GET or ATOMIC `op` at `addr` through `key`, after checking
    /// the range against the target's bounds and that the target still
    /// exports the region.
    #[inline]
    fn access(
        key: &RemoteKey,
        conn: &Conn,
        maps: &ConnMaps,
        op: &Op,
        addr: u64,
    ) -> Result<u32, Status> {
        let offset = addr
            .checked_sub(key.base)
            .filter(|off| {
                off.checked_add(u64::from(op.len))
                    .is_some_and(|end| end <= key.len)
            })
            .ok_or(Status::OutOfBounds)?;
        match &key.access {
            Access::Mapped(region) => {
                // Acquire: pairs with the Release in `StatusPage::set_live`.
                if !export::is_live(&maps.status, key.slot, key.generation, Ordering::Acquire) {
                    return Err(Status::AccessDenied);
                }
                rma::mapped(region, offset, op)
            }
            Access::CrossMemoryAttach => {
                let guard = maps
                    .channel
                    .page()
                    .word(CMA_ACTIVE_AT)
                    .ok_or(Status::Transport)?;
                // SeqCst store then SeqCst load: Dekker with the target's
                // `revoke` + guard check (see `layout`).
                guard.store(u64::from(key.slot) + 1, Ordering::SeqCst);
                // The peer's pid names it only while it lives (a reaped
                // pid can be reused): liveness is asked right before the
                // system call, and again after it, so an access that
                // overlapped the peer's death does not report success.
                let result =
                    if !export::is_live(&maps.status, key.slot, key.generation, Ordering::SeqCst) {
                        Err(Status::AccessDenied)
                    } else if conn.liveness.gone() {
                        Err(Status::PeerUnreachable)
                    } else {
                        match rma::cma(conn.peer_pid, addr, op) {
                            Ok(_) if conn.liveness.gone() => Err(Status::PeerUnreachable),
                            result => result,
                        }
                    };
                // Release: the access is over before the target may reuse
                // the memory; pairs with the SeqCst load in `deregister`.
                guard.store(0, Ordering::Release);
                result
            }
        }
    }

    /// Waits (bounded) until no peer runs a cross-memory-attach access with
    /// a key of `slot`; the slot is revoked already. `false` if one still
    /// ran when the wait ended: the peer may yet write the memory.
    fn wait_for_cma(&self, slot: u32) -> bool {
        let mut ended = true;
        let deadline = Instant::now() + REVOKE_WAIT;
        for channel in self.shared.inbound_snapshot().iter() {
            let Some(guard) = channel.page().word(CMA_ACTIVE_AT) else {
                continue;
            };
            let mut spins = 0u32;
            while guard.load(Ordering::SeqCst) == u64::from(slot) + 1 {
                if channel.closing.load(Ordering::Acquire) {
                    break;
                }
                if Instant::now() > deadline {
                    tracing::warn!(
                        peer = channel.peer_pid,
                        slot,
                        "a peer's access outlived deregistration's wait"
                    );
                    ended = false;
                    break;
                }
                spins += 1;
                if spins < 64 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
        ended
    }
}

impl Drop for Shm {
    fn drop(&mut self) {
        // Every export dies with the driver: peers are refused from now on
        // (and see the hang-up of the sockets below).
        for (slot, _) in self.shared.exports().live().collect::<Vec<_>>() {
            self.shared.status.revoke(slot);
        }
        for conn in self.conns.iter().flatten() {
            let _ = shutdown(conn.control.socket.as_raw_fd(), Shutdown::Both);
        }
        self.shared.stop.store(true, Ordering::Release);
        self.shared.ring();
        if let Some(control) = self.control.take() {
            if control.join().is_err() {
                tracing::error!("shm control thread panicked");
            }
        }
    }
}

/// Whether a connection socket is still open at the peer's end (a
/// zero-timeout `poll`: no hang-up, no error).
fn socket_open(socket: &OwnedFd) -> bool {
    // Hang-up and errors are always reported; nothing else is asked.
    let mut pfd = [PollFd::new(socket.as_fd(), PollFlags::empty())];
    match poll(&mut pfd, PollTimeout::ZERO) {
        Ok(_) => !pfd[0].revents().is_some_and(|r| {
            r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR | PollFlags::POLLNVAL)
        }),
        Err(_) => false,
    }
}

/// The size of a connection page with a channel of `bytes`.
fn page_size(bytes: u32) -> u64 {
    CHANNEL_AT as u64 + u64::from(bytes)
}

// Implements the engine's unsafe data-path contract (`post`); the memory
// accesses themselves are in `sys`.
#[allow(unsafe_code)]
impl Driver for Shm {
    fn name(&self) -> &'static str {
        "shm"
    }

    fn capabilities(&self) -> Capabilities {
        // Every operation completes inside the call that runs it (see
        // `direct` for the run path).
        Capabilities::host_rma(ringfence::MAX_LANES, MAX_LEN)
    }

    fn attach(&mut self, ctx: DriverContext) {
        let _ = self.shared.notify.set(ctx.notify.clone());
        self.notify = Some(ctx.notify);
    }

    fn address(&self) -> Vec<u8> {
        self.address.clone()
    }

    /// Local IPC with the peer's control thread (not its progress), so the
    /// connection is up when this returns.
    fn connect(&mut self, peer: &[u8], lanes: u8, _token: Token) -> Result<Connect, DriverError> {
        let name = peer
            .strip_prefix(ADDRESS_MAGIC)
            .filter(|n| !n.is_empty() && n.len() <= MAX_NAME)
            .ok_or_else(|| err(Status::InvalidArgument, "malformed shm address"))?;
        let os = |what: &'static str| move |e: nix::Error| err(Status::Io, format!("{what}: {e}"));
        let socket = socket(
            AddressFamily::Unix,
            SockType::SeqPacket,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .map_err(os("socket"))?;
        let addr = UnixAddr::new_abstract(name).map_err(os("socket name"))?;
        connect(socket.as_raw_fd(), &addr).map_err(|e| {
            err(
                Status::PeerUnreachable,
                format!("no shm worker listens at that address: {e}"),
            )
        })?;
        let peer_pid = getsockopt(&socket, sockopt::PeerCredentials)
            .map(|c| Pid::from_raw(c.pid()))
            .map_err(os("SO_PEERCRED"))?;

        // The connection page: header, indices, notification channel.
        let size = page_size(self.channel_bytes);
        let page_fd = memfd::create("ringfence-shm-conn", size)
            .and_then(|fd| memfd::seal(fd.as_fd(), memfd::RESIZE_SEALS).map(|()| fd))
            .map_err(|e| err(Status::NoMemory, format!("connection page: {e}")))?;
        let page = SharedRegion::map(page_fd.as_fd(), 0, size as usize, true)
            .map_err(|e| err(Status::NoMemory, format!("connection page: {e}")))?;
        if !channel::init_page(&page, self.channel_bytes) {
            return Err(err(Status::NoMemory, "connection page too small"));
        }

        let mut conn = Conn {
            control: Arc::new(Control {
                socket,
                seq: Mutex::new(0),
            }),
            liveness: Arc::new(Liveness::default()),
            lanes,
            peer_pid,
            peer_instance: 0,
            peer_notify_size: 0,
            maps: None,
            doorbell: None,
        };
        let hello = Message::Hello {
            lanes,
            capacity: self.channel_bytes,
            instance: self.shared.instance,
        };
        let (reply, mut fds) =
            Shm::request(&conn.control, &conn.liveness, hello, &[page_fd.as_fd()])?;
        drop(page_fd);
        let Message::Welcome {
            status,
            notify_size,
            notify_count: _,
            export_slots,
            instance,
        } = reply
        else {
            return Err(err(Status::Transport, "unexpected reply to HELLO"));
        };
        wire::status_from_wire(status)
            .map_err(|s| err(s, "the shm peer refused the connection"))?;
        let (doorbell, status_fd) = match (fds.pop(), fds.pop(), fds.is_empty()) {
            (Some(doorbell), Some(status), true) => (doorbell, status),
            _ => {
                return Err(err(
                    Status::Transport,
                    "WELCOME needs exactly two descriptors",
                ));
            }
        };
        // Whatever the peer sent, our writes to it must never block.
        nix::fcntl::fcntl(
            &doorbell,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )
        .map_err(|e| err(Status::Transport, format!("the peer's doorbell: {e}")))?;
        if export_slots == 0 || export_slots > EXPORT_SLOTS {
            return Err(err(
                Status::Transport,
                "bad export slot count from the shm peer",
            ));
        }
        let status_len = status_page_len(export_slots);
        memfd::check(&status_fd, status_len)
            .map_err(|e| err(Status::Transport, format!("the peer's status page: {e}")))?;
        let status_map = SharedRegion::map(status_fd.as_fd(), 0, status_len as usize, false)
            .map_err(|e| {
                err(
                    Status::NoMemory,
                    format!("mapping the peer's status page: {e}"),
                )
            })?;
        let status_map = Arc::new(status_map);
        // From here on the peer's liveness word speaks for it (the socket
        // too, through the control thread). A peer whose driver already
        // ended is refused now.
        conn.liveness = Arc::new(Liveness::new(
            status_map.clone(),
            liveness_at(export_slots) as usize,
        ));
        if conn.liveness.gone() {
            return Err(err(
                Status::PeerUnreachable,
                "the shm peer's driver has ended",
            ));
        }
        conn.peer_instance = instance;
        conn.doorbell = Some(doorbell);
        conn.peer_notify_size = notify_size;
        conn.maps = Some(ConnMaps {
            channel: Producer::new(page, self.channel_bytes),
            status: status_map,
        });

        // Watch the socket for the peer's death.
        let watched = conn
            .control
            .socket
            .try_clone()
            .map_err(|e| err(Status::Io, format!("dup: {e}")))?;
        self.shared
            .watches
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Watch {
                socket: watched,
                liveness: conn.liveness.clone(),
            });
        self.shared.ring();
        let ep = self.conns.len();
        {
            let mut peers = lock(&self.peers);
            peers.resize(ep + 1, None);
            peers[ep] = Some(PeerControl {
                control: conn.control.clone(),
                liveness: conn.liveness.clone(),
                instance: conn.peer_instance,
            });
        }
        self.conns.push(Some(conn));
        tracing::debug!(
            endpoint = ep,
            peer = peer_pid.as_raw(),
            lanes,
            "shm connected"
        );
        Ok(Connect::Done(DriverEp(ep as u32)))
    }

    fn disconnect(&mut self, ep: DriverEp) {
        // Its mappings go with the connection's.
        self.hot = None;
        let Some(conn) = self.conns.get_mut(ep.0 as usize).and_then(Option::take) else {
            return;
        };
        // Both directions: the peer and our control thread see the hang-up
        // even though the control thread holds a duplicate descriptor.
        let _ = shutdown(conn.control.socket.as_raw_fd(), Shutdown::Both);
        if let Some(peer) = lock(&self.peers).get_mut(ep.0 as usize) {
            *peer = None;
        }
        for key in &mut self.rkeys {
            if key.as_ref().is_some_and(|k| k.ep == ep.0) {
                *key = None;
            }
        }
    }

    fn register(&mut self, mem: &MemDesc, _prepared: Prepared) -> Result<Registered, DriverError> {
        if mem.kind != MemKind::Host {
            return Err(err(Status::Unsupported, "shm registers host memory only"));
        }
        self.allocs.retain(|a| a.strong_count() > 0);
        // The memfd path only for exactly one allocation of ours: handing a
        // peer the memfd of a larger allocation would expose all of it.
        let alloc = self
            .allocs
            .iter()
            .filter_map(Weak::upgrade)
            .find(|a| a.base() == mem.addr && a.requested() as u64 == mem.len);
        let backing = match alloc {
            Some(alloc) => Backing::Memfd(alloc),
            None => Backing::CrossMemoryAttach,
        };
        let export = Export {
            generation: 0,
            secret: mem.secret,
            base: mem.addr,
            len: mem.len,
            backing,
        };
        let (slot, generation) = self
            .shared
            .exports()
            .insert(export)
            .map_err(|s| err(s, "every shm export slot is in use"))?;
        self.shared.status.set_live(slot, generation);
        Ok(Registered::Shared(DriverMemKey(
            u64::from(slot) | u64::from(generation) << 32,
        )))
    }

    fn deregister(&mut self, key: DriverMemKey) {
        let (slot, generation) = (key.0 as u32, (key.0 >> 32) as u32);
        let removed = self.shared.exports().remove(slot, generation);
        let Some(export) = removed else { return };
        self.shared.status.revoke(slot);
        if matches!(export.backing, Backing::CrossMemoryAttach) {
            // A peer may be inside a cross memory attach access of it:
            // `quiesce` waits that out before the memory may be freed.
            self.revoked_cma.push(slot);
        }
    }

    /// A peer writes memfd memory through its own mapping (our pages stay
    /// alive while it maps them) but other registered memory through cross
    /// memory attach, straight into this process: a revoked export's
    /// access that already started is waited out here (bounded), and at
    /// teardown every export is revoked and waited out, before the worker
    /// frees anything. An access still running when the wait ends means
    /// the peer may yet write: the memory is leaked rather than freed.
    fn quiesce(&mut self, scope: Quiesce) -> Quiesced {
        let mut ended = true;
        match scope {
            Quiesce::Memory(key) => {
                let slot = key.0 as u32;
                if let Some(i) = self.revoked_cma.iter().position(|&s| s == slot) {
                    self.revoked_cma.swap_remove(i);
                    ended = self.wait_for_cma(slot);
                }
            }
            Quiesce::All => {
                let live: Vec<(u32, u32)> = self.shared.exports().live().collect();
                for (slot, generation) in live {
                    let export = self.shared.exports().remove(slot, generation);
                    self.shared.status.revoke(slot);
                    if export.is_some_and(|e| matches!(e.backing, Backing::CrossMemoryAttach)) {
                        self.revoked_cma.push(slot);
                    }
                }
                for slot in std::mem::take(&mut self.revoked_cma) {
                    ended &= self.wait_for_cma(slot);
                }
            }
        }
        if ended {
            Quiesced::Done
        } else {
            Quiesced::Leak
        }
    }

    fn pack_rkey(&self, key: DriverMemKey) -> Result<Vec<u8>, DriverError> {
        let (slot, generation) = (key.0 as u32, (key.0 >> 32) as u32);
        let exports = self.shared.exports();
        let export = exports
            .get(slot, generation)
            .ok_or_else(|| err(Status::InvalidMemHandle, "not registered"))?;
        Ok(KeyBlob {
            path: export.path(),
            instance: self.shared.instance,
            slot,
            generation,
            secret: export.secret,
            base: export.base,
            len: export.len,
        }
        .encode())
    }

    fn unpack_rkey(
        &mut self,
        ep: DriverEp,
        part: &KeyPart<'_>,
        prepared: Prepared,
    ) -> Result<Unpacked, DriverError> {
        let conn = self
            .conns
            .get(ep.0 as usize)
            .and_then(Option::as_ref)
            .ok_or_else(|| err(Status::InvalidEndpoint, "not connected"))?;
        if conn.liveness.gone() || conn.maps.is_none() {
            return Err(err(Status::PeerUnreachable, "the shm peer is gone"));
        }
        // The first phase asked the peer without the engine lock; a caller
        // without one (a test calling the driver itself) asks now.
        let mapped = match prepared.take::<MappedKey>() {
            Some(mapped) => mapped,
            None => map_key(
                &PeerControl {
                    control: conn.control.clone(),
                    liveness: conn.liveness.clone(),
                    instance: conn.peer_instance,
                },
                part.blob,
            )?,
        };
        let entry = Some(RemoteKey {
            ep: ep.0,
            slot: mapped.slot,
            generation: mapped.generation,
            base: mapped.base,
            len: mapped.len,
            access: mapped.access,
        });
        // A released entry is reused (control path: a scan is fine).
        if let Some(i) = self.rkeys.iter().position(Option::is_none) {
            self.rkeys[i] = entry;
            return Ok(Unpacked::Key(DriverRkey(i as u32)));
        }
        if self.rkeys.len() >= u32::MAX as usize {
            return Err(err(Status::NoResource, "too many keys"));
        }
        self.rkeys.push(entry);
        Ok(Unpacked::Key(DriverRkey(self.rkeys.len() as u32 - 1)))
    }

    fn prepare(&self) -> Option<Arc<dyn Prepare>> {
        Some(Arc::new(ShmPrepare {
            peers: self.peers.clone(),
        }))
    }

    fn release_rkey(&mut self, ep: DriverEp, rkey: DriverRkey) {
        if let Some(slot) = self.rkeys.get_mut(rkey.0 as usize) {
            if slot.as_ref().is_some_and(|k| k.ep == ep.0) {
                *slot = None;
            }
        }
    }

    unsafe fn post(&mut self, ep: DriverEp, op: &Op, _token: Token) -> Posted {
        if op.kind != OpKind::Notify {
            // PUT, GET, ATOMIC: a run of one.
            let mut result = [Ok(0)];
            // SAFETY: the engine vouches for `op` as `post` requires, which
            // is what `execute` requires.
            unsafe { DirectPath::execute(self, ep, std::slice::from_ref(op), &mut result) };
            return Posted::Done(result[0]);
        }
        let Some(conn) = self.conns.get_mut(ep.0 as usize).and_then(Option::as_mut) else {
            return Posted::Done(Err(Status::EndpointClosed));
        };
        if conn.liveness.gone() {
            return Posted::Done(Err(Status::PeerUnreachable));
        }
        if op.lane >= conn.lanes {
            return Posted::Done(Err(Status::InvalidArgument));
        }
        let Some(maps) = conn.maps.as_mut() else {
            return Posted::Done(Err(Status::PeerUnreachable));
        };
        if op.len > conn.peer_notify_size || !maps.channel.fits(op.len) {
            return Posted::Done(Err(Status::Truncated));
        }
        match maps.channel.push(op) {
            Ok(true) => {
                if maps.channel.needs_wakeup() {
                    // The peer's worker does not poll: its control thread
                    // drains (the one system call of this path, only then).
                    if let Some(bell) = &conn.doorbell {
                        let _ = nix::unistd::write(bell, &1u64.to_ne_bytes());
                    }
                }
                Posted::Done(Ok(op.len))
            }
            Ok(false) => Posted::NoResource,
            Err(channel::Corrupt) => {
                tracing::error!(
                    endpoint = ep.0,
                    "the shm peer corrupted the notification channel"
                );
                Posted::Done(Err(Status::Transport))
            }
        }
    }

    fn flush(&mut self, ep: DriverEp, _lanes: LaneMask, _token: Token) -> Posted {
        let Some(conn) = self.conns.get(ep.0 as usize).and_then(Option::as_ref) else {
            return Posted::Done(Err(Status::EndpointClosed));
        };
        // Every operation already ran to completion in `post`: the copies
        // are in the peer's memory. The SeqCst fence (MFENCE) orders them,
        // including weakly ordered stores a large memcpy may have used,
        // before anything this process does after the flush completes, and
        // before the liveness check below.
        fence(Ordering::SeqCst);
        // A flush succeeds only if the peer was alive when it completed
        // (the crate docs' Liveness): its liveness word is read after the
        // copies were ordered.
        if conn.peer_alive() {
            Posted::Done(Ok(0))
        } else {
            conn.liveness.dead.store(true, Ordering::Release);
            Posted::Done(Err(Status::PeerUnreachable))
        }
    }

    /// The peer's notification slots, from its handshake.
    fn peer_limits(&self, ep: DriverEp) -> Option<PeerLimits> {
        let conn = self.conns.get(ep.0 as usize)?.as_ref()?;
        Some(PeerLimits::new(conn.peer_notify_size))
    }

    fn check_alive(&mut self, ep: DriverEp) -> Result<(), Status> {
        match self.conns.get(ep.0 as usize).and_then(Option::as_ref) {
            Some(conn) if conn.peer_alive() => Ok(()),
            Some(conn) => {
                conn.liveness.dead.store(true, Ordering::Release);
                Err(Status::PeerUnreachable)
            }
            None => Err(Status::EndpointClosed),
        }
    }

    fn poll(&mut self, _out: &mut [Completion]) -> usize {
        // One writer (this thread): a plain load and store, no locked
        // instruction.
        let polls = self.shared.polls.load(Ordering::Relaxed);
        self.shared
            .polls
            .store(polls.wrapping_add(1), Ordering::Relaxed);
        self.refresh_inbound();
        if let Some(pool) = &self.notify {
            for channel in self.inbound.iter() {
                let _ = channel.drain(&**pool, channel::DRAIN_BUDGET);
            }
        }
        self.release_dead();
        // Every operation completes in `post`: nothing is ever in flight.
        0
    }

    /// Always ready: every operation and flush finishes inside its call,
    /// and a peer's notification that arrives while the core thread sleeps
    /// is delivered by the control thread into the notification pool,
    /// whose waker rings the SQ doorbell. So a core thread may sleep while
    /// an endpoint with lanes here and on another driver has work at that
    /// other driver.
    fn prepare_sleep(&mut self) -> Sleep {
        Sleep::Ready
    }

    fn direct(&mut self) -> Option<&mut dyn DirectPath> {
        Some(self)
    }

    fn alloc_memory(
        &mut self,
        len: usize,
        kind: MemKind,
    ) -> Option<Result<Arc<dyn DriverMemory>, DriverError>> {
        if kind != MemKind::Host {
            return None;
        }
        Some(match ShmAlloc::new(len) {
            Ok(alloc) => {
                let alloc = Arc::new(alloc);
                self.allocs.retain(|a| a.strong_count() > 0);
                self.allocs.push(Arc::downgrade(&alloc));
                Ok(alloc as Arc<dyn DriverMemory>)
            }
            Err(e) => Err(err(
                Status::NoMemory,
                format!("memfd allocation of {len} bytes: {e}"),
            )),
        })
    }
}

// The run path: every PUT and GET finishes inside the call.
#[allow(unsafe_code)]
impl DirectPath for Shm {
    unsafe fn execute(
        &mut self,
        ep: DriverEp,
        ops: &[Op],
        results: &mut [Result<u32, Status>],
    ) -> usize {
        match self.execute_hot(ep, ops, results) {
            Some(ran) => ran,
            None => self.execute_full(ep, ops, results),
        }
    }

    fn prefetch(&mut self, ep: DriverEp, rkey: DriverRkey, addr: u64, write: bool) {
        if let Some(hot) = self.hot.as_ref().filter(|h| h.ep == ep.0 && h.rkey == rkey) {
            hot.prefetch(addr, write);
        }
    }

    unsafe fn execute_one(&mut self, ep: DriverEp, op: &Op) -> Option<Result<u32, Status>> {
        if let Some(hot) = &self.hot {
            if let Some((rkey, addr)) = op.remote {
                // Acquire on `dead`: as in `execute_hot`.
                if hot.ep == ep.0 && rkey == hot.rkey && op.lane < hot.lanes && !hot.liveness.gone()
                {
                    if let Some(result) = hot.access(op, addr) {
                        return Some(result);
                    }
                }
            }
        }
        let mut result = [Ok(0)];
        (self.execute_full(ep, std::slice::from_ref(op), &mut result) > 0).then_some(result[0])
    }
}
