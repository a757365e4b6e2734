//! The shared-memory layout: index lines and the region header.
//!
//! A region is laid out as follows (offsets in bytes; `S` and `C` are the SQ
//! and CQ entry counts). Every offset is a pure function of `S` and `C`, so a
//! process that attaches recomputes them and refuses a header that disagrees.
//!
//! | offset              | size     | what                                   |
//! |---------------------|----------|----------------------------------------|
//! | 0                   | 128      | [`RegionHeader`] (80 bytes, padded)    |
//! | 128                 | 128      | SQ [`ProducerLine`] (application)      |
//! | 256                 | 128      | SQ [`ConsumerLine`] (engine)           |
//! | 384                 | 128      | CQ [`ProducerLine`] (engine)           |
//! | 512                 | 128      | CQ [`ConsumerLine`] (application)      |
//! | 640                 | 64 × S   | SQ entries ([`Sqe`](crate::Sqe))       |
//! | 640 + 64 × S        | 16 × C   | CQ entries ([`Cqe`](crate::Cqe))       |
//!
//! The total is rounded up to a whole page.
//!
//! Each index line holds one side's index and that side's flags word:
//!
//! | line                 | flags                                    |
//! |----------------------|------------------------------------------|
//! | [`ProducerLine`]     | [`OVERFLOW`](ProducerLine::OVERFLOW) (bit 0), [`FAILED`](ProducerLine::FAILED) (bit 1) |
//! | [`ConsumerLine`]     | [`NEED_WAKEUP`](ConsumerLine::NEED_WAKEUP) (bit 0), [`FAILED`](ConsumerLine::FAILED) (bit 1) |
//!
//! `FAILED` is sticky and set only by the word's owner (see the crate docs,
//! "Giving a ring up"). No other bits are defined.

use crate::sync::AtomicU32;
#[cfg(not(loom))]
use static_assertions::{assert_eq_size, const_assert_eq};

/// The cache line(s) written by a ring's producer. 128 bytes: two 64-byte
/// lines, because adjacent-line prefetch on x86_64 pairs them.
#[derive(Debug)]
#[repr(C, align(128))]
pub struct ProducerLine {
    /// Free-running count of entries published. Written only by the
    /// producer (Release, once per batch); read by the consumer (Acquire).
    /// Any value may be found here in shared memory: readers validate it.
    pub(crate) tail: AtomicU32,
    /// Producer-owned flags ([`ProducerLine::OVERFLOW`],
    /// [`ProducerLine::FAILED`]). Written only by the producer.
    pub(crate) flags: AtomicU32,
    /// The rest of the line: see [`Reserved`].
    reserved: Reserved,
}

/// The cache line(s) written by a ring's consumer.
#[derive(Debug)]
#[repr(C, align(128))]
pub struct ConsumerLine {
    /// Free-running count of entries consumed. Written only by the consumer
    /// (Release); read by the producer (Acquire) when its cache says full.
    pub(crate) head: AtomicU32,
    /// Consumer-owned flags ([`ConsumerLine::NEED_WAKEUP`],
    /// [`ConsumerLine::FAILED`]). Written only by the consumer.
    pub(crate) flags: AtomicU32,
    /// The rest of the line: see [`Reserved`].
    reserved: Reserved,
}

/// The 120 bytes of an index line after its two words: reserved (zero in a
/// new region, never read or written by this crate). Atomics rather than
/// padding, so that every byte a `&ProducerLine` or `&ConsumerLine` spans
/// is interior-mutable: the lines are memory that the other side (another
/// process, C code) may write at any time, and a shared reference must not
/// promise that any byte it spans stays unchanged (padding would be such a
/// byte). Left out under loom, which models no layout.
#[repr(C)]
pub(crate) struct Reserved(#[cfg(not(loom))] [AtomicU32; 30]);

impl Reserved {
    #[cfg(not(loom))]
    const fn new() -> Self {
        Reserved([const { AtomicU32::new(0) }; 30])
    }

    #[cfg(loom)]
    fn new() -> Self {
        Reserved()
    }
}

impl core::fmt::Debug for Reserved {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("Reserved")
    }
}

impl ProducerLine {
    /// In a CQ: the engine holds completions it could not post because the
    /// CQ was full; it takes no new SQEs until the application makes room.
    pub const OVERFLOW: u32 = 1 << 0;
    /// The producer gave the ring up (it found the ring memory corrupt): it
    /// publishes nothing more. Set once (Release) by the producer, never
    /// cleared; the consumer reads it when the ring is empty (crate docs,
    /// "Giving a ring up").
    pub const FAILED: u32 = 1 << 1;

    /// A line with every index and flag zero.
    pub(crate) fn new() -> Self {
        Self {
            tail: AtomicU32::new(0),
            flags: AtomicU32::new(0),
            reserved: Reserved::new(),
        }
    }
}

impl ConsumerLine {
    /// The consumer is asleep, or about to be: the producer must ring the
    /// doorbell after publishing.
    pub const NEED_WAKEUP: u32 = 1 << 0;
    /// The consumer gave the ring up (it found the ring memory corrupt): it
    /// consumes nothing more. Set once (Release) by the consumer, never
    /// cleared; the producer reads it when its cached view says full (crate
    /// docs, "Giving a ring up").
    pub const FAILED: u32 = 1 << 1;

    /// A line with every index and flag zero.
    pub(crate) fn new() -> Self {
        Self {
            head: AtomicU32::new(0),
            flags: AtomicU32::new(0),
            reserved: Reserved::new(),
        }
    }
}

#[cfg(not(loom))]
const _: () = {
    assert_eq_size!(ProducerLine, [u8; 128]);
    assert_eq_size!(ConsumerLine, [u8; 128]);
    const_assert_eq!(core::mem::align_of::<ProducerLine>(), 128);
    const_assert_eq!(core::mem::offset_of!(ProducerLine, tail), 0);
    const_assert_eq!(core::mem::offset_of!(ProducerLine, flags), 4);
    const_assert_eq!(core::mem::offset_of!(ConsumerLine, head), 0);
    const_assert_eq!(core::mem::offset_of!(ConsumerLine, flags), 4);
    const_assert_eq!(core::mem::offset_of!(ProducerLine, reserved), 8);
    const_assert_eq!(core::mem::offset_of!(ConsumerLine, reserved), 8);
};

/// Where one ring lives inside a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct RingOffsets {
    /// Number of entries; a power of two in `1..=MAX_ENTRIES`.
    pub entries: u32,
    /// Size of one entry in bytes (64 for the SQ, 16 for the CQ).
    pub entry_size: u32,
    /// Offset of the [`ProducerLine`].
    pub producer: u32,
    /// Offset of the [`ConsumerLine`].
    pub consumer: u32,
    /// Offset of the entry array.
    pub array: u32,
    /// Reserved; zero.
    pub reserved: u32,
}

/// The first bytes of a region. Written once by the creator before the
/// region is shared; every attacher copies it and validates the copy.
#[derive(Debug)]
#[repr(C)]
pub struct RegionHeader {
    /// [`RegionHeader::MAGIC`].
    pub magic: u64,
    /// [`RegionHeader::ABI_VERSION`].
    pub abi_version: u32,
    /// `size_of::<RegionHeader>()`.
    pub header_size: u32,
    /// Bytes the region spans (a multiple of the page size).
    pub region_size: u64,
    /// The submission queue.
    pub sq: RingOffsets,
    /// The completion queue.
    pub cq: RingOffsets,
    /// Which sides have been taken (bit 0: application, bit 1: engine), so
    /// that no two processes act as the producer of one ring.
    pub claims: AtomicU32,
    /// Reserved; zero.
    pub reserved: u32,
}

#[cfg(not(loom))]
const _: () = {
    assert_eq_size!(RingOffsets, [u8; 24]);
    assert_eq_size!(RegionHeader, [u8; 80]);
    const_assert_eq!(core::mem::offset_of!(RingOffsets, entries), 0);
    const_assert_eq!(core::mem::offset_of!(RingOffsets, entry_size), 4);
    const_assert_eq!(core::mem::offset_of!(RingOffsets, producer), 8);
    const_assert_eq!(core::mem::offset_of!(RingOffsets, consumer), 12);
    const_assert_eq!(core::mem::offset_of!(RingOffsets, array), 16);
    const_assert_eq!(core::mem::offset_of!(RingOffsets, reserved), 20);
    const_assert_eq!(core::mem::offset_of!(RegionHeader, magic), 0);
    const_assert_eq!(core::mem::offset_of!(RegionHeader, abi_version), 8);
    const_assert_eq!(core::mem::offset_of!(RegionHeader, header_size), 12);
    const_assert_eq!(core::mem::offset_of!(RegionHeader, region_size), 16);
    const_assert_eq!(core::mem::offset_of!(RegionHeader, sq), 24);
    const_assert_eq!(core::mem::offset_of!(RegionHeader, cq), 48);
    const_assert_eq!(core::mem::offset_of!(RegionHeader, claims), 72);
    const_assert_eq!(core::mem::offset_of!(RegionHeader, reserved), 76);
};

impl RegionHeader {
    /// `"RFRING\0\0"` read as a little-endian `u64`.
    pub const MAGIC: u64 = u64::from_le_bytes(*b"RFRING\0\0");
    /// Bumped on any incompatible change of the layout or the entries.
    pub const ABI_VERSION: u32 = 1;
    /// Claim bit of the application side (SQ producer, CQ consumer).
    pub const CLAIM_APP: u32 = 1 << 0;
    /// Claim bit of the engine side (SQ consumer, CQ producer).
    pub const CLAIM_ENGINE: u32 = 1 << 1;
}

/// The most entries one ring may have.
pub const MAX_ENTRIES: u32 = 1 << 16;

/// Offset of the first index line (the header is padded to 128 bytes).
const LINES_OFFSET: u32 = 128;
const LINE: u32 = 128;
const PAGE: u64 = 4096;

/// The canonical layout for a pair of entry counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// The submission queue's place.
    pub sq: RingOffsets,
    /// The completion queue's place.
    pub cq: RingOffsets,
    /// Total bytes, a multiple of the page size.
    pub size: u64,
}

/// Entry counts that no layout can be made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadEntries {
    /// The SQ entry count asked for.
    pub sq: u32,
    /// The CQ entry count asked for.
    pub cq: u32,
}

impl Layout {
    /// The layout for `sq` SQ entries and `cq` CQ entries.
    ///
    /// # Errors
    /// [`BadEntries`] unless both are powers of two in `1..=MAX_ENTRIES`.
    pub const fn new(sq: u32, cq: u32) -> Result<Layout, BadEntries> {
        if !valid_entries(sq) || !valid_entries(cq) {
            return Err(BadEntries { sq, cq });
        }
        const SQE: u32 = 64;
        const CQE: u32 = 16;
        let sq_array = LINES_OFFSET + 4 * LINE;
        // Cannot overflow: MAX_ENTRIES * 64 + MAX_ENTRIES * 16 + 640 < 2^32.
        let cq_array = sq_array + sq * SQE;
        let end = cq_array as u64 + cq as u64 * CQE as u64;
        let size = end.div_ceil(PAGE) * PAGE;
        Ok(Layout {
            sq: RingOffsets {
                entries: sq,
                entry_size: SQE,
                producer: LINES_OFFSET,
                consumer: LINES_OFFSET + LINE,
                array: sq_array,
                reserved: 0,
            },
            cq: RingOffsets {
                entries: cq,
                entry_size: CQE,
                producer: LINES_OFFSET + 2 * LINE,
                consumer: LINES_OFFSET + 3 * LINE,
                array: cq_array,
                reserved: 0,
            },
            size,
        })
    }
}

const fn valid_entries(n: u32) -> bool {
    n.is_power_of_two() && n <= MAX_ENTRIES
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_canonical_and_aligned() {
        let l = Layout::new(128, 256).unwrap();
        assert_eq!(
            (l.sq.producer, l.sq.consumer, l.cq.producer, l.cq.consumer),
            (128, 256, 384, 512)
        );
        assert_eq!(l.sq.array, 640);
        assert_eq!(l.cq.array, 640 + 128 * 64);
        assert_eq!(l.size, 4096 * 4, "640 + 8192 + 4096 bytes, rounded up");
        assert_eq!(l.sq.array % 64, 0);
        assert_eq!(l.cq.array % 16, 0);
        let big = Layout::new(MAX_ENTRIES, MAX_ENTRIES).unwrap();
        assert!(big.size >= 640 + 80 * MAX_ENTRIES as u64);
        assert_eq!(big.size % 4096, 0);
    }

    #[test]
    fn bad_entry_counts_are_refused() {
        for (sq, cq) in [
            (0, 8),
            (8, 0),
            (3, 8),
            (8, 12),
            (MAX_ENTRIES * 2, 8),
            (u32::MAX, 8),
        ] {
            assert_eq!(Layout::new(sq, cq), Err(BadEntries { sq, cq }));
        }
        assert!(Layout::new(1, 1).is_ok());
    }

    #[test]
    fn header_fits_before_the_lines() {
        assert!(core::mem::size_of::<RegionHeader>() as u32 <= LINES_OFFSET);
        assert_eq!(RegionHeader::MAGIC.to_le_bytes(), *b"RFRING\0\0");
    }
}
