//! The built-in loopback driver: workers of one process connected to each
//! other, operations executed directly on the target's registered memory.
//!
//! It exists so that the engine's every path can run without hardware: each
//! endpoint may have several lanes, and operations complete either at once
//! ([`CompletionMode::Immediate`]) or on the next [`Driver::poll`]
//! ([`CompletionMode::NextPoll`]), where lanes are drained in a rotating
//! order so effects on different lanes land in different orders, as on a
//! real multi-lane transport.
//!
//! The target side checks every access against its export table: the key's
//! region must still be registered, its secret must match, and the range must
//! lie inside the region; otherwise the operation fails with
//! [`Status::AccessDenied`] or [`Status::OutOfBounds`] before any byte moves.
//! The table is locked for reading while an access runs, so deregistration
//! (which takes it for writing) never leaves an access behind.

#![allow(unsafe_code)]

use crate::NotifyPool;
use crate::driver::MemKinds;
use crate::driver::{
    Capabilities, Completion, Connect, DirectPath, Driver, DriverContext, DriverEp, DriverError,
    DriverMemKey, DriverRkey, KeyPart, LaneMask, MemDesc, Op, OpKind, PeerLimits, Posted, Prepared,
    Registered, Token, Unpacked, execute_by_post,
};
use crate::memory::within;
use crate::sys::{mem, peer};
use ringfence_ring::{AtomicOp, Status};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};

/// When loopback operations complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CompletionMode {
    /// Executed and completed inside `post` (`Posted::Done`).
    #[default]
    Immediate,
    /// Queued on their lane; executed and completed by the next `poll`.
    NextPoll,
}

/// Operations one lane can hold in `NextPoll` mode before `post` answers
/// `NoResource` (the queues are allocated once, at connect).
const LANE_DEPTH: usize = 4096;

#[derive(Debug, Clone, Copy)]
struct Export {
    base: u64,
    len: u64,
    secret: u64,
}

/// Exported regions by id. Ids are handed out in sequence from 1, so a
/// vector indexed by id is the table: every remote access looks one up.
#[derive(Debug, Default)]
struct Exports {
    by_id: Vec<Option<Export>>,
}

impl Exports {
    /// The live export `id` (an id from the wire: any value is safe).
    fn get(&self, id: u32) -> Option<&Export> {
        self.by_id.get(id as usize)?.as_ref()
    }

    fn insert(&mut self, id: u32, export: Export) {
        let index = id as usize;
        if self.by_id.len() <= index {
            self.by_id.resize(index + 1, None);
        }
        self.by_id[index] = Some(export);
    }

    fn remove(&mut self, id: u32) {
        if let Some(slot) = self.by_id.get_mut(id as usize) {
            *slot = None;
        }
    }

    fn clear(&mut self) {
        self.by_id.clear();
    }
}

/// One loopback worker as its peers see it.
#[derive(Debug)]
struct Node {
    id: u64,
    alive: AtomicBool,
    exports: RwLock<Exports>,
    notify: OnceLock<Arc<NotifyPool>>,
}

fn fabric() -> &'static Mutex<HashMap<u64, Weak<Node>>> {
    static FABRIC: OnceLock<Mutex<HashMap<u64, Weak<Node>>>> = OnceLock::new();
    FABRIC.get_or_init(Default::default)
}

const ADDRESS_MAGIC: &[u8; 4] = b"LOOP";

#[derive(Debug, Clone, Copy)]
struct Queued {
    op: Op,
    token: Token,
    seq: u64,
}

#[derive(Debug, Clone, Copy)]
struct PendingFlush {
    token: Token,
    lanes: LaneMask,
    /// Every operation with a sequence number up to this one must have run.
    seq: u64,
}

#[derive(Debug)]
struct Conn {
    peer: Arc<Node>,
    lanes: Vec<VecDeque<Queued>>,
    flushes: VecDeque<PendingFlush>,
    next_seq: u64,
}

#[derive(Debug, Clone, Copy)]
struct RemoteKey {
    region: u32,
    secret: u64,
    ep: DriverEp,
}

/// The loopback driver. See the module docs.
#[derive(Debug)]
pub struct Loopback {
    name: &'static str,
    mem_kinds: MemKinds,
    /// Edits the capabilities it claims ([`Loopback::with_capabilities`]).
    edit_capabilities: fn(Capabilities) -> Capabilities,
    mode: CompletionMode,
    node: Arc<Node>,
    conns: Vec<Option<Conn>>,
    rkeys: Vec<RemoteKey>,
    /// Entries of `rkeys` released, for the next unpacks.
    free_rkeys: Vec<u32>,
    next_region: u32,
    /// Completions produced outside `poll` (disconnect), returned first.
    ready: VecDeque<Completion>,
    rotation: usize,
}

impl Loopback {
    /// A loopback driver that completes operations at once.
    pub fn new() -> Loopback {
        Loopback::with_mode(CompletionMode::Immediate)
    }

    /// A loopback driver with the given completion mode.
    pub fn with_mode(mode: CompletionMode) -> Loopback {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let node = Arc::new(Node {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            alive: AtomicBool::new(true),
            exports: RwLock::new(Exports::default()),
            notify: OnceLock::new(),
        });
        fabric()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(node.id, Arc::downgrade(&node));
        Loopback {
            name: "loopback",
            mem_kinds: MemKinds::HOST,
            edit_capabilities: |caps| caps,
            mode,
            node,
            conns: Vec::new(),
            rkeys: Vec::new(),
            free_rkeys: Vec::new(),
            next_region: 1,
            ready: VecDeque::new(),
            rotation: 0,
        }
    }

    /// This driver under another name (`"loopback"` by default), for a
    /// worker with two loopback drivers: an endpoint with lanes on both, as
    /// one would have over shm and CUDA. Peers connect driver to driver by
    /// name, so the target needs a driver of the same name too.
    pub fn named(mut self, name: &'static str) -> Loopback {
        self.name = name;
        self
    }

    /// Claims to register, and to reach at a peer, memory of `kinds`
    /// (host memory only by default), for tests that stand in for a device
    /// driver: memory registered as, say, [`MemKind::Cuda`](crate::MemKind::Cuda) must still be
    /// host memory, since this driver copies with the CPU.
    pub fn with_mem_kinds(mut self, kinds: MemKinds) -> Loopback {
        self.mem_kinds = kinds;
        self
    }

    /// Claims the capabilities `edit` makes of its own, for tests that
    /// stand in for a driver with fewer (no SWAP, NIC atomics, a smaller
    /// largest message, NOTIFY not ordered behind writes): the engine must
    /// keep to what the driver claims, whatever this one could do.
    pub fn with_capabilities(mut self, edit: fn(Capabilities) -> Capabilities) -> Loopback {
        self.edit_capabilities = edit;
        self
    }

    fn conn(&mut self, ep: DriverEp) -> Option<&mut Conn> {
        self.conns.get_mut(ep.0 as usize)?.as_mut()
    }

    /// Runs `op` against `peer`. The local range was validated by the engine.
    fn run(peer: &Node, rkeys: &[RemoteKey], ep: DriverEp, op: &Op) -> Result<u32, Status> {
        if !peer.alive.load(Ordering::Acquire) {
            return Err(Status::PeerUnreachable);
        }
        if op.kind == OpKind::Notify {
            let pool = peer.notify.get().ok_or(Status::Truncated)?;
            // SAFETY: the engine checked `[local_addr, +len)` against a live
            // local registration and holds it until this completes.
            unsafe { pool.deliver(op.local_addr, op.len, op.operand) }?;
            return Ok(op.len);
        }
        let (rkey, remote_addr) = op.remote.ok_or(Status::InvalidRkey)?;
        let key = rkeys
            .get(rkey.0 as usize)
            .filter(|k| k.ep == ep)
            .ok_or(Status::InvalidRkey)?;
        let exports = peer.exports.read().unwrap_or_else(|e| e.into_inner());
        let export = exports
            .get(key.region)
            .filter(|e| e.secret == key.secret)
            .ok_or(Status::AccessDenied)?;
        if !within(export.base, export.len, remote_addr, u64::from(op.len)) {
            return Err(Status::OutOfBounds);
        }
        // Every access below happens with the export table read-locked, so
        // the target region cannot be deregistered meanwhile.
        match op.kind {
            // SAFETY: local range validated by the engine; remote range
            // checked just above against a live export. Both are
            // registered memory, reached through raw pointers only (the
            // peer copy primitive: an aligned word lands as one store).
            OpKind::Put => unsafe {
                peer::copy_to_peer(
                    op.local_addr as usize as *const u8,
                    remote_addr as usize as *mut u8,
                    op.len as usize,
                )
            },
            // SAFETY: as for PUT, in the other direction (the target's
            // aligned word is read with one atomic load).
            OpKind::Get => unsafe {
                peer::copy_from_peer(
                    remote_addr as usize as *const u8,
                    op.local_addr as usize as *mut u8,
                    op.len as usize,
                )
            },
            OpKind::Atomic(aop) => {
                if remote_addr % 8 != 0 || op.len != 8 {
                    return Err(Status::Misaligned);
                }
                // SAFETY: 8 aligned bytes inside a live export (checked).
                let old = unsafe { mem::atomic(remote_addr, aop, op.operand, op.operand2) };
                if aop != AtomicOp::ADD {
                    // SAFETY: the engine checked that the local result word
                    // is 8-aligned inside a live local registration.
                    unsafe { mem::store_u64(op.local_addr, old) };
                }
            }
            OpKind::Notify => unreachable!("handled above"),
        }
        Ok(op.len)
    }
}

impl Default for Loopback {
    fn default() -> Self {
        Loopback::new()
    }
}

impl Drop for Loopback {
    fn drop(&mut self) {
        // No peer may touch this worker's memory from now on.
        self.node.alive.store(false, Ordering::Release);
        self.node
            .exports
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        fabric()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.node.id);
    }
}

fn err(status: Status, detail: &str) -> DriverError {
    DriverError::new(status, detail)
}

impl Driver for Loopback {
    fn name(&self) -> &'static str {
        self.name
    }

    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::host_rma(crate::driver::MAX_LANES, 1 << 30);
        caps.mem_kinds = self.mem_kinds;
        caps.remote_kinds = self.mem_kinds;
        (self.edit_capabilities)(caps)
    }

    fn attach(&mut self, ctx: DriverContext) {
        let _ = self.node.notify.set(ctx.notify);
    }

    fn address(&self) -> Vec<u8> {
        let mut address = ADDRESS_MAGIC.to_vec();
        address.extend_from_slice(&self.node.id.to_le_bytes());
        address
    }

    fn connect(&mut self, peer: &[u8], lanes: u8, _token: Token) -> Result<Connect, DriverError> {
        if peer.len() != 12 || &peer[..4] != ADDRESS_MAGIC {
            return Err(err(Status::InvalidArgument, "malformed loopback address"));
        }
        let id = u64::from_le_bytes(peer[4..].try_into().expect("8 bytes"));
        let node = fabric()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .and_then(Weak::upgrade)
            .ok_or_else(|| {
                err(
                    Status::PeerUnreachable,
                    "no loopback worker with that address in this process",
                )
            })?;
        let depth = if self.mode == CompletionMode::NextPoll {
            LANE_DEPTH
        } else {
            0
        };
        let conn = Conn {
            peer: node,
            lanes: (0..lanes).map(|_| VecDeque::with_capacity(depth)).collect(),
            flushes: VecDeque::with_capacity(depth),
            next_seq: 1,
        };
        self.conns.push(Some(conn));
        // No handshake: the peer's node is in this process.
        Ok(Connect::Done(DriverEp(self.conns.len() as u32 - 1)))
    }

    fn disconnect(&mut self, ep: DriverEp) {
        let Some(conn) = self.conns.get_mut(ep.0 as usize).and_then(Option::take) else {
            return;
        };
        for q in conn.lanes {
            self.ready.extend(
                q.into_iter()
                    .map(|q| Completion::new(q.token, Err(Status::Canceled))),
            );
        }
        self.ready.extend(
            conn.flushes
                .into_iter()
                .map(|f| Completion::new(f.token, Err(Status::Canceled))),
        );
    }

    fn register(&mut self, mem: &MemDesc, _prepared: Prepared) -> Result<Registered, DriverError> {
        if !self.mem_kinds.contains(mem.kind) {
            return Err(err(
                Status::Unsupported,
                "loopback registers host memory only (unless told otherwise)",
            ));
        }
        let region = self.next_region;
        self.next_region = self
            .next_region
            .checked_add(1)
            .ok_or_else(|| err(Status::NoResource, "region ids exhausted"))?;
        let export = Export {
            base: mem.addr,
            len: mem.len,
            secret: mem.secret,
        };
        self.node
            .exports
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(region, export);
        Ok(Registered::Shared(DriverMemKey(u64::from(region))))
    }

    fn deregister(&mut self, key: DriverMemKey) {
        self.node
            .exports
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key.0 as u32);
    }

    fn pack_rkey(&self, key: DriverMemKey) -> Result<Vec<u8>, DriverError> {
        let exports = self.node.exports.read().unwrap_or_else(|e| e.into_inner());
        let export = exports
            .get(key.0 as u32)
            .ok_or_else(|| err(Status::InvalidMemHandle, "not registered"))?;
        let mut blob = self.node.id.to_le_bytes().to_vec();
        blob.extend_from_slice(&(key.0 as u32).to_le_bytes());
        blob.extend_from_slice(&export.secret.to_le_bytes());
        Ok(blob)
    }

    fn unpack_rkey(
        &mut self,
        ep: DriverEp,
        part: &KeyPart<'_>,
        _prepared: Prepared,
    ) -> Result<Unpacked, DriverError> {
        let blob = part.blob;
        if blob.len() != 20 {
            return Err(err(Status::InvalidArgument, "malformed loopback key"));
        }
        let node = u64::from_le_bytes(blob[..8].try_into().expect("8 bytes"));
        let region = u32::from_le_bytes(blob[8..12].try_into().expect("4 bytes"));
        let secret = u64::from_le_bytes(blob[12..].try_into().expect("8 bytes"));
        let conn = self
            .conn(ep)
            .ok_or_else(|| err(Status::InvalidEndpoint, "not connected"))?;
        if conn.peer.id != node {
            return Err(err(Status::InvalidRkey, "the key belongs to another peer"));
        }
        let key = RemoteKey { region, secret, ep };
        if let Some(i) = self.free_rkeys.pop() {
            self.rkeys[i as usize] = key;
            return Ok(Unpacked::Key(DriverRkey(i)));
        }
        self.rkeys.push(key);
        Ok(Unpacked::Key(DriverRkey(self.rkeys.len() as u32 - 1)))
    }

    fn release_rkey(&mut self, ep: DriverEp, rkey: DriverRkey) {
        if let Some(key) = self.rkeys.get_mut(rkey.0 as usize).filter(|k| k.ep == ep) {
            // No endpoint has this handle: the entry names nothing now.
            key.ep = DriverEp(u32::MAX);
            self.free_rkeys.push(rkey.0);
        }
    }

    unsafe fn post(&mut self, ep: DriverEp, op: &Op, token: Token) -> Posted {
        let mode = self.mode;
        let Some(conn) = self.conns.get_mut(ep.0 as usize).and_then(Option::as_mut) else {
            return Posted::Done(Err(Status::EndpointClosed));
        };
        let Some(lane) = conn.lanes.get_mut(op.lane as usize) else {
            return Posted::Done(Err(Status::InvalidArgument));
        };
        if mode == CompletionMode::NextPoll {
            if lane.len() >= LANE_DEPTH {
                return Posted::NoResource;
            }
            lane.push_back(Queued {
                op: *op,
                token,
                seq: conn.next_seq,
            });
            conn.next_seq += 1;
            return Posted::InFlight;
        }
        match Loopback::run(&conn.peer, &self.rkeys, ep, op) {
            Err(Status::NoResource) => Posted::NoResource,
            result => Posted::Done(result),
        }
    }

    fn flush(&mut self, ep: DriverEp, lanes: LaneMask, token: Token) -> Posted {
        let Some(conn) = self.conns.get_mut(ep.0 as usize).and_then(Option::as_mut) else {
            return Posted::Done(Err(Status::EndpointClosed));
        };
        if !conn.peer.alive.load(Ordering::Acquire) {
            // A flush succeeds only while the peer lives.
            return Posted::Done(Err(Status::PeerUnreachable));
        }
        if self.mode == CompletionMode::Immediate || lanes == 0 {
            return Posted::Done(Ok(0));
        }
        if conn.flushes.len() >= LANE_DEPTH {
            return Posted::NoResource;
        }
        conn.flushes.push_back(PendingFlush {
            token,
            lanes,
            seq: conn.next_seq - 1,
        });
        Posted::InFlight
    }

    /// The peer's notification buffers (a NOTIFY longer would fail with
    /// `Truncated` when delivered).
    fn peer_limits(&self, ep: DriverEp) -> Option<PeerLimits> {
        let conn = self.conns.get(ep.0 as usize)?.as_ref()?;
        let pool = conn.peer.notify.get()?;
        Some(PeerLimits::new(pool.buffer_size()))
    }

    fn check_alive(&mut self, ep: DriverEp) -> Result<(), Status> {
        match self.conns.get(ep.0 as usize).and_then(Option::as_ref) {
            // Acquire: pairs with the peer's Release as it is dropped.
            Some(conn) if conn.peer.alive.load(Ordering::Acquire) => Ok(()),
            Some(_) => Err(Status::PeerUnreachable),
            None => Err(Status::EndpointClosed),
        }
    }

    fn direct(&mut self) -> Option<&mut dyn DirectPath> {
        // Immediate mode finishes every operation inside `post`.
        (self.mode == CompletionMode::Immediate).then_some(self as &mut dyn DirectPath)
    }

    fn poll(&mut self, out: &mut [Completion]) -> usize {
        let mut n = crate::driver::drain_completions(&mut self.ready, out);
        self.rotation = self.rotation.wrapping_add(1);
        for (index, slot) in self.conns.iter_mut().enumerate() {
            let Some(conn) = slot.as_mut() else { continue };
            let lanes = conn.lanes.len();
            for k in 0..lanes {
                // Rotate the starting lane so that, across polls, effects on
                // different lanes land in different orders.
                let lane = (k + self.rotation) % lanes;
                while n < out.len() {
                    // A NOTIFY that finds no free buffer waits at its lane's
                    // head (the lane stays ordered) until a later poll.
                    let Some(q) = conn.lanes[lane].front().copied() else {
                        break;
                    };
                    let result =
                        Loopback::run(&conn.peer, &self.rkeys, DriverEp(index as u32), &q.op);
                    if result == Err(Status::NoResource) {
                        break;
                    }
                    conn.lanes[lane].pop_front();
                    out[n] = Completion::new(q.token, result);
                    n += 1;
                }
            }
            while n < out.len() {
                let Some(f) = conn.flushes.front().copied() else {
                    break;
                };
                let done = conn.lanes.iter().enumerate().all(|(i, q)| {
                    f.lanes & (1 << i) == 0 || q.front().is_none_or(|front| front.seq > f.seq)
                });
                if !done {
                    break;
                }
                conn.flushes.pop_front();
                out[n] = Completion::new(f.token, Ok(0));
                n += 1;
            }
        }
        n
    }
}

impl DirectPath for Loopback {
    unsafe fn execute(
        &mut self,
        ep: DriverEp,
        ops: &[Op],
        results: &mut [Result<u32, Status>],
    ) -> usize {
        // Immediate mode (the only one that offers this): `post` finishes
        // every operation it takes.
        // SAFETY: the caller vouches for `ops` as `execute` requires.
        unsafe {
            execute_by_post(self, ep, ops, results, |d| {
                d.mode == CompletionMode::Immediate
            })
        }
    }
}
