//! Connecting endpoints: the driver runs the handshake; the engine queues
//! what is submitted meanwhile and starts it once the endpoint is up.

use super::*;

impl Engine {
    /// Starts connecting through driver `d` to the peer whose address part
    /// is `part`, with `lanes` lanes, and adds the endpoint at once: up if
    /// the driver finished inside the call, else connecting until its
    /// handshake completes through `poll` (`connect_done`). Nothing here
    /// waits for the peer.
    ///
    /// # Errors
    /// The driver refused at once (a malformed address, a peer known
    /// unreachable); no endpoint is added.
    pub(crate) fn connect(&mut self, d: usize, part: &[u8], lanes: u8) -> Result<u32, DriverError> {
        // The endpoint's index is known before it exists: the engine lock
        // is held, and endpoints are only ever appended.
        let e = self.endpoints.len() as u64;
        let (driver_ep, pending) =
            match self.drivers[d].connect(part, lanes, Token(CONNECT_TOKEN | e))? {
                Connect::Done(ep) => (ep, false),
                Connect::InFlight(ep) => (ep, true),
            };
        let mut ep = Endpoint::new(d as u8, driver_ep.0, lanes);
        ep.set(CONNECTING, pending);
        Ok(self.add_endpoint(ep))
    }

    /// The handshake of endpoint `e` finished with `result`. Up: what
    /// queued meanwhile is dispatched (scheduled, never run from here, R19).
    /// Failed: the endpoint fails, and everything queued completes with
    /// the error in FIFO order (R20, R32). An endpoint closed or failed
    /// meanwhile ignores it: its driver reports the pending connect after
    /// `disconnect` too.
    pub(super) fn connect_done(&mut self, e: usize, result: Result<u32, Status>) {
        let Some(ep) = self.endpoints.get_mut(e) else {
            self.stray_completions += 1;
            return;
        };
        if !ep.is_connecting() {
            if !matches!(ep.state, EpState::Failed | EpState::Closed) {
                self.stray_completions += 1;
            }
            return;
        }
        match result {
            Ok(_) => {
                ep.set(CONNECTING, false);
                tracing::debug!(endpoint = e, "connected");
                self.schedule(e);
            }
            Err(status) => {
                tracing::debug!(endpoint = e, %status, "connect failed");
                self.fail_endpoint(e, status);
            }
        }
    }

    /// The public state of endpoint `e`, if it exists.
    pub(crate) fn endpoint_state(&self, e: usize) -> Option<crate::EndpointState> {
        self.endpoints.get(e).map(Endpoint::public_state)
    }
}
