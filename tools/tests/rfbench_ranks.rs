//! `rfbench --bootstrap`: N ranks that find each other through a real
//! etcd server or Open MPI's `mpirun`, in nixlbench's pairwise scheme.
//!
//! - Four ranks in four network namespaces joined by a bridge, the etcd
//!   server in the switch's namespace: every pair's rows with
//!   `--check-consistency`, the aggregate, `--json`.
//! - A rank killed mid-run (SIGKILL, no goodbye): every other rank exits
//!   non-zero, and the dead rank is named.
//! - Four ranks under `mpirun`, all on this host's loopback: Open MPI's
//!   launcher starts its daemons over ssh or locally; across namespaces it
//!   would need an ssh server in each, so the MPI run stays on one host.
//!
//! The namespace tests are skipped, with a message, where namespaces
//! cannot be made (not root, no `ip`).

#[path = "../../drivers/tcp/tests/netns/mod.rs"]
mod netns;

mod common;

use common::{HANG, clean};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Instant;

const RFBENCH: &str = env!("CARGO_BIN_EXE_rfbench");

/// A short sweep: two block sizes, batch 1 and 4, each checked.
const SWEEP: &[&str] = &[
    "--driver",
    "tcp",
    "--op",
    "write",
    "--start-block-size",
    "4096",
    "--max-block-size",
    "65536",
    "--max-batch-size",
    "4",
    "--num-iter",
    "50",
    "--warmup-iter",
    "10",
    "--check-consistency",
];

/// Waits for `child` (a hang is killed and fails the test).
fn wait(child: Child, what: &str) -> Output {
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(HANG) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("{what} hung");
        }
    }
}

/// etcd in the switch's namespace, on its bridge address; waits until a
/// host reaches its port.
fn etcd_on_switch(net: &netns::Bridged) -> (Child, String) {
    let ip = net.switch_ip();
    let dir = std::env::temp_dir().join(format!(
        "rf-etcd-{}-{}",
        std::process::id(),
        net.switch.netns
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let c = format!("http://{ip}:2379");
    let p = format!("http://{ip}:2380");
    let child = net
        .switch
        .command("etcd")
        .args(["--name", "sw", "--data-dir"])
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
            &format!("sw={p}"),
            "--logger",
            "zap",
            "--log-level",
            "error",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("etcd (Debian's etcd-server; scripts/test.sh installs it)");
    let start = Instant::now();
    let probe = format!("exec 3<>/dev/tcp/{ip}/2379");
    while !net.hosts[0]
        .command("bash")
        .args(["-c", &probe])
        .status()
        .unwrap()
        .success()
    {
        assert!(start.elapsed() < HANG, "etcd on {ip} never listened");
        std::thread::yield_now();
    }
    (child, format!("{ip}:2379"))
}

/// Starts rank `r` of `size` on host `h` with `extra` arguments.
fn rank(h: &netns::Host, etcd: &str, run: &str, r: usize, size: usize, extra: &[&str]) -> Child {
    clean(&mut h.command(RFBENCH))
        .arg("--bootstrap")
        .arg(format!(
            "etcd://{etcd}?run={run}&size={size}&rank={r}&ttl=2"
        ))
        .args(SWEEP)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn four_ranks_over_a_bridge_through_etcd() {
    let Some(net) = netns::bridged_or_skip("four_ranks_over_a_bridge_through_etcd", 4) else {
        return;
    };
    let (mut etcd, at) = etcd_on_switch(&net);
    for (run, extra) in [("table", &[][..]), ("json", &["--json"][..])] {
        let children: Vec<Child> = net
            .hosts
            .iter()
            .enumerate()
            .map(|(r, h)| rank(h, &at, run, r, 4, extra))
            .collect();
        let outs: Vec<Output> = children
            .into_iter()
            .enumerate()
            .map(|(r, c)| wait(c, &format!("rank {r}")))
            .collect();
        for (r, o) in outs.iter().enumerate() {
            assert!(
                o.status.success(),
                "rank {r}: {}\n{}",
                o.status,
                String::from_utf8_lossy(&o.stderr)
            );
        }
        let report = String::from_utf8_lossy(&outs[0].stdout);
        for (r, o) in outs.iter().enumerate().skip(1) {
            assert!(o.stdout.is_empty(), "only rank 0 reports; rank {r} printed");
        }
        if extra.is_empty() {
            assert!(
                report.contains("pairwise: rank 0 -> rank 2 of 4"),
                "{report}"
            );
            assert!(
                report.contains("pairwise: rank 1 -> rank 3 of 4"),
                "{report}"
            );
            assert!(report.contains("aggregate of 2 pairs"), "{report}");
            // 2 block sizes x 3 batch sizes (1, 2, 4), for each pair and the aggregate.
            let rows = report
                .lines()
                .filter(|l| l.starts_with("4096 ") || l.starts_with("65536 "))
                .count();
            assert_eq!(rows, 3 * 2 * 3, "{report}");
        } else {
            let objs: Vec<serde_json::Value> = report
                .lines()
                .map(|l| serde_json::from_str(l).expect("one JSON object a line"))
                .collect();
            assert_eq!(objs.len(), 3, "{report}");
            assert_eq!(objs[0]["pair"], serde_json::json!([0, 2]));
            assert_eq!(objs[1]["pair"], serde_json::json!([1, 3]));
            assert_eq!(objs[2]["aggregate"], 2);
            let bw =
                |o: &serde_json::Value, k: usize| o["rows"][k]["bw_gb_per_sec"].as_f64().unwrap();
            for k in 0..6 {
                let sum = bw(&objs[0], k) + bw(&objs[1], k);
                assert!(
                    (bw(&objs[2], k) - sum).abs() <= 1e-9 * sum.max(1.0),
                    "row {k}"
                );
                assert!(bw(&objs[0], k) > 0.0);
            }
        }
    }
    let _ = etcd.kill();
    let _ = etcd.wait();
}

#[test]
fn a_killed_rank_is_named_by_the_others() {
    let Some(net) = netns::bridged_or_skip("a_killed_rank_is_named_by_the_others", 4) else {
        return;
    };
    let (mut etcd, at) = etcd_on_switch(&net);
    let start = Instant::now();
    let children: Vec<Child> = net
        .hosts
        .iter()
        .enumerate()
        .map(|(r, h)| {
            let die: &[&str] = if r == 3 {
                &["--die-after-rows-for-test", "2"]
            } else {
                &[]
            };
            rank(h, &at, "killed", r, 4, die)
        })
        .collect();
    let outs: Vec<Output> = children
        .into_iter()
        .enumerate()
        .map(|(r, c)| wait(c, &format!("rank {r}")))
        .collect();
    eprintln!("every rank exited {:?} after the start", start.elapsed());
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(outs[3].status.signal(), Some(9), "rank 3 killed itself");
    let mut named = 0;
    for (r, o) in outs.iter().enumerate().take(3) {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "rank {r} must fail: {err}");
        assert_eq!(
            o.status.code(),
            Some(1),
            "rank {r}: a clean error exit, not a crash: {err}"
        );
        eprintln!("rank {r}: {}", err.trim());
        if err.contains("rank 3") {
            named += 1;
        }
    }
    // Rank 3's initiator (rank 1) fails its row naming its target; the
    // others fail at a barrier naming whichever rank they saw go first.
    assert!(named >= 1, "nobody named the dead rank 3");
    let _ = etcd.kill();
    let _ = etcd.wait();
}

#[test]
fn four_ranks_under_mpirun() {
    let mut cmd = Command::new("mpirun");
    if is_root() {
        cmd.arg("--allow-run-as-root");
    }
    let child = clean(&mut cmd)
        .args(["--oversubscribe", "-np", "4"])
        .args([
            "--mca",
            "btl",
            "self,tcp",
            "--mca",
            "btl_tcp_if_include",
            "lo",
        ])
        .args(["--mca", "oob_tcp_if_include", "lo"])
        .args([RFBENCH, "--bootstrap", "mpi"])
        .args(SWEEP)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mpirun (Debian's openmpi-bin; scripts/test.sh installs it)");
    let out = wait(child, "mpirun");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "mpirun: {}\n{}\n{report}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        report.contains("pairwise: rank 0 -> rank 2 of 4"),
        "{report}"
    );
    assert!(
        report.contains("pairwise: rank 1 -> rank 3 of 4"),
        "{report}"
    );
    assert!(report.contains("aggregate of 2 pairs"), "{report}");
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}
