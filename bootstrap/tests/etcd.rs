//! The etcd bootstrap against a real etcd server on loopback: the one
//! `RINGFENCE_TEST_ETCD` names (`HOST:PORT`; `scripts/test.sh` starts one),
//! or else one this binary starts for itself (Debian's `etcd-server`).
//! Every test uses a run name of its own, so they share the server.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use ringfence_bootstrap::{Bootstrap, Error, Etcd, EtcdConfig, connect};

/// Generous: only catches hangs.
const HANG: Duration = Duration::from_secs(60);

/// `HOST:PORT` of the server the tests use.
fn server() -> &'static str {
    static SERVER: OnceLock<String> = OnceLock::new();
    SERVER.get_or_init(|| {
        let addr = std::env::var("RINGFENCE_TEST_ETCD").unwrap_or_else(|_| start_etcd());
        wait_until_it_answers(&addr);
        addr
    })
}

/// A port nobody listens on now (bound, then let go).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts etcd on two free loopback ports, from a thread that lives as
/// long as the process (etcd gets SIGKILL when that thread's process
/// ends: `PR_SET_PDEATHSIG`); its data in a fresh temporary directory.
fn start_etcd() -> String {
    let (client, peer) = (free_port(), free_port());
    let dir = std::env::temp_dir().join(format!("ringfence-etcd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let c = format!("http://127.0.0.1:{client}");
    let p = format!("http://127.0.0.1:{peer}");
    let mut cmd = Command::new("etcd");
    cmd.args(["--name", "t", "--data-dir"])
        .arg(&dir)
        .args(["--listen-client-urls", &c, "--advertise-client-urls", &c])
        .args([
            "--listen-peer-urls",
            &p,
            "--initial-advertise-peer-urls",
            &p,
        ])
        .args([
            "--initial-cluster",
            &format!("t={p}"),
            "--logger",
            "zap",
            "--log-level",
            "error",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        // SAFETY: the closure runs in the forked child before exec and
        // only makes one async-signal-safe system call (prctl).
        let spawned = unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                    .map_err(std::io::Error::from)
            })
            .spawn()
        };
        let mut child: Child = match spawned {
            Ok(c) => c,
            Err(e) => {
                tx.send(Err(e)).unwrap();
                return;
            }
        };
        tx.send(Ok(())).unwrap();
        let _ = child.wait();
        // This thread never ends first: the process's end kills etcd.
        loop {
            thread::park();
        }
    });
    rx.recv().unwrap().unwrap_or_else(|e| {
        panic!("cannot start etcd ({e}): install Debian's etcd-server (scripts/test.sh does), or set RINGFENCE_TEST_ETCD=HOST:PORT")
    });
    format!("127.0.0.1:{client}")
}

/// Returns once etcd at `addr` lets a rank join.
fn wait_until_it_answers(addr: &str) {
    let start = Instant::now();
    loop {
        let mut cfg = EtcdConfig::new(vec![addr.to_owned()], "probe", 1 << 20);
        cfg.connect_timeout = Duration::from_secs(1);
        if Etcd::connect(cfg).is_ok() {
            return;
        }
        assert!(start.elapsed() < HANG, "etcd at {addr} never answered");
        thread::yield_now();
    }
}

/// A run name unique to this test and process.
fn run(name: &str) -> String {
    format!("{name}-{}", std::process::id())
}

fn config(run: &str, size: u32) -> EtcdConfig {
    EtcdConfig::new(vec![server().to_owned()], run, size)
}

#[test]
fn four_ranks_publish_barrier_and_fetch_everything() {
    let run = run("four");
    let ranks: Vec<_> = (0..4)
        .map(|_| {
            let cfg = config(&run, 4);
            thread::spawn(move || {
                let mut b = Etcd::connect(cfg).unwrap();
                let me = b.rank();
                b.publish("address", format!("worker of rank {me}").as_bytes())
                    .unwrap();
                b.publish("rkey.0", &[me as u8; 40]).unwrap();
                b.barrier(HANG).unwrap();
                assert_eq!(b.members().unwrap().len(), 4);
                for r in 0..4 {
                    assert_eq!(
                        b.fetch(r, "address", HANG).unwrap(),
                        format!("worker of rank {r}").as_bytes()
                    );
                    assert_eq!(b.fetch(r, "rkey.0", HANG).unwrap(), vec![r as u8; 40]);
                }
                // A second barrier: nobody leaves before all have read.
                b.barrier(HANG).unwrap();
                me
            })
        })
        .collect();
    let mut got: Vec<u32> = ranks.into_iter().map(|t| t.join().unwrap()).collect();
    got.sort_unstable();
    assert_eq!(got, [0, 1, 2, 3], "each rank taken once");
}

#[test]
fn fetch_waits_for_a_later_publish() {
    let run = run("later");
    let mut a = Etcd::connect(config(&run, 2)).unwrap();
    let waiter = {
        let cfg = config(&run, 2);
        thread::spawn(move || {
            let mut b = Etcd::connect(cfg).unwrap();
            let other = 1 - b.rank();
            b.fetch(other, "late", HANG).unwrap()
        })
    };
    // Published after the other rank started watching (or before: either
    // way the fetch returns it).
    a.publish("late", b"here").unwrap();
    assert_eq!(waiter.join().unwrap(), b"here");
}

#[test]
fn a_rank_taken_or_a_full_run_is_refused() {
    let run = run("taken");
    let mut cfg = config(&run, 2);
    cfg.rank = Some(1);
    let _one = Etcd::connect(cfg.clone()).unwrap();
    let e = Etcd::connect(cfg).unwrap_err();
    assert!(matches!(&e, Error::Join(m) if m.contains("rank 1")), "{e}");
    let zero = Etcd::connect(config(&run, 2)).unwrap();
    assert_eq!(zero.rank(), 0);
    let e = Etcd::connect(config(&run, 2)).unwrap_err();
    assert!(
        matches!(&e, Error::Join(m) if m.contains("all 2 ranks")),
        "{e}"
    );
    // A rank that leaves frees its place.
    drop(zero);
    assert_eq!(Etcd::connect(config(&run, 2)).unwrap().rank(), 0);
}

#[test]
fn a_fetch_that_nobody_answers_times_out_naming_the_rank() {
    let run = run("silent");
    let mut a = Etcd::connect(config(&run, 3)).unwrap();
    let e = a
        .fetch(2, "address", Duration::from_millis(300))
        .unwrap_err();
    assert!(
        matches!(&e, Error::Timeout { what, .. } if what.contains("rank 2") && what.contains("not a member")),
        "{e}"
    );
    let e = a.barrier(Duration::from_millis(300)).unwrap_err();
    assert!(
        matches!(&e, Error::Timeout { what, .. } if what.contains("[1, 2]")),
        "{e}"
    );
    assert!(matches!(
        a.fetch(3, "address", HANG),
        Err(Error::Invalid(_))
    ));
    assert!(matches!(a.publish("no/slash", b""), Err(Error::Invalid(_))));
}

#[test]
fn a_rank_that_passed_the_barrier_and_left_still_counts() {
    let run = run("left");
    let mut cfg = config(&run, 2);
    cfg.rank = Some(0);
    let (left_tx, left_rx) = mpsc::channel();
    let fast = thread::spawn(move || {
        let mut b = Etcd::connect(cfg).unwrap();
        b.barrier(HANG).unwrap();
        drop(b); // revokes its lease: its membership goes at once
        left_tx.send(()).unwrap();
    });
    let mut slow_cfg = config(&run, 2);
    slow_cfg.rank = Some(1);
    let mut slow = Etcd::connect(slow_cfg).unwrap();
    // Rank 0's barrier passes once this rank arrives, and rank 0 leaves at
    // once; this rank may see the barrier complete before or after that
    // lease's end, and must pass either way.
    let arrive = thread::spawn(move || slow.barrier(HANG).map(|()| slow));
    left_rx.recv_timeout(HANG).unwrap();
    fast.join().unwrap();
    let mut slow = arrive.join().unwrap().expect("the barrier passes");
    // Rank 0 is gone now: a second barrier names it.
    let e = slow.barrier(Duration::from_secs(1)).unwrap_err();
    assert!(
        matches!(&e, Error::Timeout { what, .. } if what.contains("[0]")),
        "{e}"
    );
}

#[test]
fn a_killed_rank_is_named_within_its_lease() {
    if std::env::var_os("RINGFENCE_ETCD_CHILD").is_some() {
        return;
    }
    let run = run("killed");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_rank", "--nocapture", "--test-threads=1"])
        .env("RINGFENCE_ETCD_CHILD", &run)
        .env("RINGFENCE_TEST_ETCD", server())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut cfg = config(&run, 2);
    cfg.rank = Some(0);
    cfg.ttl = Duration::from_secs(2);
    let mut a = Etcd::connect(cfg).unwrap();
    assert_eq!(a.fetch(1, "ready", HANG).unwrap(), b"yes");
    child.kill().unwrap();
    child.wait().unwrap();
    let killed = Instant::now();
    let e = a.barrier(HANG).unwrap_err();
    assert!(matches!(e, Error::RankGone { rank: 1, .. }), "{e}");
    // Within the child's lease (2 s) plus etcd's expiry sweep: a hang
    // catcher, not a timing assertion on the figure.
    assert!(
        killed.elapsed() < HANG,
        "the dead rank was noticed only after {:?}",
        killed.elapsed()
    );
    eprintln!(
        "dead rank reported {:?} after SIGKILL: {e}",
        killed.elapsed()
    );
}

/// The child of `a_killed_rank_is_named_within_its_lease`: joins as rank
/// 1, says so, and waits to be killed.
#[test]
fn child_rank() {
    let Some(run) = std::env::var_os("RINGFENCE_ETCD_CHILD") else {
        return;
    };
    let mut cfg = config(run.to_str().unwrap(), 2);
    cfg.rank = Some(1);
    cfg.ttl = Duration::from_secs(2);
    let mut b = Etcd::connect(cfg).unwrap();
    b.publish("ready", b"yes").unwrap();
    loop {
        thread::park();
    }
}

#[test]
fn a_bad_or_silent_endpoint_fails_in_under_ten_seconds() {
    // Nothing listening.
    let closed = format!("127.0.0.1:{}", free_port());
    // Listening, but never answering (connections wait in the backlog).
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent = silent.local_addr().unwrap().to_string();
    for endpoint in [closed, silent] {
        let start = Instant::now();
        let e = connect(&format!("etcd://{endpoint}?run=x&size=2")).unwrap_err();
        let took = start.elapsed();
        assert!(
            matches!(&e, Error::Unreachable { endpoints, .. } if *endpoints == endpoint),
            "{e}"
        );
        assert!(took < Duration::from_secs(10), "{endpoint}: {took:?}");
    }
    assert!(matches!(connect("etcd://nohost"), Err(Error::Invalid(_))));
}
