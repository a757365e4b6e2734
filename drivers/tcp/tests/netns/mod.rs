//! Two emulated hosts joined by a network cable, built from Linux network
//! namespaces with `ip` (iproute2).
//!
//! A [`HostPair`] is two fresh network namespaces, `a` and `b`, each with its
//! own loopback, routing table and port space, joined by a veth pair (the
//! cable). Each end has an IPv4 address on a private /24 and an IPv6 unique
//! local address (`fd72::/16`, inside `fd00::/8`) on a /64, added with `nodad`
//! so it is usable at once. [`HostPair::set_link`] unplugs and replugs the
//! cable mid-test. Dropping the pair deletes both namespaces, and with them
//! the veth pair.
//!
//! This process stays in the root namespace; code runs on a host in a child
//! process started with [`Host::command`] (any program) or [`Host::spawn_role`]
//! (this test binary again, running one role of the calling test, with a
//! line-based [`Control`] channel back to the parent).
//!
//! Building a pair needs root (`CAP_SYS_ADMIN` and `CAP_NET_ADMIN`), `ip`,
//! and a kernel and container that allow namespaces and veth devices. Where
//! that is missing, [`HostPair::new`] says why in a [`Skip`] and
//! [`pair_or_skip`] prints it, so that the test passes as skipped:
//!
//! ```ignore
//! mod netns;
//!
//! #[test]
//! fn two_hosts() {
//!     if netns::role().is_some() {
//!         // The child's part, inside a namespace: answer the parent's lines.
//!         let mut control = netns::Control::from_parent();
//!         while let Some(line) = control.recv() {
//!             control.send(&handle(&line));
//!         }
//!         return;
//!     }
//!     let Some(pair) = netns::pair_or_skip("two_hosts") else { return };
//!     let mut server = pair.a.spawn_role("two_hosts", "server").unwrap();
//!     let answer = server.call(&format!("listen {}", pair.a.ipv4));
//!     // ... a client in `pair.b`, `pair.set_link(false)`, ...
//!     server.join(); // closes the channel: the child's loop ends
//! }
//! ```
//!
//! Every `ip` invocation checks its exit status; failures carry the command
//! line and ip's stderr. Waits are bounded spins, never sleeps.

// Each test binary includes this module and uses a different part of it.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::fmt;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The environment variable that carries the role to a child started with
/// [`Host::spawn_role`].
pub const ROLE_ENV: &str = "RINGFENCE_NETNS_ROLE";

/// How long the parent waits for one line from a child before it calls the
/// child hung. Generous: it only catches hangs.
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a veth end may take to report itself up after `ip link set up`
/// (the kernel's link watcher turns the carrier on asynchronously). Only
/// catches hangs.
const LINK_UP_TIMEOUT: Duration = Duration::from_secs(20);

/// The prefix lengths of the hosts' addresses.
const IPV4_PREFIX: u8 = 24;
const IPV6_PREFIX: u8 = 64;

/// Pairs created by this process so far: makes namespace names and subnets
/// unique per call.
static NEXT_PAIR: AtomicU32 = AtomicU32::new(0);

/// Why the two-host environment cannot be built here (not root, no `ip`,
/// namespaces or veth refused). A test that gets one passes as skipped.
#[derive(Debug, Clone)]
pub struct Skip(pub String);

impl fmt::Display for Skip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One emulated host: a network namespace with one end of the cable.
#[derive(Debug)]
pub struct Host {
    /// The namespace's name, as `ip netns` knows it.
    pub netns: String,
    /// The name of this host's veth end, inside its namespace.
    pub ifname: String,
    /// This host's IPv4 address (on a /24 shared with the peer).
    pub ipv4: Ipv4Addr,
    /// This host's IPv6 unique local address (on a /64 shared with the
    /// peer). It is removed while the link is down and put back by
    /// [`HostPair::set_link`].
    pub ipv6: Ipv6Addr,
}

impl Host {
    /// A command that runs `program` inside this host's namespace
    /// (`ip netns exec NETNS program ...`); add arguments, environment and
    /// standard streams as for any [`Command`]. `ip` execs the program in
    /// place, so the child's pid is the program's.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.netns]).arg(program);
        command
    }

    /// Runs the test `test` of this test binary inside this host's namespace
    /// with `role` in [`ROLE_ENV`]; the test function checks [`role`] first
    /// and runs the child's part when it is set.
    ///
    /// `test` is the test's full name as libtest prints it (the function name
    /// for a top-level test). The child's standard input is its end of the
    /// [`Control`] channel (it takes it with [`Control::from_parent`]); its
    /// standard output (libtest's chatter) is discarded; its stderr, where
    /// its panics go, is kept.
    ///
    /// # Errors
    /// If the socket pair cannot be created or the process cannot be spawned.
    pub fn spawn_role(&self, test: &str, role: &str) -> io::Result<HostProcess> {
        let (parent, child) = UnixStream::pair()?;
        parent.set_read_timeout(Some(CONTROL_TIMEOUT))?;
        let process = self
            .command(std::env::current_exe()?)
            .args([test, "--exact", "--nocapture", "--test-threads=1"])
            .env(ROLE_ENV, role)
            .stdin(Stdio::from(OwnedFd::from(child)))
            .stdout(Stdio::null())
            .spawn()?;
        Ok(HostProcess {
            process,
            control: Control::new(parent)?,
            netns: self.netns.clone(),
        })
    }
}

/// The role this process was started for by [`Host::spawn_role`], if it is
/// such a child.
pub fn role() -> Option<String> {
    std::env::var(ROLE_ENV).ok()
}

/// A line-based channel between a parent and a child started with
/// [`Host::spawn_role`] (a Unix socket pair, so it crosses namespaces).
#[derive(Debug)]
pub struct Control {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Control {
    fn new(socket: UnixStream) -> io::Result<Control> {
        Ok(Control {
            writer: socket.try_clone()?,
            reader: BufReader::new(socket),
        })
    }

    /// In a child started with [`Host::spawn_role`]: the channel to the
    /// parent, which is the child's standard input. Reads on it have no
    /// timeout; the parent closing its end ends them.
    ///
    /// # Panics
    /// If standard input cannot be duplicated.
    pub fn from_parent() -> Control {
        let fd = io::stdin()
            .as_fd()
            .try_clone_to_owned()
            .expect("dup(stdin) for the control channel");
        Control::new(UnixStream::from(fd)).expect("cloning the control channel")
    }

    /// Sends one line (without its newline).
    ///
    /// # Panics
    /// If `line` contains a newline, or the other side is gone.
    pub fn send(&mut self, line: &str) {
        self.try_send(line)
            .expect("writing to the control channel (peer gone?)");
    }

    /// Sends one line (without its newline), failing if the other side is
    /// gone.
    ///
    /// # Panics
    /// If `line` contains a newline.
    fn try_send(&mut self, line: &str) -> io::Result<()> {
        assert!(
            !line.contains('\n'),
            "control lines are single lines: {line:?}"
        );
        writeln!(self.writer, "{line}")
    }

    /// The next line (without its newline), or `None` once the other side
    /// has closed its end or exited.
    ///
    /// # Panics
    /// If reading fails, including the parent's [`CONTROL_TIMEOUT`].
    pub fn recv(&mut self) -> Option<String> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            // A peer that exits with our line unread resets the channel.
            Ok(0) => None,
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => None,
            Ok(_) => Some(line.trim_end_matches('\n').to_owned()),
            Err(e) => panic!("reading the control channel (hung peer?): {e}"),
        }
    }

    /// Sends `line` and returns the answer.
    ///
    /// # Panics
    /// If the other side closes its end instead of answering, or does not
    /// answer within the read timeout.
    pub fn call(&mut self, line: &str) -> String {
        self.send(line);
        self.recv().unwrap_or_else(|| {
            panic!("the peer closed the control channel instead of answering {line:?}")
        })
    }
}

/// A child process running in a host's namespace, started by
/// [`Host::spawn_role`]. Killed on drop if still running.
#[derive(Debug)]
pub struct HostProcess {
    /// The process (the test binary itself).
    pub process: Child,
    /// The parent's end of the control channel.
    pub control: Control,
    netns: String,
}

impl HostProcess {
    /// Sends `line` to the child and returns its answer.
    ///
    /// # Panics
    /// If the child exits instead of answering (its exit status is in the
    /// message, its panic on stderr above) or does not answer within
    /// [`CONTROL_TIMEOUT`].
    pub fn call(&mut self, line: &str) -> String {
        let answer = match self.control.try_send(line) {
            Ok(()) => self.control.recv(),
            Err(_) => None,
        };
        if let Some(answer) = answer {
            return answer;
        }
        let status = match self.process.wait() {
            Ok(status) => status.to_string(),
            Err(e) => format!("cannot wait for it: {e}"),
        };
        panic!(
            "the child in {} exited instead of answering {line:?} ({status})",
            self.netns
        )
    }

    /// Closes the control channel (a child that serves until its parent
    /// goes away then returns) and waits for the child.
    ///
    /// # Errors
    /// If waiting fails.
    pub fn finish(mut self) -> io::Result<ExitStatus> {
        // The child may already have gone; a failed shutdown changes nothing.
        let _ = self.control.writer.shutdown(std::net::Shutdown::Both);
        self.process.wait()
    }

    /// [`finish`](Self::finish), asserting that the child exited with
    /// status 0.
    ///
    /// # Panics
    /// If the child failed or cannot be waited for.
    pub fn join(self) {
        let netns = self.netns.clone();
        let status = self.finish().expect("waiting for the child");
        assert!(status.success(), "the child in {netns} failed: {status}");
    }
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.process.try_wait() {
            let _ = self.process.kill();
            let _ = self.process.wait();
        }
    }
}

/// Two hosts, `a` and `b`, each in its own network namespace, joined by a
/// veth pair. See the [module docs](self).
#[derive(Debug)]
pub struct HostPair {
    /// The first host: `.1` on the shared subnets.
    pub a: Host,
    /// The second host: `.2` (`::2`) on the shared subnets.
    pub b: Host,
    /// How many of `a`, `b` (in that order) have a namespace to delete.
    namespaces_created: usize,
}

impl HostPair {
    /// Creates the two namespaces, the cable between them and the addresses,
    /// and brings everything up (loopbacks included).
    ///
    /// Names are `rf-<pid>-<n>-a` and `-b`, unique per process and call; a
    /// namespace left with the same name by an earlier, crashed run is
    /// deleted first. The subnets are derived from the pid and `n` too:
    /// each namespace routes on its own, so equal subnets elsewhere would not
    /// break anything, but distinct ones keep concurrent runs telling apart
    /// in `ip` output and packet traces.
    ///
    /// # Errors
    /// A [`Skip`] when this machine cannot build the pair: not privileged,
    /// `ip` missing, network namespaces, `ip netns exec` or veth devices
    /// refused, or an address family refused as not permitted or supported.
    ///
    /// # Panics
    /// When a later step fails for another reason: that is a bug (in the
    /// harness, or the kernel's behaviour changed), not a missing facility.
    pub fn new() -> Result<HostPair, Skip> {
        if let Some(reason) = privilege_problem() {
            return Err(Skip(reason));
        }
        let pid = std::process::id();
        let n = NEXT_PAIR.fetch_add(1, Ordering::Relaxed);
        // 13 bits of pid and 3 of the call count pick the /24 (10.x.y.0);
        // the /64 takes the call count and the whole pid.
        let subnet = ((pid & 0x1fff) << 3 | (n & 7)) as u16;
        let [x, y] = subnet.to_be_bytes();
        let host = |side: &str, last: u8| Host {
            netns: format!("rf-{pid}-{n}-{side}"),
            ifname: format!("veth-{side}"),
            ipv4: Ipv4Addr::new(10, x, y, last),
            ipv6: Ipv6Addr::new(
                0xfd72,
                n as u16,
                (pid >> 16) as u16,
                pid as u16,
                0,
                0,
                0,
                u16::from(last),
            ),
        };
        let mut pair = HostPair {
            a: host("a", 1),
            b: host("b", 2),
            namespaces_created: 0,
        };
        // On an early return or a panic, dropping `pair` deletes what exists.
        pair.build()?;
        Ok(pair)
    }

    /// The steps of [`new`](Self::new). The first ones are gates: their
    /// failure means this machine cannot host the pair.
    fn build(&mut self) -> Result<(), Skip> {
        let gate = |what: &str, e: io::Error| {
            if e.kind() == io::ErrorKind::NotFound {
                Skip(format!("`ip` not found (install iproute2): {e}"))
            } else {
                Skip(format!("{what} refused: {e}"))
            }
        };
        for host in [&self.a, &self.b] {
            // A stale namespace from a crashed run with the same pid; absent
            // normally, so failure is expected and ignored.
            let _ = ip(&format!("netns del {}", host.netns));
        }
        ip(&format!("netns add {}", self.a.netns))
            .map_err(|e| gate("creating a network namespace", e))?;
        self.namespaces_created = 1;
        ip(&format!("netns add {}", self.b.netns))
            .map_err(|e| gate("creating a network namespace", e))?;
        self.namespaces_created = 2;
        for host in [&self.a, &self.b] {
            // Through `ip netns exec`, not `ip -n`: proves that processes can
            // be started in the namespace (it needs a private mount namespace).
            ip(&format!("netns exec {} ip link set lo up", host.netns))
                .map_err(|e| gate("running a process in a network namespace", e))?;
        }
        let (a, b) = (&self.a, &self.b);
        let veth = format!(
            "-n {} link add {} type veth peer name {} netns {}",
            a.netns, a.ifname, b.ifname, b.netns
        );
        ip(&veth).map_err(|e| gate("creating a veth pair", e))?;
        self.set_link(true).map_err(|e| {
            if is_environmental(&e) {
                Skip(format!("configuring the hosts refused: {e}"))
            } else {
                panic!("configuring the two hosts failed: {e}")
            }
        })
    }

    /// Plugs (`up`) or unplugs the cable: sets both veth ends up or down.
    ///
    /// Going down removes the hosts' routes to each other (connects fail
    /// with "network unreachable") and, as Linux does by default, their
    /// IPv6 addresses; established TCP connections stay, and what they send
    /// meanwhile is dropped and retransmitted later. Going up waits until
    /// both ends report the carrier up, then (re)installs both hosts'
    /// addresses, so a connect may start as soon as this returns.
    ///
    /// # Errors
    /// An error carrying the failed `ip` command and its stderr, or a timeout
    /// if a link does not come up.
    pub fn set_link(&self, up: bool) -> io::Result<()> {
        let state = if up { "up" } else { "down" };
        for host in [&self.a, &self.b] {
            ip(&format!(
                "-n {} link set dev {} {state}",
                host.netns, host.ifname
            ))?;
        }
        if !up {
            return Ok(());
        }
        for host in [&self.a, &self.b] {
            host.wait_link_up()?;
        }
        for host in [&self.a, &self.b] {
            let (netns, dev) = (&host.netns, &host.ifname);
            // `replace`: adds the address, or leaves an existing one as is.
            ip(&format!(
                "-n {netns} -4 addr replace {}/{IPV4_PREFIX} dev {dev}",
                host.ipv4
            ))?;
            ip(&format!(
                "-n {netns} -6 addr replace {}/{IPV6_PREFIX} dev {dev} nodad",
                host.ipv6
            ))?;
        }
        Ok(())
    }
}

impl Host {
    /// Spins (bounded) until this host's veth end has operational state UP:
    /// the carrier is on and the kernel's link watcher has run, so the
    /// device transmits.
    fn wait_link_up(&self) -> io::Result<()> {
        let start = Instant::now();
        loop {
            let out = ip(&format!(
                "-n {} -o link show dev {}",
                self.netns, self.ifname
            ))?;
            if out.contains(" state UP ") {
                return Ok(());
            }
            if start.elapsed() > LINK_UP_TIMEOUT {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "{} in {} not up after {LINK_UP_TIMEOUT:?}: {out}",
                        self.ifname, self.netns
                    ),
                ));
            }
            std::thread::yield_now();
        }
    }
}

impl Drop for HostPair {
    fn drop(&mut self) {
        // Deleting a namespace deletes its veth end, and the peer with it.
        // Processes still inside keep the namespace alive until they exit.
        for host in [&self.a, &self.b].into_iter().take(self.namespaces_created) {
            if let Err(e) = ip(&format!("netns del {}", host.netns)) {
                eprintln!("netns: leaving namespace {} behind: {e}", host.netns);
            }
        }
    }
}

/// A [`HostPair`], or `None` after printing `SKIPPED: <test>: <reason>` to
/// stderr when this machine cannot build one.
///
/// ```ignore
/// let Some(pair) = netns::pair_or_skip("my_test") else { return };
/// ```
pub fn pair_or_skip(test: &str) -> Option<HostPair> {
    match HostPair::new() {
        Ok(pair) => Some(pair),
        Err(skip) => {
            eprintln!("SKIPPED: {test}: {skip}");
            None
        }
    }
}

/// Runs `ip ARGS`, `args` split at whitespace (namespace and interface
/// names and addresses here never contain any); its stdout on success.
/// Errors carry the command line and ip's stderr; failing to start `ip`
/// keeps its kind (`NotFound`).
fn ip(args: &str) -> io::Result<String> {
    let line = format!("ip {args}");
    let out = Command::new("ip")
        .args(args.split_whitespace())
        .stdin(Stdio::null())
        .output()
        .map_err(|e| io::Error::new(e.kind(), format!("`{line}` could not start: {e}")))?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    Err(io::Error::other(format!(
        "`{line}` failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

/// Whether an `ip` failure means a missing permission or facility rather
/// than a bug: ip's stderr names `EPERM`, `EACCES` or `EOPNOTSUPP`
/// (IPv6 disabled, for instance).
fn is_environmental(e: &io::Error) -> bool {
    let text = e.to_string();
    [
        "Operation not permitted",
        "Permission denied",
        "not supported",
    ]
    .iter()
    .any(|needle| text.contains(needle))
}

/// Why this process cannot manage namespaces, if `/proc/self/status` shows
/// it lacks `CAP_SYS_ADMIN` (`ip netns` mounts) or `CAP_NET_ADMIN` (links
/// and addresses). `None` if it has both, or if the file cannot be read
/// (then `ip` itself reports the refusal).
fn privilege_problem() -> Option<String> {
    const CAP_NET_ADMIN: u32 = 12;
    const CAP_SYS_ADMIN: u32 = 21;
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .map(str::trim)
    };
    let effective = u64::from_str_radix(field("CapEff:")?, 16).ok()?;
    let needed = 1 << CAP_NET_ADMIN | 1 << CAP_SYS_ADMIN;
    if effective & needed == needed {
        return None;
    }
    let euid = field("Uid:")
        .and_then(|uids| uids.split_whitespace().nth(1))
        .unwrap_or("?");
    Some(format!(
        "needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) to create network namespaces; \
         running as euid {euid} with effective capabilities {effective:#x}"
    ))
}

/// `n` hosts on one switch: a namespace per host and one for the switch,
/// which holds a bridge with a veth to each host. The switch has an
/// address of its own on the hosts' /24 ([`Bridged::switch_ip`], `.254`),
/// so a service every host must reach (an etcd server) runs there, in
/// [`Bridged::switch`]. IPv4 only. Dropping it deletes every namespace.
#[derive(Debug)]
pub struct Bridged {
    /// The hosts, `.1` to `.n` on the /24.
    pub hosts: Vec<Host>,
    /// The switch's namespace, with the bridge.
    pub switch: Host,
    /// Namespaces to delete: the switch first, then the hosts.
    created: Vec<String>,
}

impl Bridged {
    /// Builds the switch and `n` hosts (at most 200), each host's veth
    /// enslaved to the bridge, every link up and every address usable.
    ///
    /// # Errors
    /// A [`Skip`] as for [`HostPair::new`].
    ///
    /// # Panics
    /// If a step after the gates fails: a bug, not a missing facility.
    pub fn new(n: usize) -> Result<Bridged, Skip> {
        assert!((1..=200).contains(&n));
        if let Some(reason) = privilege_problem() {
            return Err(Skip(reason));
        }
        let pid = std::process::id();
        let k = NEXT_PAIR.fetch_add(1, Ordering::Relaxed);
        let subnet = ((pid & 0x1fff) << 3 | (k & 7)) as u16;
        let [x, y] = subnet.to_be_bytes();
        let host = |name: String, ifname: &str, last: u8| Host {
            netns: name,
            ifname: ifname.to_owned(),
            ipv4: Ipv4Addr::new(10, x, y, last),
            ipv6: Ipv6Addr::UNSPECIFIED,
        };
        let switch = host(format!("rf-{pid}-{k}-sw"), "br0", 254);
        let hosts = (0..n)
            .map(|i| host(format!("rf-{pid}-{k}-h{i}"), "eth0", i as u8 + 1))
            .collect();
        let mut b = Bridged {
            hosts,
            switch,
            created: Vec::new(),
        };
        b.build()?;
        Ok(b)
    }

    fn build(&mut self) -> Result<(), Skip> {
        let gate = |what: &str, e: io::Error| {
            if e.kind() == io::ErrorKind::NotFound {
                Skip(format!("`ip` not found (install iproute2): {e}"))
            } else {
                Skip(format!("{what} refused: {e}"))
            }
        };
        let names: Vec<String> = std::iter::once(&self.switch)
            .chain(&self.hosts)
            .map(|h| h.netns.clone())
            .collect();
        for name in &names {
            let _ = ip(&format!("netns del {name}"));
            ip(&format!("netns add {name}"))
                .map_err(|e| gate("creating a network namespace", e))?;
            self.created.push(name.clone());
            ip(&format!("netns exec {name} ip link set lo up"))
                .map_err(|e| gate("running a process in a network namespace", e))?;
        }
        let sw = self.switch.netns.clone();
        ip(&format!("-n {sw} link add br0 type bridge"))
            .map_err(|e| gate("creating a bridge", e))?;
        let configure = || -> io::Result<()> {
            for (i, h) in self.hosts.iter().enumerate() {
                ip(&format!(
                    "-n {sw} link add vh{i} type veth peer name {} netns {}",
                    h.ifname, h.netns
                ))?;
                ip(&format!("-n {sw} link set vh{i} master br0"))?;
                ip(&format!("-n {sw} link set vh{i} up"))?;
                ip(&format!("-n {} link set {} up", h.netns, h.ifname))?;
                ip(&format!(
                    "-n {} -4 addr add {}/{IPV4_PREFIX} dev {}",
                    h.netns, h.ipv4, h.ifname
                ))?;
            }
            ip(&format!("-n {sw} link set br0 up"))?;
            ip(&format!(
                "-n {sw} -4 addr add {}/{IPV4_PREFIX} dev br0",
                self.switch.ipv4
            ))?;
            for h in self.hosts.iter().chain([&self.switch]) {
                h.wait_link_up()?;
            }
            Ok(())
        };
        configure().map_err(|e| {
            if is_environmental(&e) {
                Skip(format!("configuring the bridge refused: {e}"))
            } else {
                panic!("configuring the bridged hosts failed: {e}")
            }
        })
    }

    /// The switch's own address, which every host reaches.
    pub fn switch_ip(&self) -> Ipv4Addr {
        self.switch.ipv4
    }
}

impl Drop for Bridged {
    fn drop(&mut self) {
        for name in &self.created {
            if let Err(e) = ip(&format!("netns del {name}")) {
                eprintln!("netns: leaving namespace {name} behind: {e}");
            }
        }
    }
}

/// A [`Bridged`] set of `n` hosts, or `None` after printing
/// `SKIPPED: <test>: <reason>` when this machine cannot build one.
pub fn bridged_or_skip(test: &str, n: usize) -> Option<Bridged> {
    match Bridged::new(n) {
        Ok(b) => Some(b),
        Err(skip) => {
            eprintln!("SKIPPED: {test}: {skip}");
            None
        }
    }
}
