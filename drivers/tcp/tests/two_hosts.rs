//! Two hosts: a target worker in one network namespace and an initiator in
//! another, joined by a veth pair (see `netns`). Each side runs in its own
//! process with its core thread on. Data moves between them; then the link
//! goes down mid-stream, and every outstanding request must complete with
//! an error within the driver's timeout, with nothing hanging.
//!
//! Skipped, with a message, where namespaces cannot be made (not root, no
//! `ip`, a container without the capabilities).

mod netns;

use ringfence::{Cqe, EndpointState, Worker};
use ringfence_ring::{FenceMode, RemoteBuf, Sqe};
use ringfence_tcp::Tcp;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

const WINDOW: usize = 16 << 20;
/// The driver's timeout for a dead path (TCP_USER_TIMEOUT, keepalive).
const TIMEOUT: Duration = Duration::from_secs(2);

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64).wrapping_mul(131).wrapping_add(seed) as u8)
        .collect()
}

fn worker(ip: IpAddr) -> Worker {
    let tcp = Tcp::builder()
        .addr(SocketAddr::new(ip, 0))
        .timeout(TIMEOUT)
        .build()
        .unwrap();
    let mut w = Worker::builder()
        .driver(tcp)
        .ring_entries(1024, 4096)
        .requests(4096)
        .ignore_env()
        .build()
        .unwrap();
    w.start_core_thread(None).unwrap();
    w
}

/// The target's process: a window; answers `check SEED LEN` (whether the
/// window holds `pattern(LEN, SEED)`) until the channel closes.
fn target_role(ip: IpAddr) {
    let mut control = netns::Control::from_parent();
    let w = worker(ip);
    let window = w.alloc_registered(WINDOW).unwrap();
    let key = w.pack_rkey(window.handle()).unwrap();
    control.send(&format!(
        "{} {} {}",
        hex(w.address()),
        hex(&key),
        window.addr()
    ));
    while let Some(line) = control.recv() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["check", seed, len] => {
                let len: usize = len.parse().unwrap();
                let mut got = vec![0u8; len];
                window.read(0, &mut got);
                let ok = got == pattern(len, seed.parse().unwrap());
                control.send(if ok { "ok" } else { "mismatch" });
            }
            _ => control.send("unknown"),
        }
    }
}

/// The initiator's process: `connect ADDRESS KEY WINDOW`, `put SEED LEN`
/// (one PUT and a FLUSH, answered `ok`), `stream` (answers `streaming`
/// once PUTs flow, then keeps them flowing until they fail; answers
/// `failed OUTSTANDING SECONDS` when every request has completed).
fn initiator_role(ip: IpAddr) {
    let mut control = netns::Control::from_parent();
    let w = worker(ip);
    let mut qp = w.create_queue().unwrap();
    let src = w.alloc_registered(WINDOW).unwrap();
    let mut target = None;
    let reap_until = |qp: &mut ringfence::QueuePair, n: usize| -> Vec<Cqe> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut out = Vec::new();
        while out.len() < n {
            let mut batch = [Cqe::default(); 64];
            let k = qp.wait_cqe(Some(Duration::from_millis(100))).unwrap();
            if k {
                let got = qp.reap(&mut batch).unwrap();
                out.extend_from_slice(&batch[..got]);
            }
            assert!(
                Instant::now() < deadline,
                "{} of {n} completions",
                out.len()
            );
        }
        out
    };
    while let Some(line) = control.recv() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["connect", address, key, window] => {
                let ep = w.connect_lanes(&unhex(address), &[("tcp", 2)]).unwrap();
                let rkey = w.unpack_rkey(ep, &unhex(key)).unwrap();
                let deadline = Instant::now() + Duration::from_secs(30);
                while w.endpoint_state(ep).unwrap() == EndpointState::Connecting {
                    assert!(Instant::now() < deadline, "connect hung");
                    std::thread::yield_now();
                }
                target = Some((ep, rkey, window.parse::<u64>().unwrap()));
                control.send(&format!("{:?}", w.endpoint_state(ep).unwrap()));
            }
            ["put", seed, len] => {
                let (ep, rkey, addr) = target.unwrap();
                let len: usize = len.parse().unwrap();
                src.write(0, &pattern(len, seed.parse().unwrap()));
                let remote = RemoteBuf {
                    rkey: rkey.as_raw(),
                    addr,
                };
                qp.push_batch(&[
                    Sqe::put(ep.as_raw(), src.local(0), remote, len as u32).with_user_data(1),
                    Sqe::flush(ep.as_raw()).with_user_data(2),
                ])
                .unwrap();
                qp.submit();
                let cqes = reap_until(&mut qp, 2);
                let ok = cqes.iter().all(|c| c.res >= 0);
                control.send(if ok { "ok" } else { "failed" });
            }
            ["stream"] => {
                let (ep, rkey, addr) = target.unwrap();
                let remote = RemoteBuf {
                    rkey: rkey.as_raw(),
                    addr,
                };
                let put = Sqe::put(ep.as_raw(), src.local(0), remote, 256 << 10);
                let mut outstanding = 0usize;
                let mut completed_ok = 0u64;
                let mut announced = false;
                let mut failed_at = None;
                let deadline = Instant::now() + Duration::from_secs(120);
                loop {
                    // Keep up to 32 PUTs in flight while the endpoint lives.
                    while failed_at.is_none() && outstanding < 32 {
                        if qp.push(put.with_user_data(3)).is_err() {
                            break;
                        }
                        outstanding += 1;
                    }
                    qp.submit();
                    let mut batch = [Cqe::default(); 64];
                    if qp.wait_cqe(Some(Duration::from_millis(50))).unwrap() {
                        let n = qp.reap(&mut batch).unwrap();
                        for c in &batch[..n] {
                            outstanding -= 1;
                            if c.res >= 0 {
                                completed_ok += 1;
                            } else if failed_at.is_none() {
                                failed_at = Some(Instant::now());
                            }
                        }
                    }
                    if !announced && completed_ok >= 64 {
                        announced = true;
                        control.send("streaming");
                    }
                    if failed_at.is_some() && outstanding == 0 {
                        break;
                    }
                    assert!(
                        Instant::now() < deadline,
                        "{outstanding} requests never completed"
                    );
                }
                let state = w.endpoint_state(ep).unwrap();
                assert!(matches!(state, EndpointState::Failed(_)), "{state:?}");
                // A new request on the failed endpoint fails at once.
                qp.push(put.with_user_data(4)).unwrap();
                qp.push(Sqe::fence(ep.as_raw(), FenceMode::COMPLETE).with_user_data(5))
                    .unwrap();
                qp.submit();
                let cqes = reap_until(&mut qp, 2);
                assert!(
                    cqes.iter().any(|c| c.user_data == 4 && c.res < 0),
                    "{cqes:?}"
                );
                control.send(&format!("failed {completed_ok}"));
            }
            _ => control.send("unknown"),
        }
    }
}

fn run_two_hosts(test: &str, v6: bool) {
    let role_ip = |host: &netns::Host| -> IpAddr {
        if v6 {
            host.ipv6.into()
        } else {
            host.ipv4.into()
        }
    };
    if let Some(role) = netns::role() {
        // "ROLE IP": the role, and the address of the host it runs on.
        let (role, ip) = role.split_once(' ').expect("role and address");
        let ip: IpAddr = ip.parse().unwrap();
        match role {
            "target" => target_role(ip),
            "initiator" => initiator_role(ip),
            other => panic!("unknown role {other}"),
        }
        return;
    }
    let Some(pair) = netns::pair_or_skip(test) else {
        return;
    };
    let mut target = pair
        .a
        .spawn_role(test, &format!("target {}", role_ip(&pair.a)))
        .unwrap();
    let mut initiator = pair
        .b
        .spawn_role(test, &format!("initiator {}", role_ip(&pair.b)))
        .unwrap();
    let hello = target.control.recv().expect("the target's address");
    let state = initiator.call(&format!("connect {hello}"));
    assert_eq!(state, "Connected");
    for (seed, len) in [(1u64, 1usize), (2, 4096), (3, 1 << 20), (4, WINDOW)] {
        assert_eq!(initiator.call(&format!("put {seed} {len}")), "ok");
        assert_eq!(
            target.call(&format!("check {seed} {len}")),
            "ok",
            "{len} bytes"
        );
    }
    assert_eq!(initiator.call("stream"), "streaming");
    let down = Instant::now();
    pair.set_link(false).unwrap();
    let answer = initiator.control.recv().expect("the initiator's verdict");
    let took = down.elapsed();
    assert!(answer.starts_with("failed "), "{answer}");
    // Only catches a missing timeout (TCP alone would retransmit for
    // many minutes); the figure itself is printed.
    assert!(
        took < Duration::from_secs(60),
        "the dead link took {took:?} to fail the endpoint"
    );
    eprintln!("{test}: link down, every request failed after {took:?} ({answer})");
    initiator.join();
    target.join();
}

#[test]
fn two_hosts_ipv4_data_then_link_down() {
    run_two_hosts("two_hosts_ipv4_data_then_link_down", false);
}

#[test]
fn two_hosts_ipv6_data_then_link_down() {
    run_two_hosts("two_hosts_ipv6_data_then_link_down", true);
}
