//! `--listen` and `--connect`: the two sides of a tcp run started apart,
//! on one host or two, joined by a plain TCP socket (the bootstrap
//! socket) that carries what a child target gets on its pipes.
//!
//! # Protocol
//! Every message is a frame: a little-endian `u32` length, then that many
//! bytes of UTF-8 text (at most [`MAX_FRAME`]). The initiator speaks
//! first:
//!
//! | initiator sends | target answers |
//! |---|---|
//! | `rfbench-hello VERSION WINDOW_LEN` | `window CONNECTION`, or `err MESSAGE` |
//! | a child target's command (`prepare`, `verify`, `pong`) | its answers, as a child's |
//! | `done` | nothing: the target closes the socket and exits |
//!
//! `CONNECTION` is the string of [`Connection::encode`]: the target
//! worker's address (the tcp driver's own listening address and port, not
//! the bootstrap socket's), the packed key and the window. The target
//! sizes a new window for each hello; a frame over [`MAX_FRAME`], text that
//! is not UTF-8, an unknown version or a window over [`MAX_WINDOW`] ends
//! the session with an error on both sides. The target serves one
//! initiator's run, then exits; an initiator that goes away (the socket
//! closes) ends it too.

use crate::bench::cli::{Cli, DriverKind};
use crate::bench::error::BenchError;
use crate::bench::target::{ANSWER_TIMEOUT, Commands, Connection, TargetState, serve_commands};
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::mpsc;
use std::time::Duration;

/// The protocol's version, in the hello.
pub const VERSION: u32 = 1;
/// The largest frame either side accepts, in bytes.
pub const MAX_FRAME: u32 = 64 << 10;
/// The largest window an initiator may ask for (8 GiB).
pub const MAX_WINDOW: u64 = 8 << 30;
/// How long `--connect` tries to reach the target's bootstrap socket.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Writes one frame.
///
/// # Errors
/// The text is over [`MAX_FRAME`], or the socket failed.
pub fn write_frame(w: &mut impl Write, text: &str) -> std::io::Result<()> {
    let len = u32::try_from(text.len())
        .ok()
        .filter(|&n| n <= MAX_FRAME)
        .ok_or_else(|| std::io::Error::new(ErrorKind::InvalidInput, "frame over 64 KiB"))?;
    let mut frame = Vec::with_capacity(4 + text.len());
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(text.as_bytes());
    w.write_all(&frame)?;
    w.flush()
}

/// Reads one frame; `Ok(None)` when the socket closed between frames.
///
/// # Errors
/// The socket failed, closed inside a frame, timed out, or the frame is
/// over [`MAX_FRAME`] or not UTF-8 (`InvalidData`).
pub fn read_frame(r: &mut impl Read) -> std::io::Result<Option<String>> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < len.len() {
        match r.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let len = u32::from_le_bytes(len);
    if len > MAX_FRAME {
        return Err(std::io::Error::new(
            ErrorKind::InvalidData,
            format!("a frame of {len} B (at most {MAX_FRAME})"),
        ));
    }
    let mut text = vec![0u8; len as usize];
    r.read_exact(&mut text)?;
    String::from_utf8(text)
        .map(Some)
        .map_err(|_| std::io::Error::new(ErrorKind::InvalidData, "a frame that is not UTF-8"))
}

/// The hello's window length, checked.
fn parse_hello(line: &str) -> Result<usize, String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let ["rfbench-hello", version, len] = words[..] else {
        return Err(format!(
            "expected `rfbench-hello VERSION WINDOW_LEN`, got `{line}`"
        ));
    };
    match version.parse::<u32>() {
        Ok(VERSION) => {}
        _ => {
            return Err(format!(
                "protocol version `{version}`; this rfbench speaks {VERSION}"
            ));
        }
    }
    match len.parse::<u64>() {
        Ok(n) if (1..=MAX_WINDOW).contains(&n) => Ok(n as usize),
        _ => Err(format!(
            "window length `{len}`: expected 1 to {MAX_WINDOW} bytes"
        )),
    }
}

/// `--listen ADDR:PORT`: binds the bootstrap socket, prints `rfbench:
/// listening on ADDR:PORT` as the first line of standard output (the port
/// the kernel chose, for port 0), serves one initiator's run over a tcp
/// worker whose driver listens on the same IP (unless
/// `RINGFENCE_TCP_ADDR` says otherwise), then exits.
///
/// # Errors
/// The socket, the worker or the window cannot be set up, or the
/// initiator broke the protocol.
pub fn listen(cli: &Cli, addr: SocketAddr) -> Result<(), BenchError> {
    let listener = TcpListener::bind(addr).map_err(BenchError::io(format!("binding {addr}")))?;
    let bound = listener
        .local_addr()
        .map_err(BenchError::io("the bootstrap socket's address"))?;
    let worker = crate::bench::worker_at(DriverKind::Tcp, cli, Some(addr.ip()))?;
    let mut state = TargetState::new(worker, 4096, cli.corrupt_for_test)?;
    // The target carries out every request itself.
    state.start_core_thread()?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "rfbench: listening on {bound}")
            .and_then(|()| out.flush())
            .map_err(BenchError::io("writing to standard output"))?;
    }
    eprintln!(
        "rfbench target: run `rfbench --driver tcp --connect {bound}` (here or on another host); \
         serving one run"
    );
    let (socket, peer) = listener
        .accept()
        .map_err(BenchError::io("accepting an initiator"))?;
    drop(listener);
    eprintln!("rfbench target: initiator {peer}");
    serve_session(&mut state, socket)
}

/// Serves one initiator on `socket`: the hello, then commands until `done`
/// or the socket closes.
fn serve_session(state: &mut TargetState, socket: TcpStream) -> Result<(), BenchError> {
    let _ = socket.set_nodelay(true);
    let mut writer = socket
        .try_clone()
        .map_err(BenchError::io("cloning the bootstrap socket"))?;
    let mut reader = socket;
    let hello = match read_frame(&mut reader) {
        Ok(Some(line)) => line,
        Ok(None) => {
            return Err(BenchError::Bootstrap(
                "the initiator left before its hello".into(),
            ));
        }
        Err(e) => return Err(BenchError::Bootstrap(format!("reading the hello: {e}"))),
    };
    let answer = parse_hello(&hello).and_then(|len| {
        state.set_window(len).map_err(|e| e.to_string())?;
        state.connection().map_err(|e| e.to_string())
    });
    let conn = match answer {
        Ok(conn) => conn,
        Err(m) => {
            let _ = write_frame(&mut writer, &format!("err {m}"));
            return Err(BenchError::Bootstrap(m));
        }
    };
    write_frame(&mut writer, &format!("window {}", conn.encode()))
        .map_err(|e| BenchError::Bootstrap(format!("answering the hello: {e}")))?;

    // Frames become lines on a channel, as a child's standard input does;
    // `done`, the socket closing or a broken frame ends the channel.
    let (tx, commands) = mpsc::channel::<String>();
    let (broken_tx, broken) = mpsc::channel::<String>();
    std::thread::Builder::new()
        .name("rfbench-bootstrap-reader".into())
        .spawn(move || {
            loop {
                match read_frame(&mut reader) {
                    Ok(Some(line)) if line == "done" => return,
                    Ok(Some(line)) => {
                        if tx.send(line).is_err() {
                            return;
                        }
                    }
                    Ok(None) => {
                        let _ = broken_tx.send("the initiator closed the socket".into());
                        return;
                    }
                    Err(e) => {
                        let _ = broken_tx.send(format!("reading a command: {e}"));
                        return;
                    }
                }
            }
        })
        .map_err(BenchError::io("spawning the bootstrap reader"))?;
    serve_commands(state, &commands, &mut |line| write_frame(&mut writer, line))?;
    let _ = writer.shutdown(Shutdown::Both);
    match broken.try_recv() {
        Ok(m) => Err(BenchError::Bootstrap(m)),
        Err(_) => Ok(()),
    }
}

/// `--connect ADDR:PORT`: the initiator's end of the bootstrap socket, a
/// [`Target`](crate::bench::target::Target) whose commands go over it.
#[derive(Debug)]
pub struct SessionTarget {
    socket: TcpStream,
    connection: Connection,
}

impl SessionTarget {
    /// Connects to a `--listen` target at `peer` and says hello for `cli`'s
    /// window.
    ///
    /// # Errors
    /// The target cannot be reached, or refused the hello.
    pub fn connect(cli: &Cli, peer: &str) -> Result<SessionTarget, BenchError> {
        let addrs: Vec<SocketAddr> = peer
            .to_socket_addrs()
            .map_err(|e| BenchError::Usage(format!("--connect `{peer}`: {e}")))?
            .collect();
        let mut last = None;
        let mut socket = None;
        for a in &addrs {
            match TcpStream::connect_timeout(a, CONNECT_TIMEOUT) {
                Ok(s) => {
                    socket = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let socket = socket.ok_or_else(|| {
            BenchError::Bootstrap(format!(
                "connecting to `{peer}`: {}",
                last.map_or("no address".into(), |e| e.to_string())
            ))
        })?;
        let _ = socket.set_nodelay(true);
        socket
            .set_read_timeout(Some(ANSWER_TIMEOUT))
            .map_err(BenchError::io("setting the bootstrap socket's timeout"))?;
        let mut session = SessionTarget {
            socket,
            connection: Connection {
                address: vec![],
                rkey: vec![],
                base: 0,
                len: 0,
            },
        };
        session.send(&format!("rfbench-hello {VERSION} {}", cli.window_len()))?;
        let answer = session.answer()?;
        let conn = match answer.split_once(' ') {
            Some(("window", c)) => Connection::decode(c)
                .map_err(|_| BenchError::Bootstrap(format!("a malformed window `{c}`")))?,
            Some(("err", m)) => return Err(BenchError::Target(m.to_string())),
            _ => {
                return Err(BenchError::Bootstrap(format!(
                    "unexpected answer `{answer}` to the hello"
                )));
            }
        };
        session.connection = conn;
        Ok(session)
    }

    /// This host's address on the bootstrap socket: one the target can
    /// reach, where this side's tcp driver listens.
    ///
    /// # Errors
    /// The socket has no local address.
    pub fn local_ip(&self) -> Result<IpAddr, BenchError> {
        self.socket
            .local_addr()
            .map(|a| a.ip())
            .map_err(BenchError::io("the bootstrap socket's address"))
    }

    /// The target's bootstrap address.
    pub fn peer_addr(&self) -> String {
        self.socket
            .peer_addr()
            .map_or_else(|_| "?".into(), |a| a.to_string())
    }
}

impl Commands for SessionTarget {
    fn connection(&self) -> &Connection {
        &self.connection
    }

    fn send(&mut self, line: &str) -> Result<(), BenchError> {
        write_frame(&mut self.socket, line)
            .map_err(|e| BenchError::Bootstrap(format!("sending to the target: {e}")))
    }

    fn answer(&mut self) -> Result<String, BenchError> {
        match read_frame(&mut self.socket) {
            Ok(Some(line)) => Ok(line),
            Ok(None) => Err(BenchError::Target(
                "the --listen target closed the bootstrap socket; see its messages".into(),
            )),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                Err(BenchError::Hang(format!(
                    "the --listen target did not answer within {ANSWER_TIMEOUT:?}"
                )))
            }
            Err(e) => Err(BenchError::Bootstrap(format!(
                "reading from the target: {e}"
            ))),
        }
    }
}

impl Drop for SessionTarget {
    /// Says `done`: the target ends its run and exits.
    fn drop(&mut self) {
        let _ = write_frame(&mut self.socket, "done");
        let _ = self.socket.shutdown(Shutdown::Write);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_refuse_what_is_not_one() {
        let mut buf = Vec::new();
        write_frame(&mut buf, "prepare write 8 1 10").unwrap();
        write_frame(&mut buf, "").unwrap();
        let mut r = &buf[..];
        assert_eq!(
            read_frame(&mut r).unwrap().as_deref(),
            Some("prepare write 8 1 10")
        );
        assert_eq!(read_frame(&mut r).unwrap().as_deref(), Some(""));
        assert_eq!(read_frame(&mut r).unwrap(), None);

        let over = (MAX_FRAME + 1).to_le_bytes();
        assert_eq!(
            read_frame(&mut &over[..]).unwrap_err().kind(),
            ErrorKind::InvalidData
        );
        let not_utf8 = [2, 0, 0, 0, 0xff, 0xfe];
        assert_eq!(
            read_frame(&mut &not_utf8[..]).unwrap_err().kind(),
            ErrorKind::InvalidData
        );
        let cut = [9, 0, 0, 0, b'a'];
        assert_eq!(
            read_frame(&mut &cut[..]).unwrap_err().kind(),
            ErrorKind::UnexpectedEof
        );
        let cut_len = [9, 0];
        assert_eq!(
            read_frame(&mut &cut_len[..]).unwrap_err().kind(),
            ErrorKind::UnexpectedEof
        );
        assert!(write_frame(&mut Vec::new(), &"x".repeat(MAX_FRAME as usize + 1)).is_err());
    }

    #[test]
    fn hellos_are_checked() {
        assert_eq!(parse_hello("rfbench-hello 1 4096"), Ok(4096));
        assert_eq!(
            parse_hello(&format!("rfbench-hello 1 {MAX_WINDOW}")),
            Ok(MAX_WINDOW as usize)
        );
        for bad in [
            "",
            "hello",
            "rfbench-hello 1",
            "rfbench-hello 2 4096",
            "rfbench-hello x 4096",
            "rfbench-hello 1 0",
            "rfbench-hello 1 -1",
            "rfbench-hello 1 4096 extra",
        ] {
            assert!(parse_hello(bad).is_err(), "{bad}");
        }
        assert!(parse_hello(&format!("rfbench-hello 1 {}", MAX_WINDOW + 1)).is_err());
    }
}
