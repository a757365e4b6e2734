//! What the token of a driver call names. Drivers hand tokens back
//! unchanged in their completions; the engine decodes them here, and a
//! token that names nothing live is counted as stray and changes nothing.
//!
//! The two top bits say what a token is:
//!
//! | bits 63–62 | bits 61–32                        | bits 31–0              |
//! |------------|-----------------------------------|------------------------|
//! | `00`       | 0                                 | a [`RequestId`]        |
//! | `00`       | the flush's serial                | a FLUSH's `RequestId`  |
//! | `01`       | the attempt's serial              | the endpoint (connect) |
//! | `10`       | the flush's serial                | the endpoint (fence)   |
//! | `11`       | serial (61–48), endpoint (47–32)  | the worker flush's id  |
//!
//! A flush's serial tells one flush from the next (docs/fence.md R25): a late
//! or duplicated completion of an earlier one, which a lane replacement
//! can produce on a network, is stray instead of being taken for the
//! completion of the flush in flight: for a fence flush, the endpoint's
//! next one; for a user FLUSH or CLOSE or a worker flush, whatever request
//! took its slot since (the pool hands the last freed slot out first).
//! User flushes' serials are never 0, so their tokens are never a plain
//! request's. A connect's serial names one attempt: an endpoint index is
//! given again to the next connect when a connect is refused, and the
//! refused attempt's handshakes, which their drivers report as canceled
//! after `disconnect`, must not complete the next one's.
//!
//! Which driver returned a completion is known too (the engine polls one
//! at a time): a flush split over several drivers counts each driver's
//! part once, so a duplicate from one cannot stand for another's.

use crate::driver::Token;
use crate::request::RequestId;

const FENCE: u64 = 1 << 63;
const CONNECT: u64 = 1 << 62;
const KIND: u64 = FENCE | CONNECT;
/// Bits 61–32.
const MIDDLE: u64 = (1 << 30) - 1;
/// A worker flush part's serial: bits 61–48.
const PART_SERIAL: u64 = (1 << 14) - 1;

/// What a token names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TokenTarget {
    /// An operation the driver runs.
    Request(RequestId),
    /// User FLUSH or CLOSE `id`, its flush number `serial` (1..2^30).
    Flush { id: RequestId, serial: u32 },
    /// Connect attempt `attempt` (modulo 2^30) of endpoint `endpoint`.
    Connect { endpoint: usize, attempt: u32 },
    /// Fence flush number `serial` (modulo 2^30) of `endpoint`.
    Fence { endpoint: usize, serial: u32 },
    /// The part on `endpoint` (below 2^16) of worker flush `flush`, its
    /// serial `serial` (modulo 2^14).
    WorkerPart {
        endpoint: usize,
        flush: RequestId,
        serial: u32,
    },
}

impl TokenTarget {
    /// The token a driver call carries.
    pub(super) fn token(self) -> Token {
        let low = |v: usize| v as u64 & u64::from(u32::MAX);
        Token(match self {
            TokenTarget::Request(id) => u64::from(id.0),
            TokenTarget::Flush { id, serial } => {
                (u64::from(serial) & MIDDLE) << 32 | u64::from(id.0)
            }
            TokenTarget::Connect { endpoint, attempt } => {
                CONNECT | (u64::from(attempt) & MIDDLE) << 32 | low(endpoint)
            }
            TokenTarget::Fence { endpoint, serial } => {
                FENCE | (u64::from(serial) & MIDDLE) << 32 | low(endpoint)
            }
            TokenTarget::WorkerPart {
                endpoint,
                flush,
                serial,
            } => {
                KIND | (u64::from(serial) & PART_SERIAL) << 48
                    | (endpoint as u64 & 0xffff) << 32
                    | u64::from(flush.0)
            }
        })
    }

    /// What `token` names. Every token decodes to something: one that no
    /// engine call carried names nothing live, and is stray where it is
    /// looked up.
    pub(super) fn of(token: Token) -> TokenTarget {
        let (kind, middle, low) = (token.0 & KIND, (token.0 >> 32) & MIDDLE, token.0 as u32);
        match kind {
            0 if middle == 0 => TokenTarget::Request(RequestId(low)),
            0 => TokenTarget::Flush {
                id: RequestId(low),
                serial: middle as u32,
            },
            CONNECT => TokenTarget::Connect {
                endpoint: low as usize,
                attempt: middle as u32,
            },
            FENCE => TokenTarget::Fence {
                endpoint: low as usize,
                serial: middle as u32,
            },
            _ => TokenTarget::WorkerPart {
                endpoint: (middle & 0xffff) as usize,
                flush: RequestId(low),
                serial: (middle >> 16) as u32,
            },
        }
    }

    /// The serial after `serial` for user flushes: never 0, within 30 bits.
    pub(super) fn next_flush_serial(serial: u32) -> u32 {
        ((u64::from(serial) + 1) & MIDDLE).max(1) as u32
    }

    /// Whether fence flush or connect serial `serial` (as the engine
    /// counts it) is the one a token carried as `carried`.
    pub(super) fn same_serial(serial: u32, carried: u32) -> bool {
        u64::from(serial) & MIDDLE == u64::from(carried)
    }

    /// Whether worker flush serial `serial` is the one a part's token
    /// carried as `carried`.
    pub(super) fn same_part_serial(serial: u32, carried: u32) -> bool {
        u64::from(serial) & PART_SERIAL == u64::from(carried)
    }
}

/// The engine's serial counters, one per kind of token that names an
/// attempt rather than a request slot: each is carried in its tokens, so a
/// late completion of an earlier attempt matches nothing.
#[derive(Debug, Default)]
pub(super) struct Serials {
    /// The last user flush started ([`TokenTarget::Flush`]).
    flush: u32,
    /// The last worker flush taken ([`TokenTarget::WorkerPart`]).
    worker_flush: u32,
    /// The last connect attempt ([`TokenTarget::Connect`]).
    connect: u32,
}

impl Serials {
    /// The serial of a new user flush: never 0, within 30 bits.
    pub(super) fn next_flush(&mut self) -> u32 {
        self.flush = TokenTarget::next_flush_serial(self.flush);
        self.flush
    }

    /// The serial of a new worker flush.
    pub(super) fn next_worker_flush(&mut self) -> u32 {
        self.worker_flush = self.worker_flush.wrapping_add(1);
        self.worker_flush
    }

    /// The serial of a new connect attempt.
    pub(super) fn next_connect(&mut self) -> u32 {
        self.connect = self.connect.wrapping_add(1);
        self.connect
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips_and_foreign_tokens_name_nothing() {
        let named = [
            TokenTarget::Request(RequestId(0xdead_beef)),
            TokenTarget::Flush {
                id: RequestId(7),
                serial: 1,
            },
            TokenTarget::Connect {
                endpoint: 7,
                attempt: 3,
            },
            TokenTarget::Fence {
                endpoint: 65_535,
                serial: (1 << 30) - 1,
            },
            TokenTarget::WorkerPart {
                endpoint: 65_534,
                flush: RequestId(0x0010_0001),
                serial: (1 << 14) - 1,
            },
        ];
        for n in named {
            assert_eq!(TokenTarget::of(n.token()), n);
        }
        // The serial wraps at 2^30: a later flush's token still decodes.
        let t = TokenTarget::Fence {
            endpoint: 1,
            serial: (1 << 30) + 5,
        }
        .token();
        assert_eq!(
            TokenTarget::of(t),
            TokenTarget::Fence {
                endpoint: 1,
                serial: 5
            }
        );
        assert!(TokenTarget::same_serial((1 << 30) + 5, 5));
        assert!(!TokenTarget::same_serial(6, 5));
        assert_eq!(TokenTarget::next_flush_serial((1 << 30) - 1), 1, "never 0");
        assert_eq!(TokenTarget::next_flush_serial(0), 1);
        // A worker flush part's serial wraps at 2^14.
        assert!(TokenTarget::same_part_serial((1 << 14) + 2, 2));
        assert!(!TokenTarget::same_part_serial(3, 2));
    }
}
