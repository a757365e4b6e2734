//! The round's bookkeeping: which connections the next `commit` sends on,
//! starts busy receives on or arms a receive on again, which hold an ACK
//! for it, which busy-receive; and from that, whether a core thread may
//! sleep now (`prepare_sleep`).
//!
//! Each list holds connection slots. A slot may name a connection freed
//! since it was listed, or its successor in the slot; every use looks the
//! slot up and checks what it finds.

use super::conn::{AckHold, Conn};
use super::conn_table::Conns;

/// Work for the next commit, and the connections that busy-receive.
#[derive(Debug)]
pub(super) struct Round {
    /// Connections with bytes to send (each once: `Conn::on_send_list`).
    pub(super) to_send: Vec<u32>,
    /// Accepted connections whose ACK is held (see [`AckHold`]).
    pub(super) held_acks: Vec<u32>,
    /// Connections a lane posted a request on this round
    /// (`RecvMode::BusyAtCommit`): the commit starts their busy receives.
    pub(super) to_spin: Vec<u32>,
    /// Connections that busy-receive (`SPIN_ROUNDS`).
    pub(super) spinners: Vec<u32>,
    /// Busy receivers whose receive this round found data: armed again at
    /// the commit after this round's.
    pub(super) spin_next: Vec<u32>,
    /// Connections whose receive ended: armed again at the next commit.
    pub(super) rearm: Vec<u32>,
}

/// Puts `slot` on `to_send` if its connection has bytes queued and is not
/// there yet.
fn want_send(to_send: &mut Vec<u32>, slot: u32, conn: &mut Conn) {
    if !conn.on_send_list && conn.send.queued() > 0 {
        conn.on_send_list = true;
        to_send.push(slot);
    }
}

impl Round {
    pub(super) fn new() -> Round {
        Round {
            to_send: Vec::with_capacity(64),
            held_acks: Vec::with_capacity(64),
            to_spin: Vec::with_capacity(64),
            spinners: Vec::with_capacity(64),
            spin_next: Vec::with_capacity(64),
            rearm: Vec::with_capacity(64),
        }
    }

    /// Puts `slot` on the send list (sent at `commit`) if `conn`, the
    /// connection in it, has bytes queued.
    pub(super) fn want_send(&mut self, slot: u32, conn: &mut Conn) {
        want_send(&mut self.to_send, slot, conn);
    }

    /// Holds the ACK that `conn`'s reader left pending this round, if it
    /// holds none yet: the next round's commit sends it (AckHold).
    pub(super) fn hold_ack(&mut self, slot: u32, conn: &mut Conn) {
        if conn.serve.ack_pending() && conn.ack_hold == AckHold::None {
            conn.ack_hold = AckHold::Fresh;
            self.held_acks.push(slot);
        }
    }

    /// At a commit: ACKs held since the last commit are queued (those
    /// without room stay for a later one, the batch in flight makes room);
    /// this round's wait one more.
    pub(super) fn age_held_acks(&mut self, conns: &mut Conns) {
        self.held_acks.retain(|&slot| {
            let Some(conn) = conns.live(slot) else {
                return false;
            };
            match conn.ack_hold {
                AckHold::Fresh if !conn.closing() => {
                    conn.ack_hold = AckHold::Aged;
                    return true;
                }
                AckHold::Aged if !conn.closing() => {
                    if !conn.serve.queue_ack(&mut conn.send) {
                        return true;
                    }
                    want_send(&mut self.to_send, slot, conn);
                }
                _ => {}
            }
            conn.ack_hold = AckHold::None;
            false
        });
    }

    /// At teardown: every held ACK is queued now, as far as there is room.
    pub(super) fn release_held_acks(&mut self, conns: &mut Conns) {
        for slot in std::mem::take(&mut self.held_acks) {
            let Some(conn) = conns.live(slot) else {
                continue;
            };
            conn.ack_hold = AckHold::None;
            if !conn.closing() && conn.serve.queue_ack(&mut conn.send) {
                want_send(&mut self.to_send, slot, conn);
            }
        }
    }

    /// Drops the connections that no longer busy-receive (back to the
    /// multishot receive, closing, or gone) from `spinners`.
    pub(super) fn prune_spinners(&mut self, conns: &Conns) {
        self.spinners.retain(|&slot| {
            conns
                .get(slot)
                .is_some_and(|c| c.recv_mode.busy() && !c.closing())
        });
    }

    /// Whether the next round has work of its own, so that a core thread
    /// must not sleep: a held ACK to send (AckHold), a connection that
    /// busy-receives (what arrives for it signals nothing, SPIN_ROUNDS), or
    /// receives to arm again.
    pub(super) fn keeps_awake(&self) -> bool {
        !self.held_acks.is_empty() || !self.spinners.is_empty() || !self.rearm.is_empty()
    }
}
