//! Registered windows and remote keys: what a peer's PUT or GET may
//! reach, and the keys unpacked for our endpoints.

use crate::sys::mem::Window;
use crate::wire::KeyBlob;
use ringfence::{
    DriverEp, DriverError, DriverMemKey, DriverRkey, KeyPart, MemDesc, MemKind, Prepared,
    Registered, Unpacked,
};
use ringfence_ring::Status;

use super::*;

impl Tcp {
    pub(super) fn register_window(
        &mut self,
        mem: &MemDesc,
        _prepared: Prepared,
    ) -> Result<Registered, DriverError> {
        if mem.kind != MemKind::Host {
            return Err(err(Status::Unsupported, "tcp registers host memory only"));
        }
        mem.addr
            .checked_add(mem.len)
            .ok_or_else(|| err(Status::InvalidArgument, "range wraps"))?;
        let reg = Window::new(mem.addr, mem.len, mem.secret);
        // An id whose old window a connection may still reach is not
        // reused: its PUTs and GETs must not be taken for the new one's.
        let quiescing = &self.quiescing;
        let free = |(id, r): (usize, &Option<Window>)| {
            r.is_none() && !quiescing.iter().any(|q| q.key as usize == id)
        };
        let id = match self.regs.iter().enumerate().position(free) {
            Some(id) => id,
            None => {
                self.regs.push(None);
                self.regs.len() - 1
            }
        };
        self.regs[id] = Some(reg);
        Ok(Registered::Shared(DriverMemKey(id as u64)))
    }

    pub(super) fn deregister_window(&mut self, key: DriverMemKey) {
        if let Some(slot) = self.regs.get_mut(key.0 as usize) {
            *slot = None;
        }
    }

    pub(super) fn pack_key(&self, key: DriverMemKey) -> Result<Vec<u8>, DriverError> {
        let reg = self
            .regs
            .get(key.0 as usize)
            .and_then(Option::as_ref)
            .ok_or_else(|| err(Status::InvalidMemHandle, "not registered"))?;
        Ok(KeyBlob {
            instance: self.address.instance,
            key: key.0 as u32,
            secret: reg.secret(),
            base: reg.base(),
            len: reg.len(),
        }
        .encode())
    }

    pub(super) fn unpack_key(
        &mut self,
        ep: DriverEp,
        part: &KeyPart<'_>,
        _prepared: Prepared,
    ) -> Result<Unpacked, DriverError> {
        let key = KeyBlob::decode(part.blob)
            .ok_or_else(|| err(Status::InvalidArgument, "malformed tcp key"))?;
        let endpoint = self
            .eps
            .get(ep.0)
            .ok_or_else(|| err(Status::InvalidEndpoint, "not connected"))?;
        if key.instance != endpoint.peer.instance {
            return Err(err(Status::InvalidRkey, "the key belongs to another peer"));
        }
        let entry = Rkey {
            ep: ep.0,
            key: key.key,
            secret: key.secret,
        };
        // A released entry is reused (control path: a scan is fine).
        if let Some(i) = self.rkeys.iter().position(|k| k.ep == RELEASED) {
            self.rkeys[i] = entry;
            return Ok(Unpacked::Key(DriverRkey(i as u32)));
        }
        self.rkeys.push(entry);
        Ok(Unpacked::Key(DriverRkey(self.rkeys.len() as u32 - 1)))
    }

    pub(super) fn release_key(&mut self, ep: DriverEp, rkey: DriverRkey) {
        if let Some(k) = self.rkeys.get_mut(rkey.0 as usize).filter(|k| k.ep == ep.0) {
            k.ep = RELEASED;
        }
    }
}
