//! The seeded pseudo-random sequence both wrappers draw from: xorshift64,
//! so a seed gives the same shuffles on every run and machine.

/// A xorshift64 sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rng(u64);

impl Rng {
    /// A sequence from `seed`, which must not be zero (zero stays zero).
    pub(crate) const fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// A sequence not seeded yet ([`next_seeded`](Rng::next_seeded)
    /// seeds it at the first draw).
    pub(crate) const fn unseeded() -> Rng {
        Rng(0)
    }

    /// The next number.
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// The next number, seeding the sequence with `seed()` first if it was
    /// not seeded yet.
    pub(crate) fn next_seeded(&mut self, seed: impl FnOnce() -> u64) -> u64 {
        if self.0 == 0 {
            self.0 = seed();
        }
        self.next()
    }

    /// A draw below `n` (not zero): the next number modulo `n`.
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn a_seed_gives_its_sequence() {
        let mut a = Rng::new(0x2545_f491_4f6c_dd1d);
        let mut b = Rng::unseeded();
        let first = a.next();
        assert_eq!(b.next_seeded(|| 0x2545_f491_4f6c_dd1d), first);
        assert_eq!(a.next(), b.next_seeded(|| unreachable!("seeded already")));
        assert!(Rng::new(7).below(3) < 3);
    }
}
