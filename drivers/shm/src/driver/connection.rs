//! Connections to peers: the control channel (requests to the peer's
//! control thread and their replies), connecting and disconnecting, and
//! unpacking a peer's key, whose MAP round trip runs in the first phase
//! ([`ShmPrepare`]) without the engine lock.

//! [`Shm`]: the driver the engine calls.

use crate::channel::{self, Producer};
use crate::control::{Liveness, Watch};
use crate::key::KeyBlob;
use crate::layout::{CHANNEL_AT, EXPORT_SLOTS, liveness_at, status_page_len};
use crate::memfd;
use crate::sys::fdpass;
use crate::sys::region::SharedRegion;
use crate::sys::robust::Word;
use crate::wire::{self, KeyPath, Message};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{
    AddressFamily, Shutdown, SockFlag, SockType, UnixAddr, connect, getsockopt, shutdown, socket,
    sockopt,
};
use nix::unistd::Pid;
use ringfence::{
    Connect, DriverEp, DriverError, DriverRkey, KeyPart, Prepare, Prepared, Token, Unpacked,
};
use ringfence_ring::Status;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::*;

impl Conn {
    /// Whether the peer is alive now, as a flush must know it: its
    /// liveness word says so (one load); a peer whose word is not armed is
    /// asked through its socket instead (one system call, only then).
    pub(super) fn peer_alive(&self) -> bool {
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
pub(super) struct Control {
    /// Blocking; control requests and their replies.
    pub(super) socket: OwnedFd,
    /// The last request's sequence number, held for a whole exchange.
    pub(super) seq: Mutex<u32>,
}

/// What the first phase of an unpack needs of a connection that is up.
#[derive(Debug, Clone)]
pub(super) struct PeerControl {
    pub(super) control: Arc<Control>,
    pub(super) liveness: Arc<Liveness>,
    pub(super) instance: u64,
}

/// The connections that are up, by endpoint, for [`ShmPrepare`].
pub(super) type Peers = Arc<Mutex<Vec<Option<PeerControl>>>>;

/// The first phase of [`Shm`]'s unpacks ([`Driver::prepare`]): the MAP
/// round trip to the peer's control thread, and mapping its memfd, run on
/// the application's thread without the engine lock. A peer that is slow
/// to answer (stopped, swapped out) then stalls only this unpack, for at
/// most the control timeout, not every endpoint of the worker.
#[derive(Debug)]
pub(super) struct ShmPrepare {
    pub(super) peers: Peers,
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

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
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

impl Shm {
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

    /// Local IPC with the peer's control thread (not its progress), so the
    /// connection is up when this returns.
    pub(super) fn connect_peer(
        &mut self,
        peer: &[u8],
        lanes: u8,
        _token: Token,
    ) -> Result<Connect, DriverError> {
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

    pub(super) fn disconnect_peer(&mut self, ep: DriverEp) {
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

    pub(super) fn unpack_key(
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

    pub(super) fn release_key(&mut self, ep: DriverEp, rkey: DriverRkey) {
        if let Some(slot) = self.rkeys.get_mut(rkey.0 as usize)
            && slot.as_ref().is_some_and(|k| k.ep == ep.0)
        {
            *slot = None;
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
