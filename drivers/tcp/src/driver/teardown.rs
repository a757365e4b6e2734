//! Teardown: which connections hold a registration's window, quiescing
//! one key or all of them (canceling what still uses them, closing
//! connections that do not let go in time), and the completions of a
//! teardown in progress.

use crate::sys::requests::{self, Cqe, Tag};
use crate::wire::Opcode;
use io_uring::cqueue;
use ringfence::{Quiesce, Quiesced};
use ringfence_ring::Status;
use std::os::fd::AsRawFd;
use std::time::Instant;

use super::*;

impl Tcp {
    /// Cancels everything; `Done` once the kernel holds no request that
    /// names this driver's memory (or any memory registered with it).
    /// Never waits: what was canceled ends through the next asks (which
    /// take its completions) and the engine's polls between them. Requests
    /// that have not ended `CANCEL_WAIT` after the first ask may still
    /// write into windows: `Leak`.
    pub(super) fn quiesce_all(&mut self) -> Quiesced {
        let now = Instant::now();
        let first = self.teardown.is_none();
        let since = *self.teardown.get_or_insert(now);
        if first {
            self.send_held_acks();
        }
        self.quiescing.clear();
        // Every ask: a connection accepted since the last one closes too.
        for slot in 0..self.conns.slot_count() {
            self.close_conn(slot, Status::Canceled);
        }
        if self.accept_armed && first {
            let user_data = requests::user_data(Tag::Cancel, 0, 0);
            let _ = self.uring.cancel_fd(self.listener.as_raw_fd(), user_data);
        }
        if let Err(e) = self.uring.submit() {
            tracing::debug!(%e, "tcp: io_uring submit failed at teardown");
        }
        while let Some(cqe) = self.uring.next() {
            self.handle_teardown(cqe);
        }
        if !self.accept_armed && self.conns.is_empty() {
            return Quiesced::Done;
        }
        if now.duration_since(since) >= CANCEL_WAIT {
            tracing::error!(
                "tcp: requests still in flight {CANCEL_WAIT:?} into teardown: the kernel may \
                 still write registered memory"
            );
            return Quiesced::Leak;
        }
        Quiesced::Pending
    }

    /// Whether connection `c` still reaches registration `key`'s window:
    /// GET data from it is queued or being sent, a PUT's payload is still
    /// to be written into it (copied from the receive buffers, or about to
    /// be received straight into it), or a receive straight into it has
    /// not completed (closed or not).
    pub(super) fn holds_key(c: &Conn, key: u32) -> bool {
        let sending = c.send.holds_window(key) && (c.in_flight > 0 || !c.closing());
        let writing = !c.closing()
            && c.serve.write_target().is_some()
            && c.reader
                .in_payload()
                .is_some_and(|(h, _)| h.opcode == Opcode::Put && h.key == key);
        let receiving = c.recv == Receive::Direct { key } && c.in_flight > 0;
        sending || writing || receiving
    }

    /// Whether any connection still reaches registration `key`'s window
    /// ([`Tcp::holds_key`]); it was deregistered already, so no new access
    /// to it starts. The peer has the timeout from the first ask to finish
    /// what it started (take its GET data, send the rest of its PUT): until
    /// then `Pending`. After it, the connections that still hold the window
    /// close (shutdown, then their requests are canceled), and it is
    /// `Pending` until those requests have completed, which the engine's
    /// polls take; `Leak` if they have not `CANCEL_WAIT` later (the
    /// kernel may still write into the window). Never waits.
    pub(super) fn quiesce_key(&mut self, key: u32) -> Quiesced {
        let at = self.quiescing.iter().position(|q| q.key == key);
        if !self.conns.iter().any(|(_, c)| Self::holds_key(c, key)) {
            if let Some(i) = at {
                self.quiescing.swap_remove(i);
            }
            return Quiesced::Done;
        }
        let now = Instant::now();
        let i = at.unwrap_or_else(|| {
            self.quiescing.push(KeyQuiesce {
                key,
                since: now,
                closed: None,
            });
            self.quiescing.len() - 1
        });
        let q = self.quiescing[i];
        match q.closed {
            None if now.duration_since(q.since) >= self.config.timeout => {
                let slots: Vec<u32> = self
                    .conns
                    .iter()
                    .filter(|&(_, c)| Self::holds_key(c, key))
                    .map(|(slot, _)| slot)
                    .collect();
                for slot in slots {
                    tracing::debug!(
                        slot,
                        key,
                        "tcp: a deregistered window's peer did not finish; connection closed"
                    );
                    self.close_conn(slot, Status::Transport);
                }
                self.quiescing[i].closed = Some(now);
                // The cancellations go in now; their completions come
                // through the polls.
                if let Err(e) = self.uring.submit() {
                    tracing::debug!(%e, "tcp: io_uring submit failed");
                }
                Quiesced::Pending
            }
            Some(closed) if now.duration_since(closed) >= CANCEL_WAIT => {
                tracing::error!(
                    key,
                    "tcp: a closed connection's request on a deregistered window did not end: \
                     the window is leaked"
                );
                self.quiescing.swap_remove(i);
                Quiesced::Leak
            }
            _ => Quiesced::Pending,
        }
    }

    /// A completion during teardown: only the bookkeeping of what is in
    /// flight.
    pub(super) fn handle_teardown(&mut self, cqe: Cqe) {
        let Some((tag, slot, generation)) = requests::parse_user_data(cqe.user_data()) else {
            return;
        };
        let flags = cqe.flags();
        match tag {
            Tag::Accept => {
                // A new descriptor, ours: closed at once.
                drop(cqe.into_accepted());
                if !cqueue::more(flags) {
                    self.accept_armed = false;
                }
            }
            Tag::Recv => {
                self.uring.recycle(cqueue::buffer_select(flags));
                if let Some(conn) = self.conns.at(slot, generation)
                    && !cqueue::more(flags)
                {
                    conn.in_flight -= 1;
                }
                self.maybe_free(slot);
            }
            Tag::Send | Tag::Connect | Tag::Direct => {
                if let Some(conn) = self.conns.at(slot, generation) {
                    conn.in_flight -= 1;
                }
                self.maybe_free(slot);
            }
            Tag::Cancel => {}
        }
    }

    pub(super) fn quiesce_scope(&mut self, scope: Quiesce) -> Quiesced {
        match scope {
            // Accesses to registered memory happen inside `poll` (copies
            // out of the receive buffers), but a connection may still
            // reach a deregistered window: the rest of a PUT's payload
            // (copied, or received straight into it) and GET data sent
            // from it. `Pending` while the peer may finish, closed after
            // the timeout, and `Pending` until the kernel has let go.
            Quiesce::Memory(key) => self.quiesce_key(key.0 as u32),
            Quiesce::All => self.quiesce_all(),
        }
    }
}
