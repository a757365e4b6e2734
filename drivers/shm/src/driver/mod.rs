//! [`Shm`]: the driver the engine calls. The trait's methods are here;
//! what they do is in one file per concern: `connection.rs` (the control
//! channel, connect, unpack), `memory.rs` (exports and quiesce),
//! `access.rs` (the data path).

use crate::ShmError;
use crate::channel::{self, Inbound, Producer};
use crate::control::{self, Liveness, Shared};
use crate::export::{ExportTable, StatusPage};
use crate::layout::{MAX_CHANNEL, MIN_CHANNEL};
use crate::sys::alloc::ShmAlloc;
use crate::sys::hot::HotKey;
use crate::sys::region::SharedRegion;
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::socket::{
    AddressFamily, Backlog, Shutdown, SockFlag, SockType, UnixAddr, bind, listen, shutdown, socket,
};
use nix::unistd::Pid;
use ringfence::{
    Capabilities, Completion, Connect, DirectPath, Driver, DriverContext, DriverEp, DriverError,
    DriverMemKey, DriverMemory, DriverRkey, KeyPart, LaneMask, MemDesc, MemKind, NotifyPool, Op,
    PeerLimits, Posted, Prepare, Prepared, Quiesce, Quiesced, Registered, Sleep, Token, Unpacked,
};
use ringfence_ring::Status;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

mod access;
mod connection;
mod memory;

use connection::{Control, Peers, ShmPrepare};

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
        if let Some(control) = self.control.take()
            && control.join().is_err()
        {
            tracing::error!("shm control thread panicked");
        }
    }
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
        self.connect_peer(peer, lanes, _token)
    }

    fn disconnect(&mut self, ep: DriverEp) {
        self.disconnect_peer(ep);
    }

    fn register(&mut self, mem: &MemDesc, prepared: Prepared) -> Result<Registered, DriverError> {
        self.register_export(mem, prepared)
    }

    fn deregister(&mut self, key: DriverMemKey) {
        self.deregister_export(key);
    }

    fn quiesce(&mut self, scope: Quiesce) -> Quiesced {
        self.quiesce_exports(scope)
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

    fn prepare(&self) -> Option<Arc<dyn Prepare>> {
        Some(Arc::new(ShmPrepare {
            peers: self.peers.clone(),
        }))
    }

    fn release_rkey(&mut self, ep: DriverEp, rkey: DriverRkey) {
        self.release_key(ep, rkey);
    }

    unsafe fn post(&mut self, ep: DriverEp, op: &Op, token: Token) -> Posted {
        // SAFETY: the engine's guarantee for `post` is `post_op`'s.
        unsafe { self.post_op(ep, op, token) }
    }

    fn flush(&mut self, ep: DriverEp, lanes: LaneMask, token: Token) -> Posted {
        self.flush_ep(ep, lanes, token)
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
        self.alloc_shared(len, kind)
    }
}
