//! The data path: PUT, GET and ATOMIC through a mapping or cross memory
//! attach (the hot key first), NOTIFY into the peer's channel, flushes,
//! and the run path ([`DirectPath`]).

//! [`Shm`]: the driver the engine calls.

use crate::channel;
use crate::export;
use crate::layout::CMA_ACTIVE_AT;
use crate::sys::hot::HotKey;
use crate::sys::rma;
use ringfence::{DirectPath, DriverEp, DriverRkey, LaneMask, Op, OpKind, Posted, Token};
use ringfence_ring::Status;
use std::sync::atomic::{Ordering, fence};

use super::*;

// The data path's unsafe contract (`post_op` is `Driver::post`); the
// memory accesses themselves are in `sys`.
#[allow(unsafe_code)]
impl Shm {
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

    /// [`Driver::post`]'s body.
    ///
    /// # Safety
    /// As [`Driver::post`].
    pub(super) unsafe fn post_op(&mut self, ep: DriverEp, op: &Op, _token: Token) -> Posted {
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

    pub(super) fn flush_ep(&mut self, ep: DriverEp, _lanes: LaneMask, _token: Token) -> Posted {
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
        if let Some(hot) = &self.hot
            && let Some((rkey, addr)) = op.remote
        {
            // Acquire on `dead`: as in `execute_hot`.
            if hot.ep == ep.0
                && rkey == hot.rkey
                && op.lane < hot.lanes
                && !hot.liveness.gone()
                && let Some(result) = hot.access(op, addr)
            {
                return Some(result);
            }
        }
        let mut result = [Ok(0)];
        (self.execute_full(ep, std::slice::from_ref(op), &mut result) > 0).then_some(result[0])
    }
}
