//! `rfbench` from the outside: the built binary, its exit status and its
//! output. Small sweeps keep the suite fast on two cores.

mod common;

use assert_cmd::Command;
use common::finish;

fn rfbench() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rfbench"));
    // Only the options given here steer the run.
    for (k, _) in std::env::vars() {
        if k.starts_with("RINGFENCE_") {
            cmd.env_remove(k);
        }
    }
    cmd.timeout(std::time::Duration::from_secs(60));
    cmd
}

/// A small sweep: 8 B to 4 KiB, batches 1 to 8.
const SMALL: [&str; 8] = [
    "--max-block-size",
    "4K",
    "--max-batch-size",
    "8",
    "--num-iter",
    "50",
    "--warmup-iter",
    "5",
];

/// The default columns: latencies in nanoseconds.
const COLUMNS: [&str; 10] = [
    "Block Size (B)",
    "Batch Size",
    "B/W (GB/Sec)",
    "Avg Lat. (ns)",
    "Avg Prep (ns)",
    "P99 Prep (ns)",
    "Avg Post (ns)",
    "P99 Post (ns)",
    "Avg Tx (ns)",
    "P99 Tx (ns)",
];

/// nixlbench's columns (`--nixl-format`).
const NIXL_COLUMNS: [&str; 10] = [
    "Block Size (B)",
    "Batch Size",
    "B/W (GB/Sec)",
    "Avg Lat. (us)",
    "Avg Prep (us)",
    "P99 Prep (us)",
    "Avg Post (us)",
    "P99 Post (us)",
    "Avg Tx (us)",
    "P99 Tx (us)",
];

fn stdout_of(args: &[&str]) -> String {
    let out = rfbench().args(args).output().unwrap();
    assert!(
        out.status.success(),
        "rfbench {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The rows of a table: lines that start with a number.
fn rows(table: &str) -> Vec<Vec<f64>> {
    table
        .lines()
        .filter(|l| l.starts_with(|c: char| c.is_ascii_digit()))
        .map(|l| l.split_whitespace().map(|c| c.parse().unwrap()).collect())
        .collect()
}

#[test]
fn the_default_run_spawns_a_target_and_prints_every_column() {
    // The default (shm, two processes), with the default sweep: it must
    // finish well inside the timeout.
    let start = std::time::Instant::now();
    let table = stdout_of(&[]);
    assert!(start.elapsed().as_secs() < 60);
    for c in COLUMNS {
        assert!(table.contains(c), "column {c} missing:\n{table}");
    }
    assert!(table.contains("shm (target: a child process)"), "{table}");
    let rows = rows(&table);
    assert_eq!(rows.len(), 14 * 6, "8 B..64 KiB x batch 1..32:\n{table}");
    for r in &rows {
        assert_eq!(r.len(), 10, "{r:?}");
        assert!(r[2] > 0.0, "bandwidth {r:?}");
    }
    assert_eq!((rows[0][0], rows[0][1]), (8.0, 1.0));
    assert_eq!((rows[83][0], rows[83][1]), (65536.0, 32.0));
}

#[test]
fn every_driver_passes_its_consistency_checks() {
    for driver in ["loopback", "shm", "tcp"] {
        for op in ["write", "read", "atomic"] {
            let mut args = vec!["--driver", driver, "--op", op, "--check-consistency"];
            args.extend_from_slice(&SMALL);
            let table = stdout_of(&args);
            assert!(!rows(&table).is_empty(), "{driver} {op}:\n{table}");
        }
    }
    // Fences and notifications on the way.
    let mut args = vec![
        "--driver",
        "shm",
        "--fence",
        "strong",
        "--fence-every",
        "2",
        "--notify",
        "--check-consistency",
    ];
    args.extend_from_slice(&SMALL);
    stdout_of(&args);
    args[1] = "tcp";
    stdout_of(&args);
}

#[test]
fn json_lines_parse_and_carry_the_configuration() {
    let mut args = vec!["--driver", "loopback", "--json", "--op", "read"];
    args.extend_from_slice(&SMALL);
    let out = stdout_of(&args);
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(lines.len(), 10 * 4);
    for v in &lines {
        for key in ["block_size", "batch_size", "bw_gb_per_sec", "avg_lat_us"] {
            assert!(v[key].is_number(), "{key} in {v}");
        }
        for phase in ["prep", "post", "tx"] {
            assert!(v[phase]["p99_us"].is_number(), "{phase} in {v}");
        }
        assert_eq!(v["config"]["driver"], "loopback");
        assert_eq!(v["config"]["op"], "read");
        assert_eq!(v["config"]["num_iter"], 50);
        assert_eq!(v["config"]["max_block_size"], 4096);
    }
}

#[test]
fn csv_has_the_nixlbench_header() {
    let mut args = vec!["--driver", "loopback", "--csv"];
    args.extend_from_slice(&SMALL);
    let out = stdout_of(&args);
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some(COLUMNS.join(",").as_str()));
    assert_eq!(lines.count(), 10 * 4);
    // nixlbench's own header and units on request.
    args.push("--nixl-format");
    let out = stdout_of(&args);
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some(NIXL_COLUMNS.join(",").as_str()));
    assert_eq!(lines.count(), 10 * 4);
}

/// Without `--num-iter` a row runs as many batches as `--duration` takes
/// (at least 100); with it, exactly that many.
#[test]
fn rows_scale_to_the_duration_unless_num_iter_fixes_them() {
    let base = [
        "--driver",
        "loopback",
        "--json",
        "--max-block-size",
        "1K",
        "--max-batch-size",
        "4",
    ];
    let iterations = |extra: &[&str]| -> Vec<u64> {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        stdout_of(&args)
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                v["iterations"].as_u64().unwrap()
            })
            .collect()
    };
    let scaled = iterations(&["--duration", "0.01"]);
    assert_eq!(scaled.len(), 8 * 3);
    assert!(scaled.iter().all(|&n| n >= 100), "{scaled:?}");
    let fixed = iterations(&["--duration", "0.01", "--num-iter", "37"]);
    assert!(fixed.iter().all(|&n| n == 37), "{fixed:?}");
}

/// A bandwidth row runs once per pass (5 by default, 1 with `--num-iter`)
/// and prints its median pass, still one line per row; with
/// `--check-consistency` every pass is checked.
#[test]
fn rows_run_in_passes_and_print_once() {
    let passes = |extra: &[&str]| -> Vec<(u64, u64)> {
        let mut args = vec![
            "--driver",
            "loopback",
            "--json",
            "--max-block-size",
            "64",
            "--max-batch-size",
            "2",
            "--duration",
            "0.005",
            "--check-consistency",
        ];
        args.extend_from_slice(extra);
        stdout_of(&args)
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                (
                    v["passes"].as_u64().unwrap(),
                    v["iterations"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let default = passes(&[]);
    assert_eq!(default.len(), 4 * 2, "{default:?}");
    assert!(default.iter().all(|&(p, _)| p == 5), "{default:?}");
    let fixed = passes(&["--num-iter", "37"]);
    assert!(fixed.iter().all(|&p| p == (1, 37)), "{fixed:?}");
    let both = passes(&["--num-iter", "37", "--passes", "3"]);
    assert!(both.iter().all(|&p| p == (3, 37)), "{both:?}");
}

/// Latencies print in a unit that resolves them: nanoseconds with one
/// decimal by default, so no sub-microsecond figure reads as 0.0; with
/// `--nixl-format`, nixlbench's microseconds with one decimal.
#[test]
fn latencies_print_in_nanoseconds_unless_nixl_format_is_asked() {
    let mut args = vec!["--driver", "loopback", "--csv"];
    args.extend_from_slice(&SMALL);
    let cells = |out: &str| -> Vec<Vec<String>> {
        out.lines()
            .skip(1)
            .map(|l| l.split(',').map(str::to_string).collect())
            .collect()
    };
    for row in cells(&stdout_of(&args)) {
        let avg_ns: f64 = row[3].parse().unwrap();
        assert!(avg_ns > 0.0, "a latency reads as zero: {row:?}");
        assert_eq!(row[3].split('.').nth(1).map(str::len), Some(1), "{row:?}");
    }
    args.push("--nixl-format");
    for row in cells(&stdout_of(&args)) {
        assert_eq!(row[3].split('.').nth(1).map(str::len), Some(1), "{row:?}");
    }
}

#[test]
fn a_corrupted_target_fails_the_check() {
    for driver in ["loopback", "shm", "tcp"] {
        for op in ["write", "read"] {
            let mut args = vec![
                "--driver",
                driver,
                "--op",
                op,
                "--check-consistency",
                "--corrupt-for-test",
            ];
            args.extend_from_slice(&SMALL);
            let out = rfbench().args(&args).output().unwrap();
            assert_eq!(out.status.code(), Some(1), "{driver} {op}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                err.contains("consistency check failed") && err.contains("expected"),
                "{driver} {op}: {err}"
            );
        }
    }
}

#[test]
fn latency_mode_reports_one_way_latency() {
    for driver in ["loopback", "shm", "tcp"] {
        let dir = tempfile::tempdir().unwrap();
        let plot = dir.path().join("lat.svg");
        let out = stdout_of(&[
            "--driver",
            driver,
            "--mode",
            "latency",
            "--max-block-size",
            "64",
            "--num-iter",
            "2000",
            "--plot",
            plot.to_str().unwrap(),
        ]);
        assert!(out.contains("Typical Lat. (ns)"), "{out}");
        let rows = rows(&out);
        assert_eq!(rows.len(), 4, "{out}");
        for r in rows {
            assert!(r[2] > 0.0 && r[4] >= r[2], "p99 >= median: {r:?}");
        }
        let svg = std::fs::read_to_string(&plot).unwrap();
        assert!(svg.contains("<svg"));
    }
}

#[test]
fn bad_arguments_are_a_clear_message_and_status_2() {
    for (args, says) in [
        (&["--bogus"][..], "unexpected argument"),
        (&["--op", "fly"], "invalid value 'fly'"),
        (&["--start-block-size", "3"], "power of two"),
        (
            &["--start-block-size", "64", "--max-block-size", "8"],
            "larger than --max-block-size",
        ),
        (&["--driver", "verbs"], "not built"),
        (&["--duration", "0"], "--duration must be"),
        (&["--passes", "0"], "--passes must be from 1 to 101"),
        (&["--passes", "102"], "--passes must be from 1 to 101"),
        (&["--role", "initiator"], "--peer"),
        (
            &["--role", "initiator", "--peer", "nonsense"],
            "connection string",
        ),
    ] {
        let out = rfbench().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

/// A `--listen` target on 127.0.0.1 (any port) and the address its first
/// line of standard output names.
fn listening_target(extra: &[&str]) -> (std::process::Child, String) {
    common::listening(
        std::process::Command::new(env!("CARGO_BIN_EXE_rfbench"))
            .args(["--driver", "tcp", "--listen", "127.0.0.1:0"])
            .args(extra),
    )
}

#[test]
fn listen_and_connect_run_the_two_sides_apart() {
    // Bandwidth with every check the target takes part in.
    for op in ["write", "read", "atomic"] {
        let (target, addr) = listening_target(&[]);
        let mut args = vec![
            "--driver",
            "tcp",
            "--connect",
            &addr,
            "--op",
            op,
            "--check-consistency",
            "--lanes",
            "4",
        ];
        args.extend_from_slice(&SMALL);
        let table = stdout_of(&args);
        // Atomics have one block size (8 B).
        let blocks = if op == "atomic" { 1 } else { 10 };
        assert_eq!(rows(&table).len(), blocks * 4, "{op}:\n{table}");
        assert!(table.contains("--listen 127.0.0.1:"), "{table}");
        let (status, err) = finish(target);
        assert!(status.success(), "{op}: {status}: {err}");
    }
    // A corrupted target window is found from the other side too.
    let (target, addr) = listening_target(&["--corrupt-for-test"]);
    let mut args = vec!["--driver", "tcp", "--connect", &addr, "--check-consistency"];
    args.extend_from_slice(&SMALL);
    let out = rfbench().args(&args).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("consistency check failed"));
    finish(target);
    // The ping-pong: the target connects back to this side's worker.
    let (target, addr) = listening_target(&[]);
    let out = stdout_of(&[
        "--driver",
        "tcp",
        "--connect",
        &addr,
        "--mode",
        "latency",
        "--max-block-size",
        "64",
        "--num-iter",
        "500",
    ]);
    let rows = rows(&out);
    assert_eq!(rows.len(), 4, "{out}");
    for r in rows {
        assert!(r[2] > 0.0 && r[4] >= r[2], "p99 >= median: {r:?}");
    }
    let (status, err) = finish(target);
    assert!(status.success(), "{status}: {err}");
}

#[test]
fn a_listen_target_refuses_what_is_not_the_protocol() {
    use std::io::{Read, Write};
    // Each of these ends the session: the target exits with status 1 and
    // says why; a frame of the protocol, where one comes back, is `err`.
    let frame = |text: &str| {
        let mut f = (text.len() as u32).to_le_bytes().to_vec();
        f.extend_from_slice(text.as_bytes());
        f
    };
    for (bytes, says) in [
        (frame("hello there"), "expected `rfbench-hello"),
        (frame("rfbench-hello 9 4096"), "protocol version"),
        (frame("rfbench-hello 1 99999999999999"), "window length"),
        ((1u32 << 30).to_le_bytes().to_vec(), "a frame of"),
        (vec![3, 0, 0, 0, 0xff, 0xfe, 0xfd], "not UTF-8"),
        (vec![9, 0], "reading the hello"),
    ] {
        let (target, addr) = listening_target(&[]);
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        s.write_all(&bytes).unwrap();
        if bytes.len() == 2 {
            // A hello cut short: the socket closes inside it.
            s.shutdown(std::net::Shutdown::Write).unwrap();
        }
        let mut answer = Vec::new();
        s.set_read_timeout(Some(std::time::Duration::from_secs(60)))
            .unwrap();
        let _ = s.read_to_end(&mut answer);
        let (status, err) = finish(target);
        assert_eq!(status.code(), Some(1), "{says}: {err}");
        assert!(err.contains(says), "{says}: {err}");
        if answer.len() > 4 {
            assert!(answer[4..].starts_with(b"err "), "{says}: {answer:?}");
        }
    }
    // After a good hello, a command that is not one is answered with
    // `err`, and the session goes on until `done`.
    let (target, addr) = listening_target(&[]);
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    let mut ask = |text: &str| {
        s.write_all(&frame(text)).unwrap();
        if text == "done" {
            return String::new();
        }
        let mut len = [0u8; 4];
        s.read_exact(&mut len).unwrap();
        let mut answer = vec![0u8; u32::from_le_bytes(len) as usize];
        s.read_exact(&mut answer).unwrap();
        String::from_utf8(answer).unwrap()
    };
    assert!(ask("rfbench-hello 1 4096").starts_with("window rf1:"));
    let answer = ask("fly away");
    assert!(
        answer.starts_with("err ") && answer.contains("unknown command"),
        "{answer}"
    );
    let answer = ask("prepare write 4096 2 1");
    assert!(
        answer.starts_with("err ") && answer.contains("a row of 2 x 4096 B"),
        "{answer}"
    );
    // Rows that overflow, or whose checks would reach past the window.
    for bad in [
        "prepare write 18446744073709551615 2 1",
        "verify write 4294967296 4294967296 1",
        "prepare atomic 1 1000 1",
        "verify atomic 1 1000 1",
        "verify read 0 1 1",
        "pong",
        "pong rf1:00:00:0:8 0 1 4",
        "pong rf1:00:00:0:8 18446744073709551615 1 8",
    ] {
        let answer = ask(bad);
        assert!(answer.starts_with("err "), "{bad}: {answer}");
    }
    assert_eq!(ask("prepare write 8 1 1"), "ok");
    ask("done");
    let (status, err) = finish(target);
    assert!(status.success(), "{status}: {err}");
}
