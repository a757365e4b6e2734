//! Memory a driver has not released yet (docs/architecture.md, "Memory
//! and keys"): deregistered registrations whose quiesce answered
//! [`Quiesced::Pending`] wait here, re-asked from the progress round, and
//! those a driver answered [`Quiesced::Leak`] for are leaked, never freed.
//!
//! A parked registration keeps what the registry owned of it (the memory
//! of `alloc_registered`) until every driver answered `Done`. Memory the
//! application owns is not the engine's to keep: its handle stays
//! reserved, and `Worker::deregister` of it answers `Busy` until the
//! drivers released it (see there).

use super::Engine;
use super::drivers::DriverSet;
use crate::driver::{DriverMemKey, Quiesce, Quiesced};
use crate::memory::{MemRegistry, Registration};
use ringfence_ring::Status;

/// Registrations withdrawn from the drivers but not yet released by all
/// of them, and what became of those that were.
#[derive(Debug, Default)]
pub(super) struct Releases {
    /// Deregistered registrations a driver has not released yet (its
    /// quiesce answered `Pending`): asked again every round while not
    /// empty.
    parked: Vec<Parked>,
    /// Handles of application memory whose drivers have answered, until
    /// the application deregisters it again.
    settled: Vec<(u32, Settled)>,
    /// Registrations leaked (a driver answered `Leak`), and their bytes.
    leaked: (u64, u64),
}

/// A deregistered registration that a driver has not released yet.
#[derive(Debug)]
struct Parked {
    /// The handle the application deregisters again (memory it owns);
    /// `None` when the registry owns the memory (the application was told
    /// the deregistration succeeded) or it never had a handle.
    pub handle: Option<u32>,
    pub registration: Registration,
    /// The drivers (by index) whose quiesce of their key answered
    /// `Pending`, with that key: asked again every round.
    pub pending: Vec<(usize, DriverMemKey)>,
    /// A driver answered `Leak`: the memory is never freed.
    pub leak: bool,
}

/// What became of memory the application owns once its drivers answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settled {
    /// Every driver answered `Done`: the next deregistration succeeds.
    Released,
    /// A driver answered `Leak`: the memory must never be freed.
    Leaked,
}

/// Counts of memory that drivers have not released: see
/// [`Worker::unreleased_memory`](crate::Worker::unreleased_memory).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct UnreleasedMemory {
    /// Deregistered registrations a driver's quiesce still answers
    /// `Pending` for: their memory is kept (or, the application's own, must
    /// be).
    pub pending: u32,
    /// Their bytes.
    pub pending_bytes: u64,
    /// Registrations leaked because a driver answered `Leak` (or, at
    /// teardown, did not finish in time): never freed.
    pub leaked: u32,
    /// Their bytes.
    pub leaked_bytes: u64,
}

/// The outcome of asking every driver of a registration to quiesce it.
#[derive(Debug, Default)]
pub(crate) struct Withdrawal {
    pub pending: Vec<(usize, DriverMemKey)>,
    pub leak: bool,
}

impl Withdrawal {
    /// Every driver answered `Done`.
    pub fn is_done(&self) -> bool {
        self.pending.is_empty() && !self.leak
    }
}

impl Releases {
    /// Whether no registration waits for a driver.
    pub(super) fn none_parked(&self) -> bool {
        self.parked.is_empty()
    }

    /// Asks the drivers again about every parked registration (the
    /// progress round calls this only when some are parked, after polling);
    /// returns how many were settled.
    pub(super) fn reask(&mut self, drivers: &mut DriverSet) -> usize {
        let mut settled = 0;
        let mut i = 0;
        while i < self.parked.len() {
            let p = &mut self.parked[i];
            let mut leak = p.leak;
            p.pending.retain(|&(d, key)| {
                let Some(driver) = drivers.get_mut(d) else {
                    return false;
                };
                match driver.quiesce(Quiesce::Memory(key)) {
                    Quiesced::Done => false,
                    Quiesced::Pending => true,
                    Quiesced::Leak => {
                        leak = true;
                        false
                    }
                }
            });
            p.leak = leak;
            if p.pending.is_empty() {
                let p = self.parked.swap_remove(i);
                self.settle(p);
                settled += 1;
            } else {
                i += 1;
            }
        }
        settled
    }

    /// Keeps `p` until its drivers release it, or settles it now if they
    /// all answered.
    fn park(&mut self, p: Parked) {
        if p.pending.is_empty() {
            self.settle(p);
        } else {
            self.parked.push(p);
        }
    }

    /// Every driver has answered for `p`: its memory is freed (dropped with
    /// the registration), leaked, or, the application's own, reported as
    /// released or leaked to its next deregistration.
    fn settle(&mut self, mut p: Parked) {
        if p.leak {
            self.leak(&mut p.registration);
        }
        match p.handle {
            Some(raw) => {
                let settled = if p.leak {
                    Settled::Leaked
                } else {
                    Settled::Released
                };
                self.settled.push((raw, settled));
            }
            None if !p.leak => {
                tracing::debug!(len = p.registration.len, "deregistered memory released");
            }
            None => {}
        }
        // What the registry owned goes here (unless leaked above).
        drop(p);
    }

    /// Never frees `registration`'s memory: what the registry owns of it
    /// is forgotten, and the warning names its size.
    fn leak(&mut self, registration: &mut Registration) {
        self.leaked.0 += 1;
        self.leaked.1 += registration.len;
        match registration._owned.take() {
            Some(owned) => {
                tracing::warn!(
                    len = registration.len,
                    kind = ?registration.kind,
                    "a driver cannot release registered memory: leaked, never freed"
                );
                std::mem::forget(owned);
            }
            None => tracing::warn!(
                len = registration.len,
                addr = registration.base,
                "a driver cannot release registered application memory: it must never be \
                 freed or reused"
            ),
        }
    }

    /// Whether the application's deregistration of `raw` concerns a
    /// registration its drivers were asked to release: `Some(Ok(()))`
    /// released (now forgotten here: the caller unreserves the handle),
    /// `Some(Err(Busy))` not yet or never.
    fn deregister_again(&mut self, raw: u32) -> Option<Result<(), Status>> {
        if self.parked.iter().any(|p| p.handle == Some(raw)) {
            return Some(Err(Status::Busy));
        }
        let i = self.settled.iter().position(|&(h, _)| h == raw)?;
        match self.settled[i].1 {
            Settled::Leaked => Some(Err(Status::Busy)),
            Settled::Released => {
                self.settled.swap_remove(i);
                Some(Ok(()))
            }
        }
    }

    /// What drivers have not released.
    pub(super) fn unreleased(&self) -> UnreleasedMemory {
        UnreleasedMemory {
            pending: self.parked.len() as u32,
            pending_bytes: self.parked.iter().map(|p| p.registration.len).sum(),
            leaked: self.leaked.0 as u32,
            leaked_bytes: self.leaked.1,
        }
    }

    /// At teardown, after the drivers' `quiesce(All)`: `release` (every
    /// driver answered `Done`) frees every registration's memory with the
    /// engine, except what a driver answered `Leak` for; otherwise every
    /// registration is leaked, parked or live (`live`: the registry's).
    fn release_all(&mut self, release: bool, live: &mut MemRegistry) {
        for mut p in std::mem::take(&mut self.parked) {
            if p.leak || !release {
                self.leak(&mut p.registration);
            }
        }
        if !release {
            let live: Vec<Registration> = live.drain().collect();
            for mut r in live {
                self.leak(&mut r);
            }
        }
    }
}

impl Engine {
    /// Withdraws the driver keys of a registration: each driver
    /// deregisters its key and is asked to quiesce it once.
    pub(crate) fn withdraw(&mut self, keys: &[Option<DriverMemKey>]) -> Withdrawal {
        let mut w = Withdrawal::default();
        for (d, key) in keys.iter().enumerate() {
            if let (Some(key), Some(driver)) = (key, self.drivers.get_mut(d)) {
                driver.deregister(*key);
                match driver.quiesce(Quiesce::Memory(*key)) {
                    Quiesced::Done => {}
                    Quiesced::Pending => w.pending.push((d, *key)),
                    Quiesced::Leak => w.leak = true,
                }
            }
        }
        w
    }

    /// Keeps `registration`, withdrawn with outcome `w`, until its drivers
    /// release it. `handle`: the application owns the memory and asks again
    /// with this (reserved) handle.
    pub(crate) fn park(&mut self, handle: Option<u32>, registration: Registration, w: Withdrawal) {
        if let Some(raw) = handle {
            self.mem.reserve(raw);
        }
        tracing::debug!(
            len = registration.len,
            pending = w.pending.len(),
            "deregistered memory kept until its drivers release it"
        );
        self.releases.park(Parked {
            handle,
            registration,
            pending: w.pending,
            leak: w.leak,
        });
    }

    /// Whether the application's deregistration of `raw` concerns a
    /// registration its drivers were asked to release: `Some(Ok(()))`
    /// released (now forgotten here), `Some(Err(Busy))` not yet or never.
    pub(crate) fn deregister_again(&mut self, raw: u32) -> Option<Result<(), Status>> {
        let again = self.releases.deregister_again(raw);
        if again == Some(Ok(())) {
            self.mem.unreserve(raw);
        }
        again
    }

    /// What drivers have not released.
    pub(crate) fn unreleased(&self) -> UnreleasedMemory {
        self.releases.unreleased()
    }

    /// At teardown, after the drivers' `quiesce(All)`: `release` (every
    /// driver answered `Done`) frees every registration's memory with the
    /// engine, except what a driver answered `Leak` for; otherwise every
    /// registration is leaked, parked or live.
    pub(crate) fn release_all(&mut self, release: bool) {
        self.releases.release_all(release, &mut self.mem);
    }
}
