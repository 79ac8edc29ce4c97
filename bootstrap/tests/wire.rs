//! Control-message encoding: every message round-trips; bad bodies give the
//! promised error; thousands of random, truncated and mutated frames never
//! panic (the stable-toolchain stand-in for the `wire_decode` fuzz target).

mod common;

use std::io::Cursor;

use bootstrap::wire::{
    read_frame, read_message, write_message, Endpoint, Message, QpInfo, Region, Space, WireError,
    FRAME_BYTES_MAX, WHY_BYTES_MAX,
};

#[test]
fn every_message_round_trips_through_a_stream() {
    let mut buf = Vec::new();
    for m in common::sample_messages() {
        write_message(&mut buf, &m).unwrap();
    }
    let mut r = Cursor::new(buf);
    for m in common::sample_messages() {
        assert_eq!(read_message(&mut r).unwrap(), m);
    }
    assert!(matches!(read_message(&mut r), Err(WireError::Closed)));
}

#[test]
fn hello_bytes_are_as_documented() {
    let f = Message::Hello {
        node_id: 0x0102_0304,
        nonce: [0xee; 32],
        protocol: 0x0a0b,
    }
    .encode_frame();
    assert_eq!(&f[..4], &39u32.to_be_bytes());
    assert_eq!(f[4], 1, "tag");
    assert_eq!(&f[5..9], &[1, 2, 3, 4]);
    assert_eq!(&f[41..], &[0x0a, 0x0b], "protocol, last");
    assert_eq!(f.len(), 43);
    // A Hello ending at the nonce, as protocol 1's builds sent it, reads
    // as protocol 1; one byte of version is truncated.
    let old = Message::decode_body(&f[4..41]).unwrap();
    assert!(matches!(old, Message::Hello { protocol: 1, .. }), "{old:?}");
    assert!(matches!(
        Message::decode_body(&f[4..42]),
        Err(WireError::Truncated { field: "protocol" })
    ));
    assert_eq!(
        old.encode_frame(),
        [&37u32.to_be_bytes(), &f[4..41]].concat()
    );
    for bad in [0u16, 1] {
        let mut b = f[4..41].to_vec();
        b.extend_from_slice(&bad.to_be_bytes());
        assert!(matches!(
            Message::decode_body(&b),
            Err(WireError::Invalid {
                field: "protocol",
                ..
            })
        ));
    }
}

#[test]
fn bad_bodies_give_the_promised_errors() {
    let body = |m: &Message| m.encode_frame()[4..].to_vec();
    assert!(matches!(Message::decode_body(&[]), Err(WireError::Empty)));
    assert!(matches!(
        Message::decode_body(&[0]),
        Err(WireError::UnknownTag(0))
    ));
    assert!(matches!(
        Message::decode_body(&[200, 1, 2]),
        Err(WireError::UnknownTag(200))
    ));

    let hello = body(&Message::Hello {
        node_id: 1,
        nonce: [0; 32],
        protocol: bootstrap::wire::PROTOCOL,
    });
    assert!(matches!(
        Message::decode_body(&hello[..3]),
        Err(WireError::Truncated { field: "node_id" })
    ));
    assert!(matches!(
        Message::decode_body(&hello[..20]),
        Err(WireError::Truncated { field: "nonce" })
    ));
    let mut long = hello.clone();
    long.extend_from_slice(&[0, 0]);
    assert!(matches!(
        Message::decode_body(&long),
        Err(WireError::Trailing { extra: 2 })
    ));
    let mut bye = body(&Message::Bye);
    bye.push(0);
    assert!(matches!(
        Message::decode_body(&bye),
        Err(WireError::Trailing { extra: 1 })
    ));

    // Each QP field out of its range, the others valid.
    let ok = QpInfo {
        qpn: 1,
        lid: 0,
        gid: [0; 16],
        psn: 0,
        mtu: 5,
        rd_atom: 16,
    };
    let endpoint = |qp| {
        body(&Message::Endpoint(Endpoint {
            node_id: 0,
            peer_id: 1,
            qp,
        }))
    };
    assert!(Message::decode_body(&endpoint(ok)).is_ok());
    for (qp, field) in [
        (QpInfo { qpn: 1 << 24, ..ok }, "qpn"),
        (QpInfo { mtu: 0, ..ok }, "mtu"),
        (QpInfo { rd_atom: 0, ..ok }, "rd_atom"),
    ] {
        let got = Message::decode_body(&endpoint(qp));
        assert!(
            matches!(&got, Err(WireError::Invalid { field: f, .. }) if *f == field),
            "{field}: {got:?}"
        );
    }

    let mut r = body(&Message::Region(Region {
        node_id: 0,
        space: Space::Host,
        base: u64::MAX,
        len: 0,
        rkey: 0,
    }));
    assert!(Message::decode_body(&r).is_ok());
    r[5] = 2; // space
    assert!(matches!(
        Message::decode_body(&r),
        Err(WireError::Invalid { field: "space", .. })
    ));
    let r = body(&Message::Region(Region {
        node_id: 0,
        space: Space::Host,
        base: u64::MAX,
        len: 1,
        rkey: 0,
    }));
    assert!(matches!(
        Message::decode_body(&r),
        Err(WireError::Invalid { field: "len", .. })
    ));

    // Barrier name: not UTF-8, and longer than the bound.
    let mut b = vec![5u8, 0, 2, 0xff, 0xfe];
    b.extend_from_slice(&0u64.to_be_bytes());
    assert!(matches!(
        Message::decode_body(&b),
        Err(WireError::Invalid { field: "name", .. })
    ));
    let mut b = vec![5u8, 0x01, 0x01];
    b.extend(std::iter::repeat_n(b'a', 257));
    b.extend_from_slice(&0u64.to_be_bytes());
    assert!(matches!(
        Message::decode_body(&b),
        Err(WireError::Invalid { field: "name", .. })
    ));
    let b = vec![5u8, 0, 10, b'a'];
    assert!(matches!(
        Message::decode_body(&b),
        Err(WireError::Truncated { field: "name" })
    ));

    // A withdrawal's reason: not UTF-8, longer than the bound, cut short.
    let withdraw = |why: &[u8]| {
        let mut b = vec![8u8, 0, 0, 0, 2];
        b.extend_from_slice(&(why.len() as u16).to_be_bytes());
        b.extend_from_slice(why);
        Message::decode_body(&b)
    };
    assert!(matches!(
        withdraw(b"--seconds must be in (0, 86400]"),
        Ok(Message::Withdraw { node_id: 2, why }) if why == "--seconds must be in (0, 86400]"
    ));
    assert!(matches!(
        withdraw(&[b'a', 0xff]),
        Err(WireError::Invalid { field: "why", .. })
    ));
    assert!(withdraw(&[b'a'; WHY_BYTES_MAX]).is_ok());
    assert!(matches!(
        withdraw(&[b'a'; WHY_BYTES_MAX + 1]),
        Err(WireError::Invalid { field: "why", .. })
    ));
    let mut b = vec![8u8, 0, 0, 0, 2, 0, 9, b'a'];
    assert!(matches!(
        Message::decode_body(&b),
        Err(WireError::Truncated { field: "why" })
    ));
    b.truncate(3);
    assert!(matches!(
        Message::decode_body(&b),
        Err(WireError::Truncated { field: "node_id" })
    ));
}

/// A reason longer than a frame carries is cut at the bound, on a
/// character boundary, and the rest of the message still reads.
#[test]
fn a_long_reason_is_cut_on_a_character_boundary() {
    // 'é' is 2 bytes: 1023 bytes of 'a' leave room for half of one.
    let why = format!("{}{}", "a".repeat(WHY_BYTES_MAX - 1), "é".repeat(10));
    let m = Message::Withdraw { node_id: 7, why };
    let Message::Withdraw { node_id, why } = Message::decode_body(&m.encode_frame()[4..]).unwrap()
    else {
        panic!("not a Withdraw")
    };
    assert_eq!(node_id, 7);
    assert_eq!(why, "a".repeat(WHY_BYTES_MAX - 1));
}

#[test]
fn oversized_and_truncated_frames() {
    let mut huge = (FRAME_BYTES_MAX as u32 + 1).to_be_bytes().to_vec();
    huge.extend_from_slice(&[1, 2, 3]);
    match read_frame(&mut Cursor::new(huge)) {
        Err(WireError::Oversized { len, max }) => {
            assert_eq!((len, max), (FRAME_BYTES_MAX as u64 + 1, FRAME_BYTES_MAX))
        }
        other => panic!("expected Oversized, got {other:?}"),
    }
    assert!(matches!(
        read_frame(&mut Cursor::new(u32::MAX.to_be_bytes())),
        Err(WireError::Oversized { .. })
    ));
    assert!(matches!(
        read_frame(&mut Cursor::new(vec![0, 0])),
        Err(WireError::Truncated {
            field: "frame length"
        })
    ));
    assert!(matches!(
        read_frame(&mut Cursor::new(vec![0, 0, 0, 9, 1, 2])),
        Err(WireError::Truncated {
            field: "frame body"
        })
    ));
    // A frame at exactly the bound is read (and then rejected by the decoder for its tag).
    let mut max = (FRAME_BYTES_MAX as u32).to_be_bytes().to_vec();
    max.resize(4 + FRAME_BYTES_MAX, 0);
    assert_eq!(
        read_frame(&mut Cursor::new(max)).unwrap().len(),
        FRAME_BYTES_MAX
    );
}

/// xorshift64*: small, seedable, good enough to drive mutations.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

#[test]
fn randomized_frames_never_panic() {
    let seed: u64 = std::env::var("LOCH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_1234_abcd);
    let mut rng = Rng(seed | 1);
    let valid: Vec<Vec<u8>> = common::sample_messages()
        .iter()
        .map(|m| m.encode_frame())
        .collect();
    let (mut ok, mut err) = (0u32, 0u32);
    for i in 0..50_000u32 {
        let mut bytes = match i % 4 {
            // Pure noise, of any length up to 128.
            0 => (0..rng.below(128))
                .map(|_| rng.next() as u8)
                .collect::<Vec<u8>>(),
            // A valid frame cut short.
            1 => {
                let f = &valid[rng.below(valid.len())];
                f[..rng.below(f.len())].to_vec()
            }
            // A valid frame with bytes flipped.
            2 => {
                let mut f = valid[rng.below(valid.len())].clone();
                for _ in 0..=rng.below(4) {
                    let at = rng.below(f.len());
                    f[at] ^= 1 << rng.below(8);
                }
                f
            }
            // A valid frame with bytes appended or the length rewritten.
            _ => {
                let mut f = valid[rng.below(valid.len())].clone();
                if rng.next() & 1 == 0 {
                    f.extend((0..=rng.below(8)).map(|_| rng.next() as u8));
                } else {
                    let len = rng.next() as u32;
                    f[..4].copy_from_slice(&len.to_be_bytes());
                }
                f
            }
        };
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let from_stream = read_message(&mut Cursor::new(&bytes));
            let from_body = Message::decode_body(bytes.get(4..).unwrap_or(&[]));
            (from_stream.is_ok(), from_body)
        }));
        match caught {
            Ok((stream_ok, body)) => {
                if let Ok(m) = body {
                    // Whatever decodes re-encodes to the same body.
                    let re = m.encode_frame();
                    assert_eq!(
                        &re[4..],
                        &bytes[4..],
                        "seed {seed} iteration {i}: decode/encode mismatch"
                    );
                }
                if stream_ok {
                    ok += 1
                } else {
                    err += 1
                }
            }
            Err(_) => {
                bytes.truncate(64);
                panic!("decoder panicked: LOCH_SEED={seed} iteration {i} bytes {bytes:?}");
            }
        }
    }
    // Both outcomes must have been exercised for the test to mean anything.
    assert!(ok > 1000 && err > 10_000, "ok {ok} err {err}");
}
