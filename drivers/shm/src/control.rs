//! The control thread: accepts connections on the driver's unix socket,
//! answers `HELLO` and `MAP`, and watches every connection socket for a
//! hang-up (the liveness signal).
//!
//! # Why a thread
//! The target side of the socket must answer while its application is
//! busy, asleep, or itself blocked in a `connect` to us (two workers that
//! connect to each other at the same time, each from its progress thread
//! under its engine lock, would deadlock if answers came only from
//! `poll`). A thread blocked in `poll(2)` costs nothing on the data path
//! and answers in microseconds; it never takes the engine lock, and shares
//! only the export table (a mutex taken on the control path), the list of
//! incoming channels (published to `poll` as an immutable snapshot behind a
//! version counter), and per-connection liveness flags.
//!
//! # Liveness
//! This thread owns the driver's liveness word (`sys::robust`): the kernel
//! marks it when the thread ends, however it ends, before the process can
//! be reaped, and peers read it on their data path. A peer's connection
//! socket is closed by the kernel when the peer process dies (`SIGKILL`
//! included), and `poll(2)` reports `POLLHUP` at once. Either marks an
//! outgoing connection's endpoint dead: its next operation completes with [`Status::PeerUnreachable`]
//! (fatal: the engine fails the endpoint and completes everything queued on
//! it with the error), and the driver's next `poll` unmaps the peer's
//! memory. On an incoming connection the channel is drained of what the
//! peer published before it died, then dropped.
//!
//! # Waking a target that does not poll
//! Notifications are drained by the driver's `poll`, which runs only while
//! the target's worker makes progress. The worker's core thread sleeps
//! when it has nothing in flight, and nothing in the engine knows about
//! the driver's channels, so the control thread stands in: it wakes every
//! [`TICK`], and if the driver's `poll` has not run since the last tick it
//! arms every incoming channel (`NEED_WAKEUP` in the connection page) and
//! drains what is already there. A producer that publishes into an armed
//! channel rings the driver's doorbell (an eventfd; one `write`, only in
//! this state), and the control thread drains at once. Draining delivers
//! into the worker's notification pool, which rings the sleeping core
//! thread. When `poll` runs again, the next tick disarms the channels. A
//! notification therefore waits at most about two ticks when the worker has
//! just stopped polling, and not at all while it polls or sleeps armed.
//!
//! The thread also drops finished channels and closes connections whose
//! channel is broken on each tick.

use crate::channel::Inbound;
use crate::export::{Backing, ExportTable, StatusPage};
use crate::layout::{CHANNEL_AT, EXPORT_SLOTS, MAX_CHANNEL, MIN_CHANNEL};
use crate::memfd;
use crate::sys::fdpass;
use crate::sys::region::SharedRegion;
use crate::sys::robust;
use crate::wire::{self, Message};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::eventfd::EventFd;
use nix::sys::socket::{SockFlag, accept4, getsockopt, sockopt};
use ringfence::NotifyPool;
use ringfence_ring::Status;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// How often the thread wakes with nothing to do, in milliseconds.
pub(crate) const TICK: u16 = 10;
/// Records the control thread drains from one channel per wake.
const CONTROL_DRAIN_BUDGET: usize = 4096;
/// Most incoming connections at once; more are closed at accept.
pub(crate) const MAX_INCOMING: usize = 4096;

/// Whether an outgoing connection's peer is gone.
#[derive(Debug, Default)]
pub(crate) struct Liveness {
    /// Set once, by the control thread (or by a failed control request),
    /// or by the data path when it finds the peer's liveness word marked.
    pub dead: AtomicBool,
    /// The peer's status page and the offset of its liveness word
    /// (`sys::robust`); `None` until connected.
    peer: Option<(Arc<SharedRegion>, usize)>,
}

impl Liveness {
    /// Liveness through the peer's liveness word at `at` in its status
    /// page `page`.
    pub(crate) fn new(page: Arc<SharedRegion>, at: usize) -> Liveness {
        Liveness {
            dead: AtomicBool::new(false),
            peer: Some((page, at)),
        }
    }

    /// What the peer's liveness word says now (`Unarmed` before connect).
    #[inline]
    pub(crate) fn word(&self) -> robust::Word {
        match &self.peer {
            Some((page, at)) => page.word32(*at).map_or(robust::Word::Unarmed, robust::read),
            None => robust::Word::Unarmed,
        }
    }

    /// Whether the peer is known gone: its hang-up was seen, or its
    /// liveness word is marked (then `dead` is set too, so the rest of the
    /// driver sees it). No system call: two loads.
    #[inline]
    pub(crate) fn gone(&self) -> bool {
        self.state() == robust::Word::Gone
    }

    /// The peer's state as far as one look tells: `Gone` once its hang-up
    /// was seen or its word is marked (which sets `dead`), else what the
    /// word says. No system call: two loads.
    #[inline]
    pub(crate) fn state(&self) -> robust::Word {
        // Acquire: pairs with the control thread's store on hang-up.
        if self.dead.load(Ordering::Acquire) {
            return robust::Word::Gone;
        }
        let word = self.word();
        if word == robust::Word::Gone {
            self.dead.store(true, Ordering::Release);
        }
        word
    }
}

/// An outgoing connection's socket to watch for a hang-up (a duplicate of
/// the driver's descriptor).
#[derive(Debug)]
pub(crate) struct Watch {
    pub socket: OwnedFd,
    pub liveness: Arc<Liveness>,
}

/// What the driver and its control thread share.
#[derive(Debug)]
pub(crate) struct Shared {
    /// This driver's random id; keys name it so that a key is used only on
    /// an endpoint to its own target.
    pub instance: u64,
    pub exports: Mutex<ExportTable>,
    pub status: StatusPage,
    /// The worker's notification buffers (set at attach).
    pub notify: OnceLock<Arc<NotifyPool>>,
    /// Incoming channels, as published to `poll`.
    pub inbound: Mutex<Arc<[Arc<Inbound>]>>,
    /// Bumped (Release) after every change of `inbound`.
    pub inbound_version: AtomicU64,
    /// Outgoing sockets to start watching.
    pub watches: Mutex<Vec<Watch>>,
    /// Bumped (Release) whenever a peer is found dead.
    pub deaths: AtomicU64,
    /// Wakes the thread (new watches, stop).
    pub wake: EventFd,
    /// Rung by peers that published into an armed channel (see the module
    /// docs); non-blocking.
    pub doorbell: EventFd,
    /// Bumped by every `poll` of the driver (one writer: the engine
    /// thread), read by the control thread to tell whether the worker
    /// polls.
    pub polls: AtomicU64,
    pub stop: AtomicBool,
}

impl Shared {
    pub(crate) fn exports(&self) -> MutexGuard<'_, ExportTable> {
        self.exports.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn inbound_snapshot(&self) -> Arc<[Arc<Inbound>]> {
        self.inbound
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn ring(&self) {
        if let Err(e) = self.wake.write(1) {
            tracing::error!(error = %e, "waking the shm control thread failed");
        }
    }
}

/// One accepted connection.
#[derive(Debug)]
struct Incoming {
    socket: OwnedFd,
    pid: i32,
    channel: Option<Arc<Inbound>>,
}

/// Why a connection is closed.
#[derive(Debug)]
enum Close {
    /// The peer sent something this protocol does not allow.
    Protocol(&'static str),
    Io(io::Error),
}

/// The thread's body: runs until `shared.stop`.
pub(crate) fn run(shared: &Shared, listener: &OwnedFd) {
    // Before any peer can connect (this thread accepts): peers read the
    // word as alive while this thread runs, and gone once it has ended,
    // whether it returned or its process was killed.
    let _liveness = robust::Armed::arm(shared.status.liveness());
    let mut incoming: Vec<Incoming> = Vec::new();
    let mut channels: Vec<Arc<Inbound>> = Vec::new();
    let mut watches: Vec<Watch> = Vec::new();
    let tick = Duration::from_millis(u64::from(TICK));
    let (mut last_polls, mut last_tick, mut armed) =
        (shared.polls.load(Ordering::Relaxed), Instant::now(), false);
    while !shared.stop.load(Ordering::Acquire) {
        let revents = {
            let mut fds = Vec::with_capacity(3 + incoming.len() + watches.len());
            fds.push(PollFd::new(shared.wake.as_fd(), PollFlags::POLLIN));
            fds.push(PollFd::new(listener.as_fd(), PollFlags::POLLIN));
            fds.push(PollFd::new(shared.doorbell.as_fd(), PollFlags::POLLIN));
            fds.extend(
                incoming
                    .iter()
                    .map(|c| PollFd::new(c.socket.as_fd(), PollFlags::POLLIN)),
            );
            // Hang-up and errors are always reported; nothing else is
            // asked for (the driver reads the replies itself).
            fds.extend(
                watches
                    .iter()
                    .map(|w| PollFd::new(w.socket.as_fd(), PollFlags::empty())),
            );
            match poll(&mut fds, PollTimeout::from(TICK)) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => tracing::error!(error = %e, "shm control poll failed"),
            }
            fds.iter()
                .map(|f| f.revents().unwrap_or(PollFlags::POLLERR))
                .collect::<Vec<_>>()
        };
        let gone = PollFlags::POLLHUP | PollFlags::POLLERR | PollFlags::POLLNVAL;
        if revents[0].contains(PollFlags::POLLIN) {
            let _ = shared.wake.read();
        }
        let rang = revents[2].contains(PollFlags::POLLIN);
        if rang {
            let _ = shared.doorbell.read();
        }
        let (first_incoming, first_watch) = (3, 3 + incoming.len());

        // Outgoing connections whose peer went away.
        let mut k = watches.len();
        while k > 0 {
            k -= 1;
            if revents[first_watch + k].intersects(gone) {
                let w = watches.swap_remove(k);
                if !w.liveness.dead.swap(true, Ordering::AcqRel) {
                    tracing::warn!("shm peer hung up; its endpoint fails");
                }
                shared.deaths.fetch_add(1, Ordering::Release);
            }
        }
        watches.extend(
            shared
                .watches
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .drain(..),
        );

        // Requests and hang-ups on incoming connections.
        let mut changed = false;
        let mut k = incoming.len();
        while k > 0 {
            k -= 1;
            let ev = revents[first_incoming + k];
            let outcome = if ev.contains(PollFlags::POLLIN) {
                serve(shared, &mut incoming[k], &mut channels, &mut changed)
            } else if ev.intersects(gone) {
                Err(Close::Io(io::Error::from(io::ErrorKind::UnexpectedEof)))
            } else {
                Ok(())
            };
            let broken = incoming[k]
                .channel
                .as_ref()
                .is_some_and(|c| c.broken.load(Ordering::Relaxed));
            if let Err(why) = outcome {
                close(incoming.swap_remove(k), &why);
            } else if broken {
                close(incoming.swap_remove(k), &Close::Protocol("corrupt channel"));
            }
        }

        // New connections.
        if revents[1].contains(PollFlags::POLLIN) {
            loop {
                match accept4(
                    listener.as_fd(),
                    SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
                ) {
                    Ok(socket) if incoming.len() < MAX_INCOMING => {
                        let pid = getsockopt(&socket, sockopt::PeerCredentials)
                            .map(|c| c.pid())
                            .unwrap_or(0);
                        tracing::debug!(peer = pid, "shm connection accepted");
                        incoming.push(Incoming {
                            socket,
                            pid,
                            channel: None,
                        });
                    }
                    Ok(_) => tracing::warn!("too many shm connections; refused one"),
                    Err(nix::errno::Errno::EINTR) => {}
                    Err(_) => break,
                }
            }
        }

        // Stand in for a worker that does not poll.
        let mut drain = rang;
        if last_tick.elapsed() >= tick {
            last_tick = Instant::now();
            let polls = shared.polls.load(Ordering::Relaxed);
            if polls == last_polls {
                for c in &channels {
                    drain |= c.arm();
                }
                armed = true;
            } else if armed {
                channels.iter().for_each(|c| c.disarm());
                armed = false;
            }
            last_polls = polls;
        }
        if drain && let Some(pool) = shared.notify.get() {
            for c in &channels {
                let _ = c.drain(&**pool, CONTROL_DRAIN_BUDGET);
            }
        }

        // Channels drained after their peer hung up (or broken) go.
        let before = channels.len();
        channels.retain(|c| !c.done.load(Ordering::Acquire));
        if changed || channels.len() != before {
            publish(shared, &channels);
        }
    }
}

fn close(conn: Incoming, why: &Close) {
    match why {
        Close::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
            tracing::debug!(peer = conn.pid, "shm peer hung up")
        }
        Close::Io(e) => tracing::warn!(peer = conn.pid, error = %e, "shm connection closed"),
        Close::Protocol(what) => {
            tracing::warn!(
                peer = conn.pid,
                what,
                "shm peer broke the protocol; connection closed"
            )
        }
    }
    if let Some(channel) = &conn.channel {
        // Release: pairs with the Acquire in `Inbound::drain`. A peer whose
        // socket hung up is dead (or gone): what it published is drained,
        // then the channel is dropped. A peer we close for breaking the
        // protocol may still write the page; we read it only until empty.
        channel.closing.store(true, Ordering::Release);
    }
}

fn publish(shared: &Shared, channels: &[Arc<Inbound>]) {
    let snapshot: Arc<[Arc<Inbound>]> = channels.iter().cloned().collect();
    *shared.inbound.lock().unwrap_or_else(|e| e.into_inner()) = snapshot;
    // Release: the snapshot is in place before `poll` sees the new version.
    shared.inbound_version.fetch_add(1, Ordering::Release);
}

/// Reads and answers every message waiting on `conn`.
fn serve(
    shared: &Shared,
    conn: &mut Incoming,
    channels: &mut Vec<Arc<Inbound>>,
    changed: &mut bool,
) -> Result<(), Close> {
    loop {
        let mut buf = [0u8; wire::MAX_MESSAGE + 1];
        let received = match fdpass::recv(conn.socket.as_fd(), &mut buf, true) {
            Ok(r) => r,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) => return Err(Close::Io(e)),
        };
        if received.truncated {
            return Err(Close::Protocol("oversized message"));
        }
        let (seq, message) = wire::Message::decode(&buf[..received.len])
            .map_err(|_| Close::Protocol("malformed message"))?;
        let mut fds = received.fds;
        match message {
            Message::Hello {
                lanes: _,
                capacity,
                instance: _,
            } => {
                if conn.channel.is_some() {
                    return Err(Close::Protocol("second HELLO"));
                }
                let page = match (fds.pop(), fds.is_empty()) {
                    (Some(fd), true) => fd,
                    _ => return Err(Close::Protocol("HELLO needs exactly one descriptor")),
                };
                let result = attach_channel(&page, capacity, conn.pid);
                let status = wire::status_to_wire(result.as_ref().map(|_| ()).map_err(|s| *s));
                let (notify_size, notify_count) = shared
                    .notify
                    .get()
                    .map_or((0, 0), |p| (p.buffer_size(), p.count()));
                let reply = Message::Welcome {
                    status,
                    notify_size,
                    notify_count,
                    export_slots: EXPORT_SLOTS,
                    instance: shared.instance,
                };
                let Ok(channel) = result else {
                    let _ = fdpass::send(conn.socket.as_fd(), &reply.encode(seq), &[], true);
                    return Err(Close::Protocol("bad connection page"));
                };
                fdpass::send(
                    conn.socket.as_fd(),
                    &reply.encode(seq),
                    &[shared.status.fd(), shared.doorbell.as_fd()],
                    true,
                )
                .map_err(Close::Io)?;
                let channel = Arc::new(channel);
                conn.channel = Some(channel.clone());
                channels.push(channel);
                *changed = true;
            }
            Message::Map {
                slot,
                generation,
                secret,
            } => {
                if conn.channel.is_none() {
                    return Err(Close::Protocol("MAP before HELLO"));
                }
                if !fds.is_empty() {
                    return Err(Close::Protocol("descriptor with MAP"));
                }
                let exports = shared.exports();
                let export = exports.get(slot, generation).filter(|e| e.secret == secret);
                let status = if slot >= EXPORT_SLOTS {
                    Err(Status::InvalidRkey)
                } else if export.is_none() {
                    Err(Status::AccessDenied)
                } else {
                    Ok(())
                };
                let reply = Message::Mapped {
                    status: wire::status_to_wire(status),
                    path: export.map_or(0, |e| e.path().as_raw()),
                    base: export.map_or(0, |e| e.base),
                    len: export.map_or(0, |e| e.len),
                    fd_offset: 0,
                };
                if status.is_err() {
                    tracing::warn!(
                        peer = conn.pid,
                        slot,
                        "shm key refused (unknown export or wrong secret)"
                    );
                }
                let fd = match export.map(|e| &e.backing) {
                    Some(Backing::Memfd(alloc)) => Some(alloc.fd()),
                    _ => None,
                };
                fdpass::send(conn.socket.as_fd(), &reply.encode(seq), fd.as_slice(), true)
                    .map_err(Close::Io)?;
            }
            Message::Welcome { .. } | Message::Mapped { .. } => {
                return Err(Close::Protocol("a reply sent as a request"));
            }
        }
    }
}

/// Checks and maps a peer's connection page.
fn attach_channel(page: &OwnedFd, capacity: u32, pid: i32) -> Result<Inbound, Status> {
    if !capacity.is_power_of_two() || !(MIN_CHANNEL..=MAX_CHANNEL).contains(&capacity) {
        return Err(Status::InvalidArgument);
    }
    let size = CHANNEL_AT as u64 + u64::from(capacity);
    memfd::check(page, size).map_err(|e| {
        tracing::warn!(peer = pid, error = %e, "connection page refused");
        Status::InvalidArgument
    })?;
    let map =
        SharedRegion::map(page.as_fd(), 0, size as usize, true).map_err(|_| Status::NoMemory)?;
    if !crate::channel::check_page(&map, capacity) {
        return Err(Status::InvalidArgument);
    }
    Ok(Inbound::new(map, capacity, pid))
}
