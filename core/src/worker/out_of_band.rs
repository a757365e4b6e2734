//! What travels between workers out of band: worker addresses and packed
//! remote keys, as one framing each. Both end in an integrity check (a
//! CRC-32C of every byte before it, `crate::checksum`), so that a blob
//! damaged on its way (a flipped bit, a cut or padded copy) is refused as
//! it is decoded, with a clear error, before anything reaches the peer.
//! Decoding checks every field; the errors say what is wrong, for
//! [`Error::Malformed`].

use super::*;
use crate::checksum;
use crate::driver::DriverError;

const ADDRESS_MAGIC: &[u8; 4] = b"RFWA";
/// Version 1 had no integrity check.
const ADDRESS_VERSION: u8 = 2;
const KEY_MAGIC: &[u8; 4] = b"RFKY";
/// Format 1 (no header, no integrity check) was the bare parts.
const KEY_VERSION: u8 = 2;

/// The worker address: `"RFWA"`, version 2, the number of drivers, per
/// driver its name's length (`u8`), its name, its part's length
/// (little-endian `u16`) and its part; then the check.
///
/// # Errors
/// A field the format cannot hold is refused, never truncated (a cut
/// length would make an address its own decoder rejects, or worse, one
/// that decodes to other parts): more than 255 drivers or a driver name
/// that is empty or longer than [`MAX_NAME_LEN`] bytes
/// ([`Error::Drivers`]), a driver's part longer than [`MAX_PART_LEN`]
/// bytes ([`Error::Driver`] with [`Status::InvalidArgument`]). The
/// status of each is [`Status::InvalidArgument`]. Refusing long names
/// here, as the worker is built, also keeps them out of packed keys,
/// which carry the name with the same one-byte length.
pub(super) fn encode_address(drivers: &[Box<dyn Driver>]) -> Result<Vec<u8>, Error> {
    let count = u8::try_from(drivers.len())
        .map_err(|_| Error::Drivers(format!("{} drivers: at most 255", drivers.len())))?;
    let mut out = ADDRESS_MAGIC.to_vec();
    out.push(ADDRESS_VERSION);
    out.push(count);
    for d in drivers {
        let name = d.name();
        let name_len = u8::try_from(name.len())
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                Error::Drivers(format!(
                    "a driver name of {} bytes: names are 1 to {MAX_NAME_LEN} bytes",
                    name.len()
                ))
            })?;
        let part = d.address();
        let part_len = u16::try_from(part.len()).map_err(|_| Error::Driver {
            driver: name,
            op: "worker address",
            source: DriverError::new(
                Status::InvalidArgument,
                format!(
                    "its address part is {} bytes: a worker address holds at most \
                     {MAX_PART_LEN} per driver",
                    part.len()
                ),
            ),
        })?;
        out.push(name_len);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&part_len.to_le_bytes());
        out.extend_from_slice(&part);
    }
    checksum::seal(&mut out);
    Ok(out)
}

/// The longest driver name a worker address (and a packed key) holds: its
/// length is one byte.
pub(crate) const MAX_NAME_LEN: usize = u8::MAX as usize;
/// The longest address part of one driver a worker address holds: its
/// length is a `u16`.
pub(crate) const MAX_PART_LEN: usize = u16::MAX as usize;

/// The body of a sealed blob after its magic and version byte, checked in
/// order: the magic, the version, that there is a version byte, the check.
/// `errors` says what is wrong at each of those four steps.
fn open_sealed<'a>(
    blob: &'a [u8],
    magic: &[u8],
    version: u8,
    errors: [&'static str; 4],
) -> Result<&'a [u8], &'static str> {
    let [no_magic, unknown_version, cut, damaged] = errors;
    let rest = blob.strip_prefix(magic).ok_or(no_magic)?;
    match rest.first() {
        Some(&v) if v == version => {}
        Some(_) => return Err(unknown_version),
        None => return Err(cut),
    }
    let body = checksum::open(blob).ok_or(damaged)?;
    body.get(magic.len() + 1..).ok_or(cut)
}

/// The (name, part) pairs of a peer's address, checked field by field: the
/// magic, the version, the check, names that are non-empty UTF-8 and
/// distinct, lengths that account for every byte.
///
/// # Errors
/// What is wrong with it.
pub(super) fn decode_address(address: &[u8]) -> Result<Vec<(&str, &[u8])>, &'static str> {
    let cut = "the worker address is cut short";
    let (&count, mut rest) = open_sealed(
        address,
        ADDRESS_MAGIC,
        ADDRESS_VERSION,
        [
            "not a worker address (no RFWA magic)",
            "a worker address of an unknown version",
            cut,
            "the worker address fails its integrity check (damaged or cut short)",
        ],
    )?
    .split_first()
    .ok_or(cut)?;
    let mut parts: Vec<(&str, &[u8])> = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        let (&name_len, r) = rest.split_first().ok_or(cut)?;
        let (name, r) = r.split_at_checked(usize::from(name_len)).ok_or(cut)?;
        let (len, r) = r.split_first_chunk::<2>().ok_or(cut)?;
        let (part, r) = r
            .split_at_checked(usize::from(u16::from_le_bytes(*len)))
            .ok_or(cut)?;
        let name = std::str::from_utf8(name)
            .ok()
            .filter(|n| !n.is_empty())
            .ok_or("a driver name in the worker address is not a name")?;
        if parts.iter().any(|(n, _)| *n == name) {
            return Err("the worker address names a driver twice");
        }
        parts.push((name, part));
        rest = r;
    }
    if !rest.is_empty() {
        return Err("the worker address has bytes after its last part");
    }
    Ok(parts)
}

/// A packed remote key: `"RFKY"`, format 2, the number of parts, each part
/// (made by `memory::blob::encode`) prefixed with its length as a
/// little-endian `u32`; then the check.
pub(super) fn encode_key(parts: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(6 + parts.iter().map(|p| 4 + p.len()).sum::<usize>() + 4);
    out.extend_from_slice(KEY_MAGIC);
    out.push(KEY_VERSION);
    out.push(parts.len() as u8);
    for p in parts {
        out.extend_from_slice(&(p.len() as u32).to_le_bytes());
        out.extend_from_slice(p);
    }
    checksum::seal(&mut out);
    out
}

/// The parts of a packed remote key, in order, each decoded and checked
/// (`memory::blob::decode`) before any of them is used: the magic, the
/// format, the check, no bytes after the last part, no driver twice, and
/// the same region (and kind of memory) in every part.
///
/// # Errors
/// What is wrong with it.
pub(super) fn decode_key(key: &[u8]) -> Result<Vec<blob::Decoded<'_>>, &'static str> {
    let cut = "the packed remote key is cut short";
    let (&count, mut rest) = open_sealed(
        key,
        KEY_MAGIC,
        KEY_VERSION,
        [
            "not a packed remote key (no RFKY magic)",
            "a packed remote key of an unknown format",
            cut,
            "the packed remote key fails its integrity check (damaged or cut short)",
        ],
    )?
    .split_first()
    .ok_or(cut)?;
    let mut parts: Vec<blob::Decoded<'_>> = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        let (len, r) = rest.split_first_chunk::<4>().ok_or(cut)?;
        let (part, r) = r
            .split_at_checked(u32::from_le_bytes(*len) as usize)
            .ok_or(cut)?;
        let part = blob::decode(part)?;
        if parts.iter().any(|p| p.driver == part.driver) {
            return Err("the packed remote key has two parts for one driver");
        }
        if parts
            .first()
            .is_some_and(|p| (p.base, p.len, p.kind) != (part.base, part.len, part.kind))
        {
            return Err("the parts of the packed remote key disagree on the region");
        }
        parts.push(part);
        rest = r;
    }
    if !rest.is_empty() {
        return Err("the packed remote key has bytes after its last part");
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Loopback;

    fn address() -> Vec<u8> {
        let drivers: Vec<Box<dyn Driver>> = vec![Box::new(Loopback::new())];
        encode_address(&drivers).unwrap()
    }

    /// A loopback driver whose address part is `extra` bytes longer, and
    /// whose name may be any length (`Loopback::named`).
    #[derive(Debug)]
    struct Wide {
        inner: Loopback,
        extra: usize,
    }

    impl Wide {
        fn boxed(inner: Loopback, extra: usize) -> Vec<Box<dyn Driver>> {
            vec![Box::new(Wide { inner, extra })]
        }
    }

    impl Driver for Wide {
        fn name(&self) -> &'static str {
            self.inner.name()
        }
        fn capabilities(&self) -> crate::driver::Capabilities {
            self.inner.capabilities()
        }
        fn attach(&mut self, ctx: crate::driver::DriverContext) {
            self.inner.attach(ctx);
        }
        fn address(&self) -> Vec<u8> {
            let mut a = self.inner.address();
            a.resize(a.len() + self.extra, 0xa5);
            a
        }
        fn connect(
            &mut self,
            peer: &[u8],
            lanes: u8,
            token: crate::driver::Token,
        ) -> Result<crate::driver::Connect, DriverError> {
            self.inner.connect(peer, lanes, token)
        }
        fn disconnect(&mut self, ep: DriverEp) {
            self.inner.disconnect(ep);
        }
        fn register(
            &mut self,
            mem: &MemDesc,
            prepared: Prepared,
        ) -> Result<Registered, DriverError> {
            self.inner.register(mem, prepared)
        }
        fn deregister(&mut self, key: DriverMemKey) {
            self.inner.deregister(key);
        }
        fn pack_rkey(&self, key: DriverMemKey) -> Result<Vec<u8>, DriverError> {
            self.inner.pack_rkey(key)
        }
        fn unpack_rkey(
            &mut self,
            ep: DriverEp,
            part: &KeyPart<'_>,
            prepared: Prepared,
        ) -> Result<Unpacked, DriverError> {
            self.inner.unpack_rkey(ep, part, prepared)
        }
        #[allow(unsafe_code)] // forwards the unsafe `post`
        unsafe fn post(
            &mut self,
            ep: DriverEp,
            op: &crate::driver::Op,
            token: crate::driver::Token,
        ) -> crate::driver::Posted {
            // SAFETY: the caller's contract is the inner driver's.
            unsafe { self.inner.post(ep, op, token) }
        }
        fn flush(
            &mut self,
            ep: DriverEp,
            lanes: crate::driver::LaneMask,
            token: crate::driver::Token,
        ) -> crate::driver::Posted {
            self.inner.flush(ep, lanes, token)
        }
        fn poll(&mut self, out: &mut [crate::driver::Completion]) -> usize {
            self.inner.poll(out)
        }
    }

    /// A driver's address part of the longest length the format holds is
    /// encoded whole; one byte more, or 70,000 bytes, is refused with
    /// `InvalidArgument`, never cut to its low 16 bits (70,000 would have
    /// been encoded as 4,464). The worker builder reports the same error.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "safe encoding only, and 70,000-byte parts are too slow interpreted"
    )]
    fn an_address_part_longer_than_the_format_holds_is_refused() {
        let base = Loopback::new().address().len();
        let a = encode_address(&Wide::boxed(Loopback::new(), MAX_PART_LEN - base)).unwrap();
        let parts = decode_address(&a).unwrap();
        assert_eq!(parts[0].1.len(), MAX_PART_LEN);
        for extra in [MAX_PART_LEN - base + 1, 70_000 - base] {
            let err = encode_address(&Wide::boxed(Loopback::new(), extra)).unwrap_err();
            assert_eq!(err.status(), Status::InvalidArgument, "{err}");
            assert!(
                matches!(
                    err,
                    Error::Driver {
                        driver: "loopback",
                        ..
                    }
                ),
                "{err:?}"
            );
        }
        let built = crate::Worker::builder()
            .ignore_env()
            .driver(Wide {
                inner: Loopback::new(),
                extra: 70_000 - base,
            })
            .build();
        let err = built.expect_err("a 70,000-byte part is refused");
        assert_eq!(err.status(), Status::InvalidArgument, "{err}");
    }

    /// A driver name of 255 bytes is encoded whole; one of 256 or 300
    /// bytes, or an empty one, is refused with `InvalidArgument`, never
    /// cut to its low 8 bits (300 would have been encoded as 44, and the
    /// rest of the name read as the part's length).
    #[test]
    fn a_driver_name_the_format_cannot_hold_is_refused() {
        // Names are `&'static str`: slices of one static (a leaked
        // `String` would be reported by miri).
        static NAMES: [u8; 300] = [b'n'; 300];
        let name = |len: usize| -> &'static str { std::str::from_utf8(&NAMES[..len]).unwrap() };
        let a = encode_address(&Wide::boxed(Loopback::new().named(name(MAX_NAME_LEN)), 0)).unwrap();
        assert_eq!(decode_address(&a).unwrap()[0].0.len(), MAX_NAME_LEN);
        for len in [0, MAX_NAME_LEN + 1, 300] {
            let err =
                encode_address(&Wide::boxed(Loopback::new().named(name(len)), 0)).unwrap_err();
            assert_eq!(err.status(), Status::InvalidArgument, "{len}: {err}");
            assert!(matches!(err, Error::Drivers(_)), "{len}: {err:?}");
        }
        let built = crate::Worker::builder()
            .ignore_env()
            .driver(Loopback::new().named(name(300)))
            .build();
        let err = built.expect_err("a 300-byte name is refused");
        assert_eq!(err.status(), Status::InvalidArgument, "{err}");
    }

    fn flip(blob: &[u8], bit: usize) -> Vec<u8> {
        let mut bad = blob.to_vec();
        bad[bit / 8] ^= 1 << (bit % 8);
        bad
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "safe decoding only, and a checksum per flipped bit is too slow interpreted"
    )]
    fn an_address_round_trips_and_every_damage_is_refused() {
        let a = address();
        let parts = decode_address(&a).unwrap();
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].0, "loopback");
        for bit in 0..a.len() * 8 {
            assert!(decode_address(&flip(&a, bit)).is_err(), "bit {bit}");
        }
        for cut in 0..a.len() {
            assert!(decode_address(&a[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = a.clone();
        long.push(0);
        assert!(decode_address(&long).is_err(), "a trailing byte");
        // Well sealed but malformed: each field is checked on its own.
        let sealed = |mut body: Vec<u8>| {
            checksum::seal(&mut body);
            body
        };
        let mut two = b"RFWA\x02\x02".to_vec();
        for _ in 0..2 {
            two.extend_from_slice(b"\x01x\x00\x00");
        }
        assert_eq!(
            decode_address(&sealed(two)).unwrap_err(),
            "the worker address names a driver twice"
        );
        assert!(decode_address(&sealed(b"RFWA\x02\x01\x00\x00\x00".to_vec())).is_err());
        assert!(decode_address(&sealed(b"RFWA\x02\x00\x00".to_vec())).is_err());
        assert!(decode_address(&sealed(b"RFWA\x02\x01\x01x\x05\x00ab".to_vec())).is_err());
        assert!(decode_address(&sealed(b"RFWA\x01\x00".to_vec())).is_err());
        assert!(decode_address(&sealed(b"RFWA\x02\x00".to_vec())).is_ok());
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "safe decoding only, and a checksum per flipped bit is too slow interpreted"
    )]
    fn a_packed_key_round_trips_and_every_damage_is_refused() {
        let parts = [
            blob::encode("shm", MemKind::Host, 0x1000, 64, &[7; 48]),
            blob::encode("tcp", MemKind::Host, 0x1000, 64, &[9; 44]),
        ];
        let key = encode_key(&parts);
        let decoded = decode_key(&key).unwrap();
        assert_eq!(decoded.len(), 2);
        assert_eq!(
            (decoded[1].driver, decoded[1].driver_blob),
            ("tcp", &[9; 44][..])
        );
        for bit in 0..key.len() * 8 {
            assert!(decode_key(&flip(&key, bit)).is_err(), "bit {bit}");
        }
        for cut in 0..key.len() {
            assert!(decode_key(&key[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = key.clone();
        long.push(0);
        assert!(decode_key(&long).is_err(), "a trailing byte");
        // Well sealed but inconsistent.
        let twice = encode_key(&[parts[0].clone(), parts[0].clone()]);
        assert_eq!(
            decode_key(&twice).unwrap_err(),
            "the packed remote key has two parts for one driver"
        );
        for other in [
            blob::encode("tcp", MemKind::Host, 0x1000, 65, &[9; 44]),
            blob::encode("tcp", MemKind::Cuda(0), 0x1000, 64, &[9; 44]),
        ] {
            assert_eq!(
                decode_key(&encode_key(&[parts[0].clone(), other])).unwrap_err(),
                "the parts of the packed remote key disagree on the region"
            );
        }
        let mut padded = key[..key.len() - 4].to_vec();
        padded.push(0);
        checksum::seal(&mut padded);
        assert_eq!(
            decode_key(&padded).unwrap_err(),
            "the packed remote key has bytes after its last part"
        );
        assert!(decode_key(&encode_key(&[])).unwrap().is_empty());
    }
}
