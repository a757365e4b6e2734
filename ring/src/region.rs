//! Ring regions: one SQ and one CQ in a block of memory that another process
//! can map.

use crate::consumer::Consumer;
use crate::cqe::Cqe;
use crate::entry::Entry;
use crate::error::Corrupt;
use crate::layout::{
    BadEntries, ConsumerLine, Layout, MAX_ENTRIES, ProducerLine, RegionHeader, RingOffsets,
};
use crate::producer::Producer;
use crate::raw::RawRing;
use crate::sqe::Sqe;
use crate::sync::{AtomicU32, AtomicU64, Cells, Ordering};
use core::ptr::{NonNull, addr_of, addr_of_mut};
use memmap2::{MmapOptions, MmapRaw};
use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

/// The application's half of a region: it submits SQEs and reaps CQEs.
pub type AppSide = (Producer<Sqe>, Consumer<Cqe>);
/// The engine's half of a region: it takes SQEs and posts CQEs.
pub type EngineSide = (Consumer<Sqe>, Producer<Cqe>);

/// Why a region could not be created or attached.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegionError {
    /// Entry counts must be powers of two in `1..=65536`.
    #[error("ring entry counts must be powers of two in 1..={MAX_ENTRIES} (sq {sq}, cq {cq})")]
    BadEntries {
        /// The SQ count asked for or found.
        sq: u32,
        /// The CQ count asked for or found.
        cq: u32,
    },
    /// A system call failed.
    #[error("{op} failed")]
    Os {
        /// What was being done.
        op: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The descriptor is smaller than a header, or than its header claims.
    #[error("ring region is {actual} bytes, needs {needed}")]
    TooSmall {
        /// Bytes available.
        actual: u64,
        /// Bytes required.
        needed: u64,
    },
    /// The region is larger than any valid layout.
    #[error("ring region is {0} bytes, larger than any valid ring")]
    TooLarge(u64),
    /// The descriptor is not sealed against shrinking, so it could be
    /// truncated under the mapping (and fault on access).
    #[error("ring memfd is not sealed against shrinking")]
    NotSealed,
    /// The header does not start with the magic number.
    #[error("not a ringfence ring region (magic {0:#018x})")]
    BadMagic(u64),
    /// The header is from an incompatible ABI version.
    #[error("ring ABI version {found}, this build speaks {expected}")]
    AbiVersion {
        /// Version in the header.
        found: u32,
        /// Version of this build.
        expected: u32,
    },
    /// A header field disagrees with the canonical layout.
    #[error("ring header field {field} is {found}, expected {expected}")]
    BadHeader {
        /// Which field.
        field: &'static str,
        /// Value found.
        found: u64,
        /// Value the layout requires.
        expected: u64,
    },
    /// That side of the region was taken already, here or in another process.
    #[error("the {0} side of this ring region is already taken")]
    SideTaken(&'static str),
    /// The shared indices are corrupt.
    #[error(transparent)]
    Corrupt(#[from] Corrupt),
}

impl From<BadEntries> for RegionError {
    fn from(b: BadEntries) -> Self {
        RegionError::BadEntries { sq: b.sq, cq: b.cq }
    }
}

fn os(op: &'static str) -> impl FnOnce(nix::Error) -> RegionError {
    move |e| RegionError::Os {
        op,
        source: e.into(),
    }
}

/// The memory a region lives in: a mapping, and the memfd behind it.
#[derive(Debug)]
struct Mapping {
    map: MmapRaw,
    fd: Option<OwnedFd>,
}

/// Builds a [`Region`].
#[derive(Debug, Clone)]
pub struct RegionBuilder {
    sq_entries: u32,
    cq_entries: u32,
}

impl RegionBuilder {
    /// SQ entries (default 256); a power of two up to 65536.
    pub fn sq_entries(&mut self, entries: u32) -> &mut Self {
        self.sq_entries = entries;
        self
    }

    /// CQ entries (default: twice the SQ's, as io_uring); a power of two up
    /// to 65536.
    pub fn cq_entries(&mut self, entries: u32) -> &mut Self {
        self.cq_entries = entries;
        self
    }

    fn layout(&self) -> Result<Layout, RegionError> {
        let cq = if self.cq_entries == 0 {
            self.sq_entries.saturating_mul(2)
        } else {
            self.cq_entries
        };
        Ok(Layout::new(self.sq_entries, cq)?)
    }

    /// A region in private anonymous memory, for rings used by threads of
    /// this process.
    ///
    /// # Errors
    /// [`RegionError::BadEntries`], or the mapping failed.
    pub fn build_anonymous(&self) -> Result<Region, RegionError> {
        let layout = self.layout()?;
        let map = MmapOptions::new()
            .len(layout.size as usize)
            .map_anon()
            .map_err(|source| RegionError::Os {
                op: "mmap(anonymous)",
                source,
            })?;
        Ok(Region::init(
            Mapping {
                map: map.into(),
                fd: None,
            },
            layout,
        ))
    }

    /// A region in a new memfd, sealed against resizing, that another
    /// process can map after receiving the descriptor (see
    /// [`Region::as_fd`] and [`Region::attach`]).
    ///
    /// # Errors
    /// [`RegionError::BadEntries`], or a system call failed.
    pub fn build_memfd(&self, name: &str) -> Result<Region, RegionError> {
        let layout = self.layout()?;
        let fd = memfd_create(name, MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING)
            .map_err(os("memfd_create"))?;
        nix::unistd::ftruncate(&fd, layout.size as i64).map_err(os("ftruncate"))?;
        let seals = SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL;
        fcntl(&fd, FcntlArg::F_ADD_SEALS(seals)).map_err(os("fcntl(F_ADD_SEALS)"))?;
        let map = MmapOptions::new()
            .len(layout.size as usize)
            .map_raw(&fd)
            .map_err(|source| RegionError::Os {
                op: "mmap(memfd)",
                source,
            })?;
        Ok(Region::init(Mapping { map, fd: Some(fd) }, layout))
    }
}

/// One SQ and one CQ with their header, in memory that can be shared.
///
/// The creating process writes the header; any process that receives the
/// memfd [`attach`](Region::attach)es, which validates the header. One
/// process takes the [`app_side`](Region::app_side) (SQ producer, CQ
/// consumer), one the [`engine_side`](Region::engine_side) (SQ consumer, CQ
/// producer); each side can be taken once in the region's life, across all
/// processes.
///
/// # Examples
/// ```
/// use ringfence_ring::{Cqe, Region, Sqe};
/// let mut region = Region::builder().sq_entries(64).build_anonymous()?;
/// let (mut sq, mut cq) = region.app_side()?;
/// let (mut engine_sq, mut engine_cq) = region.engine_side()?;
/// sq.push(Sqe::nop().with_user_data(1)).unwrap();
/// sq.submit();
/// let sqe = engine_sq.pop()?.unwrap();
/// engine_cq.push(Cqe::new(sqe.user_data, 0, 0)).unwrap();
/// engine_cq.submit();
/// assert_eq!(cq.pop()?, Some(Cqe::new(1, 0, 0)));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Region {
    mapping: Arc<Mapping>,
    layout: Layout,
}

impl Region {
    /// A builder with 256 SQ and 512 CQ entries.
    pub fn builder() -> RegionBuilder {
        RegionBuilder {
            sq_entries: 256,
            cq_entries: 0,
        }
    }

    fn base(&self) -> NonNull<u8> {
        NonNull::new(self.mapping.map.as_mut_ptr()).expect("mappings are never at address 0")
    }

    /// The header's one shared word. No reference to the whole header is
    /// ever made: its plain fields are in memory another process may
    /// write, so they are only written before sharing (`init`) and read as
    /// one volatile copy (`attach`).
    fn claims(&self) -> &AtomicU32 {
        let h = self.base().cast::<RegionHeader>().as_ptr();
        // SAFETY: the mapping is at least one page, page-aligned, and lives
        // as long as `self` (which bounds the borrow), so `claims` is in
        // bounds and 4-aligned; it is an atomic, accessed atomically by
        // every process.
        unsafe { &*addr_of!((*h).claims) }
    }

    /// Writes the header of a new, zero-filled region.
    fn init(mapping: Mapping, layout: Layout) -> Region {
        let region = Region {
            mapping: Arc::new(mapping),
            layout,
        };
        let h = region.base().cast::<RegionHeader>().as_ptr();
        // SAFETY: the region is new, zero-filled, not yet shared with anyone,
        // and large enough for the header (one page at least).
        unsafe {
            addr_of_mut!((*h).magic).write(RegionHeader::MAGIC);
            addr_of_mut!((*h).abi_version).write(RegionHeader::ABI_VERSION);
            addr_of_mut!((*h).header_size).write(size_of::<RegionHeader>() as u32);
            addr_of_mut!((*h).region_size).write(layout.size);
            addr_of_mut!((*h).sq).write(layout.sq);
            addr_of_mut!((*h).cq).write(layout.cq);
        }
        region
    }

    /// Maps a region created by another process from its memfd and checks
    /// its header: magic, ABI version, sizes, and that every offset is the
    /// canonical one for its entry counts.
    ///
    /// The header is copied once and only the copy is trusted afterwards;
    /// the indices are validated on every use.
    ///
    /// # Errors
    /// [`RegionError::NotSealed`] if the memfd could shrink under the
    /// mapping; [`RegionError::TooSmall`], [`RegionError::TooLarge`],
    /// [`RegionError::BadMagic`], [`RegionError::AbiVersion`],
    /// [`RegionError::BadEntries`] or [`RegionError::BadHeader`] for a header
    /// that does not describe a valid region; [`RegionError::Os`] if a
    /// system call failed.
    pub fn attach(fd: OwnedFd) -> Result<Region, RegionError> {
        let seals = fcntl(&fd, FcntlArg::F_GET_SEALS).map_err(os("fcntl(F_GET_SEALS)"))?;
        if seals & SealFlag::F_SEAL_SHRINK.bits() == 0 {
            return Err(RegionError::NotSealed);
        }
        let size = nix::sys::stat::fstat(&fd).map_err(os("fstat"))?.st_size as u64;
        let largest = Layout::new(MAX_ENTRIES, MAX_ENTRIES)
            .map(|l| l.size)
            .unwrap_or(u64::MAX);
        if size < 4096 {
            return Err(RegionError::TooSmall {
                actual: size,
                needed: 4096,
            });
        }
        if size > largest {
            return Err(RegionError::TooLarge(size));
        }
        let map = MmapOptions::new()
            .len(size as usize)
            .map_raw(&fd)
            .map_err(|source| RegionError::Os {
                op: "mmap(memfd)",
                source,
            })?;
        let mapping = Mapping { map, fd: Some(fd) };
        let snapshot = HeaderSnapshot::read(&mapping);
        let layout = snapshot.validate(size)?;
        Ok(Region {
            mapping: Arc::new(mapping),
            layout,
        })
    }

    /// The memfd to pass to another process, `None` for an anonymous region.
    pub fn as_fd(&self) -> Option<BorrowedFd<'_>> {
        self.mapping.fd.as_ref().map(|fd| fd.as_fd())
    }

    /// SQ entries.
    pub fn sq_entries(&self) -> u32 {
        self.layout.sq.entries
    }

    /// CQ entries.
    pub fn cq_entries(&self) -> u32 {
        self.layout.cq.entries
    }

    /// Bytes the region spans.
    pub fn size(&self) -> u64 {
        self.layout.size
    }

    fn claim(&mut self, bit: u32, side: &'static str) -> Result<(), RegionError> {
        // AcqRel: the claim is a one-shot lock on the side; the only shared
        // word in the header that is not written once before sharing.
        let before = self.claims().fetch_or(bit, Ordering::AcqRel);
        if before & bit != 0 {
            Err(RegionError::SideTaken(side))
        } else {
            Ok(())
        }
    }

    fn ring<T: Entry>(&self, offsets: RingOffsets) -> RawRing<T> {
        let base = self.base();
        // SAFETY: (all three) `offsets` is the canonical layout, which
        // `Layout::new` keeps inside `layout.size` bytes, and the mapping
        // is at least that long (`init` maps exactly that; `attach` checks
        // `size >= region_size`). Offsets are multiples of the lines' and
        // entries' alignment, and the base is page-aligned.
        let (producer, consumer, slots) = unsafe {
            (
                base.add(offsets.producer as usize).cast::<ProducerLine>(),
                base.add(offsets.consumer as usize).cast::<ConsumerLine>(),
                base.add(offsets.array as usize).cast::<T>(),
            )
        };
        debug_assert_eq!(offsets.entry_size as usize, size_of::<T>());
        // SAFETY: `slots` points to `entries` slots inside the mapping, which
        // `owner` keeps alive.
        let cells = unsafe { Cells::from_raw(slots, offsets.entries) };
        let owner: Arc<dyn core::any::Any + Send + Sync> = self.mapping.clone();
        // SAFETY: as above; `entries` is a power of two (validated layout).
        unsafe { RawRing::new(producer, consumer, cells, offsets.entries, owner) }
    }

    /// Reads both shared indices of a ring and checks them.
    fn indices<T>(ring: &RawRing<T>) -> Result<(u32, u32), Corrupt> {
        // Acquire (both): the side that wrote them last may be another
        // process that ran before us; pairs with its Release stores.
        let head = ring.consumer_line().head.load(Ordering::Acquire);
        let tail = ring.producer_line().tail.load(Ordering::Acquire);
        if tail.wrapping_sub(head) > ring.capacity() {
            return Err(Corrupt {
                head,
                tail,
                capacity: ring.capacity(),
            });
        }
        Ok((head, tail))
    }

    /// Takes the application side: the SQ producer and the CQ consumer.
    ///
    /// # Errors
    /// [`RegionError::SideTaken`] if this or another process took it;
    /// [`RegionError::Corrupt`] if the shared indices are inconsistent.
    pub fn app_side(&mut self) -> Result<AppSide, RegionError> {
        let sq = self.ring::<Sqe>(self.layout.sq);
        let cq = self.ring::<Cqe>(self.layout.cq);
        let (sq_head, sq_tail) = Self::indices(&sq)?;
        let (cq_head, _) = Self::indices(&cq)?;
        self.claim(RegionHeader::CLAIM_APP, "application")?;
        Ok((
            Producer::new(sq, sq_tail, sq_head),
            Consumer::new(cq, cq_head),
        ))
    }

    /// Takes the engine side: the SQ consumer and the CQ producer.
    ///
    /// # Errors
    /// As [`app_side`](Region::app_side).
    pub fn engine_side(&mut self) -> Result<EngineSide, RegionError> {
        let sq = self.ring::<Sqe>(self.layout.sq);
        let cq = self.ring::<Cqe>(self.layout.cq);
        let (sq_head, _) = Self::indices(&sq)?;
        let (cq_head, cq_tail) = Self::indices(&cq)?;
        self.claim(RegionHeader::CLAIM_ENGINE, "engine")?;
        Ok((
            Consumer::new(sq, sq_head),
            Producer::new(cq, cq_tail, cq_head),
        ))
    }
}

/// A private copy of the plain header fields.
#[derive(Debug, Clone, Copy)]
struct HeaderSnapshot {
    magic: u64,
    abi_version: u32,
    header_size: u32,
    region_size: u64,
    sq: RingOffsets,
    cq: RingOffsets,
}

impl HeaderSnapshot {
    /// Copies the header out, each field with one Relaxed atomic load:
    /// another process may write the header meanwhile (a racing write is
    /// then no data race here, and no field can tear), and only the copy is
    /// looked at. Every field is an integer, valid for any bit pattern.
    fn read(mapping: &Mapping) -> HeaderSnapshot {
        use core::mem::offset_of;
        let base = mapping.map.as_ptr();
        let u32_at = |offset: usize| {
            // SAFETY: the mapping is at least 4096 bytes (checked by
            // `attach`), page-aligned and writable, so every header field is
            // in bounds and aligned; the `&AtomicU32` lives for one load.
            unsafe { AtomicU32::from_ptr(base.wrapping_add(offset).cast::<u32>().cast_mut()) }
                .load(Ordering::Relaxed)
        };
        let u64_at = |offset: usize| {
            // SAFETY: as for `u32_at`, for an 8-aligned 8-byte field.
            unsafe { AtomicU64::from_ptr(base.wrapping_add(offset).cast::<u64>().cast_mut()) }
                .load(Ordering::Relaxed)
        };
        let ring = |at: usize| RingOffsets {
            entries: u32_at(at + offset_of!(RingOffsets, entries)),
            entry_size: u32_at(at + offset_of!(RingOffsets, entry_size)),
            producer: u32_at(at + offset_of!(RingOffsets, producer)),
            consumer: u32_at(at + offset_of!(RingOffsets, consumer)),
            array: u32_at(at + offset_of!(RingOffsets, array)),
            reserved: u32_at(at + offset_of!(RingOffsets, reserved)),
        };
        HeaderSnapshot {
            magic: u64_at(offset_of!(RegionHeader, magic)),
            abi_version: u32_at(offset_of!(RegionHeader, abi_version)),
            header_size: u32_at(offset_of!(RegionHeader, header_size)),
            region_size: u64_at(offset_of!(RegionHeader, region_size)),
            sq: ring(offset_of!(RegionHeader, sq)),
            cq: ring(offset_of!(RegionHeader, cq)),
        }
    }

    fn validate(&self, file_size: u64) -> Result<Layout, RegionError> {
        if self.magic != RegionHeader::MAGIC {
            return Err(RegionError::BadMagic(self.magic));
        }
        if self.abi_version != RegionHeader::ABI_VERSION {
            return Err(RegionError::AbiVersion {
                found: self.abi_version,
                expected: RegionHeader::ABI_VERSION,
            });
        }
        let field = |field, found: u64, expected: u64| {
            if found == expected {
                Ok(())
            } else {
                Err(RegionError::BadHeader {
                    field,
                    found,
                    expected,
                })
            }
        };
        field(
            "header_size",
            self.header_size.into(),
            size_of::<RegionHeader>() as u64,
        )?;
        let layout = Layout::new(self.sq.entries, self.cq.entries)?;
        let names = |ring: &str| {
            if ring == "sq" {
                [
                    "sq.entry_size",
                    "sq.producer",
                    "sq.consumer",
                    "sq.array",
                    "sq.reserved",
                ]
            } else {
                [
                    "cq.entry_size",
                    "cq.producer",
                    "cq.consumer",
                    "cq.array",
                    "cq.reserved",
                ]
            }
        };
        for (ring, found, expected) in [("sq", self.sq, layout.sq), ("cq", self.cq, layout.cq)] {
            let found = [
                found.entry_size,
                found.producer,
                found.consumer,
                found.array,
                found.reserved,
            ];
            let expected = [
                expected.entry_size,
                expected.producer,
                expected.consumer,
                expected.array,
                expected.reserved,
            ];
            for ((name, a), b) in names(ring).into_iter().zip(found).zip(expected) {
                field(name, a.into(), b.into())?;
            }
        }
        field("region_size", self.region_size, layout.size)?;
        if file_size < layout.size {
            return Err(RegionError::TooSmall {
                actual: file_size,
                needed: layout.size,
            });
        }
        Ok(layout)
    }
}

#[cfg(test)]
mod tests;
