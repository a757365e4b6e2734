//! Decoding of the small enumerated fields of an entry.
//!
//! Entries are read from memory another party wrote, so each enumerated field
//! is a newtype over its raw integer with associated constants, converted
//! with `TryFrom`: an unknown value is an error that names the field and maps
//! to the [`Status`] the engine completes the entry with.

use crate::Status;
use core::fmt;

/// Which field held an unknown value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Field {
    /// [`Sqe::opcode`](crate::Sqe::opcode).
    Opcode,
    /// [`Sqe::flags`](crate::Sqe::flags).
    SqeFlags,
    /// [`Sqe::subop`](crate::Sqe::subop) of an ATOMIC.
    AtomicOp,
    /// [`Sqe::subop`](crate::Sqe::subop) of a FENCE.
    FenceMode,
    /// [`Sqe::subop`](crate::Sqe::subop) of a CLOSE.
    CloseMode,
    /// [`Sqe::subop`](crate::Sqe::subop) of a FLUSH.
    FlushScope,
    /// [`Cqe::flags`](crate::Cqe::flags).
    CqeFlags,
}

/// A raw value that is not one this version knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UnknownValue {
    /// The field it was read from.
    pub field: Field,
    /// The raw value.
    pub value: u32,
}

impl UnknownValue {
    /// The status an SQE carrying this value completes with.
    pub const fn status(self) -> Status {
        match self.field {
            Field::Opcode => Status::InvalidOpcode,
            Field::SqeFlags | Field::CqeFlags => Status::InvalidFlags,
            Field::AtomicOp | Field::FenceMode | Field::CloseMode | Field::FlushScope => {
                Status::InvalidSubop
            }
        }
    }
}

impl fmt::Display for UnknownValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown {:?} value {:#x}", self.field, self.value)
    }
}

impl std::error::Error for UnknownValue {}

/// Declares a newtype over a raw integer whose valid values are a closed set
/// of associated constants.
macro_rules! closed_set {
    (
        $(#[$meta:meta])*
        pub struct $name:ident($raw:ty) as $field:ident {
            $( $(#[$cmeta:meta])* $konst:ident = $val:expr, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(transparent)]
        pub struct $name($raw);

        impl $name {
            $( $(#[$cmeta])* pub const $konst: $name = $name($val); )+

            /// Every valid value.
            pub const ALL: &'static [$name] = &[$( $name::$konst ),+];

            /// The raw value as stored in an entry.
            #[inline]
            pub const fn as_raw(self) -> $raw {
                self.0
            }

            /// The value for `raw`; `None` if it is not one this version
            /// knows (what `TryFrom` does, usable in `const` code).
            #[inline]
            pub const fn from_raw(raw: $raw) -> Option<$name> {
                match raw {
                    $( v if v == $val => Some($name($val)), )+
                    _ => None,
                }
            }

            /// The constant's name.
            pub const fn name(self) -> &'static str {
                match self.0 {
                    $( v if v == $val => stringify!($konst), )+
                    _ => "?",
                }
            }
        }

        impl TryFrom<$raw> for $name {
            type Error = UnknownValue;

            #[inline]
            fn try_from(raw: $raw) -> Result<Self, UnknownValue> {
                match raw {
                    $( v if v == $val => Ok($name($val)), )+
                    _ => Err(UnknownValue { field: Field::$field, value: raw as u32 }),
                }
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

closed_set! {
    /// What an SQE asks for.
    pub struct Opcode(u8) as Opcode {
        /// Does nothing; completes with `res = 0`. Measures the engine itself.
        NOP = 0,
        /// Writes `len` bytes from local memory to remote memory.
        PUT = 1,
        /// Reads `len` bytes from remote memory into local memory.
        GET = 2,
        /// An 8-byte atomic on remote memory; [`Sqe::subop`](crate::Sqe::subop)
        /// holds the [`AtomicOp`].
        ATOMIC = 3,
        /// Orders later operations on the endpoint after earlier ones;
        /// [`Sqe::subop`](crate::Sqe::subop) holds the [`FenceMode`].
        FENCE = 4,
        /// Completes when every earlier operation on the endpoint is remotely
        /// complete.
        FLUSH = 5,
        /// Sends a small payload to the peer, delivered after every earlier
        /// operation on the endpoint is remotely complete.
        NOTIFY = 6,
        /// Closes the endpoint; [`Sqe::subop`](crate::Sqe::subop) holds the
        /// [`CloseMode`]. Later operations on it fail with
        /// `EndpointClosed`.
        CLOSE = 7,
    }
}

closed_set! {
    /// How a [`Opcode::CLOSE`] closes its endpoint (docs/fence.md R41–R43).
    pub struct CloseMode(u8) as CloseMode {
        /// After everything submitted before it is remotely complete; its
        /// CQE comes last.
        GRACEFUL = 0,
        /// At once: queued operations and the in-flight fence complete with
        /// `Canceled`.
        FORCE = 1,
    }
}

closed_set! {
    /// The sub-operation of an [`Opcode::ATOMIC`], on one 8-byte word.
    pub struct AtomicOp(u8) as AtomicOp {
        /// `*remote += operand`; fetches nothing.
        ADD = 0,
        /// `old = *remote; *remote += operand`; `old` goes to local memory.
        FADD = 1,
        /// `old = *remote; *remote = operand`; `old` goes to local memory.
        SWAP = 2,
        /// `old = *remote; if old == operand { *remote = operand2 }`; `old`
        /// goes to local memory.
        CSWAP = 3,
    }
}

closed_set! {
    /// What an [`Opcode::FENCE`] promises. Not to be confused with the
    /// *paths* of docs/fence.md (§2), which are how the engine keeps a promise:
    /// at the next operation after the fence it takes the free path
    /// (nothing outstanding, R10), the weak path (a transport fence flag on
    /// the one ordered lane everything is on, R8) or the strong path (a
    /// flush of the dirty lanes, R9).
    ///
    /// | mode       | free path | weak path | strong path          |
    /// |------------|-----------|-----------|----------------------|
    /// | `ORDER`    | yes       | yes       | when the weak cannot |
    /// | `COMPLETE` | yes       | never     | always otherwise     |
    pub struct FenceMode(u8) as FenceMode {
        /// Order only: what comes after takes effect at the target after
        /// what came before (docs/fence.md R5). The engine picks the cheapest
        /// path that keeps the order.
        ORDER = 0,
        /// Complete: nothing after starts before everything before is
        /// remotely complete; the strong path whenever anything is
        /// outstanding, even on one ordered lane.
        COMPLETE = 1,
    }
}

impl FenceMode {
    /// The former name of [`FenceMode::ORDER`].
    #[deprecated(
        note = "renamed FenceMode::ORDER: it names what a fence promises, not a docs/fence.md path"
    )]
    pub const WEAK: FenceMode = FenceMode::ORDER;
    /// The former name of [`FenceMode::COMPLETE`].
    #[deprecated(
        note = "renamed FenceMode::COMPLETE: it names what a fence promises, not a docs/fence.md path"
    )]
    pub const STRONG: FenceMode = FenceMode::COMPLETE;
}

closed_set! {
    /// What an [`Opcode::FLUSH`] covers.
    pub struct FlushScope(u8) as FlushScope {
        /// Everything submitted on the SQE's endpoint before it (docs/fence.md
        /// R21, R23).
        ENDPOINT = 0,
        /// Everything submitted on every endpoint of the worker before it
        /// (a quiet, R26): the SQE's `endpoint` must be 0. Work submitted
        /// after it, on any endpoint, is not waited for.
        WORKER = 1,
    }
}

impl AtomicOp {
    /// Whether the old value is written back to local memory.
    #[inline]
    pub const fn is_fetching(self) -> bool {
        self.0 != AtomicOp::ADD.0
    }
}

/// Declares a bit-set newtype whose unknown bits are refused by `TryFrom`.
macro_rules! flag_set {
    (
        $(#[$meta:meta])*
        pub struct $name:ident($raw:ty) as $field:ident, known = $known:expr;
        $( $(#[$cmeta:meta])* $konst:ident = $val:expr, )+
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
        #[repr(transparent)]
        pub struct $name($raw);

        impl $name {
            /// No flags.
            pub const EMPTY: $name = $name(0);
            $( $(#[$cmeta])* pub const $konst: $name = $name($val); )+

            /// The raw bits as stored in an entry.
            #[inline]
            pub const fn bits(self) -> $raw {
                self.0
            }

            /// Whether every flag of `other` is set.
            #[inline]
            pub const fn contains(self, other: $name) -> bool {
                self.0 & other.0 == other.0
            }

            /// Both sets together.
            #[inline]
            pub const fn union(self, other: $name) -> $name {
                $name(self.0 | other.0)
            }
        }

        impl core::ops::BitOr for $name {
            type Output = $name;
            #[inline]
            fn bitor(self, rhs: $name) -> $name {
                self.union(rhs)
            }
        }

        impl TryFrom<$raw> for $name {
            type Error = UnknownValue;

            #[inline]
            fn try_from(raw: $raw) -> Result<Self, UnknownValue> {
                if raw & !($known) == 0 {
                    Ok($name(raw))
                } else {
                    Err(UnknownValue { field: Field::$field, value: raw as u32 })
                }
            }
        }
    };
}

flag_set! {
    /// Flags of an SQE.
    pub struct SqeFlags(u8) as SqeFlags, known = SqeFlags::SKIP_SUCCESS.0;
    /// Post no CQE if the operation succeeds (errors always post one).
    SKIP_SUCCESS = 1 << 0,
}

flag_set! {
    /// Flags of a CQE. Bits 16..32 are not flags: they hold the buffer id of a
    /// [`NOTIFICATION`](CqeFlags::NOTIFICATION) (see
    /// [`Cqe::buffer_id`](crate::Cqe::buffer_id)).
    pub struct CqeFlags(u32) as CqeFlags, known = CqeFlags::NOTIFICATION.0 | 0xffff_0000;
    /// This CQE is an incoming notification from a peer: `res` is the payload
    /// length and the payload is in the buffer named by the upper 16 bits.
    NOTIFICATION = 1 << 0,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closed_sets_round_trip_and_refuse_unknown_values() {
        for raw in 0..=u8::MAX {
            match Opcode::try_from(raw) {
                Ok(op) => {
                    assert!(raw <= 7);
                    assert_eq!(op.as_raw(), raw);
                    assert_ne!(op.name(), "?");
                }
                Err(e) => {
                    assert!(raw > 7);
                    assert_eq!(
                        e,
                        UnknownValue {
                            field: Field::Opcode,
                            value: raw as u32
                        }
                    );
                    assert_eq!(e.status(), Status::InvalidOpcode);
                }
            }
            assert_eq!(AtomicOp::try_from(raw).is_ok(), raw <= 3);
            assert_eq!(FenceMode::try_from(raw).is_ok(), raw <= 1);
        }
        assert_eq!(Opcode::ALL.len(), 8);
        assert_eq!(
            CloseMode::try_from(2).unwrap_err().status(),
            Status::InvalidSubop
        );
        assert_eq!(CloseMode::ALL, &[CloseMode::GRACEFUL, CloseMode::FORCE]);
        assert_eq!(format!("{:?}", Opcode::NOTIFY), "NOTIFY");
        assert_eq!(Opcode(200).name(), "?");
        assert_eq!(
            AtomicOp::try_from(9).unwrap_err().status(),
            Status::InvalidSubop
        );
        assert_eq!(
            FenceMode::try_from(2).unwrap_err().status(),
            Status::InvalidSubop
        );
    }

    #[test]
    fn fetching_atomics() {
        assert!(!AtomicOp::ADD.is_fetching());
        assert!(AtomicOp::FADD.is_fetching());
        assert!(AtomicOp::SWAP.is_fetching());
        assert!(AtomicOp::CSWAP.is_fetching());
    }

    #[test]
    fn flag_sets_refuse_unknown_bits() {
        assert_eq!(SqeFlags::try_from(0), Ok(SqeFlags::EMPTY));
        assert_eq!(SqeFlags::try_from(1), Ok(SqeFlags::SKIP_SUCCESS));
        for raw in 2..=u8::MAX {
            let err = SqeFlags::try_from(raw).unwrap_err();
            assert_eq!(err.status(), Status::InvalidFlags);
        }
        assert!(CqeFlags::try_from(0x0042_0001).is_ok());
        assert_eq!(CqeFlags::try_from(2).unwrap_err().field, Field::CqeFlags);
        let both = SqeFlags::EMPTY | SqeFlags::SKIP_SUCCESS;
        assert!(both.contains(SqeFlags::SKIP_SUCCESS));
        assert!(!SqeFlags::EMPTY.contains(SqeFlags::SKIP_SUCCESS));
        assert_eq!(both.bits(), 1);
        assert!(
            UnknownValue {
                field: Field::SqeFlags,
                value: 4
            }
            .to_string()
            .contains("0x4")
        );
    }
}
