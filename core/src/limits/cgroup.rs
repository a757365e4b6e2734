//! The cgroup limits: which cgroups this process is in (v2, and v1's memory
//! hierarchy), where they are mounted, and the limit files of each level
//! from the process's cgroup up to the mount point.

use super::Level;
use std::path::{Component, Path, PathBuf};

/// The cgroup v2 and v1 memory levels that apply to this process,
/// innermost first, from `/proc/self/cgroup` and `/proc/self/mountinfo`;
/// `under` maps an absolute path to where it is read (tests point it at a
/// tree of their own), `file` reads a file.
pub(super) fn levels(
    cgroups: &str,
    mounts: &str,
    under: impl Fn(&str) -> PathBuf,
    file: impl Fn(&Path) -> Option<String>,
) -> (Vec<Level>, Vec<Level>) {
    let memberships = parse_self_cgroup(cgroups);
    let mounts = parse_mountinfo(mounts);
    let value = |dir: &Path, name: &str| file(&dir.join(name)).and_then(|t| parse_value(&t));
    let (mut v2, mut v1) = (Vec::new(), Vec::new());
    let mut done = [false; 3];
    for m in &mounts {
        // The first mount of each hierarchy is enough.
        if std::mem::replace(&mut done[usize::from(m.version)], true) {
            continue;
        }
        let path = match m.version {
            2 => memberships.v2.as_deref(),
            _ => memberships.v1_memory.as_deref(),
        };
        let Some(path) = path else { continue };
        let mount_point = under(&m.mount_point);
        let Some(dirs) = cgroup_dirs(&m.root, &mount_point, path) else {
            continue;
        };
        for dir in dirs {
            if m.version == 2 {
                v2.push(Level {
                    mem: value(&dir, "memory.max"),
                    swap: value(&dir, "memory.swap.max"),
                    dir,
                });
            } else {
                v1.push(Level {
                    mem: value(&dir, "memory.limit_in_bytes"),
                    swap: value(&dir, "memory.memsw.limit_in_bytes"),
                    dir,
                });
            }
        }
    }
    (v2, v1)
}

/// This process's cgroups: the v2 path and the v1 memory hierarchy's path.
#[derive(Debug, Default, PartialEq, Eq)]
struct Memberships {
    v2: Option<String>,
    v1_memory: Option<String>,
}

/// Parses `/proc/self/cgroup` (`id:controllers:path` lines; v2 is `0::path`).
fn parse_self_cgroup(text: &str) -> Memberships {
    let mut out = Memberships::default();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            out.v2 = Some(path.to_owned());
        } else if controllers.split(',').any(|c| c == "memory") {
            out.v1_memory = Some(path.to_owned());
        }
    }
    out
}

/// A cgroup mount: v2, or v1 with the memory controller.
#[derive(Debug, PartialEq, Eq)]
struct CgroupMount {
    version: u8,
    /// The cgroup the mount shows as its top (`/` unless bind-mounted).
    root: String,
    mount_point: String,
}

/// The cgroup mounts in `/proc/self/mountinfo`: `id parent dev root point
/// options [optional...] - fstype source superoptions`.
fn parse_mountinfo(text: &str) -> Vec<CgroupMount> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let left: Vec<&str> = left.split(' ').collect();
        let right: Vec<&str> = right.split(' ').collect();
        let (Some(root), Some(point), Some(fstype)) = (left.get(3), left.get(4), right.first())
        else {
            continue;
        };
        let version = match *fstype {
            "cgroup2" => 2,
            "cgroup"
                if right
                    .get(2)
                    .is_some_and(|o| o.split(',').any(|c| c == "memory")) =>
            {
                1
            }
            _ => continue,
        };
        out.push(CgroupMount {
            version,
            root: unescape(root),
            mount_point: unescape(point),
        });
    }
    out
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && let Some(code) = field
                .get(i + 1..i + 4)
                .and_then(|d| u8::from_str_radix(d, 8).ok())
        {
            out.push(code);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The directories whose limits apply to cgroup `path`, innermost first,
/// up to the mount point: `path` is relative to the hierarchy's root, the
/// mount shows it from `root`. `None` for a path that is not absolute or
/// climbs (`..`); a cgroup outside what the mount shows (another cgroup
/// namespace) yields the mount point alone.
fn cgroup_dirs(root: &str, mount_point: &Path, path: &str) -> Option<Vec<PathBuf>> {
    let path = Path::new(path.strip_suffix(" (deleted)").unwrap_or(path));
    if !path.is_absolute()
        || path
            .components()
            .any(|c| !matches!(c, Component::RootDir | Component::Normal(_)))
    {
        return None;
    }
    let relative = path.strip_prefix(root).unwrap_or(Path::new(""));
    let mut dirs = vec![mount_point.to_path_buf()];
    let mut dir = mount_point.to_path_buf();
    for c in relative.components() {
        dir.push(c);
        dirs.push(dir.clone());
    }
    dirs.reverse();
    Some(dirs)
}

/// A limit file's value: bytes, or `None` for `max` (unlimited) or
/// anything unreadable.
fn parse_value(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsers_read_the_kernel_formats() {
        let cgroup = "9:name=systemd:/\n4:memory:/jobs/7\n1:cpu,cpuacct:/\n0::/user.slice/a\n";
        assert_eq!(
            parse_self_cgroup(cgroup),
            Memberships {
                v2: Some("/user.slice/a".into()),
                v1_memory: Some("/jobs/7".into()),
            }
        );
        let mountinfo = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 /jobs /sys/fs/cgroup/mem\\040ory rw,relatime shared:5 - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
        assert_eq!(
            parse_mountinfo(mountinfo),
            vec![
                CgroupMount {
                    version: 1,
                    root: "/jobs".into(),
                    mount_point: "/sys/fs/cgroup/mem ory".into(),
                },
                CgroupMount {
                    version: 2,
                    root: "/".into(),
                    mount_point: "/sys/fs/cgroup/unified".into(),
                },
            ]
        );
        assert_eq!(parse_value("max\n"), None);
        assert_eq!(parse_value("1073741824\n"), Some(1 << 30));
        assert_eq!(
            cgroup_dirs("/jobs", Path::new("/m"), "/jobs/7/x"),
            Some(vec!["/m/7/x".into(), "/m/7".into(), "/m".into()])
        );
        assert_eq!(
            cgroup_dirs("/", Path::new("/m"), "/"),
            Some(vec!["/m".into()])
        );
        assert_eq!(
            cgroup_dirs("/other", Path::new("/m"), "/jobs/7"),
            Some(vec!["/m".into()]),
            "outside the mount's view: the mount point only"
        );
        assert_eq!(cgroup_dirs("/", Path::new("/m"), "/a/../../etc"), None);
        assert_eq!(cgroup_dirs("/", Path::new("/m"), "relative"), None);
    }
}
