//! The layouts of the memory this driver shares, as `#[repr(C)]` structs
//! with asserted offsets (the structs are never built: offsets are taken
//! from them and every access goes through bounds-checked offsets).
//!
//! # The shared words
//!
//! | field | writer | reader | ordering | pairs with |
//! |---|---|---|---|---|
//! | `ConnPage::tail` | initiator, once per NOTIFY record | target's `poll` | Release store / Acquire load | publishes the record (and every earlier copy into the target's memory) |
//! | `ConnPage::head` | target's `poll` (or its control thread), once per drained batch | initiator, when its cached head says full | Release store / Acquire load | the target's reads of the records are done before the bytes are reused |
//! | `ConnPage::wake` | target's control thread (arms when its worker stops polling, disarms when it polls again) | initiator, after publishing a record | Relaxed, each side fenced by SeqCst | store-buffering: either the initiator sees `NEED_WAKEUP` and rings the doorbell, or the control thread, after arming, sees the record and drains it |
//! | `ConnPage::cma_active` | initiator, around each cross-memory-attach access | target's `deregister` | SeqCst store / SeqCst load, against SeqCst store / load of the status word | Dekker: either the initiator sees the key revoked, or the target waits for the access to end |
//! | status word of slot `s` | target (`register`, `deregister`) | initiator, before every access with a key of slot `s` | Release or SeqCst store / Acquire or SeqCst load | the export's bounds were set before it is live |
//! | liveness word (status page, after the slots) | target's control thread (its id, once; `OWNER_DIED` when it ends), or the kernel as that thread exits (`OWNER_DIED`, a locked cmpxchg) | initiator, before every operation and after every flush's fence | Release store / Acquire load | the thread's death happens before its process can be reaped: a peer that loads the word after the reap sees it marked |

use static_assertions::const_assert_eq;

/// One cache line pair, as the ring crate pads its index lines.
pub(crate) const LINE: usize = 128;

/// The connection page: created by the initiator of an endpoint (one per
/// endpoint), passed to the target at connect, mapped writable by both.
/// The notification channel's bytes follow it (`capacity` bytes).
#[repr(C)]
#[allow(dead_code)] // a layout description: only its offsets are used
pub(crate) struct ConnPage {
    /// [`CONN_MAGIC`]; written once by the initiator before sharing.
    pub magic: u64,
    /// [`CONN_VERSION`].
    pub version: u32,
    /// Channel bytes after this header: a power of two in
    /// `MIN_CHANNEL..=MAX_CHANNEL`.
    pub capacity: u32,
    _pad0: [u8; LINE - 16],
    /// Bytes ever published by the initiator (wraps at 2^64).
    pub tail: u64,
    _pad1: [u8; LINE - 8],
    /// Bytes ever consumed by the target (wraps at 2^64).
    pub head: u64,
    /// [`NEED_WAKEUP`] while the target's worker is not polling: a producer
    /// that publishes then rings the target's doorbell.
    pub wake: u64,
    _pad2: [u8; LINE - 16],
    /// `slot + 1` while a cross-memory-attach access with a key of `slot`
    /// runs, else 0.
    pub cma_active: u64,
    _pad3: [u8; LINE - 8],
}

const_assert_eq!(core::mem::offset_of!(ConnPage, capacity), 12);
const_assert_eq!(core::mem::offset_of!(ConnPage, tail), LINE);
const_assert_eq!(core::mem::offset_of!(ConnPage, head), 2 * LINE);
const_assert_eq!(core::mem::offset_of!(ConnPage, wake), 2 * LINE + 8);
const_assert_eq!(core::mem::offset_of!(ConnPage, cma_active), 3 * LINE);
const_assert_eq!(core::mem::size_of::<ConnPage>(), 4 * LINE);

/// `"RFSHCONN"`.
pub(crate) const CONN_MAGIC: u64 = u64::from_le_bytes(*b"RFSHCONN");
/// The connection page's version.
pub(crate) const CONN_VERSION: u32 = 1;
/// Where the channel bytes start.
pub(crate) const CHANNEL_AT: usize = core::mem::size_of::<ConnPage>();
/// Offsets of the shared words.
pub(crate) const TAIL_AT: usize = core::mem::offset_of!(ConnPage, tail);
pub(crate) const HEAD_AT: usize = core::mem::offset_of!(ConnPage, head);
pub(crate) const WAKE_AT: usize = core::mem::offset_of!(ConnPage, wake);
/// The bit of `ConnPage::wake`.
pub(crate) const NEED_WAKEUP: u64 = 1;
pub(crate) const CMA_ACTIVE_AT: usize = core::mem::offset_of!(ConnPage, cma_active);
/// Smallest and largest channel.
pub(crate) const MIN_CHANNEL: u32 = 4096;
pub(crate) const MAX_CHANNEL: u32 = 64 << 20;

/// A channel record's header; the payload follows, and the record is padded
/// to [`RECORD_ALIGN`]. Records never wrap: a [`KIND_PAD`] record fills the
/// end of the channel instead.
#[repr(C)]
#[allow(dead_code)] // a layout description: encoded and decoded by hand
pub(crate) struct RecordHeader {
    /// Payload bytes (for a pad record: the bytes it skips after its header).
    pub len: u32,
    /// [`KIND_NOTIFY`] or [`KIND_PAD`].
    pub kind: u32,
    /// The notification's tag (the target CQE's `user_data`).
    pub tag: u64,
}

const_assert_eq!(core::mem::size_of::<RecordHeader>(), 16);

/// Record header size, and the alignment of every record.
pub(crate) const RECORD_ALIGN: u64 = 16;
/// A notification.
pub(crate) const KIND_NOTIFY: u32 = 1;
/// Padding to the end of the channel.
pub(crate) const KIND_PAD: u32 = 2;

/// The export status page: created by the target when its driver starts,
/// one `u64` per export slot; peers map it read-only (it is sealed with
/// `F_SEAL_FUTURE_WRITE`, so no process can map it writable again). Word
/// `s` is the generation of the live export in slot `s`, or 0.
pub(crate) const EXPORT_SLOTS: u32 = 1 << 16;
/// After the slot words of a status page of `slots` slots: the target's
/// **liveness word**, a `u32` on its own line that the kernel marks when
/// the target's control thread ends (`sys::robust`). A peer reads it from
/// its read-only mapping before every operation and after every flush.
pub(crate) const fn liveness_at(slots: u32) -> u64 {
    slots as u64 * 8
}
/// The status page's full length for `slots` slots: the slot words, then
/// one line holding the liveness word.
pub(crate) const fn status_page_len(slots: u32) -> u64 {
    liveness_at(slots) + LINE as u64
}
