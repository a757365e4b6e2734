//! The frame header's checks, field by field.

use super::*;

const MAX: u32 = 1 << 20;

fn put() -> Header {
    Header {
        len: 64,
        seq: 7,
        key: 3,
        secret: 0xfeed,
        addr: 0x1000,
        ..Header::new(Opcode::Put, 2)
    }
}

#[test]
fn every_opcode_round_trips() {
    let frames = [
        Header {
            arg: 4,
            seq: 9,
            addr: 1,
            operand: 5,
            ..Header::new(Opcode::Hello, 3)
        },
        Header {
            operand: 5,
            status: Status::AccessDenied.as_raw(),
            ..Header::new(Opcode::HelloAck, 3)
        },
        Header {
            operand: 5,
            addr: u64::from(u32::MAX),
            ..Header::new(Opcode::HelloAck, 3)
        },
        put(),
        Header {
            opcode: Opcode::Get,
            ..put()
        },
        Header {
            opcode: Opcode::Atomic,
            arg: AtomicOp::CSWAP.as_raw(),
            len: 8,
            operand: 1,
            operand2: 2,
            ..put()
        },
        Header {
            len: 12,
            operand: 77,
            ..Header::new(Opcode::Notify, 0)
        },
        Header::new(Opcode::Bye, 0),
        Header {
            seq: 10,
            ..Header::new(Opcode::Ack, 1)
        },
        Header {
            seq: 10,
            len: 100,
            arg: LAST,
            ..Header::new(Opcode::GetData, 1)
        },
        Header {
            seq: 10,
            operand: u64::MAX,
            ..Header::new(Opcode::AtomicData, 1)
        },
    ];
    for h in frames {
        assert_eq!(Header::decode(&h.encode(), MAX), Ok(h));
    }
}

#[test]
fn wrong_version_is_refused() {
    for version in [0, 1, VERSION + 1] {
        let mut b = put().encode();
        b[0] = version;
        assert_eq!(Header::decode(&b, MAX), Err(FrameError::Version(version)));
    }
}

#[test]
fn unknown_opcodes_are_refused() {
    for raw in [0u8, 11, 0x80, 0xff] {
        let mut b = put().encode();
        b[1] = raw;
        assert_eq!(Header::decode(&b, MAX), Err(FrameError::Opcode(raw)));
    }
}

#[test]
fn lanes_beyond_64_are_refused() {
    let mut b = put().encode();
    b[2] = 64;
    assert_eq!(Header::decode(&b, MAX), Err(FrameError::Lane(64)));
}

#[test]
fn oversized_frames_are_refused() {
    for opcode in [Opcode::Put, Opcode::Get, Opcode::Notify] {
        let mut h = Header {
            opcode,
            len: MAX + 1,
            ..put()
        };
        if opcode == Opcode::Notify {
            h = Header {
                len: MAX + 1,
                ..Header::new(Opcode::Notify, 0)
            };
        }
        assert_eq!(
            Header::decode(&h.encode(), MAX),
            Err(FrameError::Length {
                opcode,
                len: MAX + 1
            })
        );
    }
    let data = Header {
        len: MAX + 1,
        ..Header::new(Opcode::GetData, 0)
    };
    assert!(matches!(
        Header::decode(&data.encode(), MAX),
        Err(FrameError::Length { .. })
    ));
}

#[test]
fn wrong_fixed_lengths_are_refused() {
    for (opcode, len) in [
        (Opcode::Hello, 1),
        (Opcode::HelloAck, 8),
        (Opcode::Atomic, 4),
        (Opcode::Atomic, 16),
        (Opcode::Ack, 1),
        (Opcode::AtomicData, 8),
        (Opcode::Bye, 56),
    ] {
        let h = Header {
            len,
            ..Header::new(opcode, 0)
        };
        assert_eq!(
            Header::decode(&h.encode(), MAX),
            Err(FrameError::Length { opcode, len }),
            "{opcode:?}"
        );
    }
    // A failed GET_DATA carries no data.
    let h = Header {
        len: 4,
        status: Status::OutOfBounds.as_raw(),
        ..Header::new(Opcode::GetData, 0)
    };
    assert!(matches!(
        Header::decode(&h.encode(), MAX),
        Err(FrameError::Length { .. })
    ));
}

#[test]
fn non_zero_reserved_fields_are_refused() {
    // Byte offsets of fields each opcode leaves unused.
    let unused: [(Opcode, &[usize]); 10] = [
        (Opcode::Hello, &[16, 20, 24, 48]),
        (Opcode::HelloAck, &[3, 16, 24, 36, 48]),
        (Opcode::Put, &[3, 20, 40, 48]),
        (Opcode::Get, &[3, 20, 40, 48]),
        (Opcode::Atomic, &[20, 48]),
        (Opcode::Notify, &[3, 16, 20, 24, 32, 48]),
        (Opcode::Ack, &[3, 16, 24, 32, 40, 48]),
        (Opcode::GetData, &[16, 24, 32, 40, 48]),
        (Opcode::AtomicData, &[3, 16, 24, 32, 48]),
        (Opcode::Bye, &[3, 8, 16, 20, 24, 32, 40, 48]),
    ];
    for (opcode, offsets) in unused {
        let len = match opcode {
            Opcode::Atomic => 8,
            _ => 0,
        };
        let base = Header {
            len,
            ..Header::new(opcode, 0)
        };
        assert!(Header::decode(&base.encode(), MAX).is_ok(), "{opcode:?}");
        for &at in offsets {
            let mut b = base.encode();
            // The high byte of the field: a positive status, for the
            // status field (0x01 in its low byte would be too).
            b[at] = 1;
            let decoded = Header::decode(&b, MAX);
            assert!(
                matches!(decoded, Err(FrameError::Reserved { .. })),
                "{opcode:?} byte {at}: {decoded:?}"
            );
        }
    }
}

#[test]
fn unknown_atomic_sub_operations_pass_the_frame_check() {
    // The target answers them with InvalidSubop; the stream stays sound.
    let h = Header {
        opcode: Opcode::Atomic,
        arg: 200,
        len: 8,
        ..put()
    };
    assert_eq!(Header::decode(&h.encode(), MAX), Ok(h));
}

#[test]
fn response_statuses_map_to_statuses() {
    let h = Header {
        status: Status::OutOfBounds.as_raw(),
        ..Header::new(Opcode::Ack, 0)
    };
    assert_eq!(h.result(), Err(Status::OutOfBounds));
    let unknown = Header { status: -1000, ..h };
    assert_eq!(unknown.result(), Err(Status::Transport));
}
