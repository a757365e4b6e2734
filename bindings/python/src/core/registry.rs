//! Registered memory's bookkeeping: keeping a registration's backing
//! until the engine lets go, deregistering, releasing remote keys, and
//! retrying what the drivers still held.

use super::*;

impl Core {
    /// Keeps `backing` as the memory of registration `handle`.
    pub(crate) fn keep(&self, handle: MemHandle, backing: Backing) {
        lock(&self.regs)
            .live
            .insert(handle.as_raw(), Reg { handle, backing });
    }

    /// Deregisters `handle` and gives back its memory: at once if the
    /// engine lets go, else it is parked and let go later. With `refuse`,
    /// a registration that operations still use is kept as it was and
    /// the call answers `Busy` instead.
    ///
    /// Returns the memory to drop with no lock held (a Python buffer's
    /// release takes the GIL).
    pub(crate) fn deregister(&self, handle: MemHandle, refuse: bool) -> Res<Option<Backing>> {
        let w = match self.worker() {
            Ok(w) => w,
            // Closed: `close` let every registration go.
            Err(_) if self.is_closed() => return Ok(None),
            Err(f) => return Err(f),
        };
        let w = w.as_ref().expect("checked by worker()");
        let mut regs = lock(&self.regs);
        let Some(reg) = regs.live.remove(&handle.as_raw()) else {
            return Ok(None);
        };
        match w.deregister(handle) {
            Ok(()) => Ok(Some(reg.backing)),
            Err(e) if e.status() == Status::InvalidMemHandle => Ok(Some(reg.backing)),
            Err(e) if e.status() == Status::Busy => {
                // Busy means either that requests use it (nothing changed:
                // it is still registered) or that it was withdrawn and a
                // driver still holds it (the handle is unknown now).
                let registered = !matches!(
                    w.pack_rkey(handle),
                    Err(ref p) if p.status() == Status::InvalidMemHandle
                );
                if refuse && registered {
                    regs.live.insert(handle.as_raw(), reg);
                    return Err(Fail::new(
                        Status::Busy,
                        "operations in flight use this memory: wait for their transfers, \
                         then release it (or drop it: it is released when they are done)",
                    ));
                }
                regs.parked.push(Parked::Mem(reg));
                // Relaxed: a hint that `retry_parked` has work; it looks
                // under the lock.
                self.parked.fetch_add(1, Ordering::Relaxed);
                Ok(None)
            }
            Err(e) => {
                regs.live.insert(handle.as_raw(), reg);
                Err(e.into())
            }
        }
    }

    /// Releases remote key `rkey`, or parks it while its endpoint has work.
    pub(crate) fn release_key(&self, rkey: RkeyId) {
        let Ok(w) = self.worker() else { return };
        let w = w.as_ref().expect("checked by worker()");
        if let Err(e) = w.release_rkey(rkey)
            && e.status() == Status::Busy
        {
            lock(&self.regs).parked.push(Parked::Key(rkey));
            self.parked.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Tries the parked deregistrations and key releases again; returns
    /// the memory let go, to drop with no lock held.
    pub(crate) fn retry_parked(&self) -> Vec<Backing> {
        // Relaxed: see `deregister`.
        if self.parked.load(Ordering::Relaxed) == 0 {
            return Vec::new();
        }
        let Ok(w) = self.worker() else {
            return Vec::new();
        };
        let w = w.as_ref().expect("checked by worker()");
        let mut regs = lock(&self.regs);
        let mut freed = Vec::new();
        let parked = std::mem::take(&mut regs.parked);
        for p in parked {
            match p {
                Parked::Mem(reg) => match w.deregister(reg.handle) {
                    Err(e) if e.status() == Status::Busy => regs.parked.push(Parked::Mem(reg)),
                    // Ok, or unknown: nothing holds it any more.
                    _ => freed.push(reg.backing),
                },
                Parked::Key(rkey) => {
                    if let Err(e) = w.release_rkey(rkey)
                        && e.status() == Status::Busy
                    {
                        regs.parked.push(Parked::Key(rkey));
                    }
                }
            }
        }
        self.parked.store(regs.parked.len(), Ordering::Relaxed);
        freed
    }
}
