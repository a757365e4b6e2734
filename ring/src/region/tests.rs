//! The region's tests: building, attaching, and every corrupt header and index refused.

use super::*;
use crate::RingError;
use std::os::fd::AsRawFd;

fn memfd_region(sq: u32, cq: u32) -> Region {
    Region::builder()
        .sq_entries(sq)
        .cq_entries(cq)
        .build_memfd("ringfence-test")
        .unwrap()
}

/// A second descriptor for the same memfd, as another process would
/// receive it.
fn dup(region: &Region) -> OwnedFd {
    region.as_fd().unwrap().try_clone_to_owned().unwrap()
}

/// Writes `bytes` at `offset` of the region's memory.
fn poke(region: &Region, offset: usize, bytes: &[u8]) {
    assert!(offset + bytes.len() <= region.size() as usize);
    // SAFETY: in bounds (asserted); the test owns every side of the
    // region and no ring handle is reading these bytes right now.
    unsafe {
        core::ptr::copy_nonoverlapping(
            bytes.as_ptr(),
            region.base().as_ptr().add(offset),
            bytes.len(),
        )
    };
}

#[test]
#[cfg_attr(miri, ignore = "mmap")]
fn builder_defaults_and_bad_counts() {
    let region = Region::builder().build_anonymous().unwrap();
    assert_eq!((region.sq_entries(), region.cq_entries()), (256, 512));
    assert!(region.as_fd().is_none());
    assert_eq!(region.size() % 4096, 0);
    for (sq, cq) in [(3, 8), (8, 5), (0, 8), (1 << 17, 8)] {
        let err = Region::builder()
            .sq_entries(sq)
            .cq_entries(cq)
            .build_anonymous()
            .unwrap_err();
        assert!(matches!(err, RegionError::BadEntries { .. }), "{err}");
    }
}

#[test]
#[cfg_attr(miri, ignore = "mmap")]
fn each_side_is_taken_once() {
    let mut region = Region::builder().sq_entries(4).build_anonymous().unwrap();
    let _app = region.app_side().unwrap();
    assert!(matches!(
        region.app_side(),
        Err(RegionError::SideTaken("application"))
    ));
    let _engine = region.engine_side().unwrap();
    let err = region.engine_side().unwrap_err();
    assert_eq!(
        err.to_string(),
        "the engine side of this ring region is already taken"
    );
}

#[test]
#[cfg_attr(miri, ignore = "memfd")]
fn two_mappings_of_one_memfd_share_the_rings() {
    let mut creator = memfd_region(8, 16);
    let mut attached = Region::attach(dup(&creator)).unwrap();
    assert_eq!(
        (
            attached.sq_entries(),
            attached.cq_entries(),
            attached.size()
        ),
        (8, 16, creator.size())
    );
    let (mut sq, mut cq) = creator.app_side().unwrap();
    let (mut engine_sq, mut engine_cq) = attached.engine_side().unwrap();
    // The claims are shared too: the other mapping cannot take them again.
    assert!(matches!(
        attached.app_side(),
        Err(RegionError::SideTaken(_))
    ));
    assert!(matches!(
        creator.engine_side(),
        Err(RegionError::SideTaken(_))
    ));
    for round in 0..100u64 {
        for i in 0..5 {
            sq.push(Sqe::nop().with_user_data(round * 10 + i)).unwrap();
        }
        sq.submit();
        let mut batch = [Sqe::default(); 8];
        let n = engine_sq.pop_batch(&mut batch).unwrap();
        assert_eq!(n, 5);
        for sqe in &batch[..n] {
            engine_cq.push(Cqe::new(sqe.user_data, 1, 0)).unwrap();
        }
        engine_cq.submit();
        for i in 0..5 {
            assert_eq!(cq.pop().unwrap(), Some(Cqe::new(round * 10 + i, 1, 0)));
        }
    }
}

#[test]
#[cfg_attr(miri, ignore = "memfd")]
fn attaching_resumes_from_the_shared_indices() {
    let mut creator = memfd_region(4, 4);
    {
        let (mut sq, _cq) = creator.app_side().unwrap();
        sq.push_batch(&[Sqe::nop().with_user_data(1), Sqe::nop().with_user_data(2)])
            .unwrap();
        sq.submit();
    }
    let mut attached = Region::attach(dup(&creator)).unwrap();
    let (mut engine_sq, _engine_cq) = attached.engine_side().unwrap();
    assert_eq!(engine_sq.ready(), Ok(2));
    assert_eq!(engine_sq.pop().unwrap().unwrap().user_data, 1);
}

/// Every way a header can lie, each with its own error.
#[test]
#[cfg_attr(miri, ignore = "memfd")]
fn bad_headers_are_refused() {
    type Check = fn(&RegionError) -> bool;
    let cases: [(usize, Vec<u8>, Check); 9] = [
        (0, b"NOTARING".to_vec(), |e| {
            matches!(e, RegionError::BadMagic(_))
        }),
        (8, 2u32.to_le_bytes().to_vec(), |e| {
            matches!(e, RegionError::AbiVersion { found: 2, .. })
        }),
        (12, 81u32.to_le_bytes().to_vec(), |e| {
            matches!(
                e,
                RegionError::BadHeader {
                    field: "header_size",
                    ..
                }
            )
        }),
        (16, 1u64.to_le_bytes().to_vec(), |e| {
            matches!(
                e,
                RegionError::BadHeader {
                    field: "region_size",
                    ..
                }
            )
        }),
        (24, 3u32.to_le_bytes().to_vec(), |e| {
            matches!(e, RegionError::BadEntries { sq: 3, .. })
        }),
        (28, 32u32.to_le_bytes().to_vec(), |e| {
            matches!(
                e,
                RegionError::BadHeader {
                    field: "sq.entry_size",
                    ..
                }
            )
        }),
        (40, 0x1000u32.to_le_bytes().to_vec(), |e| {
            matches!(
                e,
                RegionError::BadHeader {
                    field: "sq.array",
                    ..
                }
            )
        }),
        (56, 0u32.to_le_bytes().to_vec(), |e| {
            matches!(
                e,
                RegionError::BadHeader {
                    field: "cq.producer",
                    ..
                }
            )
        }),
        // Entry counts that are valid but need more memory than the file has.
        (48, (1u32 << 16).to_le_bytes().to_vec(), |e| {
            matches!(
                e,
                RegionError::BadHeader {
                    field: "cq.array",
                    ..
                } | RegionError::BadHeader {
                    field: "region_size",
                    ..
                }
            )
        }),
    ];
    for (offset, bytes, check) in cases {
        let region = memfd_region(8, 8);
        poke(&region, offset, &bytes);
        let err = Region::attach(dup(&region)).unwrap_err();
        assert!(check(&err), "offset {offset}: unexpected {err:?}");
        assert!(!err.to_string().is_empty());
    }
}

#[test]
#[cfg_attr(miri, ignore = "memfd")]
fn descriptors_that_are_not_sealed_ring_memfds_are_refused() {
    let unsealed = memfd_create("unsealed", MFdFlags::MFD_CLOEXEC).unwrap();
    nix::unistd::ftruncate(&unsealed, 4096).unwrap();
    assert!(matches!(
        Region::attach(unsealed),
        Err(RegionError::NotSealed)
    ));

    let small = memfd_create("small", MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING).unwrap();
    nix::unistd::ftruncate(&small, 100).unwrap();
    fcntl(&small, FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK)).unwrap();
    assert!(matches!(
        Region::attach(small),
        Err(RegionError::TooSmall { actual: 100, .. })
    ));

    let huge = memfd_create("huge", MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING).unwrap();
    nix::unistd::ftruncate(&huge, 1 << 30).unwrap();
    fcntl(&huge, FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK)).unwrap();
    assert!(matches!(
        Region::attach(huge),
        Err(RegionError::TooLarge(_))
    ));

    let zeros = memfd_create("zeros", MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING).unwrap();
    nix::unistd::ftruncate(&zeros, 8192).unwrap();
    fcntl(&zeros, FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK)).unwrap();
    assert!(matches!(
        Region::attach(zeros),
        Err(RegionError::BadMagic(0))
    ));

    let (pipe_read, _pipe_write) = nix::unistd::pipe().unwrap();
    let err = Region::attach(pipe_read).unwrap_err();
    assert!(
        matches!(
            err,
            RegionError::Os {
                op: "fcntl(F_GET_SEALS)",
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
#[cfg_attr(miri, ignore = "memfd")]
fn corrupt_shared_indices_are_errors_on_every_side() {
    let mut creator = memfd_region(4, 4);
    let layout = creator.layout;
    let (mut sq, mut cq) = creator.app_side().unwrap();
    let mut attached = Region::attach(dup(&creator)).unwrap();
    let (mut engine_sq, mut engine_cq) = attached.engine_side().unwrap();

    // The "engine" process scribbles on the SQ tail: the consumer refuses it.
    poke(
        &creator,
        layout.sq.producer as usize,
        &1000u32.to_le_bytes(),
    );
    let err = engine_sq.pop().unwrap_err();
    assert_eq!(
        err,
        Corrupt {
            head: 0,
            tail: 1000,
            capacity: 4
        }
    );
    // The CQ head runs past the CQ tail: the CQ producer refuses to push
    // once its cache is exhausted.
    poke(&creator, layout.cq.consumer as usize, &9u32.to_le_bytes());
    for i in 0..4 {
        engine_cq.push(Cqe::new(i, 0, 0)).unwrap();
    }
    assert!(matches!(
        engine_cq.push(Cqe::default()),
        Err(RingError::Corrupt(_))
    ));
    // The application's CQ consumer trusts its own head (0), sees no tail.
    assert_eq!(cq.pop(), Ok(None));
    // A garbage SQ head makes the application's producer refuse once full.
    poke(
        &creator,
        layout.sq.consumer as usize,
        &u32::MAX.to_le_bytes(),
    );
    for _ in 0..4 {
        sq.push(Sqe::nop()).unwrap();
    }
    assert!(matches!(sq.push(Sqe::nop()), Err(RingError::Corrupt(_))));

    // A new attacher checks the indices before handing out a side.
    let mut third = Region::attach(dup(&creator)).unwrap();
    poke(&creator, CLAIMS_OFFSET, &0u32.to_le_bytes());
    assert!(matches!(third.app_side(), Err(RegionError::Corrupt(_))));
}

const CLAIMS_OFFSET: usize = core::mem::offset_of!(RegionHeader, claims);

/// Random garbage anywhere in the region: attaching and using it gives
/// errors or garbage entries, never a crash.
#[test]
#[cfg_attr(miri, ignore = "memfd")]
fn random_garbage_never_crashes() {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for round in 0..200 {
        let region = memfd_region(4, 8);
        let size = region.size() as usize;
        // Keep a valid header in half the rounds so the index paths run.
        let start = if round % 2 == 0 { 0 } else { 128 };
        let mut garbage = vec![0u8; size - start];
        garbage.iter_mut().for_each(|b| *b = next() as u8);
        poke(&region, start, &garbage);
        let Ok(mut attached) = Region::attach(dup(&region)) else {
            continue;
        };
        if let Ok((mut sq, mut cq)) = attached.app_side() {
            let _ = sq.push(Sqe::nop());
            sq.submit();
            let _ = cq.pop_batch(&mut [Cqe::default(); 8]);
        }
        if let Ok((mut sq, mut cq)) = attached.engine_side() {
            while let Ok(Some(sqe)) = sq.pop() {
                let _ = sqe.opcode();
            }
            let _ = cq.push(Cqe::default());
        }
    }
    let fd = memfd_region(4, 4);
    assert!(fd.as_fd().unwrap().as_raw_fd() >= 0);
}
