//! The types and constants that C sees: `struct rf_sqe`, `struct rf_cqe`,
//! `struct rf_ring`, `struct rf_worker_config`, the handle types, and the
//! `RF_*` values of opcodes, flags and statuses.
//!
//! cbindgen copies these into `ringfence.h`. Values are literals (cbindgen
//! cannot evaluate calls), and each is asserted below to equal the
//! `ringfence-ring` value it mirrors, so the two cannot drift apart.
#![allow(non_camel_case_types)]

use core::ffi::c_char;
use ringfence_ring::{
    AtomicOp, CloseMode, ConsumerLine, Cqe, CqeFlags, FenceMode, FlushScope, Opcode, ProducerLine,
    Sqe, SqeFlags, Status,
};
use static_assertions::{assert_eq_size, const_assert_eq};

/// A worker: drivers, endpoints, memory, rings and the progress loop.
/// A generation-checked handle, never a pointer; 0 is never valid.
pub type rf_worker_t = u64;

/// A ring (one SQ and one CQ, for one thread). A generation-checked
/// handle, never a pointer; 0 is never valid.
pub type rf_ring_t = u64;

/// A submission queue entry: one operation, exactly 64 bytes. The same
/// layout as the Rust `ringfence_ring::Sqe` (asserted on both sides). Fill
/// it with the `rf_prep_*` helpers, which write all 64 bytes.
///
/// Every field the opcode does not use must be zero, so that a later
/// version can give it a meaning: the SQE otherwise completes with
/// `RF_EINVALID_ARGUMENT` and does nothing. The reserved fields are used by
/// no opcode. A flag bit this version does not define is
/// `RF_EINVALID_FLAGS`; a `subop` where the opcode takes none (PUT, GET,
/// NOTIFY, NOP) or an unknown one is `RF_EINVALID_SUBOP`. Besides `opcode`,
/// `flags` and `user_data`: PUT and GET use `endpoint`, `len`, `local_*`,
/// `rkey`, `remote_addr`; ATOMIC uses `subop`, `endpoint`, `len`, `rkey`,
/// `remote_addr`, `operand`, `local_*` unless ADD, `operand2` for CSWAP
/// only; FENCE and CLOSE `subop` and `endpoint`; FLUSH `subop`, and
/// `endpoint` for `RF_FLUSH_ENDPOINT` (a worker flush's non-zero endpoint
/// is `RF_EINVALID_ENDPOINT`); NOTIFY `endpoint`, `len`, `local_*` and
/// `operand` (the tag); NOP nothing.
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct rf_sqe {
    /// `RF_OP_*`.
    pub opcode: u8,
    /// `RF_SQE_*` flags.
    pub flags: u8,
    /// `RF_ATOMIC_*` of an ATOMIC, `RF_FENCE_*` of a FENCE, `RF_CLOSE_*`
    /// of a CLOSE, `RF_FLUSH_*` of a FLUSH; zero otherwise (else
    /// `RF_EINVALID_SUBOP`).
    pub subop: u8,
    /// Reserved; zero (else `RF_EINVALID_ARGUMENT`).
    pub reserved0: u8,
    /// The endpoint id (from `rf_ep_connect`); zero for a NOP and a worker
    /// flush.
    pub endpoint: u32,
    /// Bytes to move (PUT, GET, NOTIFY); 8 for ATOMIC; zero otherwise.
    pub len: u32,
    /// Local memory handle of `local_addr` (from `rf_mem_register` or
    /// `rf_mem_alloc`); zero where that is.
    pub local_mem: u32,
    /// Local address: PUT source, GET destination, the fetched value of an
    /// atomic other than ADD, the NOTIFY payload; zero otherwise.
    pub local_addr: u64,
    /// Remote address of PUT, GET and ATOMIC; zero otherwise.
    pub remote_addr: u64,
    /// Remote key id of `remote_addr` (from `rf_rkey_unpack`); zero where
    /// that is.
    pub rkey: u32,
    /// Reserved; zero (else `RF_EINVALID_ARGUMENT`).
    pub reserved1: u32,
    /// ATOMIC operand: the addend, the new value of SWAP, the compare value
    /// of CSWAP. NOTIFY: the tag (the `user_data` of the target's CQE).
    /// Zero otherwise.
    pub operand: u64,
    /// The swap value of CSWAP; zero otherwise.
    pub operand2: u64,
    /// Returned untouched in the CQE.
    pub user_data: u64,
}

/// A completion queue entry: exactly 16 bytes, the same layout as the Rust
/// `ringfence_ring::Cqe`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct rf_cqe {
    /// The `user_data` of the SQE this completes (or of the notification
    /// buffer, for an incoming notification).
    pub user_data: u64,
    /// Zero or more: success (bytes moved where that applies). Negative: an
    /// `RF_E*` status.
    pub res: i32,
    /// `RF_CQE_*` flags; bits 16..32 hold a notification's buffer id.
    pub flags: u32,
}

// The C structs are the Rust entries, field for field.
assert_eq_size!(rf_sqe, Sqe);
assert_eq_size!(rf_cqe, Cqe);
const_assert_eq!(align_of::<rf_sqe>(), align_of::<Sqe>());
const_assert_eq!(align_of::<rf_cqe>(), align_of::<Cqe>());
macro_rules! same_offsets {
    ($c:ty, $rust:ty: $($field:ident),+) => {
        $( const_assert_eq!(core::mem::offset_of!($c, $field), core::mem::offset_of!($rust, $field)); )+
    };
}
same_offsets!(rf_sqe, Sqe: opcode, flags, subop, reserved0, endpoint, len, local_mem, local_addr,
    remote_addr, rkey, reserved1, operand, operand2, user_data);
same_offsets!(rf_cqe, Cqe: user_data, res, flags);

/// One thread's ring: its SQ and CQ as pointers into the ring memory, plus
/// the thread's own indices. Filled by `rf_ring_create`; used by the inline
/// helpers (`rf_get_sqe`, `rf_submit`, `rf_peek_cqe`, ...), which follow the
/// Rust `Producer`/`Consumer` protocol exactly. One thread at a time uses a
/// ring. `shared_*` words are written by the engine; `cached_*` are this
/// thread's copies of them; `local_*` are this thread's own indices.
#[repr(C)]
#[derive(Debug)]
pub struct rf_ring {
    /// SQ tail in ring memory: written here (release store, `rf_submit`),
    /// read by the engine (acquire).
    pub sq_tail: *mut u32,
    /// SQ head in ring memory: written by the engine (release), read here
    /// (acquire) when `sq_cached_head` says the SQ is full.
    pub sq_shared_head: *mut u32,
    /// The engine's SQ flags (`RF_SQ_NEED_WAKEUP`, `RF_SQ_FAILED`), read
    /// by `rf_submit` after a sequentially consistent fence.
    pub sq_shared_flags: *mut u32,
    /// The SQ's `sq_entries` slots.
    pub sqes: *mut rf_sqe,
    /// `sq_entries - 1`.
    pub sq_mask: u32,
    /// SQ slots; a power of two.
    pub sq_entries: u32,
    /// The next SQ slot to fill (free-running).
    pub sq_local_tail: u32,
    /// The tail last stored to `sq_tail`.
    pub sq_published: u32,
    /// The engine's SQ head as last loaded; may be stale (behind).
    pub sq_cached_head: u32,
    /// Reserved.
    pub sq_reserved: u32,
    /// CQ head in ring memory: written here (release store,
    /// `rf_cq_advance`), read by the engine (acquire).
    pub cq_head: *mut u32,
    /// CQ tail in ring memory: written by the engine (release), read here
    /// (acquire) when `cq_cached_tail` says the CQ is empty.
    pub cq_shared_tail: *mut u32,
    /// The engine's CQ flags (`RF_CQ_OVERFLOW`, `RF_CQ_FAILED`), acquire.
    pub cq_shared_flags: *mut u32,
    /// This thread's CQ flags (`RF_CQ_NEED_WAKEUP`), set by
    /// `rf_ring_cq_arm`.
    pub cq_wait_flags: *mut u32,
    /// The CQ's `cq_entries` slots.
    pub cqes: *mut rf_cqe,
    /// `cq_entries - 1`.
    pub cq_mask: u32,
    /// CQ slots; a power of two.
    pub cq_entries: u32,
    /// The next CQ slot to read (free-running).
    pub cq_local_head: u32,
    /// The engine's CQ tail as last loaded; may be stale (behind).
    pub cq_cached_tail: u32,
    /// The ring's handle, for the library calls that take the ring.
    pub handle: rf_ring_t,
    /// Reserved.
    pub reserved: [u64; 4],
}

/// A snapshot of an endpoint's fence engine, from `rf_ep_fence_state`
/// (docs/fence.md §3 names the epochs and masks). Consistent when taken;
/// progress may change it right after.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct rf_fence_state {
    /// W: the submission epoch, bumped by every FENCE and before every
    /// NOTIFY.
    pub submit_epoch: u64,
    /// C: the admitted epoch; requests of epochs up to C may start.
    pub admitted_epoch: u64,
    /// D: lanes written since the last flush of them started.
    pub dirty_lanes: u64,
    /// Lanes whose earlier work FLUSHes, CLOSEs or worker flushes in
    /// flight cover (clean once they complete).
    pub covered_lanes: u64,
    /// Lanes of the strong fence flush in flight; 0 when none is.
    pub flushing_lanes: u64,
    /// The epoch C moves to when that flush completes; 0 when none is.
    pub fence_target: u64,
    /// The epoch a weak fence admitted on `weak_lane` only; 0 when none.
    pub weak_epoch: u64,
    /// FENCE SQEs taken on the endpoint.
    pub fences: u64,
    /// Boundaries crossed with a transport fence flag on one ordered lane.
    pub weak_fences: u64,
    /// Driver flushes started by strong fences.
    pub fence_flushes: u64,
    /// Driver flushes started by the implicit fence before a NOTIFY.
    pub notify_flushes: u64,
    /// Driver flushes started by FLUSH SQEs and graceful CLOSEs.
    pub user_flushes: u64,
    /// Driver flushes started by worker flushes (`RF_FLUSH_WORKER`).
    pub worker_flushes: u64,
    /// Requests waiting in the endpoint's FIFO behind a boundary or the
    /// handshake.
    pub deferred: u32,
    /// Requests and flushes at the driver, not yet completed.
    pub in_flight: u32,
    /// The lane of `weak_epoch`; 255 when none.
    pub weak_lane: u8,
    /// Zero.
    pub reserved: [u8; 7],
}

/// How `rf_worker_create` builds a worker. Start from
/// `rf_worker_config_init`; a zero numeric field means the default (or the
/// `RINGFENCE_*` environment variable, unless `ignore_env` is set).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct rf_worker_config {
    /// Comma-separated driver names in priority order (`"shm"`, `"tcp"`,
    /// `"loopback"`), NUL-terminated; NULL for the default (`"shm"` when the
    /// library has it, else `"loopback"`). A name given twice counts once.
    /// `"tcp"` listens on `RINGFENCE_TCP_ADDR` (default 127.0.0.1, any
    /// port), or on 127.0.0.1 with `ignore_env`; over tcp the target must
    /// make progress (its core thread, or `rf_progress`).
    pub drivers: *const c_char,
    /// SQ entries of each ring (power of two, at most 65536).
    pub sq_entries: u32,
    /// CQ entries of each ring (power of two, at most 65536).
    pub cq_entries: u32,
    /// Requests in flight per ring.
    pub requests: u32,
    /// Lanes per endpoint: 1 to `RF_MAX_LANES` (0: the default), capped
    /// by the driver.
    pub lanes: u32,
    /// Notification buffers (at most 65536; together with `notify_size`
    /// counted against the memory limit, see `rf_mem_alloc`).
    pub notify_buffers: u32,
    /// Bytes per notification buffer.
    pub notify_size: u32,
    /// Non-zero: start the core thread (busy-polling progress) at creation.
    pub core_thread: u32,
    /// The core thread's CPU; negative: `RINGFENCE_CORE_CPU`, else a CPU
    /// other than the calling thread's (unpinned if it may run on one only).
    pub core_cpu: i32,
    /// Non-zero: ignore `RINGFENCE_*` environment variables.
    pub ignore_env: u32,
    /// Reserved; zero.
    pub reserved: [u32; 7],
}

// ------------------------------------------------------------------ values

/// The library version, `major << 16 | minor << 8 | patch`, as returned by
/// `rf_version`.
pub const RF_VERSION: u32 = 0x00_01_00;

/// The most lanes an endpoint has (`RINGFENCE_LANES`, `config.lanes`, the
/// connect calls): one limit, checked in one place.
pub const RF_MAX_LANES: u32 = 64;
const_assert_eq!(RF_MAX_LANES, ringfence::MAX_LANES as u32);

/// Opcode: does nothing; completes with `res = 0`.
pub const RF_OP_NOP: u8 = 0;
/// Opcode: writes `len` bytes from local to remote memory.
pub const RF_OP_PUT: u8 = 1;
/// Opcode: reads `len` bytes from remote into local memory.
pub const RF_OP_GET: u8 = 2;
/// Opcode: an 8-byte atomic on remote memory (`subop`: `RF_ATOMIC_*`).
pub const RF_OP_ATOMIC: u8 = 3;
/// Opcode: orders later operations after earlier ones (`subop`:
/// `RF_FENCE_*`).
pub const RF_OP_FENCE: u8 = 4;
/// Opcode: completes when every earlier operation on the endpoint is
/// remotely complete.
pub const RF_OP_FLUSH: u8 = 5;
/// Opcode: a small payload to the peer, after every earlier operation.
pub const RF_OP_NOTIFY: u8 = 6;
/// Opcode: closes the endpoint (`subop`: `RF_CLOSE_*`).
pub const RF_OP_CLOSE: u8 = 7;

/// SQE flag: post no CQE if the operation succeeds.
pub const RF_SQE_SKIP_SUCCESS: u8 = 1;

/// CQE flag: an incoming notification (`res` is the payload length; read
/// it with `rf_notification_read`).
pub const RF_CQE_NOTIFICATION: u32 = 1;
/// Bits 16..32 of a notification CQE's flags: its buffer id.
pub const RF_CQE_BUFFER_SHIFT: u32 = 16;

/// Atomic: `*remote += operand`.
pub const RF_ATOMIC_ADD: u8 = 0;
/// Atomic: fetch-and-add.
pub const RF_ATOMIC_FADD: u8 = 1;
/// Atomic: swap.
pub const RF_ATOMIC_SWAP: u8 = 2;
/// Atomic: compare-and-swap (`operand` compare, `operand2` swap).
pub const RF_ATOMIC_CSWAP: u8 = 3;

/// Fence mode "order": later operations take effect at the target after
/// earlier ones; the engine picks the cheapest way (nothing when nothing
/// is outstanding, a transport fence on one ordered lane, else a flush).
pub const RF_FENCE_ORDER: u8 = 0;
/// Fence mode "complete": nothing after starts before everything before
/// is remotely complete (a flush whenever anything is outstanding).
pub const RF_FENCE_COMPLETE: u8 = 1;
/// Deprecated: the former name of `RF_FENCE_ORDER`.
pub const RF_FENCE_WEAK: u8 = RF_FENCE_ORDER;
/// Deprecated: the former name of `RF_FENCE_COMPLETE`.
pub const RF_FENCE_STRONG: u8 = RF_FENCE_COMPLETE;

/// Flush scope: everything submitted on the SQE's endpoint before it.
pub const RF_FLUSH_ENDPOINT: u8 = 0;
/// Flush scope: everything submitted on every endpoint of the worker
/// before it (a quiet); the SQE's endpoint must be 0.
pub const RF_FLUSH_WORKER: u8 = 1;

/// Close after everything submitted before is remotely complete.
pub const RF_CLOSE_GRACEFUL: u8 = 0;
/// Close at once; queued operations complete with `RF_ECANCELED`.
pub const RF_CLOSE_FORCE: u8 = 1;

/// In `*sq_shared_flags`: the engine sleeps; `rf_submit` wakes it.
pub const RF_SQ_NEED_WAKEUP: u32 = 1;
/// In `*cq_wait_flags`: this thread waits on the CQ eventfd.
pub const RF_CQ_NEED_WAKEUP: u32 = 1;
/// In `*cq_shared_flags`: the engine holds completions that did not fit;
/// it takes no SQEs from this ring until they are reaped.
pub const RF_CQ_OVERFLOW: u32 = 1;
/// In `*sq_shared_flags`: the engine failed this ring (it found the ring
/// memory corrupt) and takes no more SQEs; `rf_submit` returns
/// `RF_ERING_CORRUPT`. Set once, never cleared.
pub const RF_SQ_FAILED: u32 = 2;
/// In `*cq_shared_flags`: the engine failed this ring and posts no more
/// CQEs; `rf_peek_cqe` returns `RF_ERING_CORRUPT` once the CQ is empty.
/// Set once, never cleared.
pub const RF_CQ_FAILED: u32 = 2;

/// `rf_ep_state`: the driver's handshake goes on; SQEs queue in order and
/// start when it is up.
pub const RF_EP_CONNECTING: i32 = 0;
/// `rf_ep_state`: up; operations start.
pub const RF_EP_CONNECTED: i32 = 1;
/// `rf_ep_state`: a graceful close is queued; new SQEs fail.
pub const RF_EP_CLOSING: i32 = 2;
/// `rf_ep_state`: failed; `*error` holds the sticky first error, which
/// every operation on it completes with.
pub const RF_EP_FAILED: i32 = 3;
/// `rf_ep_state`: closed; every SQE fails with `RF_EENDPOINT_CLOSED`.
pub const RF_EP_CLOSED: i32 = 4;

const_assert_eq!(RF_OP_NOP, Opcode::NOP.as_raw());
const_assert_eq!(RF_OP_PUT, Opcode::PUT.as_raw());
const_assert_eq!(RF_OP_GET, Opcode::GET.as_raw());
const_assert_eq!(RF_OP_ATOMIC, Opcode::ATOMIC.as_raw());
const_assert_eq!(RF_OP_FENCE, Opcode::FENCE.as_raw());
const_assert_eq!(RF_OP_FLUSH, Opcode::FLUSH.as_raw());
const_assert_eq!(RF_OP_NOTIFY, Opcode::NOTIFY.as_raw());
const_assert_eq!(RF_OP_CLOSE, Opcode::CLOSE.as_raw());
const_assert_eq!(RF_SQE_SKIP_SUCCESS, SqeFlags::SKIP_SUCCESS.bits());
const_assert_eq!(RF_CQE_NOTIFICATION, CqeFlags::NOTIFICATION.bits());
const_assert_eq!(RF_CQE_BUFFER_SHIFT, ringfence_ring::CQE_BUFFER_SHIFT);
const_assert_eq!(RF_ATOMIC_ADD, AtomicOp::ADD.as_raw());
const_assert_eq!(RF_ATOMIC_FADD, AtomicOp::FADD.as_raw());
const_assert_eq!(RF_ATOMIC_SWAP, AtomicOp::SWAP.as_raw());
const_assert_eq!(RF_ATOMIC_CSWAP, AtomicOp::CSWAP.as_raw());
const_assert_eq!(RF_FENCE_ORDER, FenceMode::ORDER.as_raw());
const_assert_eq!(RF_FENCE_COMPLETE, FenceMode::COMPLETE.as_raw());
const_assert_eq!(RF_FLUSH_ENDPOINT, FlushScope::ENDPOINT.as_raw());
const_assert_eq!(RF_FLUSH_WORKER, FlushScope::WORKER.as_raw());
const_assert_eq!(RF_CLOSE_GRACEFUL, CloseMode::GRACEFUL.as_raw());
const_assert_eq!(RF_CLOSE_FORCE, CloseMode::FORCE.as_raw());
const_assert_eq!(RF_SQ_NEED_WAKEUP, ConsumerLine::NEED_WAKEUP);
const_assert_eq!(RF_CQ_NEED_WAKEUP, ConsumerLine::NEED_WAKEUP);
const_assert_eq!(RF_CQ_OVERFLOW, ProducerLine::OVERFLOW);
const_assert_eq!(RF_SQ_FAILED, ConsumerLine::FAILED);
const_assert_eq!(RF_CQ_FAILED, ProducerLine::FAILED);

// Statuses: the values of the Rust `Status` (asserted below, by name):
// the negative errno where one corresponds (so `strerror(-status)` names
// it), else a library code at `RF_ELIBRARY_BASE` or below.
/// The library's own status codes are this value and below, outside the
/// errno range.
pub const RF_ELIBRARY_BASE: i32 = -4096;
/// The operation was canceled before it ran.
pub const RF_ECANCELED: i32 = -125; // -ECANCELED
/// The SQE's opcode is unknown.
pub const RF_EINVALID_OPCODE: i32 = -4097; // library
/// An SQE flag bit this version does not define. (A non-zero reserved or
/// unused SQE field is `RF_EINVALID_ARGUMENT`.)
pub const RF_EINVALID_FLAGS: i32 = -4098; // library
/// No such endpoint.
pub const RF_EINVALID_ENDPOINT: i32 = -4099; // library
/// No such local memory handle (never registered, or deregistered).
pub const RF_EINVALID_MEM_HANDLE: i32 = -4100; // library
/// No such remote key id.
pub const RF_EINVALID_RKEY: i32 = -4101; // library
/// The range lies outside its registered region.
pub const RF_EOUT_OF_BOUNDS: i32 = -14; // -EFAULT
/// An atomic's address is not 8-byte aligned.
pub const RF_EMISALIGNED: i32 = -4102; // library
/// A zero length where data is required, or a length over the limit.
pub const RF_EINVALID_LENGTH: i32 = -4103; // library
/// The target refused the access.
pub const RF_EACCESS_DENIED: i32 = -13; // -EACCES
/// The endpoint failed earlier.
pub const RF_EENDPOINT_FAILED: i32 = -4104; // library
/// The endpoint was closed.
pub const RF_EENDPOINT_CLOSED: i32 = -107; // -ENOTCONN
/// Out of resources (a full SQ, the request pool): try again later.
pub const RF_ENO_RESOURCE: i32 = -105; // -ENOBUFS
/// The transport reported an error.
pub const RF_ETRANSPORT: i32 = -70; // -ECOMM
/// Timed out.
pub const RF_ETIMEOUT: i32 = -62; // -ETIME
/// Not supported by the driver or this build.
pub const RF_EUNSUPPORTED: i32 = -95; // -EOPNOTSUPP
/// Ring indices are inconsistent (corrupt ring memory).
pub const RF_ERING_CORRUPT: i32 = -4105; // library
/// The peer is gone.
pub const RF_EPEER_UNREACHABLE: i32 = -113; // -EHOSTUNREACH
/// An invalid argument: a NULL pointer, a bad value, a handle of the
/// wrong kind, a malformed or damaged address or key blob, a non-zero
/// reserved field, or an SQE field its opcode does not use that is not
/// zero.
pub const RF_EINVALID_ARGUMENT: i32 = -22; // -EINVAL
/// The handle's object was destroyed.
pub const RF_ESTALE_HANDLE: i32 = -116; // -ESTALE
/// Out of memory.
pub const RF_ENO_MEMORY: i32 = -12; // -ENOMEM
/// The object is in use.
pub const RF_EBUSY: i32 = -16; // -EBUSY
/// The output buffer is too small, or a payload did not fit.
pub const RF_ETRUNCATED: i32 = -90; // -EMSGSIZE
/// Unknown atomic operation, fence mode or close mode.
pub const RF_EINVALID_SUBOP: i32 = -4106; // library
/// An operating system error, or an internal error of the library.
pub const RF_EIO: i32 = -5; // -EIO
/// Nothing ready yet (an empty CQ): try again later.
pub const RF_EAGAIN: i32 = -11; // -EAGAIN

/// Asserts each `RF_E*` constant equals the `Status` it is named after, and
/// lists them for the tests.
macro_rules! same_statuses {
    ($( $name:ident => $status:ident, )+) => {
        $( const_assert_eq!($name, Status::$status.as_raw()); )+
        /// Every `RF_E*` name with its value, in `Status::ALL`'s order.
        #[cfg(test)]
        pub(crate) const STATUS_NAMES: &[(&str, i32)] = &[$( (stringify!($name), $name) ),+];
    };
}

const_assert_eq!(RF_ELIBRARY_BASE, ringfence_ring::LIBRARY_BASE);

same_statuses! {
    RF_ECANCELED => Canceled,
    RF_EINVALID_OPCODE => InvalidOpcode,
    RF_EINVALID_FLAGS => InvalidFlags,
    RF_EINVALID_ENDPOINT => InvalidEndpoint,
    RF_EINVALID_MEM_HANDLE => InvalidMemHandle,
    RF_EINVALID_RKEY => InvalidRkey,
    RF_EOUT_OF_BOUNDS => OutOfBounds,
    RF_EMISALIGNED => Misaligned,
    RF_EINVALID_LENGTH => InvalidLength,
    RF_EACCESS_DENIED => AccessDenied,
    RF_EENDPOINT_FAILED => EndpointFailed,
    RF_EENDPOINT_CLOSED => EndpointClosed,
    RF_ENO_RESOURCE => NoResource,
    RF_ETRANSPORT => Transport,
    RF_ETIMEOUT => Timeout,
    RF_EUNSUPPORTED => Unsupported,
    RF_ERING_CORRUPT => RingCorrupt,
    RF_EPEER_UNREACHABLE => PeerUnreachable,
    RF_EINVALID_ARGUMENT => InvalidArgument,
    RF_ESTALE_HANDLE => StaleHandle,
    RF_ENO_MEMORY => NoMemory,
    RF_EBUSY => Busy,
    RF_ETRUNCATED => Truncated,
    RF_EINVALID_SUBOP => InvalidSubop,
    RF_EIO => Io,
    RF_EAGAIN => Again,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_has_its_c_name() {
        assert_eq!(STATUS_NAMES.len(), Status::ALL.len());
        for (&(name, value), status) in STATUS_NAMES.iter().zip(Status::ALL) {
            assert_eq!(value, status.as_raw(), "{name}");
            // The C name is the Rust variant's, shouted.
            let mut shouted = String::from("RF_E");
            for (i, c) in format!("{status:?}").chars().enumerate() {
                if c.is_uppercase() && i > 0 {
                    shouted.push('_');
                }
                shouted.push(c.to_ascii_uppercase());
            }
            assert_eq!(name, shouted);
        }
    }

    #[test]
    fn version_is_the_crate_version() {
        let [major, minor, patch] = [
            env!("CARGO_PKG_VERSION_MAJOR"),
            env!("CARGO_PKG_VERSION_MINOR"),
            env!("CARGO_PKG_VERSION_PATCH"),
        ]
        .map(|v| v.parse::<u32>().unwrap());
        assert_eq!(RF_VERSION, major << 16 | minor << 8 | patch);
    }
}
