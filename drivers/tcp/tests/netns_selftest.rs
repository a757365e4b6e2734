//! The two-host harness (`netns`) on its own, with plain std sockets: TCP
//! between the hosts over IPv4 and IPv6 (and the server sees the client's
//! address, so the bytes crossed the veth cable), the hosts' isolation from
//! each other's loopback and from the root namespace, a cable unplugged
//! mid-connection and plugged back, and namespace cleanup.
//!
//! Each test runs the same small agent (below) in one or both namespaces,
//! as a child re-executing this test binary, and drives it line by line
//! over the control channel. Without root or namespaces, each test prints
//! why it is skipped and passes.

mod netns;

use netns::{HostPair, HostProcess};
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::Duration;

/// Connects that must succeed get this long: only catches hangs (a dropped
/// SYN is retransmitted after one second).
const CONNECT_HANG: Duration = Duration::from_secs(30);

/// Connects that must fail get this long. It only detects failure: an
/// unreachable network fails at once, a black hole by this timeout.
const CONNECT_FAILS: Duration = Duration::from_secs(2);

/// Reads on test connections: only catches hangs.
const READ_HANG: Duration = Duration::from_secs(30);

/// The echo exchange moves data in chunks of this size, written and read
/// back in turn, so neither side's socket buffers can fill up and block.
const CHUNK: usize = 16 << 10;

// ---------------------------------------------------------------- the agent

/// The child's part: serves commands from the parent, one line each, until
/// the parent closes the channel.
///
/// - `listen IP` binds a TCP listener on port 0 of `IP` and answers
///   `port N`. Every connection it accepts gets the peer's address as a
///   first line, then an echo of everything it sends.
/// - `connect ADDR MS` connects to `ADDR` within `MS` milliseconds and reads
///   the greeting; answers `connected ID PEER` (`PEER` being the address the
///   server saw) or `failed ERROR`.
/// - `echo ID BYTES` sends `BYTES` of a pattern on connection `ID` and checks
///   the echo; answers `echoed` or `failed ERROR`.
fn agent() {
    let mut control = netns::Control::from_parent();
    let mut streams: Vec<TcpStream> = Vec::new();
    while let Some(line) = control.recv() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let answer = match words.as_slice() {
            ["listen", ip] => listen(ip.parse().expect("listen IP")),
            ["connect", addr, ms] => {
                let addr: SocketAddr = addr.parse().expect("connect ADDR");
                let timeout = Duration::from_millis(ms.parse().expect("connect MS"));
                match connect(addr, timeout) {
                    Ok((stream, seen)) => {
                        streams.push(stream);
                        format!("connected {} {seen}", streams.len() - 1)
                    }
                    Err(e) => format!("failed {e}"),
                }
            }
            ["echo", id, bytes] => {
                let stream = &mut streams[id.parse::<usize>().expect("echo ID")];
                match echo(stream, bytes.parse().expect("echo BYTES")) {
                    Ok(()) => "echoed".to_owned(),
                    Err(e) => format!("failed {e}"),
                }
            }
            _ => panic!("agent: unknown command {line:?}"),
        };
        control.send(&answer);
    }
}

fn listen(ip: IpAddr) -> String {
    let listener = TcpListener::bind((ip, 0)).expect("binding the listener");
    let port = listener.local_addr().expect("listener address").port();
    // Runs until the process exits (when the parent closes the channel).
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            std::thread::spawn(move || {
                // Errors end this connection only: a peer may vanish.
                let _ = serve(stream);
            });
        }
    });
    format!("port {port}")
}

/// Greets with the peer's address, then echoes until the peer shuts down.
fn serve(mut stream: TcpStream) -> io::Result<()> {
    writeln!(stream, "{}", stream.peer_addr()?)?;
    let mut reader = stream.try_clone()?;
    io::copy(&mut reader, &mut stream)?;
    Ok(())
}

/// Connects and reads the server's greeting: the address it saw us from.
fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<(TcpStream, SocketAddr)> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(READ_HANG))?;
    // Byte by byte: nothing after the newline may be consumed here.
    let mut greeting = Vec::new();
    let mut byte = [0u8];
    while byte[0] != b'\n' {
        stream.read_exact(&mut byte)?;
        greeting.push(byte[0]);
    }
    let seen = String::from_utf8_lossy(&greeting)
        .trim()
        .parse()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("greeting: {e}")))?;
    Ok((stream, seen))
}

fn echo(stream: &mut TcpStream, bytes: usize) -> io::Result<()> {
    let mut back = vec![0u8; CHUNK];
    let mut offset = 0;
    while offset < bytes {
        let len = CHUNK.min(bytes - offset);
        let chunk: Vec<u8> = (offset..offset + len)
            .map(|i| (i % 251) as u8 ^ (i >> 12) as u8)
            .collect();
        stream.write_all(&chunk)?;
        stream.read_exact(&mut back[..len])?;
        if back[..len] != chunk[..] {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("echo differs in the chunk at byte {offset}"),
            ));
        }
        offset += len;
    }
    Ok(())
}

// ---------------------------------------------------------------- the parent's side

/// Starts the agent in both hosts for the test `test`.
fn agents(pair: &HostPair, test: &str) -> (HostProcess, HostProcess) {
    let a = pair
        .a
        .spawn_role(test, "agent")
        .expect("starting the agent in a");
    let b = pair
        .b
        .spawn_role(test, "agent")
        .expect("starting the agent in b");
    (a, b)
}

/// `listen IP` on `agent`: the listening address.
fn listen_on(agent: &mut HostProcess, ip: IpAddr) -> SocketAddr {
    let answer = agent.call(&format!("listen {ip}"));
    let port = answer
        .strip_prefix("port ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("listen {ip}: {answer}"));
    SocketAddr::new(ip, port)
}

/// `connect` that must succeed: the connection's id and the address the
/// server saw.
fn connect_ok(agent: &mut HostProcess, addr: SocketAddr) -> (usize, SocketAddr) {
    let answer = agent.call(&format!("connect {addr} {}", CONNECT_HANG.as_millis()));
    let mut words = answer.split_whitespace();
    match (words.next(), words.next(), words.next()) {
        (Some("connected"), Some(id), Some(seen)) => (id.parse().unwrap(), seen.parse().unwrap()),
        _ => panic!("connect {addr}: {answer}"),
    }
}

/// `connect` that must fail: the error.
fn connect_fails(agent: &mut HostProcess, addr: SocketAddr) -> String {
    let answer = agent.call(&format!("connect {addr} {}", CONNECT_FAILS.as_millis()));
    match answer.strip_prefix("failed ") {
        Some(error) => error.to_owned(),
        None => panic!("connect {addr} should have failed: {answer}"),
    }
}

fn echo_ok(agent: &mut HostProcess, id: usize, bytes: usize) {
    let answer = agent.call(&format!("echo {id} {bytes}"));
    assert_eq!(answer, "echoed", "echo of {bytes} bytes on connection {id}");
}

/// The body of the exchange tests: b connects to a server on a at the
/// address `pick` chooses, the server sees b's address of that family, and
/// 1 MiB is echoed.
fn exchange(test: &str, pick: fn(&netns::Host) -> IpAddr) {
    if netns::role().is_some() {
        return agent();
    }
    let Some(pair) = netns::pair_or_skip(test) else {
        return;
    };
    let (mut a, mut b) = agents(&pair, test);
    let server = listen_on(&mut a, pick(&pair.a));
    let (id, seen) = connect_ok(&mut b, server);
    assert_eq!(seen.ip(), pick(&pair.b), "the server sees b's address");
    echo_ok(&mut b, id, 1 << 20);
    b.join();
    a.join();
}

// ---------------------------------------------------------------- tests

#[test]
fn tcp_between_hosts_over_ipv4() {
    exchange("tcp_between_hosts_over_ipv4", |host| host.ipv4.into());
}

#[test]
fn tcp_between_hosts_over_ipv6() {
    exchange("tcp_between_hosts_over_ipv6", |host| host.ipv6.into());
}

#[test]
fn hosts_are_isolated() {
    if netns::role().is_some() {
        return agent();
    }
    let test = "hosts_are_isolated";
    let Some(pair) = netns::pair_or_skip(test) else {
        return;
    };
    let (mut a, mut b) = agents(&pair, test);
    let a_loopback = listen_on(&mut a, "127.0.0.1".parse().unwrap());
    let a_server = listen_on(&mut a, pair.a.ipv4.into());

    // a reaches its own loopback listener; b's loopback is another one,
    // where nothing listens.
    connect_ok(&mut a, a_loopback);
    let error = connect_fails(&mut b, a_loopback);
    assert!(error.contains("refused"), "b to its own loopback: {error}");

    // The root namespace owns none of the hosts' addresses...
    for ip in [
        IpAddr::from(pair.a.ipv4),
        pair.a.ipv6.into(),
        pair.b.ipv4.into(),
        pair.b.ipv6.into(),
    ] {
        let error = TcpListener::bind((ip, 0)).expect_err("binding a host's address in the root");
        assert_eq!(
            error.kind(),
            io::ErrorKind::AddrNotAvailable,
            "{ip}: {error}"
        );
    }
    // ...and has no cable to them: a's server is out of its reach.
    let result = TcpStream::connect_timeout(&a_server, CONNECT_FAILS);
    assert!(result.is_err(), "the root namespace reached {a_server}");

    // While b does reach it.
    let (_, seen) = connect_ok(&mut b, a_server);
    assert_eq!(seen.ip(), IpAddr::from(pair.b.ipv4));
    b.join();
    a.join();
}

#[test]
fn link_down_and_up_mid_connection() {
    if netns::role().is_some() {
        return agent();
    }
    let test = "link_down_and_up_mid_connection";
    let Some(pair) = netns::pair_or_skip(test) else {
        return;
    };
    let (mut a, mut b) = agents(&pair, test);
    let server4 = listen_on(&mut a, pair.a.ipv4.into());
    let server6 = listen_on(&mut a, pair.a.ipv6.into());
    let (old, _) = connect_ok(&mut b, server4);
    echo_ok(&mut b, old, 64 << 10);

    pair.set_link(false).expect("unplugging the cable");
    let error = connect_fails(&mut b, server4);
    eprintln!("link down: connect to {server4}: {error}");
    let error = connect_fails(&mut b, server6);
    eprintln!("link down: connect to {server6}: {error}");

    pair.set_link(true).expect("plugging the cable back");
    // The connection, idle while the cable was out, carries on.
    echo_ok(&mut b, old, 64 << 10);
    // New connections work again, over both families.
    for server in [server4, server6] {
        let (id, _) = connect_ok(&mut b, server);
        echo_ok(&mut b, id, 64 << 10);
    }
    b.join();
    a.join();
}

#[test]
fn dropping_the_pair_deletes_its_namespaces() {
    if netns::role().is_some() {
        return agent();
    }
    let Some(pair) = netns::pair_or_skip("dropping_the_pair_deletes_its_namespaces") else {
        return;
    };
    let names = [pair.a.netns.clone(), pair.b.netns.clone()];
    let listed = |name: &str| {
        let out = std::process::Command::new("ip")
            .args(["netns", "list"])
            .output()
            .expect("ip netns list");
        assert!(out.status.success(), "ip netns list: {out:?}");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|line| line.split_whitespace().next() == Some(name))
    };
    for name in &names {
        assert!(listed(name), "{name} exists while the pair lives");
    }
    // A program runs inside and sees the host's interface.
    let out = pair
        .a
        .command("ip")
        .args(["-o", "addr", "show", "dev", &pair.a.ifname])
        .output()
        .expect("ip netns exec");
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains(&pair.a.ipv4.to_string()));

    drop(pair);
    for name in &names {
        assert!(!listed(name), "{name} is gone after the drop");
        assert!(!Path::new("/run/netns").join(name).exists());
    }
}
