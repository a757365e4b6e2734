//! `ring_attach`: arbitrary region headers and indices given to
//! `Region::attach`, then entries produced and consumed on both sides.
//!
//! Input: byte 0, flags: bit 0: a raw memfd (its whole content from the
//! input, `(byte 1 % 4) + 1` pages, sealed against shrinking unless bit 1
//! is set); otherwise a canonical region built by `Region::builder` with
//! `1 << (byte 1 % 8)` SQ and `1 << (byte 2 % 9)` CQ entries, patched.
//! Then, for the raw memfd, its content; for the canonical one, patches:
//! `offset: u16`, `n: u8` (at most 16), `n` bytes, until a zero `n`. The
//! rest: one operation per byte on the attached region (see [`Op`]); an
//! index write takes a `u32` after it.
//!
//! Properties: no panic; a memfd too small, unsealed or with a header that
//! is not canonical is refused with an error; an attached region's sizes
//! are sane; a side is taken once; indices corrupted through the memfd are
//! reported as `Corrupt` (never followed out of bounds: the run stays in
//! the mapping); without corruption, entries come out in order, each once.

use super::Cursor;
use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};
use ringfence_ring::{Cqe, MAX_ENTRIES, Region, RegionError, Sqe};
use std::collections::VecDeque;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;

/// The operations on an attached region, one per input byte (mod 8).
#[derive(Debug, Clone, Copy)]
pub enum Op {
    /// Push an SQE (application side).
    PushSqe = 0,
    /// Publish pushed SQEs.
    SubmitSq = 1,
    /// Pop an SQE (engine side).
    PopSqe = 2,
    /// Push a CQE (engine side) and publish it.
    PushCqe = 3,
    /// Pop a CQE (application side).
    PopCqe = 4,
    /// Write a `u32` over one of the four shared indices (next byte mod 4
    /// picks it: SQ tail, SQ head, CQ tail, CQ head), as a peer would.
    Corrupt = 5,
    /// Take the application side again (must fail).
    TakeApp = 6,
    /// Pop a batch of SQEs and push a batch of CQEs.
    Batch = 7,
}

fn raw_memfd(content: &[u8], size: u64, seal: bool) -> OwnedFd {
    let fd = memfd_create(
        "rf-fuzz-ring",
        MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING,
    )
    .expect("memfd_create");
    nix::unistd::ftruncate(&fd, size as i64).expect("ftruncate");
    let file = File::from(fd.try_clone().expect("dup"));
    let n = content.len().min(size as usize);
    file.write_all_at(&content[..n], 0).expect("write");
    if seal {
        fcntl(
            &fd,
            FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW),
        )
        .expect("seal");
    }
    fd
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

pub fn ring_attach(data: &[u8]) {
    let _ = ring_outcome(data);
}

/// How far [`ring_attach`] got with an input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reached {
    /// `Region::attach` refused the memfd.
    Refused,
    /// Attached, but a side could not be taken.
    Attached,
    /// Both sides taken; this many CQEs reached the application.
    Ran(usize),
}

/// Runs [`ring_attach`]'s checks; returns how far the input got.
pub fn ring_outcome(data: &[u8]) -> Reached {
    let mut c = Cursor(data);
    let flags = c.u8();
    let a = c.u8();
    let b = c.u8();
    // Indices and entries the fuzzer wrote are not ours: order is only
    // checked on a region nobody but us wrote.
    let mut corrupted = flags & 1 != 0;
    let (fd, size) = if flags & 1 != 0 {
        let size = (u64::from(a % 4) + 1) * 4096;
        let content = c.take(size as usize);
        (raw_memfd(content, size, flags & 2 == 0), size)
    } else {
        let built = Region::builder()
            .sq_entries(1 << (a % 8))
            .cq_entries(1 << (b % 9))
            .build_memfd("rf-fuzz-ring")
            .expect("a canonical region");
        let fd = built
            .as_fd()
            .expect("a memfd")
            .try_clone_to_owned()
            .expect("dup");
        let file = File::from(fd.try_clone().expect("dup"));
        loop {
            let offset = u64::from(c.u16());
            let n = usize::from(c.u8()).min(16);
            if n == 0 {
                break;
            }
            let bytes = c.take(n);
            if offset + bytes.len() as u64 <= built.size() {
                file.write_all_at(bytes, offset).expect("patch");
                corrupted = true;
            }
        }
        (fd, built.size())
    };
    let mut header = vec![0u8; 80];
    File::from(fd.try_clone().expect("dup"))
        .read_exact_at(&mut header, 0)
        .expect("header");
    let writer = File::from(fd.try_clone().expect("dup"));
    let mut region = match Region::attach(fd) {
        Ok(r) => r,
        Err(e) => {
            let _ = e.to_string();
            if let RegionError::Os { .. } = e {
                panic!("a system call failed on a fuzzed region: {e}");
            }
            return Reached::Refused;
        }
    };
    assert!(region.size() <= size, "a region larger than its memfd");
    for entries in [region.sq_entries(), region.cq_entries()] {
        assert!(
            entries.is_power_of_two() && entries <= MAX_ENTRIES,
            "{entries} entries"
        );
    }
    // The attached header is the canonical one: index offsets as written.
    let sq_producer = u64::from(u32_at(&header, 24 + 8));
    let sq_consumer = u64::from(u32_at(&header, 24 + 12));
    let cq_producer = u64::from(u32_at(&header, 48 + 8));
    let cq_consumer = u64::from(u32_at(&header, 48 + 12));
    // Index words: the tail opens the producer line, the head the consumer's.
    let index_at = [sq_producer, sq_consumer, cq_producer, cq_consumer];
    for at in index_at {
        assert!(at + 4 <= region.size(), "an index outside the region");
    }
    let (mut sq, mut cq) = match region.app_side() {
        Ok(s) => s,
        Err(e) => {
            let _ = e.to_string();
            return Reached::Attached;
        }
    };
    let (mut esq, mut ecq) = match region.engine_side() {
        Ok(s) => s,
        Err(e) => {
            let _ = e.to_string();
            return Reached::Attached;
        }
    };
    let mut next = 0u64;
    let mut submitted: VecDeque<u64> = VecDeque::new();
    let mut pending: VecDeque<u64> = VecDeque::new();
    let mut in_cq: VecDeque<u64> = VecDeque::new();
    let mut reaped = 0;
    for _ in 0..256 {
        if c.0.is_empty() {
            break;
        }
        match c.u8() % 8 {
            0 => {
                if sq.push(Sqe::nop().with_user_data(next)).is_ok() {
                    pending.push_back(next);
                }
                next += 1;
            }
            1 => {
                sq.submit();
                submitted.extend(pending.drain(..));
            }
            2 => match esq.pop() {
                Ok(Some(sqe)) if !corrupted => {
                    assert_eq!(Some(sqe.user_data), submitted.pop_front(), "SQ order");
                    in_cq.push_back(sqe.user_data);
                }
                Ok(None) if !corrupted => assert!(submitted.is_empty(), "a submitted SQE was lost"),
                _ => {}
            },
            3 => {
                if let Some(&ud) = in_cq.front()
                    && ecq.push(Cqe::new(ud, 0, 0)).is_ok()
                {
                    ecq.submit();
                    in_cq.pop_front();
                }
            }
            4 => match cq.pop() {
                Ok(Some(cqe)) if !corrupted => {
                    assert!(cqe.user_data < next, "a CQE nobody produced: {cqe:?}");
                    reaped += 1;
                }
                _ => {}
            },
            5 => {
                let which = usize::from(c.u8() % 4);
                let value = c.u32();
                writer
                    .write_all_at(&value.to_le_bytes(), index_at[which])
                    .expect("index write");
                corrupted = true;
            }
            6 => assert!(
                region.app_side().is_err(),
                "the application side taken twice"
            ),
            _ => {
                let mut out = [Sqe::default(); 8];
                if let Ok(n) = esq.pop_batch(&mut out)
                    && !corrupted
                {
                    for sqe in &out[..n] {
                        assert_eq!(Some(sqe.user_data), submitted.pop_front(), "SQ batch order");
                        in_cq.push_back(sqe.user_data);
                    }
                }
                let _ = esq.ready_published();
                let _ = sq.free();
                let _ = cq.ready();
            }
        }
    }
    Reached::Ran(reaped)
}

fn patch(out: &mut Vec<u8>, offset: u16, bytes: &[u8]) {
    out.extend_from_slice(&offset.to_le_bytes());
    out.push(bytes.len() as u8);
    out.extend_from_slice(bytes);
}

pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let ops = [0u8, 0, 1, 2, 3, 4, 0, 1, 7, 3, 3, 4, 4, 6];
    let canonical = |sq: u8, cq: u8, patches: &[(u16, &[u8])], tail: &[u8]| {
        let mut out = vec![0, sq, cq];
        for (o, b) in patches {
            patch(&mut out, *o, b);
        }
        out.extend_from_slice(&[0, 0, 0]);
        out.extend_from_slice(tail);
        out
    };
    // The header of a canonical 4-SQE, 8-CQE region, for the raw seeds.
    let built = Region::builder()
        .sq_entries(4)
        .cq_entries(8)
        .build_memfd("rf-fuzz-seed")
        .unwrap();
    let mut header = vec![0u8; 80];
    File::from(built.as_fd().unwrap().try_clone_to_owned().unwrap())
        .read_exact_at(&mut header, 0)
        .unwrap();
    let pages = (built.size() / 4096) as u8;
    let raw = |a: u8, flags: u8, content: &[u8]| {
        let mut out = vec![flags, a, 0];
        out.extend_from_slice(content);
        out
    };
    let mut corrupt_tail = ops.to_vec();
    corrupt_tail.extend_from_slice(&[5, 0, 0xff, 0xff, 0xff, 0x7f, 2, 7, 5, 3, 9, 0, 0, 0, 4]);
    vec![
        ("canonical".into(), canonical(2, 3, &[], &ops)),
        ("canonical_one".into(), canonical(0, 0, &[], &ops)),
        (
            "corrupt_indices".into(),
            canonical(2, 3, &[], &corrupt_tail),
        ),
        ("bad_magic".into(), canonical(2, 3, &[(0, b"XX")], &ops)),
        ("bad_version".into(), canonical(2, 3, &[(8, &[2])], &ops)),
        ("bad_entries".into(), canonical(2, 3, &[(24, &[3])], &ops)),
        ("bad_offset".into(), canonical(2, 3, &[(32, &[0x40])], &ops)),
        (
            "big_region_size".into(),
            canonical(2, 3, &[(16, &[0, 0, 0, 1])], &ops),
        ),
        ("claimed".into(), canonical(2, 3, &[(72, &[1])], &ops)),
        (
            "raw_header".into(),
            raw(pages.saturating_sub(1), 1, &header),
        ),
        (
            "raw_unsealed".into(),
            raw(pages.saturating_sub(1), 3, &header),
        ),
        ("raw_zero".into(), raw(0, 1, &[])),
    ]
}
