//! The memory this process can have, and the check every allocation that
//! ringfence makes for its user goes through.
//!
//! The limit is the smallest of what can back memory here:
//! - the machine: physical memory plus swap (`MemTotal + SwapTotal` of
//!   `/proc/meminfo`), not what is free now (`MemAvailable` moves with every
//!   other process and page cache; the question asked here is whether the
//!   request can ever be backed, so that an impossible one fails at once);
//! - the cgroup v2 `memory.max` of this process's cgroup and of each of its
//!   ancestors (the tightest applies), plus its `memory.swap.max` (bounded by
//!   the machine's swap);
//! - the cgroup v1 `memory.limit_in_bytes` of the memory hierarchy (again
//!   walking up), plus swap, or `memory.memsw.limit_in_bytes` where that is
//!   tighter;
//! - `RLIMIT_AS` and `RLIMIT_DATA` where finite.
//!
//! Each source has its file: `machine.rs`, `cgroup.rs` (both
//! hierarchies), `rlimit.rs`; this one combines them and keeps the count.
//!
//! The values are read when a worker is built ([`Worker::builder`]'s
//! `build`) and kept for the process; allocations (a control-path call)
//! compare against the kept value, never reading anything on the data path.
//!
//! Every allocation ringfence makes for its user (registered memory from
//! [`Worker::alloc_registered`], a worker's notification buffers) is
//! counted while it lives: a request fails with
//! [`Status::NoMemory`](crate::Status) when it, page-rounded, plus what is
//! already live exceeds the limit. A driver that allocates memory of its
//! own on a user's behalf checks with [`check`].
//!
//! [`Worker::builder`]: crate::Worker::builder
//! [`Worker::alloc_registered`]: crate::Worker::alloc_registered

mod cgroup;
mod machine;
mod rlimit;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// The most memory this process can have, and what sets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryLimit {
    bytes: u64,
    source: LimitSource,
}

/// What sets a [`MemoryLimit`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LimitSource {
    /// Nothing that could be read limits it (the limit is `u64::MAX`).
    Unknown,
    /// Physical memory plus swap (`/proc/meminfo`).
    Machine,
    /// `memory.max` (plus `memory.swap.max`) of this cgroup v2 directory.
    CgroupV2(PathBuf),
    /// `memory.limit_in_bytes` (plus swap, or `memory.memsw.limit_in_bytes`)
    /// of this cgroup v1 directory.
    CgroupV1(PathBuf),
    /// `RLIMIT_AS`, the address-space limit.
    RlimitAs,
    /// `RLIMIT_DATA`, the data-segment limit (private mappings included).
    RlimitData,
}

impl MemoryLimit {
    /// The limit in bytes (`u64::MAX`: nothing known limits it).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// What sets it.
    pub fn source(&self) -> &LimitSource {
        &self.source
    }
}

impl fmt::Display for MemoryLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = self.bytes;
        match &self.source {
            LimitSource::Unknown => write!(f, "no known limit"),
            LimitSource::Machine => write!(
                f,
                "{bytes} bytes, the machine's physical memory plus swap (/proc/meminfo)"
            ),
            LimitSource::CgroupV2(dir) => write!(
                f,
                "{bytes} bytes, memory.max plus memory.swap.max of cgroup {}",
                dir.display()
            ),
            LimitSource::CgroupV1(dir) => write!(
                f,
                "{bytes} bytes, memory.limit_in_bytes plus swap of cgroup {}",
                dir.display()
            ),
            LimitSource::RlimitAs => write!(f, "{bytes} bytes, RLIMIT_AS"),
            LimitSource::RlimitData => write!(f, "{bytes} bytes, RLIMIT_DATA"),
        }
    }
}

/// A request beyond the [`MemoryLimit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitExceeded {
    /// The request, rounded up to whole pages (`u64::MAX` if that
    /// overflows).
    pub requested: u64,
    /// The ringfence allocations of this process already live that were
    /// counted with it (0 for [`check`], which bounds one request).
    pub live: u64,
    /// The limit.
    pub limit: MemoryLimit,
}

impl fmt::Display for LimitExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} bytes asked for", self.requested)?;
        if self.live > 0 {
            write!(
                f,
                ", with {} bytes of ringfence allocations live,",
                self.live
            )?;
        }
        write!(f, " exceed the memory limit: {}", self.limit)
    }
}

impl std::error::Error for LimitExceeded {}

/// The process's limit: read by [`refresh`], or at first use.
static LIMIT: Mutex<Option<MemoryLimit>> = Mutex::new(None);

/// Bytes (page-rounded) of live ringfence allocations in this process.
static LIVE: AtomicU64 = AtomicU64::new(0);

/// The limit as last read (reading it now if it never was).
pub fn memory_limit() -> MemoryLimit {
    let mut limit = LIMIT.lock().unwrap_or_else(|e| e.into_inner());
    limit.get_or_insert_with(read).clone()
}

/// Reads the limit again (at worker creation: system calls allowed) and
/// keeps it for later checks.
pub(crate) fn refresh() -> MemoryLimit {
    let fresh = read();
    *LIMIT.lock().unwrap_or_else(|e| e.into_inner()) = Some(fresh.clone());
    fresh
}

/// Bytes of live ringfence allocations in this process (page-rounded).
pub fn live_bytes() -> u64 {
    LIVE.load(Ordering::Relaxed)
}

/// The page size allocations are rounded to.
pub fn page_size() -> usize {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|p| usize::try_from(p).ok())
        .filter(|p| p.is_power_of_two())
        .unwrap_or(4096)
}

/// `len` (at least one byte) rounded up to whole pages; `None` if that
/// overflows or exceeds `isize::MAX` (no allocation can be that large).
pub fn round_to_pages(len: usize) -> Option<usize> {
    let page = page_size();
    len.max(1)
        .checked_add(page - 1)
        .map(|l| l & !(page - 1))
        .filter(|&l| isize::try_from(l).is_ok())
}

/// Checks one allocation of `len` bytes (page-rounded) against the limit:
/// for a driver that allocates on a user's behalf
/// ([`Driver::alloc_memory`](crate::Driver::alloc_memory)), before it asks
/// the system. Live allocations are not counted here: the worker counts
/// them itself (it has already reserved the bytes when it asks a driver).
///
/// # Errors
/// [`LimitExceeded`] (report it as [`Status::NoMemory`](crate::Status)),
/// also for a `len` that overflows when rounded to pages.
pub fn check(len: usize) -> Result<(), LimitExceeded> {
    let requested = round_to_pages(len).map_or(u64::MAX, |l| l as u64);
    let limit = memory_limit();
    if requested > limit.bytes {
        return Err(LimitExceeded {
            requested,
            live: 0,
            limit,
        });
    }
    Ok(())
}

/// Bytes counted against the limit while this lives.
#[derive(Debug)]
pub(crate) struct Reservation {
    bytes: u64,
}

/// Counts `len` bytes (page-rounded) against the limit until the returned
/// reservation is dropped.
///
/// # Errors
/// [`LimitExceeded`] if they do not fit beside what is live.
pub(crate) fn reserve(len: usize) -> Result<Reservation, LimitExceeded> {
    let limit = memory_limit();
    let requested = round_to_pages(len).map_or(u64::MAX, |l| l as u64);
    let mut live = LIVE.load(Ordering::Relaxed);
    loop {
        // A length that overflows never fits, whatever the limit (an
        // unknown limit is u64::MAX, which a saturated sum would meet).
        let total = round_to_pages(len)
            .and_then(|l| live.checked_add(l as u64))
            .filter(|&total| total <= limit.bytes);
        let Some(total) = total else {
            return Err(LimitExceeded {
                requested,
                live,
                limit,
            });
        };
        // Relaxed: a counter; the allocation itself is ordered by whatever
        // hands its address out.
        match LIVE.compare_exchange_weak(live, total, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return Ok(Reservation { bytes: requested }),
            Err(now) => live = now,
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        LIVE.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// Reads the limit from the running system.
fn read() -> MemoryLimit {
    // Miri models neither these files nor getrlimit: no known limit there.
    if cfg!(miri) {
        return MemoryLimit {
            bytes: u64::MAX,
            source: LimitSource::Unknown,
        };
    }
    let mut inputs = read_files(Path::new("/"));
    (inputs.rlimit_as, inputs.rlimit_data) = rlimit::read();
    let limit = compute(&inputs);
    tracing::debug!(%limit, "memory limit");
    limit
}

/// What the limit is computed from, as read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Inputs {
    /// `MemTotal` in bytes.
    ram: Option<u64>,
    /// `SwapTotal` in bytes.
    swap: Option<u64>,
    /// The cgroup v2 levels, innermost first.
    v2: Vec<Level>,
    /// The cgroup v1 memory levels, innermost first.
    v1: Vec<Level>,
    /// The soft `RLIMIT_AS`, if finite.
    rlimit_as: Option<u64>,
    /// The soft `RLIMIT_DATA`, if finite.
    rlimit_data: Option<u64>,
}

/// One cgroup directory's limits (`None`: unlimited or unreadable).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Level {
    dir: PathBuf,
    /// v2 `memory.max`; v1 `memory.limit_in_bytes`.
    mem: Option<u64>,
    /// v2 `memory.swap.max` (swap on top of `mem`); v1
    /// `memory.memsw.limit_in_bytes` (memory and swap together).
    swap: Option<u64>,
}

/// The smallest of the inputs' limits. Unknown swap counts as none.
fn compute(inputs: &Inputs) -> MemoryLimit {
    let swap = inputs.swap.unwrap_or(0);
    let mut best = MemoryLimit {
        bytes: u64::MAX,
        source: LimitSource::Unknown,
    };
    let mut consider = |bytes: u64, source: LimitSource| {
        if bytes < best.bytes {
            best = MemoryLimit { bytes, source };
        }
    };
    if let Some(ram) = inputs.ram {
        consider(ram.saturating_add(swap), LimitSource::Machine);
    }
    for level in &inputs.v2 {
        if let Some(mem) = level.mem {
            let swap = level.swap.map_or(swap, |s| s.min(swap));
            consider(
                mem.saturating_add(swap),
                LimitSource::CgroupV2(level.dir.clone()),
            );
        }
    }
    for level in &inputs.v1 {
        let with_swap = level.mem.map(|m| m.saturating_add(swap));
        let bytes = match (with_swap, level.swap) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if let Some(bytes) = bytes {
            consider(bytes, LimitSource::CgroupV1(level.dir.clone()));
        }
    }
    if let Some(bytes) = inputs.rlimit_as {
        consider(bytes, LimitSource::RlimitAs);
    }
    if let Some(bytes) = inputs.rlimit_data {
        consider(bytes, LimitSource::RlimitData);
    }
    best
}

/// Reads the file inputs with `root` standing for `/` (tests point it at
/// a tree of their own).
fn read_files(root: &Path) -> Inputs {
    let file = |path: &Path| std::fs::read_to_string(path).ok();
    let under = |abs: &str| root.join(abs.trim_start_matches('/'));
    let mut inputs = Inputs::default();
    if let Some(text) = file(&under("/proc/meminfo")) {
        (inputs.ram, inputs.swap) = machine::parse_meminfo(&text);
    }
    if let (Some(cgroups), Some(mounts)) = (
        file(&under("/proc/self/cgroup")),
        file(&under("/proc/self/mountinfo")),
    ) {
        (inputs.v2, inputs.v1) = cgroup::levels(&cgroups, &mounts, under, file);
    }
    inputs
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn level(dir: &str, mem: Option<u64>, swap: Option<u64>) -> Level {
        Level {
            dir: dir.into(),
            mem,
            swap,
        }
    }

    #[test]
    fn the_tightest_input_wins() {
        const G: u64 = 1 << 30;
        let machine = Inputs {
            ram: Some(16 * G),
            swap: Some(4 * G),
            ..Inputs::default()
        };
        let cases: Vec<(Inputs, u64, LimitSource)> = vec![
            (Inputs::default(), u64::MAX, LimitSource::Unknown),
            (machine.clone(), 20 * G, LimitSource::Machine),
            (
                // The parent is tighter than the leaf; swap.max caps swap.
                Inputs {
                    v2: vec![
                        level("/c/a/b", Some(8 * G), None),
                        level("/c/a", Some(2 * G), Some(G)),
                        level("/c", None, None),
                    ],
                    ..machine.clone()
                },
                3 * G,
                LimitSource::CgroupV2("/c/a".into()),
            ),
            (
                // Unlimited swap.max: the machine's swap bounds it.
                Inputs {
                    v2: vec![level("/c/a", Some(2 * G), None)],
                    ..machine.clone()
                },
                6 * G,
                LimitSource::CgroupV2("/c/a".into()),
            ),
            (
                // v1: memsw is memory and swap together.
                Inputs {
                    v1: vec![level("/m/x", Some(4 * G), Some(5 * G))],
                    ..machine.clone()
                },
                5 * G,
                LimitSource::CgroupV1("/m/x".into()),
            ),
            (
                // v1 without swap accounting: limit plus the machine's swap.
                Inputs {
                    v1: vec![level("/m/x", Some(G), None)],
                    ..machine.clone()
                },
                5 * G,
                LimitSource::CgroupV1("/m/x".into()),
            ),
            (
                // v1's "unlimited" is a huge number: the machine wins.
                Inputs {
                    v1: vec![level("/m", Some(9223372036854771712), None)],
                    ..machine.clone()
                },
                20 * G,
                LimitSource::Machine,
            ),
            (
                Inputs {
                    rlimit_as: Some(G),
                    rlimit_data: Some(2 * G),
                    ..machine.clone()
                },
                G,
                LimitSource::RlimitAs,
            ),
            (
                Inputs {
                    rlimit_data: Some(G / 2),
                    ..machine.clone()
                },
                G / 2,
                LimitSource::RlimitData,
            ),
        ];
        for (inputs, bytes, source) in cases {
            let limit = compute(&inputs);
            assert_eq!(
                (limit.bytes(), limit.source()),
                (bytes, &source),
                "{inputs:?}"
            );
        }
    }

    fn opt() -> impl Strategy<Value = Option<u64>> {
        prop_oneof![Just(None), any::<u64>().prop_map(Some)]
    }

    proptest! {
        /// The limit is the smallest input's (`u64::MAX` with none).
        #[test]
        #[cfg_attr(miri, ignore = "proptest persists failures in files")]
        fn the_limit_is_the_minimum(
            ram in opt(), swap in opt(), rlimit_as in opt(), rlimit_data in opt(),
            v2 in proptest::collection::vec((opt(), opt()), 0..4),
            v1 in proptest::collection::vec((opt(), opt()), 0..4),
        ) {
            let inputs = Inputs {
                ram, swap, rlimit_as, rlimit_data,
                v2: v2.iter().map(|&(m, s)| level("/v2", m, s)).collect(),
                v1: v1.iter().map(|&(m, s)| level("/v1", m, s)).collect(),
            };
            let limit = compute(&inputs).bytes();
            let sw = swap.unwrap_or(0);
            let mut each: Vec<u64> = Vec::new();
            each.extend(ram.map(|r| r.saturating_add(sw)));
            each.extend(rlimit_as);
            each.extend(rlimit_data);
            for &(m, s) in &v2 {
                each.extend(m.map(|m| m.saturating_add(s.map_or(sw, |s| s.min(sw)))));
            }
            for &(m, s) in &v1 {
                each.extend(m.map(|m| m.saturating_add(sw)));
                each.extend(s);
            }
            prop_assert_eq!(limit, each.iter().copied().min().unwrap_or(u64::MAX));
        }
    }

    /// The whole read path over a fake `/proc` and `/sys/fs/cgroup` tree.
    #[test]
    #[cfg_attr(miri, ignore = "miri does not model the file system")]
    fn reads_a_cgroup_tree_walking_up() {
        let root = std::env::temp_dir().join(format!("ringfence-limits-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let put = |path: &str, text: &str| {
            let path = root.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        put(
            "proc/meminfo",
            "MemTotal: 8388608 kB\nSwapTotal: 1048576 kB\n",
        );
        put("proc/self/cgroup", "4:memory:/batch/job\n0::/a/b/c\n");
        put(
            "proc/self/mountinfo",
            "41 31 0:38 / /cg2 rw - cgroup2 cgroup2 rw\n\
             35 31 0:32 / /cg1 rw - cgroup cgroup rw,memory\n",
        );
        put("cg2/a/b/c/memory.max", "max\n");
        put("cg2/a/b/memory.max", "3221225472\n");
        put("cg2/a/b/memory.swap.max", "0\n");
        put("cg2/a/memory.max", "4294967296\n");
        put(
            "cg1/batch/job/memory.limit_in_bytes",
            "9223372036854771712\n",
        );
        put("cg1/batch/memory.limit_in_bytes", "2147483648\n");
        put("cg1/batch/memory.memsw.limit_in_bytes", "2684354560\n");
        let inputs = read_files(&root);
        assert_eq!(inputs.ram, Some(8 << 30));
        assert_eq!(inputs.swap, Some(1 << 30));
        assert_eq!(
            inputs.v2,
            vec![
                level(root.join("cg2/a/b/c").to_str().unwrap(), None, None),
                level(
                    root.join("cg2/a/b").to_str().unwrap(),
                    Some(3 << 30),
                    Some(0)
                ),
                level(root.join("cg2/a").to_str().unwrap(), Some(4 << 30), None),
                level(root.join("cg2").to_str().unwrap(), None, None),
            ]
        );
        let limit = compute(&inputs);
        // v1 batch: min(2 GiB + 1 GiB swap, 2.5 GiB memsw) = 2.5 GiB, below
        // v2's 3 GiB (a/b, no swap) and the machine's 9 GiB.
        assert_eq!(limit.bytes(), 2684354560);
        assert_eq!(
            limit.source(),
            &LimitSource::CgroupV1(root.join("cg1/batch"))
        );
        assert!(limit.to_string().contains("cg1/batch"), "{limit}");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    #[cfg_attr(miri, ignore = "reads /proc and calls getrlimit")]
    fn the_running_system_has_a_limit() {
        // Every Linux machine has /proc/meminfo: the limit is at most RAM
        // plus swap, never unknown.
        let limit = refresh();
        assert_ne!(limit.source(), &LimitSource::Unknown);
        assert!(limit.bytes() < u64::MAX);
        assert_eq!(memory_limit(), limit);
    }

    #[test]
    #[cfg_attr(miri, ignore = "reads /proc and calls getrlimit")]
    fn reservations_count_until_dropped() {
        assert!(reserve(usize::MAX).is_err(), "overflows when page-rounded");
        let limit = memory_limit().bytes();
        let over = usize::try_from(limit).unwrap_or(usize::MAX);
        let e = reserve(over.saturating_add(1)).unwrap_err();
        assert!(e.requested > limit);
        assert!(check(over.saturating_add(1)).is_err());
        let r = reserve(1).unwrap();
        assert_eq!(r.bytes, page_size() as u64);
        assert!(live_bytes() >= r.bytes);
        assert_eq!(round_to_pages(0), Some(page_size()));
        assert_eq!(round_to_pages(usize::MAX - 1), None);
        assert_eq!(round_to_pages(isize::MAX as usize), None);
    }
}
