//! Thin entry points to the driver's decoders for the fuzz targets under
//! `fuzz/` and the stable test that replays their corpus
//! (`tests/tests/fuzz_corpus.rs`). Built only with the `fuzzing` feature
//! and hidden from the docs: no part of the supported API.
//!
//! Each function calls the decoder the driver itself uses (the control
//! message decoder, the key blob decoder, the connection page check and the
//! notification channel's consumer) and returns plain values, so the fuzz
//! checks do not depend on the driver's private types.

use crate::channel::{Deliver, Inbound, check_page};
use crate::key::KeyBlob;
use crate::layout::{CHANNEL_AT, MAX_CHANNEL, MIN_CHANNEL};
use crate::memfd;
use crate::sys::region::SharedRegion;
use crate::wire::{self, KeyPath, Message};
use ringfence_ring::Status;
use std::cell::RefCell;
use std::os::fd::AsFd;

/// The longest control message.
pub const MAX_MESSAGE: usize = wire::MAX_MESSAGE;

/// Where the notification channel starts in a connection page.
pub const CHANNEL_OFFSET: u64 = CHANNEL_AT as u64;

/// Decodes one control message as the control thread does. On success:
/// its sequence number, the message (`Debug`-formatted), and the message
/// encoded again with the same sequence number.
pub fn decode_message(buf: &[u8]) -> Option<(u32, String, Vec<u8>)> {
    let (seq, message) = Message::decode(buf).ok()?;
    // What the initiator does with the statuses of replies.
    if let Message::Welcome { status, .. } | Message::Mapped { status, .. } = message {
        let _ = wire::status_from_wire(status);
    }
    if let Message::Mapped { path, .. } = message {
        let _ = KeyPath::from_raw(path);
    }
    Some((seq, format!("{message:?}"), message.encode(seq)))
}

/// Encodings of one message of every kind with sequence number `seq`, for
/// the seed corpus.
pub fn sample_messages(seq: u32) -> Vec<Vec<u8>> {
    [
        Message::Hello {
            lanes: 4,
            capacity: 1 << 16,
            instance: 0x0123_4567_89ab_cdef,
        },
        Message::Welcome {
            status: 0,
            notify_size: 256,
            notify_count: 8,
            export_slots: crate::layout::EXPORT_SLOTS,
            instance: 7,
        },
        Message::Welcome {
            status: Status::InvalidArgument.as_raw(),
            notify_size: 0,
            notify_count: 0,
            export_slots: 0,
            instance: 7,
        },
        Message::Map {
            slot: 3,
            generation: 1,
            secret: 0xdead_beef,
        },
        Message::Mapped {
            status: 0,
            path: KeyPath::Memfd.as_raw(),
            base: 0x7f00_0000_0000,
            len: 4096,
            fd_offset: 0,
        },
        Message::Mapped {
            status: Status::AccessDenied.as_raw(),
            path: 0,
            base: 0,
            len: 0,
            fd_offset: 0,
        },
    ]
    .iter()
    .map(|m| m.encode(seq))
    .collect()
}

/// The fields of the driver's part of a remote key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyFields {
    /// Reached through a memfd (`true`) or cross-memory attach.
    pub memfd: bool,
    /// The target driver's instance id.
    pub instance: u64,
    /// Export slot.
    pub slot: u32,
    /// Its generation.
    pub generation: u32,
    /// The secret.
    pub secret: u64,
    /// Claimed start of the region.
    pub base: u64,
    /// Claimed length of the region.
    pub len: u64,
}

/// Decodes the driver's part of a key blob as `unpack_rkey` does.
pub fn decode_key(blob: &[u8]) -> Option<KeyFields> {
    KeyBlob::decode(blob).map(|k| KeyFields {
        memfd: k.path == KeyPath::Memfd,
        instance: k.instance,
        slot: k.slot,
        generation: k.generation,
        secret: k.secret,
        base: k.base,
        len: k.len,
    })
}

/// Encodes the driver's part of a key blob as `pack_rkey` does.
pub fn encode_key(k: &KeyFields) -> Vec<u8> {
    KeyBlob {
        path: if k.memfd {
            KeyPath::Memfd
        } else {
            KeyPath::CrossMemoryAttach
        },
        instance: k.instance,
        slot: k.slot,
        generation: k.generation,
        secret: k.secret,
        base: k.base,
        len: k.len,
    }
    .encode()
}

/// One notification the channel's consumer handed to the sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivered {
    /// Offset of the payload in the connection page.
    pub offset: u64,
    /// Payload bytes.
    pub len: u32,
    /// The record's tag.
    pub tag: u64,
    /// Whether the payload range lay inside the mapped page.
    pub inside: bool,
}

/// What draining a connection page did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChannelOutcome {
    /// The page was refused before any record was read (bad capacity or
    /// header), as `HELLO` refuses it.
    Refused,
    /// The page was attached and drained.
    Drained {
        /// Notifications delivered, in order.
        delivered: Vec<Delivered>,
        /// Records dropped as too large for the sink's buffers.
        dropped: usize,
        /// Whether the consumer reported the channel corrupt.
        corrupt: bool,
        /// The consumer's head as published in the page afterwards.
        head: u64,
    },
}

/// A sink with `free` buffers of `size` bytes: full means `NoResource`
/// (the record stays for later), too large means dropped.
struct Sink {
    size: u32,
    free: RefCell<usize>,
    delivered: RefCell<Vec<Delivered>>,
}

impl Deliver for Sink {
    fn deliver(&self, page: &SharedRegion, offset: u64, len: u32, tag: u64) -> Result<(), Status> {
        if len > self.size {
            return Err(Status::InvalidArgument);
        }
        let mut free = self.free.borrow_mut();
        if *free == 0 {
            return Err(Status::NoResource);
        }
        *free -= 1;
        let mut payload = vec![0u8; len as usize];
        let inside = page.read(offset, &mut payload);
        self.delivered.borrow_mut().push(Delivered {
            offset,
            len,
            tag,
            inside,
        });
        Ok(())
    }
}

/// Attaches a connection page of `capacity` channel bytes whose contents
/// are `page` (zero-padded or cut to the page's size) the way the control
/// thread attaches a peer's page, then drains its channel in `rounds`
/// rounds of at most `budget` records, with `buffers` free sink buffers of
/// `buffer_size` bytes per round.
///
/// Capacities above 1 MiB are refused here (not by the driver) to keep
/// fuzz runs fast.
pub fn drain_connection_page(
    capacity: u32,
    page: &[u8],
    rounds: usize,
    budget: usize,
    buffers: usize,
    buffer_size: u32,
) -> ChannelOutcome {
    if !capacity.is_power_of_two()
        || !(MIN_CHANNEL..=MAX_CHANNEL).contains(&capacity)
        || capacity > 1 << 20
    {
        return ChannelOutcome::Refused;
    }
    let size = CHANNEL_AT as u64 + u64::from(capacity);
    let Ok(fd) = memfd::create("rf-fuzz-conn", size) else {
        return ChannelOutcome::Refused;
    };
    let Ok(writer) = SharedRegion::map(fd.as_fd(), 0, size as usize, true) else {
        return ChannelOutcome::Refused;
    };
    let n = page.len().min(size as usize);
    if !writer.write(0, &page[..n])
        || memfd::seal(fd.as_fd(), memfd::RESIZE_SEALS).is_err()
        || memfd::check(&fd, size).is_err()
    {
        return ChannelOutcome::Refused;
    }
    let Ok(map) = SharedRegion::map(fd.as_fd(), 0, size as usize, true) else {
        return ChannelOutcome::Refused;
    };
    if !check_page(&map, capacity) {
        return ChannelOutcome::Refused;
    }
    let inbound = Inbound::new(map, capacity, 0);
    let sink = Sink {
        size: buffer_size,
        free: RefCell::new(0),
        delivered: RefCell::new(Vec::new()),
    };
    let mut dropped = 0;
    let mut corrupt = false;
    for _ in 0..rounds {
        *sink.free.borrow_mut() = buffers;
        match inbound.drain(&sink, budget) {
            Ok(d) => dropped += d.dropped,
            Err(_) => {
                corrupt = true;
                break;
            }
        }
        if !inbound.has_pending() {
            break;
        }
    }
    let head = inbound
        .page()
        .word(crate::layout::HEAD_AT)
        .map_or(0, |w| w.load(std::sync::atomic::Ordering::Acquire));
    ChannelOutcome::Drained {
        delivered: sink.delivered.into_inner(),
        dropped,
        corrupt,
        head,
    }
}

/// The 16 bytes that open a valid connection page of `capacity` channel
/// bytes, for the seed corpus.
pub fn page_header(capacity: u32) -> Vec<u8> {
    let mut h = Vec::with_capacity(16);
    h.extend_from_slice(&crate::layout::CONN_MAGIC.to_le_bytes());
    h.extend_from_slice(&crate::layout::CONN_VERSION.to_le_bytes());
    h.extend_from_slice(&capacity.to_le_bytes());
    h
}

/// Offsets of the shared words in a connection page: the producer's tail,
/// the consumer's head, and the wake flag.
pub const PAGE_WORDS: (u64, u64, u64) = (
    crate::layout::TAIL_AT as u64,
    crate::layout::HEAD_AT as u64,
    crate::layout::WAKE_AT as u64,
);

/// Record kinds of the channel: a notification and a pad.
pub const RECORD_KINDS: (u32, u32) = (crate::layout::KIND_NOTIFY, crate::layout::KIND_PAD);
