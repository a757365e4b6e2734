//! Registering memory and exchanging remote keys.

use super::*;

impl Worker {
    pub(super) fn register_desc(
        &self,
        addr: u64,
        len: u64,
        kind: MemKind,
        owned: Option<Arc<OwnedMem>>,
    ) -> Result<MemHandle, Error> {
        if len == 0 || addr.checked_add(len).is_none() {
            return Err(Error::Status {
                op: "register",
                status: Status::InvalidLength,
            });
        }
        let secret = getrandom::u64().map_err(|e| Error::Os {
            op: "getrandom",
            source: std::io::Error::other(e.to_string()),
        })?;
        let desc = MemDesc {
            addr,
            len,
            kind,
            secret,
        };
        let drivers = &self.shared.drivers;
        if !drivers.iter().any(|d| d.caps.supports_mem_kind(kind)) {
            return Err(Error::Unsupported(format!(
                "no driver of this worker registers {kind:?} memory (drivers: {:?})",
                drivers.iter().map(|d| d.name).collect::<Vec<_>>()
            )));
        }
        // Phase one, without the engine lock: each driver that supports
        // the kind does its slow part (pinning, mapping) while the engine
        // progresses. Drivers that do not support it never see it (device
        // memory never reaches a host-only driver).
        let mut prepared = Vec::with_capacity(drivers.len());
        for d in drivers {
            prepared.push(match &d.prepare {
                Some(p) if d.caps.supports_mem_kind(kind) => {
                    p.register(&desc).map_err(|source| Error::Driver {
                        driver: d.name,
                        op: "register",
                        source,
                    })?
                }
                _ => Prepared::none(),
            });
        }
        // Phase two, under the lock: each takes its part's result.
        let mut engine = self.shared.engine();
        let mut keys = Vec::with_capacity(drivers.len());
        let mut local_only = Vec::new();
        for (d, prepared) in prepared.into_iter().enumerate() {
            if !drivers[d].caps.supports_mem_kind(kind) {
                keys.push(None);
                continue;
            }
            match engine.drivers[d].register(&desc, prepared) {
                Ok(registered) => {
                    if let Registered::Local(_) = registered {
                        local_only.push(d as u8);
                    }
                    keys.push(registered.key());
                }
                Err(source) => {
                    withdraw_unused(&mut engine, &desc, owned, &keys);
                    return Err(Error::Driver {
                        driver: drivers[d].name,
                        op: "register",
                        source,
                    });
                }
            }
        }
        if keys.iter().all(Option::is_none) {
            return Err(Error::Unsupported(format!(
                "every driver of this worker that registers {kind:?} memory declined this region"
            )));
        }
        let registration = Registration {
            base: addr,
            len,
            kind,
            keys,
            local_only,
            inflight: 0,
            _owned: owned,
        };
        match engine.mem.insert(registration) {
            Ok(handle) => Ok(handle),
            Err((status, registration)) => {
                let w = engine.withdraw(&registration.keys);
                if !w.is_done() {
                    engine.park(None, registration, w);
                }
                Err(Error::Status {
                    op: "register",
                    status,
                })
            }
        }
    }

    /// Registers existing memory for local use in SQEs and remote access by
    /// peers that receive its key.
    ///
    /// # Errors
    /// Zero or overflowing length, an unsupported kind, or no free slot.
    ///
    /// # Safety
    /// - `[addr, addr + len)` stays valid, writable memory until
    ///   [`deregister`](Worker::deregister) succeeds (it answers
    ///   [`Status::Busy`] while a driver still holds the memory) or the
    ///   worker is dropped (unless a warning at teardown says that a
    ///   driver could not release it: then it must never be freed).
    /// - While registered, peers and the engine may write it at any time:
    ///   the owner reads it only in ways that tolerate that (volatile or
    ///   atomic accesses, or after a completion or a notification says the
    ///   writes are done).
    #[allow(unsafe_code)]
    pub unsafe fn register(
        &self,
        addr: *mut u8,
        len: usize,
        kind: MemKind,
    ) -> Result<MemHandle, Error> {
        self.register_desc(addr as usize as u64, len as u64, kind, None)
    }

    /// Allocates `len` zeroed, 64-byte aligned bytes of host memory and
    /// registers them: the zero-copy way to start. The same as
    /// [`alloc_registered_kind`](Worker::alloc_registered_kind) with
    /// [`MemKind::Host`]: beyond the process's memory limit
    /// ([`limits::memory_limit`]) it fails at once with
    /// [`Error::MemoryLimit`] (status [`Status::NoMemory`]).
    ///
    /// # Errors
    /// As `alloc_registered_kind`.
    pub fn alloc_registered(&self, len: usize) -> Result<RegisteredBuf, Error> {
        self.alloc_registered_kind(len, MemKind::Host)
    }

    /// Allocates `len` zeroed, 64-byte aligned bytes of memory of `kind`
    /// and registers them with every driver that supports that kind.
    ///
    /// The memory comes from the first driver that provides its own
    /// ([`Driver::alloc_memory`], e.g. a sealed memfd that a shared-memory
    /// peer maps, or device memory from the CUDA driver), else, for host
    /// memory, from the heap. Device memory is never read or written by
    /// host code: the returned buffer's `read`, `write` and word accessors
    /// panic on it.
    ///
    /// # Memory limit
    /// Host memory is checked before anything is allocated: `len` rounded
    /// up to whole pages, plus every ringfence allocation of this process
    /// still live (registered memory, notification buffers), must fit in
    /// the process's memory limit ([`limits::memory_limit`]: the smallest of
    /// physical memory plus swap, the cgroup's `memory.max` plus swap, and
    /// a finite `RLIMIT_AS` or `RLIMIT_DATA`). Beyond it the call fails at
    /// once with [`Error::MemoryLimit`] (status [`Status::NoMemory`]),
    /// whose message names the limit.
    ///
    /// Within the limit, heap memory of 64 KiB or more is an anonymous
    /// mapping, committed at creation (no `MAP_NORESERVE`: under strict
    /// overcommit, a commitment the kernel cannot back fails here) and
    /// zeroed by the kernel page by page as it is first touched, so a large
    /// allocation is fast and costs no resident memory until used. The shm
    /// driver's memfd memory is allocated in full at creation
    /// (`fallocate`), because peers write it: it is really there, or the
    /// call fails with `NoMemory`, never a fault later.
    ///
    /// # Errors
    /// [`Status::InvalidLength`] for a zero `len` or one that overflows
    /// when rounded up to pages; [`Error::MemoryLimit`] beyond the memory
    /// limit; [`Error::Unsupported`] if no driver of this worker provides or
    /// registers `kind`; as [`register`](Worker::register); the driver's
    /// allocation error; or the allocation failed ([`Status::NoMemory`]).
    pub fn alloc_registered_kind(&self, len: usize, kind: MemKind) -> Result<RegisteredBuf, Error> {
        let no_memory = Error::Status {
            op: "alloc_registered",
            status: Status::NoMemory,
        };
        if len == 0 || limits::round_to_pages(len).is_none() {
            return Err(Error::Status {
                op: "alloc_registered",
                status: Status::InvalidLength,
            });
        }
        // Host memory counts against the process's limit, checked before
        // any driver allocates; device memory is the driver's to bound.
        let reservation = match kind {
            MemKind::Host => Some(limits::reserve(len).map_err(|source| Error::MemoryLimit {
                op: "alloc_registered",
                source,
            })?),
            MemKind::Cuda(_) => None,
        };
        let from_driver = {
            let mut engine = self.shared.engine();
            engine.drivers.iter_mut().find_map(|d| {
                let name = d.name();
                d.alloc_memory(len, kind).map(|r| {
                    r.map_err(|source| Error::Driver {
                        driver: name,
                        op: "alloc_memory",
                        source,
                    })
                })
            })
        };
        let mem = Arc::new(match (from_driver, reservation) {
            (Some(mem), reservation) => {
                let mem = mem?;
                if mem.kind() != kind {
                    return Err(Error::Unsupported(format!(
                        "a driver handed out {:?} memory for a {kind:?} allocation",
                        mem.kind()
                    )));
                }
                OwnedMem::from_driver(mem, len, reservation).ok_or(no_memory)?
            }
            (None, Some(reservation)) => OwnedMem::new(len, reservation).ok_or(no_memory)?,
            (None, None) => {
                return Err(Error::Unsupported(format!(
                    "no driver of this worker allocates {kind:?} memory"
                )));
            }
        });
        let handle = self.register_desc(mem.addr(), len as u64, kind, Some(mem.clone()))?;
        Ok(RegisteredBuf {
            mem,
            handle,
            len,
            kind,
        })
    }

    /// Withdraws a registration, and frees its memory once no driver can
    /// touch it any more.
    ///
    /// Fails cleanly, changing nothing, while requests that use it are in
    /// flight. Otherwise the handle is withdrawn at once (SQEs naming it
    /// fail with [`Status::InvalidMemHandle`], no peer access that starts
    /// from now on succeeds), and each driver is asked to quiesce it
    /// ([`Driver::quiesce`]). A driver that cannot say yet that nothing it
    /// started (a peer's PUT still arriving, a canceled receive, GET data
    /// still being sent from it) can touch the memory answers later, from
    /// the progress rounds, and this call does not wait for it:
    /// - Memory the worker owns ([`alloc_registered`](Worker::alloc_registered)):
    ///   this returns `Ok` once the handle is withdrawn. The worker keeps
    ///   the memory until every driver has released it, and frees it then
    ///   (when the last [`RegisteredBuf`] handle is gone too); memory a
    ///   driver can never release is leaked, never freed (a warning says
    ///   so). [`unreleased_memory`](Worker::unreleased_memory) counts both.
    /// - Memory the application owns ([`register`](Worker::register)):
    ///   `Ok` means, as before, that no driver can touch it any more and it
    ///   may be freed. While a driver still holds it, this answers
    ///   [`Status::Busy`] instead: the memory must stay valid; progress the
    ///   worker and call `deregister` again with the same handle, which
    ///   answers `Busy` until the drivers have released it, then `Ok` (once;
    ///   after that the handle is unknown). If a driver can never release
    ///   it, every later call answers `Busy` and a warning says that the
    ///   memory must never be freed or reused.
    ///
    /// # Errors
    /// [`Status::InvalidMemHandle`] for an unknown handle (a second
    /// deregistration included), [`Status::Busy`] while requests use it
    /// (nothing changed) or while a driver holds memory the application
    /// owns (see above).
    pub fn deregister(&self, handle: MemHandle) -> Result<(), Error> {
        let mut engine = self.shared.engine();
        let raw = handle.as_raw();
        if let Some(again) = engine.deregister_again(raw) {
            return again.map_err(Error::status_of("deregister"));
        }
        let registration = engine
            .mem
            .remove(raw)
            .map_err(Error::status_of("deregister"))?;
        let w = engine.withdraw(&registration.keys);
        tracing::debug!(kind = ?registration.kind, len = registration.len, "deregistered");
        if w.is_done() {
            // Memory the registry owned is freed here, after every quiesce.
            drop(registration);
            return Ok(());
        }
        if registration._owned.is_some() {
            engine.park(None, registration, w);
            return Ok(());
        }
        engine.park(Some(raw), registration, w);
        // Answered at once if a driver said `Leak` and none is pending.
        match engine.deregister_again(raw) {
            Some(Ok(())) | None => Ok(()),
            Some(Err(status)) => Err(Error::Status {
                op: "deregister",
                status,
            }),
        }
    }

    /// Memory that drivers have not released: deregistered registrations a
    /// driver's quiesce still answers "not yet" for (kept, not freed), and
    /// those leaked because a driver could never release them. A snapshot.
    ///
    /// # Staleness
    /// The next progress round may release what is pending.
    pub fn unreleased_memory(&self) -> UnreleasedMemory {
        self.shared.engine().unreleased()
    }

    /// The blob a peer unpacks to access a registration: exact bounds, the
    /// memory's kind, and a part for each driver that registered it for
    /// remote access (each carries a random secret).
    ///
    /// # Errors
    /// [`Status::InvalidMemHandle`] for an unknown handle;
    /// [`Error::Unsupported`] if every driver that registered the memory
    /// did so for local use only (no peer can reach it).
    pub fn pack_rkey(&self, handle: MemHandle) -> Result<Vec<u8>, Error> {
        let engine = self.shared.engine();
        let r = engine.mem.get(handle.as_raw()).ok_or(Error::Status {
            op: "pack_rkey",
            status: Status::InvalidMemHandle,
        })?;
        let mut parts = Vec::new();
        for (d, key) in r.keys.iter().enumerate() {
            let Some(key) = key else { continue };
            if r.local_only.contains(&(d as u8)) {
                continue;
            }
            let driver = &engine.drivers[d];
            let part = driver.pack_rkey(*key).map_err(|source| Error::Driver {
                driver: driver.name(),
                op: "pack_rkey",
                source,
            })?;
            parts.push(blob::encode(driver.name(), r.kind, r.base, r.len, &part));
        }
        if parts.is_empty() {
            return Err(Error::Unsupported(format!(
                "no driver registered this {:?} memory for remote access",
                r.kind
            )));
        }
        Ok(encode_key(&parts))
    }

    /// The remote region remote key `rkey` (unpacked for endpoint `ep`)
    /// reaches: its base, the target's own virtual address of the window
    /// (the address a PUT or GET names, `RemoteBuf::addr`), and its length
    /// in bytes.
    ///
    /// # Errors
    /// `InvalidRkey` if `rkey` was not unpacked for `ep` on this worker.
    pub fn rkey_bounds(&self, ep: EndpointId, rkey: RkeyId) -> Result<(u64, u64), Error> {
        self.rkey(ep, rkey, "rkey_bounds").map(|k| (k.base, k.len))
    }

    /// What memory remote key `rkey` (unpacked for endpoint `ep`) reaches at
    /// the peer, with the peer's device ordinal for device memory.
    ///
    /// # Errors
    /// `InvalidRkey` if `rkey` was not unpacked for `ep` on this worker.
    pub fn rkey_kind(&self, ep: EndpointId, rkey: RkeyId) -> Result<MemKind, Error> {
        self.rkey(ep, rkey, "rkey_kind").map(|k| k.kind)
    }

    fn rkey(&self, ep: EndpointId, rkey: RkeyId, op: &'static str) -> Result<Rkey, Error> {
        self.shared
            .engine()
            .rkeys
            .get(rkey.as_raw(), ep.0)
            .copied()
            .ok_or(Error::Status {
                op,
                status: Status::InvalidRkey,
            })
    }

    /// Turns a peer's key blob into an id for SQEs on `ep`: each of the
    /// endpoint's drivers unpacks its part (an endpoint with lanes on
    /// several drivers uses the lanes of those that had one). The whole
    /// blob is checked first, field by field and against its integrity
    /// check, so that a damaged one is refused before any driver sees it
    /// (and so before anything is sent to the target).
    ///
    /// A part is skipped, and operations on the key take the lanes of
    /// another of `ep`'s drivers, where its driver does not reach the
    /// peer's kind of memory ([`Capabilities::remote_kinds`]) or finds it
    /// unreachable from here ([`Unpacked::Unreachable`]). The slow part of
    /// a driver's unpack ([`Prepare::unpack`], opening an IPC handle) runs
    /// without the engine lock: other endpoints keep progressing.
    ///
    /// # Errors
    /// [`Status::InvalidEndpoint`]; [`Error::Malformed`]
    /// ([`Status::InvalidArgument`]) for a blob that is malformed or fails
    /// its integrity check (a flipped bit, cut short, bytes after its
    /// end); [`Status::InvalidArgument`] for one without a part for any of
    /// `ep`'s drivers; [`Error::Unsupported`] if every part was skipped; or
    /// a driver's error (its own part malformed: `InvalidArgument`;
    /// refused by the target: `AccessDenied`, `InvalidRkey`). On any error
    /// nothing stays unpacked.
    pub fn unpack_rkey(&self, ep: EndpointId, key: &[u8]) -> Result<RkeyId, Error> {
        let parts = decode_key(key).map_err(|what| Error::Malformed {
            op: "unpack_rkey",
            what,
        })?;
        let drivers = &self.shared.drivers;
        let groups = self.groups(ep, "unpack_rkey")?;
        // The part each group's driver takes, where it reaches the memory.
        let mut named = false;
        let mut plan = Vec::with_capacity(groups.len());
        for (gi, &(driver, _)) in groups.iter().enumerate() {
            let info = &drivers[driver];
            let Some(part) = parts.iter().find(|p| p.driver == info.name) else {
                continue;
            };
            named = true;
            if info.caps.reaches(part.kind) {
                plan.push((gi, driver, part));
            }
        }
        let (base, len, kind) = match parts.first() {
            Some(p) if named => (p.base, p.len, p.kind),
            _ => {
                return Err(Error::Status {
                    op: "unpack_rkey",
                    status: Status::InvalidArgument,
                });
            }
        };
        // Phase one, without the engine lock.
        let mut prepared = Vec::with_capacity(plan.len());
        for &(gi, driver, part) in &plan {
            let info = &drivers[driver];
            prepared.push(match &info.prepare {
                Some(p) => {
                    p.unpack(groups[gi].1, &key_part(part))
                        .map_err(|source| Error::Driver {
                            driver: info.name,
                            op: "unpack_rkey",
                            source,
                        })?
                }
                None => Prepared::none(),
            });
        }
        // Phase two, under the lock. An endpoint's groups never change,
        // and its index is never another endpoint's.
        let mut engine = self.shared.engine();
        let mut entry = Rkey {
            endpoint: ep.0,
            parts: [None; MAX_GROUPS],
            base,
            len,
            kind,
        };
        for (&(gi, driver, part), prepared) in plan.iter().zip(prepared) {
            let driver_ep = groups[gi].1;
            match engine.drivers[driver].unpack_rkey(driver_ep, &key_part(part), prepared) {
                Ok(Unpacked::Key(rkey)) => entry.parts[gi] = Some(rkey),
                Ok(Unpacked::Unreachable) => {}
                Err(source) => {
                    engine.release_rkey_parts(&entry);
                    return Err(Error::Driver {
                        driver: drivers[driver].name,
                        op: "unpack_rkey",
                        source,
                    });
                }
            }
        }
        if entry.parts.iter().all(Option::is_none) {
            return Err(Error::Unsupported(format!(
                "no driver of this endpoint reaches the peer's {kind:?} memory"
            )));
        }
        engine.rkeys.insert(entry).map_err(|status| {
            engine.release_rkey_parts(&entry);
            Error::Status {
                op: "unpack_rkey",
                status,
            }
        })
    }

    /// The (driver, driver endpoint) of each lane group of `ep`.
    fn groups(&self, ep: EndpointId, op: &'static str) -> Result<Vec<(usize, DriverEp)>, Error> {
        let engine = self.shared.engine();
        let cold = engine.cold.get(ep.0 as usize).ok_or(Error::Status {
            op,
            status: Status::InvalidEndpoint,
        })?;
        Ok(cold
            .groups
            .iter()
            .map(|g| (g.driver as usize, DriverEp(g.driver_ep)))
            .collect())
    }

    /// Releases a remote key from [`unpack_rkey`](Worker::unpack_rkey):
    /// each driver frees its part ([`Driver::release_rkey`]), and the id
    /// is stale from now on (SQEs naming it fail with
    /// [`Status::InvalidRkey`], and a later unpack never hands it out
    /// again until its slot's generation wraps). Keys still unpacked when
    /// their endpoint closes, or the worker goes, are released then.
    ///
    /// # Errors
    /// [`Status::InvalidRkey`] for an id that is not a live key of this
    /// worker (a second release included); [`Status::Busy`], changing
    /// nothing, while the key's endpoint has operations queued or in
    /// flight (any of them may use it): release it after they completed.
    pub fn release_rkey(&self, rkey: RkeyId) -> Result<(), Error> {
        self.shared
            .engine()
            .release_rkey(rkey.as_raw())
            .map_err(Error::status_of("release_rkey"))
    }

    /// How many remote keys are unpacked and not released. A snapshot.
    pub fn unpacked_rkeys(&self) -> usize {
        self.shared.engine().rkeys.len()
    }
}

/// Withdraws the keys of a registration that failed before it got a
/// handle (nothing can have used it): memory a driver does not release at
/// once is kept as for a deregistration.
fn withdraw_unused(
    engine: &mut Engine,
    desc: &MemDesc,
    owned: Option<Arc<OwnedMem>>,
    keys: &[Option<DriverMemKey>],
) {
    let w = engine.withdraw(keys);
    if w.is_done() {
        return;
    }
    let registration = Registration {
        base: desc.addr,
        len: desc.len,
        kind: desc.kind,
        keys: keys.to_vec(),
        local_only: Vec::new(),
        inflight: 0,
        _owned: owned,
    };
    engine.park(None, registration, w);
}

/// What a driver is given of a decoded key part.
fn key_part<'a>(p: &blob::Decoded<'a>) -> KeyPart<'a> {
    KeyPart {
        kind: p.kind,
        base: p.base,
        len: p.len,
        blob: p.driver_blob,
    }
}
