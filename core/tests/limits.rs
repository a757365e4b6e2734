//! Resource limits: allocations and notification pools beyond what the
//! machine (or the cgroup, or an rlimit) can back fail at creation with
//! `NoMemory`, and a large pool does not touch its memory when built.

use ringfence::limits::{self, LimitSource};
use ringfence::{Error, Loopback, Worker};
use ringfence_ring::Status;

const TIB: usize = 1 << 40;

fn worker() -> Worker {
    Worker::builder()
        .driver(Loopback::new())
        .ignore_env()
        .build()
        .unwrap()
}

/// A request just above the limit (the limit itself if that is beyond
/// any address space).
fn just_over_limit() -> usize {
    usize::try_from(limits::memory_limit().bytes())
        .unwrap_or(usize::MAX)
        .saturating_add(1)
}

fn assert_limit_error(e: &Error) {
    assert_eq!(e.status(), Status::NoMemory, "{e}");
    assert!(
        matches!(e, Error::MemoryLimit { .. }),
        "a limit error, not {e:?}"
    );
    assert!(e.to_string().contains("memory limit"), "{e}");
}

#[test]
fn the_limit_is_known_and_below_a_tebibyte_here() {
    let w = worker();
    let limit = limits::memory_limit();
    assert_ne!(limit.source(), &LimitSource::Unknown, "{limit}");
    drop(w);
    // The tests below rely on 1 TiB being beyond what this machine backs.
    assert!(
        limit.bytes() < TIB as u64,
        "this machine backs a TiB ({limit}): the 1 TiB test needs a smaller one"
    );
}

#[test]
fn a_tebibyte_fails_at_once_with_no_memory() {
    let w = worker();
    if limits::memory_limit().bytes() >= TIB as u64 {
        eprintln!("skipped: this machine backs 1 TiB");
        return;
    }
    let e = w.alloc_registered(TIB).unwrap_err();
    assert_limit_error(&e);
}

#[test]
fn just_above_the_limit_fails_and_a_modest_allocation_succeeds() {
    let w = worker();
    let e = w.alloc_registered(just_over_limit()).unwrap_err();
    assert_limit_error(&e);
    // A failed request leaves nothing counted.
    let modest = w.alloc_registered(1 << 20).unwrap();
    assert_eq!(modest.len(), 1 << 20);
    assert_eq!(modest.load_u64((1 << 20) - 8), 0, "zeroed");
    modest.store_u64((1 << 20) - 8, 7);
    assert_eq!(modest.load_u64((1 << 20) - 8), 7);
    assert!(limits::live_bytes() >= 1 << 20);
    w.deregister(modest.handle()).unwrap();
}

#[test]
fn lengths_that_overflow_page_rounding_are_invalid() {
    let w = worker();
    for len in [0, usize::MAX, usize::MAX - 1, isize::MAX as usize] {
        let e = w.alloc_registered(len).unwrap_err();
        assert_eq!(e.status(), Status::InvalidLength, "{len}: {e}");
    }
}

#[test]
fn a_pool_beyond_the_limit_fails_at_build() {
    let limit = limits::memory_limit().bytes();
    // 65,536 buffers of the smallest size that puts the pool over.
    let size = u32::try_from(limit / 65536 + 1).unwrap_or(u32::MAX);
    let e = Worker::builder()
        .driver(Loopback::new())
        .ignore_env()
        .notify_buffers(65536, size)
        .build()
        .unwrap_err();
    if u64::from(size) * 65536 > limit {
        assert_limit_error(&e);
    } else {
        panic!("the machine backs 65,536 x 4 GiB: {e}");
    }
}

/// Resident pages of this process, from /proc/self/statm.
fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * limits::page_size() as u64
}

#[test]
fn a_large_pool_builds_without_touching_its_memory() {
    const POOL: u64 = 65536 * 65536;
    if limits::memory_limit().bytes() < POOL {
        eprintln!("skipped: the memory limit is below the 4 GiB pool");
        return;
    }
    let before = resident_bytes();
    let w = Worker::builder()
        .driver(Loopback::new())
        .ignore_env()
        .notify_buffers(65536, 65536)
        .build()
        .unwrap();
    let grown = resident_bytes().saturating_sub(before);
    // The pool's pages are untouched; the worker's own structures (rings,
    // buffer states, the delivery queue) are a few MiB. Other tests of
    // this binary allocate concurrently, but far less than this bound.
    assert!(
        grown < POOL / 16,
        "building a 4 GiB pool made {grown} bytes resident"
    );
    assert!(limits::live_bytes() >= POOL);
    drop(w);
}
