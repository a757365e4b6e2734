//! What the token of a driver call names. Drivers hand tokens back
//! unchanged in their completions; the engine decodes them here, and a
//! token that names nothing live is counted as stray and changes nothing.
//!
//! The two top bits say what a token is:
//!
//! | bits 63–62 | bits 61–32          | bits 31–0              |
//! |------------|---------------------|------------------------|
//! | `00`       | 0                   | a [`RequestId`]        |
//! | `00`       | the flush's serial  | a FLUSH's `RequestId`  |
//! | `01`       | 0                   | the endpoint (connect) |
//! | `10`       | the flush's serial  | the endpoint (fence)   |
//! | `11`       | the endpoint        | the worker flush's id  |
//!
//! A flush's serial tells one flush from the next (FENCE.md R25): a late
//! or duplicated completion of an earlier one, which a lane replacement
//! can produce on a network, is stray instead of being taken for the
//! completion of the flush in flight: for a fence flush, the endpoint's
//! next one; for a user FLUSH or CLOSE, whatever request took its slot
//! since. User flushes' serials are never 0, so their tokens are never a
//! plain request's.

use crate::driver::Token;
use crate::request::RequestId;

const FENCE: u64 = 1 << 63;
const CONNECT: u64 = 1 << 62;
const KIND: u64 = FENCE | CONNECT;
/// Bits 61–32.
const MIDDLE: u64 = (1 << 30) - 1;

/// What a token names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Named {
    /// An operation the driver runs.
    Request(RequestId),
    /// User FLUSH or CLOSE `id`, its flush number `serial` (1..2^30).
    Flush { id: RequestId, serial: u32 },
    /// The handshake of endpoint `.0`.
    Connect(usize),
    /// Fence flush number `serial` (modulo 2^30) of `endpoint`.
    Fence { endpoint: usize, serial: u32 },
    /// The part on `endpoint` of the worker flush `flush`.
    WorkerPart { endpoint: usize, flush: RequestId },
}

impl Named {
    /// The token a driver call carries.
    pub(super) fn token(self) -> Token {
        let low = |v: usize| v as u64 & u64::from(u32::MAX);
        Token(match self {
            Named::Request(id) => u64::from(id.0),
            Named::Flush { id, serial } => (u64::from(serial) & MIDDLE) << 32 | u64::from(id.0),
            Named::Connect(e) => CONNECT | low(e),
            Named::Fence { endpoint, serial } => {
                FENCE | (u64::from(serial) & MIDDLE) << 32 | low(endpoint)
            }
            Named::WorkerPart { endpoint, flush } => {
                KIND | (endpoint as u64 & MIDDLE) << 32 | u64::from(flush.0)
            }
        })
    }

    /// What `token` names; `None` for a token no engine call carried.
    pub(super) fn of(token: Token) -> Option<Named> {
        let (kind, middle, low) = (token.0 & KIND, (token.0 >> 32) & MIDDLE, token.0 as u32);
        Some(match kind {
            0 if middle == 0 => Named::Request(RequestId(low)),
            0 => Named::Flush {
                id: RequestId(low),
                serial: middle as u32,
            },
            CONNECT if middle == 0 => Named::Connect(low as usize),
            FENCE => Named::Fence {
                endpoint: low as usize,
                serial: middle as u32,
            },
            KIND => Named::WorkerPart {
                endpoint: middle as usize,
                flush: RequestId(low),
            },
            _ => return None,
        })
    }

    /// The serial after `serial` for user flushes: never 0, within 30 bits.
    pub(super) fn next_flush_serial(serial: u32) -> u32 {
        ((u64::from(serial) + 1) & MIDDLE).max(1) as u32
    }

    /// Whether fence flush serial `serial` (as the engine counts it) is
    /// the one a token carried as `carried`.
    pub(super) fn same_serial(serial: u32, carried: u32) -> bool {
        u64::from(serial) & MIDDLE == u64::from(carried)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips_and_foreign_tokens_name_nothing() {
        let named = [
            Named::Request(RequestId(0xdead_beef)),
            Named::Flush {
                id: RequestId(7),
                serial: 1,
            },
            Named::Connect(7),
            Named::Fence {
                endpoint: 65_535,
                serial: (1 << 30) - 1,
            },
            Named::WorkerPart {
                endpoint: 3,
                flush: RequestId(0x0010_0001),
            },
        ];
        for n in named {
            assert_eq!(Named::of(n.token()), Some(n));
        }
        // The serial wraps at 2^30: a later flush's token still decodes.
        let t = Named::Fence {
            endpoint: 1,
            serial: (1 << 30) + 5,
        }
        .token();
        assert_eq!(
            Named::of(t),
            Some(Named::Fence {
                endpoint: 1,
                serial: 5
            })
        );
        assert!(Named::same_serial((1 << 30) + 5, 5));
        assert!(!Named::same_serial(6, 5));
        assert_eq!(Named::next_flush_serial((1 << 30) - 1), 1, "never 0");
        assert_eq!(Named::next_flush_serial(0), 1);
        // Bits no call sets.
        assert_eq!(Named::of(Token(CONNECT | 1 << 40)), None);
    }
}
