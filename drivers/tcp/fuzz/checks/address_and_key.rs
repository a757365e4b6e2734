//! The `address_and_key` target: the address and remote-key decoders never panic, and
//! what they take re-encodes to the same bytes.
//!
//! Input: any bytes, given to [`Address::decode`] and [`KeyBlob::decode`].

use ringfence_tcp::wire::{Address, KEY_LEN, KeyBlob};

/// `address_and_key`: the address and key decoders never panic, and what they take
/// re-encodes to the same bytes.
pub fn address_and_key(data: &[u8]) {
    if let Some(a) = Address::decode(data) {
        assert_eq!(a.encode(), data, "{a:?}");
        assert_ne!(a.socket.port(), 0);
        assert!(!a.socket.ip().is_unspecified());
    }
    if let Some(k) = KeyBlob::decode(data) {
        assert_eq!(k.encode(), data, "{k:?}");
        assert_eq!(data.len(), KEY_LEN);
        assert!(k.base.checked_add(k.len).is_some());
    }
}

/// The target's seeds: addresses and keys, valid and not.
pub fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut out = Vec::new();
    // address_and_key: addresses and keys, valid and not.
    let v4 = Address {
        socket: "127.0.0.1:7000".parse().expect("v4"),
        instance: 0x0123_4567_89ab_cdef,
    };
    let v6 = Address {
        socket: "[fd00::2]:65535".parse().expect("v6"),
        instance: 1,
    };
    let key = KeyBlob {
        instance: 0x0123_4567_89ab_cdef,
        key: 3,
        secret: 0x5ec2_e75e_c2e7_5ec2,
        base: 0x7f00_0000_0000,
        len: 1 << 20,
    };
    out.push(("address_and_key", "address_v4".into(), v4.encode()));
    out.push(("address_and_key", "address_v6".into(), v6.encode()));
    out.push(("address_and_key", "key".into(), key.encode()));
    let mut unspecified = v4.encode();
    unspecified[15..19].copy_from_slice(&[0; 4]);
    out.push(("address_and_key", "address_unspecified".into(), unspecified));
    let mut port0 = v4.encode();
    port0[5..7].copy_from_slice(&[0; 2]);
    out.push(("address_and_key", "address_port0".into(), port0));
    let wraps = KeyBlob {
        base: u64::MAX - 10,
        len: 11,
        ..key
    };
    out.push(("address_and_key", "key_wraps".into(), wraps.encode()));
    let mut short = key.encode();
    short.pop();
    out.push(("address_and_key", "key_short".into(), short));
    out
}
