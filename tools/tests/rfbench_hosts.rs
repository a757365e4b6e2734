//! `rfbench --driver tcp` between two hosts: `--listen` in one network
//! namespace, `--connect` in another, joined by a veth pair (the tcp
//! driver's harness, `drivers/tcp/tests/netns`), over IPv4 and IPv6: the
//! bandwidth sweep with its consistency checks, and the ping-pong.
//!
//! Skipped, with a message, where namespaces cannot be made (not root, no
//! `ip`, a container without the capabilities).

#[path = "../../drivers/tcp/tests/netns/mod.rs"]
mod netns;

mod common;

use common::{HANG, clean, finish};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;

/// A `--listen` target on `host` at `ip` (any port), and the address its
/// first line names.
fn listen(host: &netns::Host, ip: &str) -> (Child, String) {
    common::listening(host.command(env!("CARGO_BIN_EXE_rfbench")).args([
        "--driver",
        "tcp",
        "--listen",
        &format!("{ip}:0"),
    ]))
}

/// `rfbench` with `args` on `host`, which must succeed; its standard
/// output once it exited (a hang is killed and fails the test).
fn run_on(host: &netns::Host, args: &[&str]) -> String {
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
    let out = match rx.recv_timeout(HANG) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("rfbench {args:?} hung");
        }
    };
    assert!(
        out.status.success(),
        "rfbench {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
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
        assert_eq!(rows(&out), 18 * 3, "{ip}:\n{out}");
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
        assert_eq!(rows(&out), 10, "{ip}:\n{out}");
        let (status, err) = finish(target);
        assert!(status.success(), "{ip}: {status}: {err}");
    }
}
