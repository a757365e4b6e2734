//! `rfbench --driver tcp` between two hosts: `--listen` in one network
//! namespace, `--connect` in another, joined by a veth pair (the tcp
//! driver's harness, `drivers/tcp/tests/netns`), over IPv4 and IPv6: the
//! bandwidth sweep with its consistency checks, and the ping-pong.
//!
//! Skipped, with a message, where namespaces cannot be made (not root, no
//! `ip`, a container without the capabilities).

#[path = "../../drivers/tcp/tests/netns/mod.rs"]
mod netns;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Only catches a hang.
const HANG: Duration = Duration::from_secs(120);

/// Steers a command by its arguments alone.
fn clean(cmd: &mut Command) -> &mut Command {
    for (k, _) in std::env::vars() {
        if k.starts_with("RINGFENCE_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// A `--listen` target on `host` at `ip` (any port), and the address its
/// first line names.
fn listen(host: &netns::Host, ip: &str) -> (Child, String) {
    let mut child = clean(&mut host.command(env!("CARGO_BIN_EXE_rfbench")))
        .args(["--driver", "tcp", "--listen", &format!("{ip}:0")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let addr = first
        .trim()
        .strip_prefix("rfbench: listening on ")
        .unwrap_or_else(|| panic!("first line `{first}`"))
        .to_string();
    (child, addr)
}

/// `rfbench` with `args` on `host`; its output once it exited (a hang is
/// killed and fails the test).
fn run_on(host: &netns::Host, args: &[&str]) -> Output {
    let child = clean(&mut host.command(env!("CARGO_BIN_EXE_rfbench")))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(HANG) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("rfbench {args:?} hung");
        }
    }
}

/// Waits for a `--listen` target to exit; its status and standard error.
fn finish(mut child: Child) -> (std::process::ExitStatus, String) {
    let mut stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut err = String::new();
        let _ = stderr.read_to_string(&mut err);
        let _ = tx.send(err);
    });
    let err = match rx.recv_timeout(HANG) {
        Ok(err) => err,
        Err(_) => {
            let _ = child.kill();
            panic!("the --listen target did not exit");
        }
    };
    (child.wait().unwrap(), err)
}

fn rows(table: &str) -> usize {
    table
        .lines()
        .filter(|l| l.starts_with(|c: char| c.is_ascii_digit()))
        .count()
}

#[test]
fn listen_on_one_host_and_connect_from_another() {
    let Some(pair) = netns::pair_or_skip("listen_on_one_host_and_connect_from_another") else {
        return;
    };
    for ip in [pair.a.ipv4.to_string(), format!("[{}]", pair.a.ipv6)] {
        // The sweep, every transfer checked by the target.
        let (target, addr) = listen(&pair.a, &ip);
        let out = run_on(
            &pair.b,
            &[
                "--driver",
                "tcp",
                "--connect",
                &addr,
                "--lanes",
                "4",
                "--max-block-size",
                "1M",
                "--max-batch-size",
                "4",
                "--num-iter",
                "20",
                "--warmup-iter",
                "2",
                "--check-consistency",
                "--notify",
            ],
        );
        let table = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{ip}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(rows(&table), 18 * 3, "{ip}:\n{table}");
        let (status, err) = finish(target);
        assert!(status.success(), "{ip}: {status}: {err}");

        // The ping-pong: the target connects back across the cable.
        let (target, addr) = listen(&pair.a, &ip);
        let out = run_on(
            &pair.b,
            &[
                "--driver",
                "tcp",
                "--connect",
                &addr,
                "--mode",
                "latency",
                "--max-block-size",
                "4K",
                "--num-iter",
                "200",
            ],
        );
        assert!(
            out.status.success(),
            "{ip}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(rows(&String::from_utf8_lossy(&out.stdout)), 10, "{ip}");
        let (status, err) = finish(target);
        assert!(status.success(), "{ip}: {status}: {err}");
    }
}
