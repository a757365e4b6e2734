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
    assert!(
        u64::from(size) * 65536 > limit,
        "the machine backs 65,536 buffers of 4 GiB"
    );
    let e = Worker::builder()
        .driver(Loopback::new())
        .ignore_env()
        .notify_buffers(65536, size)
        .build()
        .unwrap_err();
    assert_limit_error(&e);
    assert!(e.to_string().contains("notification buffers"), "{e}");
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

/// The cgroup directory this process is in for memory: (the directory,
/// whether it is cgroup v2). v1's memory hierarchy first, as the limit
/// code reads both.
fn own_memory_cgroup() -> Option<(std::path::PathBuf, bool)> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mount = |v2: bool| {
        mounts.lines().find_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let left: Vec<&str> = left.split(' ').collect();
            let right: Vec<&str> = right.split(' ').collect();
            let fits = if v2 {
                right[0] == "cgroup2"
            } else {
                right[0] == "cgroup" && right.get(2)?.split(',').any(|o| o == "memory")
            };
            (fits && left.get(3) == Some(&"/")).then(|| left[4].to_owned())
        })
    };
    for line in cgroups.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        if controllers.split(',').any(|c| c == "memory") {
            let dir = std::path::Path::new(&mount(false)?).join(path.trim_start_matches('/'));
            return Some((dir, false));
        }
    }
    let path = cgroups.lines().find_map(|l| l.strip_prefix("0::"))?;
    let dir = std::path::Path::new(&mount(true)?).join(path.trim_start_matches('/'));
    Some((dir, true))
}

const CHILD_LIMIT: u64 = 256 << 20;

/// In a child cgroup with a 256 MiB memory limit (where this process may
/// make one: root with a writable cgroup hierarchy), a child process sees
/// that limit, names it, and is held to it. Skipped, saying why, where the
/// cgroup cannot be made.
#[test]
fn a_process_in_a_limited_cgroup_is_held_to_its_limit() {
    use std::io::{BufRead, Write};
    if let Ok(dir) = std::env::var("RINGFENCE_LIMITS_CHILD_CGROUP") {
        // The child: wait until the parent has moved us, then check.
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line).unwrap();
        let w = worker();
        let limit = limits::memory_limit();
        eprintln!("in cgroup {dir}: {limit}");
        assert!(
            matches!(limit.source(),
                LimitSource::CgroupV1(d) | LimitSource::CgroupV2(d) if d.ends_with(&dir)),
            "{limit}"
        );
        assert!(limit.bytes() >= CHILD_LIMIT, "{limit}");
        assert!(limit.to_string().contains(&dir), "{limit}");
        let over = usize::try_from(limit.bytes()).unwrap() + 1;
        assert_limit_error(&w.alloc_registered(over).unwrap_err());
        let buf = w.alloc_registered(1 << 20).unwrap();
        w.deregister(buf.handle()).unwrap();
        return;
    }
    let Some((own, v2)) = own_memory_cgroup() else {
        eprintln!("skipped: no cgroup memory hierarchy found in /proc/self");
        return;
    };
    let name = format!("ringfence-limits-{}", std::process::id());
    let dir = own.join(&name);
    if let Err(e) = std::fs::create_dir(&dir) {
        eprintln!("skipped: cannot make cgroup {} ({e})", dir.display());
        return;
    }
    let limit_file = if v2 {
        "memory.max"
    } else {
        "memory.limit_in_bytes"
    };
    if let Err(e) = std::fs::write(dir.join(limit_file), CHILD_LIMIT.to_string()) {
        eprintln!(
            "skipped: cannot set {limit_file} in {} ({e}; cgroup v2 needs the memory controller delegated)",
            dir.display()
        );
        let _ = std::fs::remove_dir(&dir);
        return;
    }
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_process_in_a_limited_cgroup_is_held_to_its_limit",
            "--nocapture",
        ])
        .env("RINGFENCE_LIMITS_CHILD_CGROUP", &name)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let moved = std::fs::write(dir.join("cgroup.procs"), child.id().to_string());
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "go").unwrap();
    drop(stdin);
    let status = child.wait().unwrap();
    // Empty once the child has exited; the kernel may take a moment to
    // let go of it.
    for _ in 0..1000 {
        if std::fs::remove_dir(&dir).is_ok() {
            break;
        }
        std::thread::yield_now();
    }
    moved.unwrap();
    assert!(status.success(), "the child in {} failed", dir.display());
}
