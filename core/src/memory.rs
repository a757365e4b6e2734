//! The memory registry: local registrations, packed and unpacked remote keys.
//!
//! A registration is named in SQEs by a [`MemHandle`] (slot and generation,
//! so a handle outlives nothing: after deregistration it is stale, never
//! another registration). A remote key travels as a blob made by
//! [`Worker::pack_rkey`](crate::Worker::pack_rkey): the exact bounds of the
//! region plus the driver's own part, which carries a random secret that the
//! target side checks. The peer's
//! [`Worker::unpack_rkey`](crate::Worker::unpack_rkey) turns it into an
//! [`RkeyId`] bound to one endpoint.

use crate::driver::{DriverMemKey, DriverRkey, MemKind};
use crate::sys::mem::OwnedMem;
use ringfence_ring::Status;
use std::sync::Arc;

/// A local registration, as put in [`Sqe::local_mem`](ringfence_ring::Sqe).
/// Zero is never a valid handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MemHandle(u32);

impl MemHandle {
    /// The raw value for an SQE.
    pub const fn as_raw(self) -> u32 {
        self.0
    }

    fn new(slot: u16, generation: u16) -> MemHandle {
        MemHandle(u32::from(generation) << 16 | u32::from(slot))
    }

    fn slot(raw: u32) -> usize {
        (raw & 0xffff) as usize
    }

    fn generation(raw: u32) -> u16 {
        (raw >> 16) as u16
    }
}

/// An unpacked remote key, as put in [`Sqe::rkey`](ringfence_ring::Sqe).
/// Zero is never a valid id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RkeyId(u32);

impl RkeyId {
    /// The raw value for an SQE.
    pub const fn as_raw(self) -> u32 {
        self.0
    }

    /// The id an SQE carried (`Sqe::rkey`), for code that holds ids as
    /// integers (the C ABI). Nothing is checked here: the worker checks
    /// every id it is given.
    pub const fn from_raw(raw: u32) -> RkeyId {
        RkeyId(raw)
    }
}

/// One registration.
#[derive(Debug)]
pub(crate) struct Registration {
    pub base: u64,
    pub len: u64,
    /// What memory it is.
    pub kind: MemKind,
    /// The driver's key, one per driver of the worker (same order); `None`
    /// for a driver that does not register this kind of memory or declined
    /// it ([`Registered::Declined`](crate::driver::Registered::Declined)).
    pub keys: Vec<Option<DriverMemKey>>,
    /// The drivers (by index) that registered it for local use only
    /// ([`Registered::Local`](crate::driver::Registered::Local)): a packed
    /// key has a part for every other driver with a key, none for these.
    pub local_only: Vec<u8>,
    /// Requests that reference this registration and have not completed.
    pub inflight: u32,
    /// Memory the registry owns (from `alloc_registered`), kept alive here
    /// until the registration and every handle to it are gone.
    pub _owned: Option<Arc<OwnedMem>>,
}

#[derive(Debug, Default)]
struct Slot {
    /// Bumped on every removal; starts at 1 so that handle 0 is invalid.
    generation: u16,
    registration: Option<Registration>,
    /// A removed registration's handle is still answered for (a driver has
    /// not released memory the application owns, see
    /// `Engine::deregister`): the slot is not reused until then.
    reserved: bool,
}

/// The local registrations of a worker.
#[derive(Debug, Default)]
pub(crate) struct MemRegistry {
    slots: Vec<Slot>,
    /// Registrations removed so far: whoever keeps what it looked up here
    /// checks that this has not moved since.
    removals: u64,
}

impl MemRegistry {
    /// Adds a registration.
    ///
    /// # Errors
    /// [`Status::NoResource`] when all 65,536 slots are in use; the
    /// registration comes back, for its driver keys to be withdrawn.
    pub fn insert(
        &mut self,
        registration: Registration,
    ) -> Result<MemHandle, (Status, Registration)> {
        let slot = match self
            .slots
            .iter()
            .position(|s| s.registration.is_none() && !s.reserved)
        {
            Some(i) => i,
            None if self.slots.len() < 1 << 16 => {
                self.slots.push(Slot {
                    generation: 1,
                    registration: None,
                    reserved: false,
                });
                self.slots.len() - 1
            }
            None => return Err((Status::NoResource, registration)),
        };
        let s = &mut self.slots[slot];
        s.registration = Some(registration);
        Ok(MemHandle::new(slot as u16, s.generation))
    }

    /// The live registration named by a raw handle.
    pub fn get(&self, raw: u32) -> Option<&Registration> {
        let s = self.slots.get(MemHandle::slot(raw))?;
        if s.generation != MemHandle::generation(raw) {
            return None;
        }
        s.registration.as_ref()
    }

    /// As `get`, mutable.
    pub fn get_mut(&mut self, raw: u32) -> Option<&mut Registration> {
        let s = self.slots.get_mut(MemHandle::slot(raw))?;
        if s.generation != MemHandle::generation(raw) {
            return None;
        }
        s.registration.as_mut()
    }

    /// Registrations removed so far (see [`MemRegistry::removals`]'s
    /// field): a lookup kept from before is stale when this has moved.
    pub fn removals(&self) -> u64 {
        self.removals
    }

    /// Checks that `[addr, addr + len)` lies in registration `raw`.
    ///
    /// # Errors
    /// [`Status::InvalidMemHandle`] for an unknown or stale handle;
    /// [`Status::OutOfBounds`] for a range outside it.
    pub fn check(&self, raw: u32, addr: u64, len: u64) -> Result<&Registration, Status> {
        let r = self.get(raw).ok_or(Status::InvalidMemHandle)?;
        if within(r.base, r.len, addr, len) {
            Ok(r)
        } else {
            Err(Status::OutOfBounds)
        }
    }

    /// Removes a registration that no request references.
    ///
    /// # Errors
    /// [`Status::InvalidMemHandle`] for an unknown or stale handle;
    /// [`Status::Busy`] while requests still reference it (nothing changes).
    pub fn remove(&mut self, raw: u32) -> Result<Registration, Status> {
        let r = self.get(raw).ok_or(Status::InvalidMemHandle)?;
        if r.inflight != 0 {
            return Err(Status::Busy);
        }
        let s = &mut self.slots[MemHandle::slot(raw)];
        s.generation = s.generation.checked_add(1).unwrap_or(1);
        self.removals += 1;
        s.registration.take().ok_or(Status::InvalidMemHandle)
    }

    /// Keeps the slot of `raw`, a handle [`remove`](MemRegistry::remove)
    /// returned the registration of, from being reused: no new
    /// registration gets a handle equal to `raw` until
    /// [`unreserve`](MemRegistry::unreserve).
    pub fn reserve(&mut self, raw: u32) {
        if let Some(s) = self.slots.get_mut(MemHandle::slot(raw)) {
            s.reserved = true;
        }
    }

    /// Lets the slot of `raw` be reused again.
    pub fn unreserve(&mut self, raw: u32) {
        if let Some(s) = self.slots.get_mut(MemHandle::slot(raw)) {
            s.reserved = false;
        }
    }

    /// Takes every live registration out (teardown).
    pub fn drain(&mut self) -> impl Iterator<Item = Registration> + '_ {
        self.slots.iter_mut().filter_map(|s| s.registration.take())
    }
}

/// Whether `[addr, addr + len)` lies inside `[base, base + size)`, with no
/// overflow anywhere.
pub(crate) fn within(base: u64, size: u64, addr: u64, len: u64) -> bool {
    let Some(end) = addr.checked_add(len) else {
        return false;
    };
    let Some(limit) = base.checked_add(size) else {
        return false;
    };
    addr >= base && end <= limit
}

/// A remote key after unpacking.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rkey {
    /// The endpoint it was unpacked for.
    pub endpoint: u32,
    /// The driver's key for each lane group of the endpoint (one group
    /// unless the endpoint has lanes on several drivers); `None` where the
    /// blob had no part for that group's driver, or the part names memory
    /// that driver cannot reach.
    pub parts: [Option<DriverRkey>; MAX_GROUPS],
    pub base: u64,
    pub len: u64,
    /// What memory the region is, at the peer.
    pub kind: MemKind,
}

/// The most drivers one endpoint can have lanes on.
pub(crate) const MAX_GROUPS: usize = 4;

/// Bits of an [`RkeyId`] that name its slot (plus one: zero is never an
/// id); the rest is the slot's generation, so that an id released and
/// reused names the new key only with the new generation.
const RKEY_SLOT_BITS: u32 = 22;
const RKEY_SLOT_MASK: u32 = (1 << RKEY_SLOT_BITS) - 1;

/// Unpacked remote keys: slots reused after release, each with a
/// generation in the ids it hands out.
#[derive(Debug, Default)]
pub(crate) struct RkeyTable {
    slots: Vec<RkeySlot>,
    /// Free slots, reused last-released first.
    free: Vec<u32>,
}

#[derive(Debug)]
struct RkeySlot {
    generation: u32,
    key: Option<Rkey>,
}

impl RkeyTable {
    /// Adds a key.
    ///
    /// # Errors
    /// [`Status::NoResource`] when all 4,194,303 slots are in use.
    pub fn insert(&mut self, key: Rkey) -> Result<RkeyId, Status> {
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None if self.slots.len() < RKEY_SLOT_MASK as usize => {
                self.slots.push(RkeySlot {
                    generation: 0,
                    key: None,
                });
                self.slots.len() as u32 - 1
            }
            None => return Err(Status::NoResource),
        };
        let s = &mut self.slots[slot as usize];
        s.key = Some(key);
        Ok(RkeyId(s.generation << RKEY_SLOT_BITS | (slot + 1)))
    }

    fn slot(&self, raw: u32) -> Option<(usize, &Rkey)> {
        let slot = ((raw & RKEY_SLOT_MASK) as usize).checked_sub(1)?;
        let s = self.slots.get(slot)?;
        (s.generation == raw >> RKEY_SLOT_BITS)
            .then_some(())
            .and(s.key.as_ref())
            .map(|k| (slot, k))
    }

    /// The key for a raw id, if it was unpacked for `endpoint`.
    pub fn get(&self, raw: u32, endpoint: u32) -> Option<&Rkey> {
        let (_, key) = self.slot(raw)?;
        (key.endpoint == endpoint).then_some(key)
    }

    /// The live key a raw id names, whatever its endpoint.
    pub fn peek(&self, raw: u32) -> Option<&Rkey> {
        self.slot(raw).map(|(_, k)| k)
    }

    /// Removes the key a raw id names; the id is stale from now on.
    pub fn remove(&mut self, raw: u32) -> Option<Rkey> {
        let (slot, _) = self.slot(raw)?;
        self.release_slot(slot)
    }

    fn release_slot(&mut self, slot: usize) -> Option<Rkey> {
        let s = &mut self.slots[slot];
        let key = s.key.take()?;
        s.generation = (s.generation + 1) & (u32::MAX >> RKEY_SLOT_BITS);
        self.free.push(slot as u32);
        Some(key)
    }

    /// Removes every key unpacked for `endpoint` (all of them if `None`).
    pub fn remove_all(&mut self, endpoint: Option<u32>) -> Vec<Rkey> {
        let mut out = Vec::new();
        for i in 0..self.slots.len() {
            let ours = self.slots[i]
                .key
                .is_some_and(|k| endpoint.is_none_or(|e| k.endpoint == e));
            if ours {
                out.extend(self.release_slot(i));
            }
        }
        out
    }

    /// How many keys are live.
    pub fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }
}

/// One driver's part of a packed remote key (format 3): `"RFRK"`,
/// version 3, the length of the driver's name, the memory's kind and
/// device ordinal (`u8`, little-endian `u16`), the region's base and
/// length (little-endian `u64`s), the length of the driver's own blob
/// (`u32`), the name, then the driver's blob. The packed key around the
/// parts (`worker::out_of_band`) carries the integrity check. Version 2 had no
/// kind.
pub(crate) mod blob {
    use crate::driver::MemKind;

    const MAGIC: &[u8; 4] = b"RFRK";
    const VERSION: u8 = 3;
    const FIXED: usize = 4 + 1 + 1 + 3 + 8 + 8 + 4;

    /// A decoded part; borrows the input.
    #[derive(Debug, PartialEq, Eq)]
    pub(crate) struct Decoded<'a> {
        pub driver: &'a str,
        pub kind: MemKind,
        pub base: u64,
        pub len: u64,
        pub driver_blob: &'a [u8],
    }

    /// A part for `driver`'s blob of a region of `kind`. Callers keep the
    /// name to 255 bytes (the worker refuses longer ones when it is built)
    /// and the blob to `u32::MAX` bytes.
    pub(crate) fn encode(
        driver: &str,
        kind: MemKind,
        base: u64,
        len: u64,
        driver_blob: &[u8],
    ) -> Vec<u8> {
        let mut out = Vec::with_capacity(FIXED + driver.len() + driver_blob.len());
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.push(driver.len() as u8);
        out.push(kind.code());
        out.extend_from_slice(&kind.device().unwrap_or(0).to_le_bytes());
        out.extend_from_slice(&base.to_le_bytes());
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(driver_blob.len() as u32).to_le_bytes());
        out.extend_from_slice(driver.as_bytes());
        out.extend_from_slice(driver_blob);
        out
    }

    /// Decodes a part from a peer, field by field: the magic, the version,
    /// a known memory kind, a non-empty UTF-8 name, a non-empty region that
    /// does not wrap, and lengths that account for every byte.
    ///
    /// # Errors
    /// What is wrong, for [`Error::Malformed`](crate::Error::Malformed).
    pub(crate) fn decode(input: &[u8]) -> Result<Decoded<'_>, &'static str> {
        let Some((fixed, rest)) = input.split_first_chunk::<FIXED>() else {
            return Err("a remote key part is cut short");
        };
        if &fixed[..4] != MAGIC {
            return Err("a remote key part has no RFRK magic");
        }
        if fixed[4] != VERSION {
            return Err("a remote key part has an unknown version");
        }
        let name_len = usize::from(fixed[5]);
        let device = u16::from_le_bytes([fixed[7], fixed[8]]);
        let kind = MemKind::from_code(fixed[6], device)
            .ok_or("a remote key part names an unknown memory kind")?;
        let u64_at = |at: usize| u64::from_le_bytes(fixed[at..at + 8].try_into().expect("8 bytes"));
        let (base, len) = (u64_at(9), u64_at(17));
        let blob_len = u32::from_le_bytes(fixed[25..29].try_into().expect("4 bytes")) as usize;
        if rest.len() != name_len + blob_len {
            return Err("a remote key part's lengths do not match its size");
        }
        if len == 0 || base.checked_add(len).is_none() {
            return Err("a remote key part's region is empty or wraps");
        }
        let (name, driver_blob) = rest.split_at(name_len);
        let driver = std::str::from_utf8(name)
            .ok()
            .filter(|n| !n.is_empty())
            .ok_or("a remote key part's driver name is not a name")?;
        Ok(Decoded {
            driver,
            kind,
            base,
            len,
            driver_blob,
        })
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn round_trip_and_every_damage_is_refused() {
            const H: MemKind = MemKind::Host;
            let blob = encode("loopback", H, 0x1000, 64, &[1, 2, 3]);
            let d = decode(&blob).unwrap();
            assert_eq!(
                d,
                Decoded {
                    driver: "loopback",
                    kind: H,
                    base: 0x1000,
                    len: 64,
                    driver_blob: &[1, 2, 3]
                }
            );
            let device = encode("cuda", MemKind::Cuda(7), 0x1000, 64, &[]);
            assert_eq!(decode(&device).unwrap().kind, MemKind::Cuda(7));
            for cut in 0..blob.len() {
                assert!(decode(&blob[..cut]).is_err(), "cut at {cut}");
            }
            let mut long = blob.clone();
            long.push(0);
            assert!(decode(&long).is_err(), "a trailing byte");
            assert!(decode(&encode("x", H, u64::MAX, 2, &[])).is_err(), "wraps");
            assert!(decode(&encode("x", H, 0x1000, 0, &[])).is_err(), "empty");
            assert!(decode(&encode("", H, 0x1000, 8, &[])).is_err(), "no name");
            assert!(decode(&encode("\u{ff}", H, 0x1000, 8, &[])[..]).is_ok());
            let mut not_utf8 = encode("ab", H, 0x1000, 8, &[]);
            not_utf8[FIXED] = 0xff;
            assert!(decode(&not_utf8).is_err(), "not UTF-8");
            // The magic, versions 2 and 4, an unknown kind, host memory
            // with a device ordinal.
            for (at, value) in [(0, b'X'), (4, 2), (4, 4), (6, 2), (7, 1)] {
                let mut bad = blob.clone();
                bad[at] = value;
                assert!(decode(&bad).is_err(), "byte {at} = {value}");
            }
            assert!(decode(&[0xff; 40]).is_err());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(base: u64, len: u64) -> Registration {
        Registration {
            base,
            len,
            kind: MemKind::Host,
            keys: vec![],
            local_only: vec![],
            inflight: 0,
            _owned: None,
        }
    }

    #[test]
    fn handles_are_generation_checked() {
        let mut r = MemRegistry::default();
        let a = r.insert(reg(0x1000, 100)).unwrap();
        assert_ne!(a.as_raw(), 0);
        assert!(r.check(a.as_raw(), 0x1000, 100).is_ok());
        assert_eq!(
            r.check(a.as_raw(), 0x1000, 101).unwrap_err(),
            Status::OutOfBounds
        );
        assert_eq!(
            r.check(a.as_raw(), 0xfff, 1).unwrap_err(),
            Status::OutOfBounds
        );
        assert_eq!(
            r.check(a.as_raw(), u64::MAX, 2).unwrap_err(),
            Status::OutOfBounds
        );
        assert_eq!(r.check(0, 0, 0).unwrap_err(), Status::InvalidMemHandle);
        r.get_mut(a.as_raw()).unwrap().inflight = 1;
        assert_eq!(r.remove(a.as_raw()).unwrap_err(), Status::Busy);
        r.get_mut(a.as_raw()).unwrap().inflight = 0;
        r.remove(a.as_raw()).unwrap();
        assert_eq!(
            r.check(a.as_raw(), 0x1000, 1).unwrap_err(),
            Status::InvalidMemHandle
        );
        let b = r.insert(reg(0x2000, 8)).unwrap();
        assert_ne!(a, b, "the slot is reused with a new generation");
        assert!(r.get(a.as_raw()).is_none());
        assert!(r.get(b.as_raw()).is_some());
    }

    #[test]
    fn within_never_overflows() {
        assert!(within(10, 10, 10, 10));
        assert!(within(10, 10, 15, 0));
        assert!(!within(10, 10, 15, 6));
        assert!(!within(u64::MAX - 1, 10, u64::MAX - 1, 1));
        assert!(!within(0, u64::MAX, u64::MAX, 1));
    }

    #[test]
    fn rkeys_are_bound_to_their_endpoint() {
        let mut t = RkeyTable::default();
        let id = t
            .insert(Rkey {
                endpoint: 3,
                parts: [Some(DriverRkey(0)), None, None, None],
                base: 0,
                len: 8,
                kind: MemKind::Host,
            })
            .unwrap();
        assert!(t.get(id.as_raw(), 3).is_some());
        assert!(t.get(id.as_raw(), 4).is_none());
        assert!(t.get(0, 3).is_none());
        assert!(t.get(99, 3).is_none());
    }

    #[test]
    fn a_released_rkey_id_is_stale_and_its_slot_is_reused() {
        let mut t = RkeyTable::default();
        let key = |endpoint| Rkey {
            endpoint,
            parts: [Some(DriverRkey(0)), None, None, None],
            base: 0,
            len: 8,
            kind: MemKind::Host,
        };
        let a = t.insert(key(1)).unwrap();
        assert!(t.remove(a.as_raw()).is_some());
        assert!(t.remove(a.as_raw()).is_none(), "released twice");
        let b = t.insert(key(1)).unwrap();
        assert_ne!(a, b, "same slot, new generation");
        assert!(t.get(a.as_raw(), 1).is_none(), "the old id is stale");
        assert!(t.get(b.as_raw(), 1).is_some());
        for _ in 0..10_000 {
            let id = t.insert(key(2)).unwrap();
            t.remove(id.as_raw()).unwrap();
        }
        assert_eq!((t.len(), t.slots.len()), (1, 2), "the table does not grow");
        t.insert(key(2)).unwrap();
        assert_eq!(t.remove_all(Some(1)).len(), 1);
        assert_eq!(t.remove_all(None).len(), 1);
        assert_eq!(t.len(), 0);
    }
}
