//! The submission queue entry: 64 bytes, one cache line.

use crate::entry::{Entry, private::Sealed};
use crate::value::{AtomicOp, CloseMode, FenceMode, FlushScope, Opcode, SqeFlags, UnknownValue};
use static_assertions::{assert_eq_size, const_assert_eq};

/// A buffer in the initiator's own registered memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LocalBuf {
    /// The local memory handle returned by registration.
    pub mem: u32,
    /// The address inside that registration.
    pub addr: u64,
}

/// A buffer in a peer's registered memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RemoteBuf {
    /// The remote key id returned by unpacking the peer's key.
    pub rkey: u32,
    /// The address inside the peer's registration.
    pub addr: u64,
}

/// A submission queue entry: one operation, exactly 64 bytes.
///
/// The layout is ABI (mirrored by `struct rf_sqe` in C) and every field's
/// offset is pinned below. Fields are public because applications and C code
/// fill entries in place; the engine treats every field as untrusted and
/// validates it before use.
///
/// # Fields an opcode does not use
///
/// Every field an opcode does not use must be zero, so that a later version
/// can give it a meaning without old callers' garbage changing what their
/// entries do. The engine checks them all (see [`Sqe::unused_bits`]) and
/// completes an entry that breaks a rule with exactly one error CQE,
/// having moved no byte:
///
/// | what is wrong                                        | status                   |
/// |------------------------------------------------------|--------------------------|
/// | `opcode` unknown                                     | [`Status::InvalidOpcode`]|
/// | a `flags` bit this version does not define           | [`Status::InvalidFlags`] |
/// | a field the opcode does not use is not zero (below)  | [`Status::InvalidArgument`] |
/// | `subop` not zero where the opcode takes none, or not one of its values | [`Status::InvalidSubop`] |
///
/// What each opcode uses (`opcode`, `flags` and `user_data` always):
///
/// | opcode   | uses                                                                  |
/// |----------|-----------------------------------------------------------------------|
/// | `NOP`    | nothing else                                                          |
/// | `PUT`, `GET` | `endpoint`, `len`, `local_mem`, `local_addr`, `rkey`, `remote_addr` |
/// | `ATOMIC` | `subop`, `endpoint`, `len` (8), `rkey`, `remote_addr`, `operand`; `local_mem` and `local_addr` unless `ADD`; `operand2` for `CSWAP` only |
/// | `FENCE`, `CLOSE` | `subop`, `endpoint`                                           |
/// | `FLUSH`  | `subop`; `endpoint` for scope `ENDPOINT` (scope `WORKER`: a non-zero `endpoint` is [`Status::InvalidEndpoint`]) |
/// | `NOTIFY` | `endpoint`, `len`, `local_mem`, `local_addr` (the payload, not looked up when `len` is 0), `operand` (the tag) |
///
/// `reserved0` and `reserved1` are used by no opcode. The flag bit this
/// version defines, [`SqeFlags::SKIP_SUCCESS`], means the same for every
/// opcode.
///
/// [`Status::InvalidOpcode`]: crate::Status::InvalidOpcode
/// [`Status::InvalidFlags`]: crate::Status::InvalidFlags
/// [`Status::InvalidArgument`]: crate::Status::InvalidArgument
/// [`Status::InvalidSubop`]: crate::Status::InvalidSubop
/// [`Status::InvalidEndpoint`]: crate::Status::InvalidEndpoint
///
/// # Examples
/// ```
/// use ringfence_ring::{LocalBuf, Opcode, RemoteBuf, Sqe};
/// let sqe = Sqe::put(3, LocalBuf { mem: 1, addr: 0x1000 }, RemoteBuf { rkey: 9, addr: 0x2000 }, 64)
///     .with_user_data(7);
/// assert_eq!(sqe.opcode(), Ok(Opcode::PUT));
/// assert_eq!(sqe.user_data, 7);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C, align(64))]
pub struct Sqe {
    /// The [`Opcode`], raw.
    pub opcode: u8,
    /// [`SqeFlags`], raw.
    pub flags: u8,
    /// The [`AtomicOp`] of an ATOMIC, the [`FenceMode`] of a FENCE, the
    /// [`CloseMode`] of a CLOSE or the [`FlushScope`] of a FLUSH, raw;
    /// zero otherwise (else `InvalidSubop`).
    pub subop: u8,
    /// Reserved; must be zero (else `InvalidArgument`).
    pub reserved0: u8,
    /// The endpoint id; zero for a NOP and a worker FLUSH.
    pub endpoint: u32,
    /// Bytes to move (PUT, GET, NOTIFY); 8 for ATOMIC; zero otherwise.
    pub len: u32,
    /// Local memory handle of `local_addr`; zero where that is.
    pub local_mem: u32,
    /// Local address: PUT source, GET destination, fetched value of an
    /// atomic other than ADD, NOTIFY payload; zero otherwise.
    pub local_addr: u64,
    /// Remote address of PUT, GET and ATOMIC; zero otherwise.
    pub remote_addr: u64,
    /// Remote key id of `remote_addr`; zero where that is.
    pub rkey: u32,
    /// Reserved; must be zero (else `InvalidArgument`).
    pub reserved1: u32,
    /// ATOMIC operand: the addend, the new value of SWAP, the compare value
    /// of CSWAP. Copied at submission: the caller's memory is never re-read.
    /// The tag of a NOTIFY (the `user_data` of the target's CQE). Zero
    /// otherwise.
    pub operand: u64,
    /// The swap value of CSWAP; zero otherwise.
    pub operand2: u64,
    /// Returned untouched in the CQE.
    pub user_data: u64,
}

assert_eq_size!(Sqe, [u8; 64]);
const_assert_eq!(core::mem::align_of::<Sqe>(), 64);
const_assert_eq!(core::mem::offset_of!(Sqe, opcode), 0);
const_assert_eq!(core::mem::offset_of!(Sqe, flags), 1);
const_assert_eq!(core::mem::offset_of!(Sqe, subop), 2);
const_assert_eq!(core::mem::offset_of!(Sqe, reserved0), 3);
const_assert_eq!(core::mem::offset_of!(Sqe, endpoint), 4);
const_assert_eq!(core::mem::offset_of!(Sqe, len), 8);
const_assert_eq!(core::mem::offset_of!(Sqe, local_mem), 12);
const_assert_eq!(core::mem::offset_of!(Sqe, local_addr), 16);
const_assert_eq!(core::mem::offset_of!(Sqe, remote_addr), 24);
const_assert_eq!(core::mem::offset_of!(Sqe, rkey), 32);
const_assert_eq!(core::mem::offset_of!(Sqe, reserved1), 36);
const_assert_eq!(core::mem::offset_of!(Sqe, operand), 40);
const_assert_eq!(core::mem::offset_of!(Sqe, operand2), 48);
const_assert_eq!(core::mem::offset_of!(Sqe, user_data), 56);

impl Sealed for Sqe {}

// SAFETY: `Sqe` is `repr(C)`, made only of integers, with no padding (the
// offsets above tile all 64 bytes), so every bit pattern is a valid value.
unsafe impl Entry for Sqe {
    const ZERO: Sqe = Sqe::new(Opcode::NOP);
}

impl Default for Sqe {
    fn default() -> Self {
        Sqe::ZERO
    }
}

impl Sqe {
    /// An entry with `opcode` and every other field zero.
    #[inline]
    pub const fn new(opcode: Opcode) -> Sqe {
        Sqe {
            opcode: opcode.as_raw(),
            flags: 0,
            subop: 0,
            reserved0: 0,
            endpoint: 0,
            len: 0,
            local_mem: 0,
            local_addr: 0,
            remote_addr: 0,
            rkey: 0,
            reserved1: 0,
            operand: 0,
            operand2: 0,
            user_data: 0,
        }
    }

    /// A NOP: completes with `res = 0` without touching any endpoint.
    #[inline]
    pub const fn nop() -> Sqe {
        Sqe::new(Opcode::NOP)
    }

    const fn data(
        opcode: Opcode,
        endpoint: u32,
        local: LocalBuf,
        remote: RemoteBuf,
        len: u32,
    ) -> Sqe {
        let mut sqe = Sqe::new(opcode);
        sqe.endpoint = endpoint;
        sqe.len = len;
        sqe.local_mem = local.mem;
        sqe.local_addr = local.addr;
        sqe.rkey = remote.rkey;
        sqe.remote_addr = remote.addr;
        sqe
    }

    /// PUT `len` bytes from `local` to `remote` over `endpoint`.
    #[inline]
    pub const fn put(endpoint: u32, local: LocalBuf, remote: RemoteBuf, len: u32) -> Sqe {
        Sqe::data(Opcode::PUT, endpoint, local, remote, len)
    }

    /// GET `len` bytes from `remote` into `local` over `endpoint`.
    #[inline]
    pub const fn get(endpoint: u32, local: LocalBuf, remote: RemoteBuf, len: u32) -> Sqe {
        Sqe::data(Opcode::GET, endpoint, local, remote, len)
    }

    const fn atomic(endpoint: u32, op: AtomicOp, local: LocalBuf, remote: RemoteBuf) -> Sqe {
        let mut sqe = Sqe::data(Opcode::ATOMIC, endpoint, local, remote, 8);
        sqe.subop = op.as_raw();
        sqe
    }

    /// Atomic `*remote += value`, fetching nothing.
    #[inline]
    pub const fn atomic_add(endpoint: u32, remote: RemoteBuf, value: u64) -> Sqe {
        let mut sqe = Sqe::atomic(
            endpoint,
            AtomicOp::ADD,
            LocalBuf { mem: 0, addr: 0 },
            remote,
        );
        sqe.operand = value;
        sqe
    }

    /// Atomic fetch-and-add; the old value is written to `result`.
    #[inline]
    pub const fn atomic_fadd(
        endpoint: u32,
        result: LocalBuf,
        remote: RemoteBuf,
        value: u64,
    ) -> Sqe {
        let mut sqe = Sqe::atomic(endpoint, AtomicOp::FADD, result, remote);
        sqe.operand = value;
        sqe
    }

    /// Atomic swap; the old value is written to `result`.
    #[inline]
    pub const fn atomic_swap(
        endpoint: u32,
        result: LocalBuf,
        remote: RemoteBuf,
        value: u64,
    ) -> Sqe {
        let mut sqe = Sqe::atomic(endpoint, AtomicOp::SWAP, result, remote);
        sqe.operand = value;
        sqe
    }

    /// Atomic compare-and-swap: if `*remote == compare` it becomes `swap`;
    /// the old value is written to `result` either way.
    #[inline]
    pub const fn atomic_cswap(
        endpoint: u32,
        result: LocalBuf,
        remote: RemoteBuf,
        compare: u64,
        swap: u64,
    ) -> Sqe {
        let mut sqe = Sqe::atomic(endpoint, AtomicOp::CSWAP, result, remote);
        sqe.operand = compare;
        sqe.operand2 = swap;
        sqe
    }

    /// A fence of strength `mode` on `endpoint`.
    #[inline]
    pub const fn fence(endpoint: u32, mode: FenceMode) -> Sqe {
        let mut sqe = Sqe::new(Opcode::FENCE);
        sqe.endpoint = endpoint;
        sqe.subop = mode.as_raw();
        sqe
    }

    /// A flush of everything submitted on `endpoint` before it.
    #[inline]
    pub const fn flush(endpoint: u32) -> Sqe {
        let mut sqe = Sqe::new(Opcode::FLUSH);
        sqe.endpoint = endpoint;
        sqe
    }

    /// A worker flush (a quiet, docs/fence.md R26): completes when everything
    /// submitted on every endpoint of the worker before it is remotely
    /// complete, without waiting for anything submitted after it.
    #[inline]
    pub const fn flush_worker() -> Sqe {
        let mut sqe = Sqe::new(Opcode::FLUSH);
        sqe.subop = FlushScope::WORKER.as_raw();
        sqe
    }

    /// A notification carrying `len` bytes of `payload` to the peer.
    #[inline]
    pub const fn notify(endpoint: u32, payload: LocalBuf, len: u32) -> Sqe {
        let mut sqe = Sqe::new(Opcode::NOTIFY);
        sqe.endpoint = endpoint;
        sqe.local_mem = payload.mem;
        sqe.local_addr = payload.addr;
        sqe.len = len;
        sqe
    }

    /// A close of `endpoint` (see [`CloseMode`]).
    #[inline]
    pub const fn close(endpoint: u32, mode: CloseMode) -> Sqe {
        let mut sqe = Sqe::new(Opcode::CLOSE);
        sqe.endpoint = endpoint;
        sqe.subop = mode.as_raw();
        sqe
    }

    /// This entry with `user_data` set.
    #[inline]
    pub const fn with_user_data(mut self, user_data: u64) -> Sqe {
        self.user_data = user_data;
        self
    }

    /// This entry with `flags` set (replacing any it had).
    #[inline]
    pub const fn with_flags(mut self, flags: SqeFlags) -> Sqe {
        self.flags = flags.bits();
        self
    }

    /// The decoded opcode.
    ///
    /// # Errors
    /// [`UnknownValue`] if the raw opcode is not one this version knows.
    #[inline]
    pub fn opcode(&self) -> Result<Opcode, UnknownValue> {
        Opcode::try_from(self.opcode)
    }

    /// The decoded flags.
    ///
    /// # Errors
    /// [`UnknownValue`] if an unknown flag bit is set.
    #[inline]
    pub fn flags(&self) -> Result<SqeFlags, UnknownValue> {
        SqeFlags::try_from(self.flags)
    }

    /// The decoded atomic sub-operation (meaningful for ATOMIC only).
    ///
    /// # Errors
    /// [`UnknownValue`] if `subop` is not an [`AtomicOp`].
    #[inline]
    pub fn atomic_op(&self) -> Result<AtomicOp, UnknownValue> {
        AtomicOp::try_from(self.subop)
    }

    /// The decoded close mode (meaningful for CLOSE only).
    ///
    /// # Errors
    /// [`UnknownValue`] if `subop` is not a [`CloseMode`].
    #[inline]
    pub fn close_mode(&self) -> Result<CloseMode, UnknownValue> {
        CloseMode::try_from(self.subop)
    }

    /// The decoded fence mode (meaningful for FENCE only).
    ///
    /// # Errors
    /// [`UnknownValue`] if `subop` is not a [`FenceMode`].
    #[inline]
    pub fn fence_mode(&self) -> Result<FenceMode, UnknownValue> {
        FenceMode::try_from(self.subop)
    }

    /// The [`FlushScope`] of a FLUSH.
    ///
    /// # Errors
    /// [`UnknownValue`] if `subop` is not a [`FlushScope`].
    #[inline]
    pub fn flush_scope(&self) -> Result<FlushScope, UnknownValue> {
        FlushScope::try_from(self.subop)
    }

    /// Whether both reserved fields are zero, as they must be.
    #[inline]
    pub const fn reserved_are_zero(&self) -> bool {
        self.reserved0 == 0 && self.reserved1 == 0
    }

    /// The fields this entry's opcode does not use (see the table on
    /// [`Sqe`]), ORed together: zero exactly when each of them is zero, as
    /// it must be. `opcode`, `flags`, `subop` and `user_data` are not part
    /// of it (their own checks say what is wrong with them); neither is
    /// `endpoint` of a FLUSH (a worker FLUSH's is `InvalidEndpoint`), nor
    /// what depends on an unknown opcode or sub-operation.
    ///
    /// One OR of words, no branch per field: cheap enough for every SQE.
    #[inline]
    pub const fn unused_bits(&self) -> u64 {
        let reserved = self.reserved0 as u64 | self.reserved1 as u64;
        let local = self.local_mem as u64 | self.local_addr;
        let remote = self.rkey as u64 | self.remote_addr;
        let operands = self.operand | self.operand2;
        match Opcode::from_raw(self.opcode) {
            Some(Opcode::PUT | Opcode::GET) => self.rma_unused_bits(),
            Some(Opcode::ATOMIC) => {
                let by_op = match AtomicOp::from_raw(self.subop) {
                    Some(AtomicOp::ADD) => local | self.operand2,
                    Some(AtomicOp::CSWAP) | None => 0,
                    Some(_) => self.operand2,
                };
                reserved | by_op
            }
            Some(Opcode::NOTIFY) => reserved | remote | self.operand2,
            Some(Opcode::FENCE | Opcode::FLUSH | Opcode::CLOSE) => {
                reserved | self.len as u64 | local | remote | operands
            }
            Some(Opcode::NOP) => {
                reserved | self.endpoint as u64 | self.len as u64 | local | remote | operands
            }
            _ => 0,
        }
    }

    /// [`unused_bits`](Sqe::unused_bits) of a PUT or GET, without decoding
    /// the opcode: for a caller that already knows it (the engine's
    /// validation of each PUT and GET).
    #[inline]
    pub const fn rma_unused_bits(&self) -> u64 {
        self.reserved0 as u64 | self.reserved1 as u64 | self.operand | self.operand2
    }

    /// The local buffer named by this entry.
    #[inline]
    pub const fn local(&self) -> LocalBuf {
        LocalBuf {
            mem: self.local_mem,
            addr: self.local_addr,
        }
    }

    /// The remote buffer named by this entry.
    #[inline]
    pub const fn remote(&self) -> RemoteBuf {
        RemoteBuf {
            rkey: self.rkey,
            addr: self.remote_addr,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Status;

    const L: LocalBuf = LocalBuf {
        mem: 2,
        addr: 0x1000,
    };
    const R: RemoteBuf = RemoteBuf {
        rkey: 5,
        addr: 0x8000,
    };

    #[test]
    fn size_alignment_and_zero() {
        assert_eq!(core::mem::size_of::<Sqe>(), 64);
        assert_eq!(core::mem::align_of::<Sqe>(), 64);
        assert_eq!(Sqe::default(), Sqe::ZERO);
        assert_eq!(Sqe::ZERO.opcode(), Ok(Opcode::NOP));
        assert!(Sqe::ZERO.reserved_are_zero());
    }

    #[test]
    fn builders_fill_the_fields_they_name() {
        let put = Sqe::put(3, L, R, 100).with_user_data(42);
        assert_eq!(
            (put.opcode(), put.endpoint, put.len),
            (Ok(Opcode::PUT), 3, 100)
        );
        assert_eq!((put.local(), put.remote(), put.user_data), (L, R, 42));

        let get = Sqe::get(4, L, R, 8);
        assert_eq!(get.opcode(), Ok(Opcode::GET));
        assert_eq!((get.local(), get.remote()), (L, R));

        let add = Sqe::atomic_add(1, R, 5);
        assert_eq!(
            (add.opcode(), add.atomic_op(), add.len),
            (Ok(Opcode::ATOMIC), Ok(AtomicOp::ADD), 8)
        );
        assert_eq!((add.operand, add.local()), (5, LocalBuf::default()));

        let fadd = Sqe::atomic_fadd(1, L, R, 6);
        assert_eq!(
            (fadd.atomic_op(), fadd.operand, fadd.local()),
            (Ok(AtomicOp::FADD), 6, L)
        );
        let swap = Sqe::atomic_swap(1, L, R, 7);
        assert_eq!((swap.atomic_op(), swap.operand), (Ok(AtomicOp::SWAP), 7));
        let cswap = Sqe::atomic_cswap(1, L, R, 8, 9);
        assert_eq!(
            (cswap.atomic_op(), cswap.operand, cswap.operand2),
            (Ok(AtomicOp::CSWAP), 8, 9)
        );

        let weak = Sqe::fence(2, FenceMode::ORDER);
        assert_eq!(
            (weak.opcode(), weak.fence_mode(), weak.endpoint),
            (Ok(Opcode::FENCE), Ok(FenceMode::ORDER), 2)
        );
        assert_eq!(
            Sqe::fence(2, FenceMode::COMPLETE).fence_mode(),
            Ok(FenceMode::COMPLETE)
        );

        let flush = Sqe::flush(6);
        assert_eq!((flush.opcode(), flush.endpoint), (Ok(Opcode::FLUSH), 6));

        let notify = Sqe::notify(7, L, 12);
        assert_eq!(
            (notify.opcode(), notify.local(), notify.len),
            (Ok(Opcode::NOTIFY), L, 12)
        );

        let close = Sqe::close(5, CloseMode::FORCE);
        assert_eq!(
            (close.opcode(), close.close_mode(), close.endpoint),
            (Ok(Opcode::CLOSE), Ok(CloseMode::FORCE), 5)
        );

        let skip = Sqe::nop().with_flags(SqeFlags::SKIP_SUCCESS);
        assert_eq!(skip.flags(), Ok(SqeFlags::SKIP_SUCCESS));
    }

    #[test]
    fn builders_leave_unused_fields_zero_and_each_one_counts() {
        let all = [
            Sqe::nop(),
            Sqe::put(3, L, R, 100),
            Sqe::get(3, L, R, 100),
            Sqe::atomic_add(1, R, 5),
            Sqe::atomic_fadd(1, L, R, 6),
            Sqe::atomic_swap(1, L, R, 7),
            Sqe::atomic_cswap(1, L, R, 8, 9),
            Sqe::fence(2, FenceMode::COMPLETE),
            Sqe::flush(6),
            Sqe::flush_worker(),
            Sqe::notify(7, L, 12),
            Sqe::notify(7, L, 0),
            Sqe::close(5, CloseMode::FORCE),
        ];
        for sqe in all {
            assert_eq!(sqe.unused_bits(), 0, "{sqe:?}");
            let mut r0 = sqe;
            r0.reserved0 = 0x80;
            let mut r1 = sqe;
            r1.reserved1 = 1 << 31;
            assert_ne!(r0.unused_bits(), 0);
            assert_ne!(r1.unused_bits(), 0);
        }
        let add = Sqe::atomic_add(1, R, 5);
        assert_ne!(
            Sqe {
                local_mem: 1,
                ..add
            }
            .unused_bits(),
            0
        );
        assert_ne!(
            Sqe {
                local_addr: 1 << 63,
                ..add
            }
            .unused_bits(),
            0
        );
        assert_ne!(Sqe { operand2: 1, ..add }.unused_bits(), 0);
        let put = Sqe::put(3, L, R, 100);
        assert_ne!(Sqe { operand2: 1, ..put }.unused_bits(), 0);
        assert_ne!(Sqe { operand: 1, ..put }.unused_bits(), 0);
        let notify = Sqe::notify(7, L, 12);
        assert_eq!(
            Sqe {
                operand: 9,
                ..notify
            }
            .unused_bits(),
            0,
            "the tag"
        );
        assert_ne!(Sqe { rkey: 1, ..notify }.unused_bits(), 0);
        let fence = Sqe::fence(2, FenceMode::ORDER);
        assert_ne!(Sqe { len: 1, ..fence }.unused_bits(), 0);
        assert_ne!(
            Sqe {
                endpoint: 1,
                ..Sqe::nop()
            }
            .unused_bits(),
            0
        );
        // Unknown opcodes and sub-operations: their own checks answer.
        assert_eq!(
            Sqe {
                opcode: 0xee,
                operand: 1,
                ..put
            }
            .unused_bits(),
            0
        );
        assert_eq!(
            Sqe {
                subop: 0x77,
                operand2: 1,
                ..add
            }
            .unused_bits(),
            0
        );
    }

    #[test]
    fn garbage_decodes_to_errors_not_ub() {
        let mut sqe = Sqe::nop();
        sqe.opcode = 0xee;
        sqe.flags = 0x80;
        sqe.subop = 0x77;
        sqe.reserved1 = 1;
        assert_eq!(sqe.opcode().unwrap_err().status(), Status::InvalidOpcode);
        assert_eq!(sqe.flags().unwrap_err().status(), Status::InvalidFlags);
        assert_eq!(sqe.atomic_op().unwrap_err().status(), Status::InvalidSubop);
        assert_eq!(sqe.fence_mode().unwrap_err().status(), Status::InvalidSubop);
        assert!(!sqe.reserved_are_zero());
    }
}
