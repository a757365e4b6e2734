//! The connection table: one slot per connection, a generation per slot
//! (a completion names the slot and the generation, so that one of a
//! connection that is gone is not taken for its successor's), and the
//! free slots.

use super::conn::Conn;

/// Every connection, by slot.
#[derive(Debug, Default)]
pub(super) struct Conns {
    slots: Vec<Option<Box<Conn>>>,
    /// The generation of each slot (kept when it is freed).
    generations: Vec<u32>,
    /// Slots whose connection was freed, to reuse.
    free: Vec<u32>,
}

impl Conns {
    /// Puts the connection `make` builds for its slot and generation in a
    /// free slot; returns the slot.
    pub(super) fn insert(&mut self, make: impl FnOnce(u32, u32) -> Conn) -> u32 {
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.slots.push(None);
                self.generations.push(0);
                self.slots.len() as u32 - 1
            }
        };
        let generation = self.generations[slot as usize].wrapping_add(1);
        self.generations[slot as usize] = generation;
        self.slots[slot as usize] = Some(Box::new(make(slot, generation)));
        slot
    }

    /// The connection in `slot`, if there is one.
    pub(super) fn live(&mut self, slot: u32) -> Option<&mut Conn> {
        self.slots.get_mut(slot as usize)?.as_deref_mut()
    }

    /// The connection in `slot`, if there is one, to look at.
    pub(super) fn get(&self, slot: u32) -> Option<&Conn> {
        self.slots.get(slot as usize)?.as_deref()
    }

    /// The connection in `slot` if its generation is `generation`.
    pub(super) fn at(&mut self, slot: u32, generation: u32) -> Option<&mut Conn> {
        self.live(slot).filter(|c| c.generation == generation)
    }

    /// Takes a closing connection out of its slot once nothing in flight
    /// names it (the slot is free again); `None` while something does.
    pub(super) fn take_finished(&mut self, slot: u32) -> Option<Box<Conn>> {
        let finished = self
            .get(slot)
            .is_some_and(|c| c.closing() && c.in_flight == 0);
        if !finished {
            return None;
        }
        let conn = self.slots[slot as usize].take();
        self.free.push(slot);
        conn
    }

    /// Slots, live or free: every slot is below this.
    pub(super) fn slot_count(&self) -> u32 {
        self.slots.len() as u32
    }

    /// Every live connection, by slot, lowest first.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u32, &Conn)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(slot, c)| Some((slot as u32, c.as_deref()?)))
    }

    /// Whether no connection is left.
    pub(super) fn is_empty(&self) -> bool {
        self.slots.iter().all(Option::is_none)
    }

    /// Never frees the connections: the kernel may still read their send
    /// batches or their connect addresses (a teardown that leaks).
    pub(super) fn leak(&mut self) {
        std::mem::forget(std::mem::take(&mut self.slots));
    }
}
