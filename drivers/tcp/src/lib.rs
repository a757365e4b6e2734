//! The tcp driver: one-sided RMA between workers on different hosts over
//! TCP, with every socket operation driven by one io_uring.
//!
//! # Model
//!
//! - **Lanes are connections.** An endpoint with N lanes has N TCP
//!   connections to the peer (default 1, for latency; more for bandwidth).
//!   Each lane is ordered: the target takes a lane's requests in the order
//!   they were sent and answers them in that order.
//! - **Both ways on one connection.** A worker that connects back to a
//!   worker which already has an endpoint to it takes that endpoint's
//!   connections for its own lanes, where they come from the address it
//!   connects to: each connection then carries requests both ways, and TCP's
//!   acknowledgements ride on data instead of travelling as segments of
//!   their own (a ping-pong's 4 segments per round trip become 2; 8-byte
//!   one-way latency 7.7 → 6.7 µs on loopback, A/B medians). On such a lane at most
//!   256 requests are in flight, room for the peer's answers is kept in
//!   the send batches, GET data goes straight from the window, and a PUT,
//!   NOTIFY or ATOMIC waits for the GETs before it on the lane, so that
//!   neither side's reader ever waits for room to answer while the other's
//!   does (see [`wire`], "Both ways on one connection"). Either side may
//!   close its endpoint first; the connection stays while the other uses
//!   it (BYE).
//! - **The target executes.** PUT, GET, atomics and NOTIFY are carried out
//!   by the target's own progress against its registered memory, after
//!   checking the registration id, its secret and the bounds. **The target
//!   must make progress** (a core thread does, or the application calls
//!   `progress`), or nothing it is sent completes.
//! - **Remote completion is the answer.** An operation completes when the
//!   target's answer arrives (an ACK, the GET data, the atomic's old
//!   value); a FLUSH of a set of lanes completes when every operation posted
//!   on them before it has been answered. NOTIFY arrives after the data
//!   posted before it on its lane (the engine orders lanes for it).
//! - **ACKs go out one round late.** The target's round that executes a
//!   PUT or NOTIFY returns without sending its (cumulative) ACK; its next
//!   progress round sends it, behind whatever the application posted in
//!   between. An application polling the window of a ping-pong sees the
//!   data as soon as `progress` returns, and its answer leaves before the
//!   ACK does (8-byte one-way latency 11.2 → 5.8 µs on loopback). GET
//!   data and atomic results are not held. A core thread never sleeps on
//!   a held ACK (`prepare_sleep` answers not now).
//! - **One doorbell per round.** `post` and `flush` only queue; `commit`
//!   starts each connection's batch with one `sendmsg` and submits
//!   everything with one `io_uring_enter` (none when nothing is pending).
//!   Receives are multishot over a provided-buffer ring; the ring's CQ
//!   eventfd is the driver's wake descriptor, so a sleeping core thread
//!   wakes on network traffic; it is read only when the core thread is
//!   about to sleep (`prepare_sleep`), never while it polls. Sockets are entered in the ring's
//!   fixed-file table (no descriptor lookup per request).
//! - **Busy receives while an answer is awaited.** A connection a lane has
//!   just posted on receives by one nonblocking `RECV` per round, inside
//!   the round's `io_uring_enter`, instead of the multishot receive, whose
//!   poll leaves an arrival to task work that only the next enter runs. A
//!   round whose receive found data does not receive again in its own
//!   commit (the application sees the data first). After 64 empty busy
//!   receives, or a full buffer (a stream), the multishot receive is back;
//!   meanwhile a core thread about to sleep is told not now. 8-byte one-way latency
//!   on loopback 6.8 → 5.7 µs, with the fixed files. In the round's
//!   `io_uring_enter` the receives come after the sends: the kernel runs
//!   entries in order, and a receive that cannot find the answer to what
//!   the round sends yet would only delay it (4.5 → 4.3 µs, A/B).
//! - **Receives run in the polling thread.** The ring is set up with
//!   cooperative task running: the kernel does not interrupt the thread
//!   (an IPI) to finish a receive, it flags the ring, and `poll` answers the
//!   flag with an `io_uring_enter` that runs the work (and submits what
//!   the round has queued so far). A round that receives and then sends
//!   thus enters the kernel twice, an idle round never. The interrupt cost
//!   more than half of an 8-byte PUT's one-way latency (29 µs against 12
//!   µs before the ACK change, `cargo bench --bench tcp -- put_lat`).
//! - **Failure.** A reset, a peer that exits, or a path that goes away
//!   (noticed within the configured timeout through `TCP_USER_TIMEOUT` and
//!   keepalive) fails the endpoint: every request on it completes once,
//!   with an error; the worker's other endpoints go on. A malformed frame
//!   closes its connection, and a lane's endpoint fails with
//!   [`Status::Transport`]; nothing
//!   outside a registered window is ever written.
//!
//! # Addresses
//!
//! The worker address carries the listening address and port (IPv4 or
//! IPv6) and a random instance number. The listening address is
//! `127.0.0.1` on a free port unless set with [`TcpBuilder::addr`] or the
//! environment variable `RINGFENCE_TCP_ADDR` (`IP` or `IP:PORT`; an IPv6
//! address in brackets with a port: `[fd00::1]:7000`). Binding the
//! unspecified address (`0.0.0.0`, `::`) is refused: peers need an
//! address they can reach.
//!
//! # Wire protocol
//!
//! See [`wire`]: a fixed 56-byte header per frame, versioned, decoded with
//! checks on every field.
//!
//! # Unsafe code
//!
//! Confined to the private module `sys`: the io_uring requests that hand
//! the kernel pointers (send batches, connect addresses, the
//! provided-buffer ring, the window a large PUT is received into), raw
//! copies and atomics on an operation's local memory and on registered
//! windows, and adopting the descriptors accepts return. The rest of the
//! crate denies unsafe code and reaches all of it through safe functions,
//! with one exception: `Tcp::post`, which the `Driver` trait declares
//! `unsafe`, is allowed unsafe code to turn the engine's promise about
//! the operation's memory into the value `sys` reads and writes that
//! memory through (`sys::mem::Local`, made by an `unsafe fn`). Some of
//! `sys`'s safe functions rest on lifetimes the driver keeps outside it (a
//! connection is freed only once no request names it; a deregistered
//! window's quiesce waits while a connection still reaches it); `sys`'s
//! documentation names them.
#![deny(unsafe_code, missing_docs)]

mod driver;
mod lane;
pub mod stream;
// The only module allowed unsafe code (see the crate docs, "Unsafe
// code").
#[allow(unsafe_code)]
mod sys;
mod target;
pub mod wire;

pub use driver::Tcp;

use ringfence::{DriverError, Status};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

/// The largest PUT, GET or NOTIFY, in bytes (1 GiB).
pub const MAX_LEN: u32 = 1 << 30;

/// The driver's settings; see [`TcpBuilder`].
#[derive(Debug, Clone)]
pub(crate) struct Config {
    addr: SocketAddr,
    timeout: Duration,
    ring_entries: u32,
    recv_buffers: u16,
    recv_buffer_size: u32,
    send_buffer: usize,
    depth: usize,
    max_lanes: u8,
    direct_min: u32,
}

/// Builds a [`Tcp`] driver.
#[derive(Debug, Clone)]
pub struct TcpBuilder {
    config: Config,
    from_env: bool,
}

impl Default for TcpBuilder {
    fn default() -> Self {
        TcpBuilder {
            config: Config {
                addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
                timeout: Duration::from_secs(10),
                ring_entries: 512,
                recv_buffers: 64,
                recv_buffer_size: 64 << 10,
                send_buffer: 128 << 10,
                depth: 1024,
                max_lanes: ringfence::MAX_LANES,
                direct_min: 256 << 10,
            },
            from_env: true,
        }
    }
}

impl TcpBuilder {
    /// Listens on `addr` (port 0: any free port). Overrides
    /// `RINGFENCE_TCP_ADDR`.
    pub fn addr(mut self, addr: SocketAddr) -> Self {
        self.config.addr = addr;
        self.from_env = false;
        self
    }

    /// Ignores `RINGFENCE_TCP_ADDR`.
    pub fn ignore_env(mut self) -> Self {
        self.from_env = false;
        self
    }

    /// How long a peer may leave sent data unacknowledged, or an idle
    /// connection unanswered by keepalive probes, before its endpoint fails
    /// (default 10 s; whole seconds, at least 1).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.config.timeout = timeout;
        self
    }

    /// Requests in flight per lane before `post` says NO_RESOURCE (default
    /// 1024).
    pub fn depth(mut self, depth: usize) -> Self {
        self.config.depth = depth;
        self
    }

    /// Receive buffers shared by every connection: `count` (a power of
    /// two, at most 32768) of `size` bytes (default 64 of 64 KiB).
    pub fn recv_buffers(mut self, count: u16, size: u32) -> Self {
        self.config.recv_buffers = count;
        self.config.recv_buffer_size = size;
        self
    }

    /// Staging bytes per connection and send batch (two batches per
    /// connection; default 128 KiB, at least about 19 KiB): frame headers,
    /// small payloads, and GET data a target sends.
    pub fn send_buffer(mut self, bytes: usize) -> Self {
        self.config.send_buffer = bytes;
        self
    }

    /// A PUT payload with at least `bytes` still to come is received
    /// straight into the target's window instead of through the receive
    /// buffers (default 256 KiB; `u32::MAX`: never).
    pub fn direct_recv_min(mut self, bytes: u32) -> Self {
        self.config.direct_min = bytes;
        self
    }

    /// Builds the driver: an io_uring, the receive buffers, and a listening
    /// socket with its multishot accept.
    ///
    /// # Errors
    /// Bad settings, `RINGFENCE_TCP_ADDR` malformed, or io_uring or the
    /// socket could not be set up.
    pub fn build(self) -> Result<Tcp, DriverError> {
        let mut config = self.config;
        if self.from_env
            && let Ok(value) = std::env::var("RINGFENCE_TCP_ADDR")
        {
            config.addr = parse_addr(&value).ok_or_else(|| {
                DriverError::new(
                    Status::InvalidArgument,
                    format!("RINGFENCE_TCP_ADDR={value:?}: expected IP or IP:PORT"),
                )
            })?;
        }
        let invalid = |what: &str| {
            Err(DriverError::new(
                Status::InvalidArgument,
                format!("tcp: {what}"),
            ))
        };
        if config.addr.ip().is_unspecified() {
            return invalid("the listening address must be one peers can reach, not 0.0.0.0 or ::");
        }
        if !config.recv_buffers.is_power_of_two() || config.recv_buffers > 1 << 15 {
            return invalid("receive buffer count must be a power of two up to 32768");
        }
        if config.recv_buffer_size < 4096 {
            return invalid("receive buffers must be at least 4096 bytes");
        }
        if config.send_buffer < driver::MIN_SEND_BUFFER {
            return invalid(&format!(
                "send buffers must be at least {} bytes",
                driver::MIN_SEND_BUFFER
            ));
        }
        if config.depth == 0 {
            return invalid("depth must be at least 1");
        }
        Tcp::with_config(config)
    }
}

/// `IP`, `IP:PORT` or `[IPv6]:PORT`.
fn parse_addr(s: &str) -> Option<SocketAddr> {
    let s = s.trim();
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Some(addr);
    }
    s.parse::<IpAddr>().ok().map(|ip| SocketAddr::new(ip, 0))
}

impl Tcp {
    /// A driver with the default settings, listening where
    /// `RINGFENCE_TCP_ADDR` says (default `127.0.0.1`, any port).
    ///
    /// # Errors
    /// As [`TcpBuilder::build`].
    pub fn new() -> Result<Tcp, DriverError> {
        TcpBuilder::default().build()
    }

    /// A builder for the settings.
    pub fn builder() -> TcpBuilder {
        TcpBuilder::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_addresses_parse() {
        assert_eq!(parse_addr("10.0.0.1"), Some("10.0.0.1:0".parse().unwrap()));
        assert_eq!(
            parse_addr("10.0.0.1:7000"),
            Some("10.0.0.1:7000".parse().unwrap())
        );
        assert_eq!(parse_addr("::1"), Some("[::1]:0".parse().unwrap()));
        assert_eq!(
            parse_addr("[fd00::1]:7000"),
            Some("[fd00::1]:7000".parse().unwrap())
        );
        assert_eq!(parse_addr("host:1"), None);
        assert_eq!(parse_addr(""), None);
    }

    #[test]
    fn bad_settings_are_refused() {
        let unspecified = Tcp::builder().addr("0.0.0.0:0".parse().unwrap()).build();
        assert_eq!(unspecified.unwrap_err().status, Status::InvalidArgument);
        let buffers = Tcp::builder().ignore_env().recv_buffers(3, 65536).build();
        assert_eq!(buffers.unwrap_err().status, Status::InvalidArgument);
        let depth = Tcp::builder().ignore_env().depth(0).build();
        assert_eq!(depth.unwrap_err().status, Status::InvalidArgument);
        // Below the room a both-ways connection keeps for answers.
        let send = Tcp::builder().ignore_env().send_buffer(16 << 10).build();
        assert_eq!(send.unwrap_err().status, Status::InvalidArgument);
        assert!(
            Tcp::builder()
                .ignore_env()
                .send_buffer(32 << 10)
                .build()
                .is_ok()
        );
    }
}
