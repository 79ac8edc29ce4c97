//! The control channel on loopback: a 3-node rendezvous with barriers
//! checked against the whole arrival/departure history; a peer without the
//! secret is refused and reads nothing but a nonce; a replayed handshake is
//! refused; malformed frames and silent peers end in errors, not panics or
//! hangs.

mod common;

use std::cell::Cell;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use bootstrap::auth::{Direction, SessionMac, Transcript};
use bootstrap::channel::{
    agreement_fits, Cancel, ChannelError, ChannelOptions, ControlChannel, Directory, Rendezvous,
    WaitReport, NODES_MAX, SHUT_OUT_RETRIES,
};
use bootstrap::wire::{self, Endpoint, Message, QpInfo, Region, Space, WireError};
use common::secret;

fn opts(id: u32, key: u8) -> ChannelOptions {
    let mut o = ChannelOptions::new(id, secret(key));
    o.handshake_timeout = Duration::from_millis(1500);
    o.io_timeout = Duration::from_millis(1500);
    o.barrier_timeout = Duration::from_secs(5);
    o
}

fn listener() -> (TcpListener, SocketAddr) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = l.local_addr().unwrap();
    (l, a)
}

/// What node `id` publishes in a cluster of `n`: one endpoint per peer and,
/// for even ids, a host region and a device-memory region.
fn records(id: u32, n: u32) -> Directory {
    let endpoints = (0..n)
        .filter(|&p| p != id)
        .map(|p| Endpoint {
            node_id: id,
            peer_id: p,
            qp: QpInfo {
                qpn: 100 * id + p,
                lid: id as u16,
                gid: [id as u8; 16],
                psn: 7 * id,
                mtu: 5,
                rd_atom: 16,
            },
        })
        .collect();
    let regions = if id.is_multiple_of(2) {
        vec![
            Region {
                node_id: id,
                space: Space::Host,
                base: 0x1000 * id as u64,
                len: 1 << 20,
                rkey: 0x100 + id,
            },
            Region {
                node_id: id,
                space: Space::Device,
                base: 0,
                len: 1 << 17,
                rkey: 0x200 + id,
            },
        ]
    } else {
        vec![]
    };
    Directory { endpoints, regions }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Event {
    Arrive(u32, usize),
    Leave(u32, usize),
}

#[test]
fn three_nodes_exchange_and_pass_two_barriers() {
    const N: u32 = 3;
    let (l, addr) = listener();
    let history = Arc::new(Mutex::new(Vec::<Event>::new()));
    let run = move |mut rv: Rendezvous, history: Arc<Mutex<Vec<Event>>>| -> Directory {
        let id = rv.node_id();
        let all = rv.exchange(&records(id, N)).unwrap();
        for (b, name) in ["loaded", "warm"].iter().enumerate() {
            // Stagger arrivals so an early release would show in the history.
            thread::sleep(Duration::from_millis(
                30 * ((id as u64 + b as u64) % N as u64),
            ));
            history.lock().unwrap().push(Event::Arrive(id, b));
            rv.barrier(name).unwrap();
            history.lock().unwrap().push(Event::Leave(id, b));
        }
        rv.close();
        all
    };
    let mut handles = Vec::new();
    for id in 1..N {
        let h = history.clone();
        handles.push(thread::spawn(move || {
            let rv = Rendezvous::join(addr, 0, &opts(id, 1), Duration::from_secs(5)).unwrap();
            run(rv, h)
        }));
    }
    let rv = Rendezvous::coordinate(&l, &[0, 1, 2], &opts(0, 1), Duration::from_secs(5)).unwrap();
    assert!(rv.refused().is_empty());
    let mut dirs = vec![run(rv, history.clone())];
    for h in handles {
        dirs.push(h.join().unwrap());
    }

    // Everyone holds exactly the union of what everyone published.
    let mut want = Directory::default();
    for id in 0..N {
        let r = records(id, N);
        want.endpoints.extend(r.endpoints);
        want.regions.extend(r.regions);
    }
    want.endpoints.sort();
    want.regions.sort();
    assert_eq!(want.endpoints.len(), 6);
    assert_eq!(want.regions.len(), 4);
    for d in &dirs {
        assert_eq!(d, &want);
    }

    // Barrier history: for each barrier, every arrival precedes every
    // departure, and each node arrives and leaves exactly once.
    let h = history.lock().unwrap();
    assert_eq!(h.len(), 2 * 2 * N as usize);
    for b in 0..2 {
        let first_leave = h
            .iter()
            .position(|e| matches!(e, Event::Leave(_, x) if *x == b))
            .unwrap();
        let last_arrive = h
            .iter()
            .rposition(|e| matches!(e, Event::Arrive(_, x) if *x == b))
            .unwrap();
        assert!(
            last_arrive < first_leave,
            "barrier {b} released early: {h:?}"
        );
        for id in 0..N {
            assert_eq!(h.iter().filter(|e| **e == Event::Arrive(id, b)).count(), 1);
            assert_eq!(h.iter().filter(|e| **e == Event::Leave(id, b)).count(), 1);
        }
    }
}

/// Reads everything the peer sends until it closes (or 2 s pass).
/// Writes a Hello by hand (as a node of `protocol` would).
fn send_hello(s: &mut TcpStream, node_id: u32, nonce: [u8; 32], protocol: u16) {
    let hello = Message::Hello {
        node_id,
        nonce,
        protocol,
    };
    wire::write_message(s, &hello).unwrap();
}

fn read_all(s: &mut TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    got
}

#[test]
fn wrong_secret_is_refused_and_learns_only_a_nonce() {
    let (l, addr) = listener();
    let coord = thread::spawn(move || {
        let mut rv =
            Rendezvous::coordinate(&l, &[0, 1], &opts(0, 1), Duration::from_secs(5)).unwrap();
        let all = rv.exchange(&records(0, 2)).unwrap();
        (rv.refused().len(), all)
    });

    // The impostor claims node 1 and proves with the wrong key, by hand so
    // every byte it receives is kept.
    let mut s = TcpStream::connect(addr).unwrap();
    let nonce = [42u8; 32];
    send_hello(&mut s, 1, nonce, wire::PROTOCOL);
    let got_hello = wire::read_message(&mut s).unwrap();
    let Message::Hello {
        node_id: 0,
        nonce: their,
        protocol: wire::PROTOCOL,
    } = got_hello
    else {
        panic!("{got_hello:?}")
    };
    let t = Transcript {
        protocol: wire::PROTOCOL,
        initiator_id: 1,
        responder_id: 0,
        initiator_nonce: nonce,
        responder_nonce: their,
    };
    wire::write_message(
        &mut s,
        &Message::Auth {
            mac: t.prove(&secret(2), Direction::Initiator),
        },
    )
    .unwrap();
    let after = read_all(&mut s);
    assert!(
        after.is_empty(),
        "the impostor received {} bytes after its proof",
        after.len()
    );

    // Through the library, an impostor gets a clear refusal.
    let e = ControlChannel::connect(addr, Some(0), &opts(1, 2)).unwrap_err();
    assert!(
        matches!(&e, ChannelError::ProofRejected { peer: 0 })
            && e.to_string().contains("rejected our proof"),
        "{e}"
    );

    // The real node 1 still joins, and the exchange works.
    let mut rv = Rendezvous::join(addr, 0, &opts(1, 1), Duration::from_secs(5)).unwrap();
    let all = rv.exchange(&records(1, 2)).unwrap();
    let (refused, coord_all) = coord.join().unwrap();
    assert_eq!(refused, 2);
    assert_eq!(all, coord_all);
    assert_eq!(all.regions.len(), 2);
}

#[test]
fn a_client_never_sends_records_to_a_server_without_the_secret() {
    let (l, addr) = listener();
    let fake = thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let hello = wire::read_message(&mut s).unwrap();
        send_hello(&mut s, 0, [5; 32], wire::PROTOCOL);
        wire::write_message(&mut s, &Message::Auth { mac: [0; 32] }).unwrap();
        let Message::Hello { .. } = hello else {
            panic!("{hello:?}")
        };
        let proof = wire::read_message(&mut s).unwrap();
        let Message::Auth { .. } = proof else {
            panic!("{proof:?}")
        };
        read_all(&mut s)
    });
    let e = Rendezvous::join(addr, 0, &opts(1, 1), Duration::from_secs(5))
        .err()
        .expect("refused");
    assert!(
        matches!(&e, ChannelError::Refused(why) if why.contains("wrong proof")),
        "{e}"
    );
    assert!(
        fake.join().unwrap().is_empty(),
        "nothing after the client's proof"
    );
}

#[test]
fn replayed_handshake_is_refused() {
    // A legitimate client dials through a relay that records its bytes.
    let (server_l, server_addr) = listener();
    let (relay_l, relay_addr) = listener();
    let server = thread::spawn(move || {
        let o = opts(0, 1);
        let first = ControlChannel::accept(&server_l, &o, &|id| id == 1).map(|c| c.peer_id());
        let second = ControlChannel::accept(&server_l, &o, &|id| id == 1).map(|c| c.peer_id());
        (first, second)
    });
    let relay = thread::spawn(move || {
        let (mut c, _) = relay_l.accept().unwrap();
        let mut s = TcpStream::connect(server_addr).unwrap();
        let mut recorded = Vec::new();
        for from_client in [true, false, true, false] {
            let (src, dst) = if from_client {
                (&mut c, &mut s)
            } else {
                (&mut s, &mut c)
            };
            let body = wire::read_frame(src).unwrap();
            let mut frame = (body.len() as u32).to_be_bytes().to_vec();
            frame.extend_from_slice(&body);
            if from_client {
                recorded.extend_from_slice(&frame);
            }
            dst.write_all(&frame).unwrap();
        }
        recorded
    });
    let ch = ControlChannel::connect(relay_addr, Some(0), &opts(1, 1)).unwrap();
    assert_eq!(ch.peer_id(), 0);
    let recorded = relay.join().unwrap();
    assert_eq!(recorded.len(), 43 + 37, "Hello and Auth frames");

    // Replay the recorded Hello and Auth on a new connection.
    let mut r = TcpStream::connect(server_addr).unwrap();
    r.write_all(&recorded).unwrap();
    let got = read_all(&mut r);
    assert_eq!(
        got.len(),
        43,
        "the replayer gets only the server's Hello: {got:?}"
    );
    assert!(matches!(
        Message::decode_body(&got[4..]),
        Ok(Message::Hello { node_id: 0, .. })
    ));

    let (first, second) = server.join().unwrap();
    assert_eq!(first.unwrap(), 1);
    let e = second.unwrap_err();
    assert!(
        matches!(&e, ChannelError::Refused(why) if why.contains("wrong proof")),
        "{e}"
    );
}

#[test]
fn reflected_proof_is_refused() {
    // A responder's proof must not pass as an initiator's: an attacker that
    // bounces the server's own Auth back gets nowhere.
    let s = secret(1);
    let t = Transcript {
        protocol: wire::PROTOCOL,
        initiator_id: 1,
        responder_id: 0,
        initiator_nonce: [1; 32],
        responder_nonce: [2; 32],
    };
    assert!(t.verify(&s, Direction::Initiator, &t.prove(&s, Direction::Initiator)));
    assert!(!t.verify(&s, Direction::Initiator, &t.prove(&s, Direction::Responder)));
    assert!(!t.verify(&s, Direction::Responder, &t.prove(&s, Direction::Initiator)));
    let swapped = Transcript {
        initiator_id: 0,
        responder_id: 1,
        ..t
    };
    assert!(!swapped.verify(&s, Direction::Initiator, &t.prove(&s, Direction::Initiator)));
    // Nor across protocol versions: a version rewritten on the path fails.
    let other = Transcript {
        protocol: t.protocol + 1,
        ..t
    };
    assert!(!other.verify(&s, Direction::Initiator, &t.prove(&s, Direction::Initiator)));
    assert!(!t.verify(
        &secret(2),
        Direction::Initiator,
        &t.prove(&s, Direction::Initiator)
    ));
}

/// Nodes of builds speaking different control protocols are refused at
/// the handshake, both ends naming both versions: a responder given a
/// protocol-1 Hello (it ended at the nonce) answers with its own Hello
/// before refusing, so that the initiator can name the mismatch too; an
/// initiator answered with another version refuses; and one whose Hello
/// the responder could not read (an older build closes on the unknown
/// field) is told what that may mean.
#[test]
fn nodes_of_different_control_protocols_are_refused_naming_both() {
    // A protocol-1 initiator, by hand.
    let (l, addr) = listener();
    let old = thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        let hello = Message::Hello {
            node_id: 1,
            nonce: [7; 32],
            protocol: 1,
        }
        .encode_frame();
        assert_eq!(hello.len(), 41, "protocol 1's Hello, as its builds sent it");
        s.write_all(&hello).unwrap();
        read_all(&mut s)
    });
    let (stream, _) = l.accept().unwrap();
    let e = ControlChannel::respond(stream, &opts(0, 1), &|_| true, [9; 32])
        .err()
        .unwrap();
    let mismatch = format!(
        "node 1 (unauthenticated) speaks control protocol 1, this node {}",
        wire::PROTOCOL
    );
    assert!(
        matches!(&e, ChannelError::Refused(why) if why.contains(&mismatch)),
        "{e}"
    );
    let got = old.join().unwrap();
    let reply = Message::decode_body(&got[4..]).unwrap();
    assert!(
        matches!(
            reply,
            Message::Hello {
                node_id: 0,
                protocol: wire::PROTOCOL,
                ..
            }
        ),
        "{reply:?}"
    );
    assert_eq!(got.len(), 43, "nothing after the Hello: {got:?}");

    // A responder of a later protocol, by hand.
    let (l, addr) = listener();
    let newer = thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let _ = wire::read_message(&mut s).unwrap();
        send_hello(&mut s, 0, [5; 32], wire::PROTOCOL + 1);
        read_all(&mut s)
    });
    let e = ControlChannel::connect(addr, Some(0), &opts(1, 1)).unwrap_err();
    let want = format!(
        "node 0 (unauthenticated) speaks control protocol {}, this node {}",
        wire::PROTOCOL + 1,
        wire::PROTOCOL
    );
    assert!(
        matches!(&e, ChannelError::Refused(why) if why.contains(&want)),
        "{e}"
    );
    assert!(newer.join().unwrap().is_empty(), "no proof was sent");

    // A responder that closes on our Hello.
    let (l, addr) = listener();
    let closes = thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut b = [0u8; 43];
        s.read_exact(&mut b).unwrap();
    });
    let e = ControlChannel::connect(addr, Some(0), &opts(1, 1)).unwrap_err();
    let why = e.to_string();
    assert!(
        matches!(&e, ChannelError::ShutOut { node: 1 })
            && why.contains("older than control protocol")
            && why.contains("admit node 1"),
        "{e}"
    );
    closes.join().unwrap();

    // A coordinator says why a member it waits for has not joined: in its
    // next wait report and in its timeout.
    let (l, addr) = listener();
    let knocks = thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        send_hello(&mut s, 1, [7; 32], 1);
        read_all(&mut s)
    });
    let heard = Arc::new(Mutex::new(Vec::new()));
    let mut o = opts(0, 1);
    let h = heard.clone();
    o.on_wait = Some(WaitReport::new(move |ids, refused| {
        h.lock()
            .unwrap()
            .push((ids.to_vec(), refused.map(|e| e.to_string())));
    }));
    let e = Rendezvous::coordinate(&l, &[0, 1], &o, Duration::from_millis(2500))
        .err()
        .unwrap();
    assert!(
        matches!(&e, ChannelError::Timeout(why)
            if why.contains("1 connections refused; the last: handshake refused")
                && why.contains(&mismatch)),
        "{e}"
    );
    knocks.join().unwrap();
    let heard = heard.lock().unwrap();
    assert!(!heard.is_empty());
    assert!(heard.iter().all(|(ids, _)| ids == &[1]), "{heard:?}");
    // Said once, in the first report after it.
    let told: Vec<&String> = heard.iter().filter_map(|(_, r)| r.as_ref()).collect();
    assert_eq!(told.len(), 1, "{heard:?}");
    assert!(told[0].contains(&mismatch), "{heard:?}");
}

/// Sends `bytes` to a fresh responder and returns its result.
fn respond_to(bytes: &[u8], close_after: bool) -> Result<u32, ChannelError> {
    let (l, addr) = listener();
    let bytes = bytes.to_vec();
    let client = thread::spawn(move || {
        let mut c = TcpStream::connect(addr).unwrap();
        let _ = c.write_all(&bytes);
        if close_after {
            let _ = c.shutdown(std::net::Shutdown::Write);
        }
        read_all(&mut c)
    });
    let mut o = opts(0, 1);
    o.handshake_timeout = Duration::from_millis(400);
    let r = ControlChannel::accept(&l, &o, &|_| true).map(|c| c.peer_id());
    let _ = client.join();
    r
}

#[test]
fn malformed_truncated_and_oversized_frames_are_refused() {
    let hello = Message::Hello {
        node_id: 1,
        nonce: [1; 32],
        protocol: wire::PROTOCOL,
    }
    .encode_frame();
    type Case = (&'static str, Vec<u8>, fn(&ChannelError) -> bool);
    let cases: Vec<Case> = vec![
        ("oversized", u32::MAX.to_be_bytes().to_vec(), |e| {
            matches!(e, ChannelError::Wire(WireError::Oversized { .. }))
        }),
        ("unknown tag", vec![0, 0, 0, 1, 99], |e| {
            matches!(e, ChannelError::Wire(WireError::UnknownTag(99)))
        }),
        ("truncated body", hello[..20].to_vec(), |e| {
            matches!(e, ChannelError::Wire(WireError::Truncated { .. }))
        }),
        ("empty", vec![0, 0, 0, 0], |e| {
            matches!(e, ChannelError::Wire(WireError::Empty))
        }),
        ("wrong first message", Message::Bye.encode_frame(), |e| {
            matches!(e, ChannelError::Refused(_))
        }),
        ("closed at once", vec![], |e| {
            matches!(e, ChannelError::Wire(WireError::Closed))
        }),
        (
            "trailing bytes",
            {
                let mut f = hello.clone();
                f[3] += 1;
                f.push(0);
                f
            },
            |e| matches!(e, ChannelError::Wire(WireError::Trailing { extra: 1 })),
        ),
    ];
    for (name, bytes, want) in cases {
        let e = respond_to(&bytes, true).expect_err(name);
        assert!(want(&e), "{name}: got {e:?}");
    }
}

/// Authenticates to the coordinator at `addr` as node 1 by hand, then lets
/// `send` write whatever it likes; returns all bytes received afterwards.
fn hand_member(
    addr: SocketAddr,
    send: fn(&mut TcpStream, &mut SessionMac),
) -> thread::JoinHandle<Vec<u8>> {
    thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        let nonce = [8u8; 32];
        send_hello(&mut s, 1, nonce, wire::PROTOCOL);
        let Message::Hello { nonce: theirs, .. } = wire::read_message(&mut s).unwrap() else {
            panic!()
        };
        let t = Transcript {
            protocol: wire::PROTOCOL,
            initiator_id: 1,
            responder_id: 0,
            initiator_nonce: nonce,
            responder_nonce: theirs,
        };
        let mac = t.prove(&secret(1), Direction::Initiator);
        wire::write_message(&mut s, &Message::Auth { mac }).unwrap();
        let Message::Auth { .. } = wire::read_message(&mut s).unwrap() else {
            panic!()
        };
        let mut session = t.session(&secret(1), Direction::Initiator);
        send(&mut s, &mut session);
        read_all(&mut s)
    })
}

fn sealed(s: &mut TcpStream, session: &mut SessionMac, body: &[u8]) {
    let trailer = session.seal(body);
    wire::write_frame(s, &[body, &trailer]).unwrap();
}

#[test]
fn bad_frames_after_authentication_are_errors() {
    type Case = (
        &'static str,
        fn(&mut TcpStream, &mut SessionMac),
        fn(&ChannelError) -> bool,
    );
    let cases: Vec<Case> = vec![
        (
            "record under another node's id",
            |s, m| {
                let forged = Region {
                    node_id: 0,
                    space: Space::Host,
                    base: 0,
                    len: 8,
                    rkey: 9,
                };
                let mut body = Vec::new();
                Message::Region(forged).encode_body(&mut body);
                sealed(s, m, &body);
            },
            |e| matches!(e, ChannelError::Protocol { peer: 1, why } if why.contains("another node's id")),
        ),
        (
            "withdraws another node",
            |s, m| {
                let mut body = Vec::new();
                Message::Withdraw {
                    node_id: 2,
                    why: "not mine to say".into(),
                }
                .encode_body(&mut body);
                sealed(s, m, &body);
            },
            |e| matches!(e, ChannelError::Protocol { peer: 1, why } if why.contains("not itself")),
        ),
        (
            "unknown tag, sealed",
            |s, m| sealed(s, m, &[77, 1, 2, 3]),
            |e| matches!(e, ChannelError::Wire(WireError::UnknownTag(77))),
        ),
        (
            "unsealed message",
            |s, _| {
                let m = Message::Barrier {
                    name: "exchange-but-without-any-mac".into(),
                    epoch: 0,
                };
                wire::write_message(s, &m).unwrap();
            },
            |e| matches!(e, ChannelError::Tampered { peer: 1 }),
        ),
        (
            "frame shorter than a MAC",
            |s, _| wire::write_frame(s, &[&[7u8; 5]]).unwrap(),
            |e| matches!(e, ChannelError::Wire(WireError::Truncated { field: "mac" })),
        ),
        (
            "oversized",
            |s, _| s.write_all(&u32::MAX.to_be_bytes()).unwrap(),
            |e| matches!(e, ChannelError::Wire(WireError::Oversized { .. })),
        ),
    ];
    for (name, send, want) in cases {
        let (l, addr) = listener();
        let member = hand_member(addr, send);
        let mut rv =
            Rendezvous::coordinate(&l, &[0, 1], &opts(0, 1), Duration::from_secs(5)).unwrap();
        let e = rv.exchange(&records(0, 2)).unwrap_err();
        assert!(want(&e), "{name}: got {e:?}");
        drop(rv);
        assert!(
            member.join().unwrap().is_empty(),
            "{name}: the member receives no records"
        );
    }
}

/// A relay that passes the four handshake frames untouched, then applies
/// `meddle` to the client's next frame and forwards the result.
fn meddling_relay(
    server: SocketAddr,
    meddle: fn(Vec<u8>) -> Vec<Vec<u8>>,
) -> (SocketAddr, thread::JoinHandle<()>) {
    let (l, addr) = listener();
    let h = thread::spawn(move || {
        let (mut c, _) = l.accept().unwrap();
        let mut s = TcpStream::connect(server).unwrap();
        let frame_of = |body: Vec<u8>| {
            let mut f = (body.len() as u32).to_be_bytes().to_vec();
            f.extend_from_slice(&body);
            f
        };
        for from_client in [true, false, true, false] {
            let (src, dst) = if from_client {
                (&mut c, &mut s)
            } else {
                (&mut s, &mut c)
            };
            let body = wire::read_frame(src).unwrap();
            dst.write_all(&frame_of(body)).unwrap();
        }
        let body = wire::read_frame(&mut c).unwrap();
        for b in meddle(body) {
            s.write_all(&frame_of(b)).unwrap();
        }
        let _ = read_all(&mut s);
    });
    (addr, h)
}

#[test]
fn frames_altered_or_replayed_on_the_path_are_detected() {
    type Meddle = fn(Vec<u8>) -> Vec<Vec<u8>>;
    let cases: Vec<(&str, Meddle)> = vec![
        ("bit flipped in the body", |mut b| {
            b[3] ^= 1;
            vec![b]
        }),
        ("frame replayed", |b| vec![b.clone(), b]),
        ("frame injected first", |b| {
            let mut fake = b.clone();
            fake[1] ^= 0x40;
            vec![fake, b]
        }),
    ];
    for (name, meddle) in cases {
        let (server_l, server_addr) = listener();
        let (relay_addr, relay) = meddling_relay(server_addr, meddle);
        let server = thread::spawn(move || {
            let mut ch = ControlChannel::accept(&server_l, &opts(0, 1), &|id| id == 1).unwrap();
            let first = ch.recv();
            let second = if first.is_ok() {
                ch.recv()
            } else {
                Ok(Message::Bye)
            };
            (first, second)
        });
        let mut ch = ControlChannel::connect(relay_addr, Some(0), &opts(1, 1)).unwrap();
        let region = Region {
            node_id: 1,
            space: Space::Host,
            base: 0x1000,
            len: 64,
            rkey: 5,
        };
        ch.send(&Message::Region(region)).unwrap();
        let (first, second) = server.join().unwrap();
        drop(ch);
        relay.join().unwrap();
        let tampered = |r: &Result<Message, ChannelError>| {
            matches!(r, Err(ChannelError::Tampered { peer: 1 }))
        };
        match name {
            "frame replayed" => {
                assert_eq!(first.unwrap(), Message::Region(region), "{name}");
                assert!(tampered(&second), "{name}: {second:?}");
            }
            _ => assert!(tampered(&first), "{name}: {first:?}"),
        }
    }
}

#[test]
fn silent_and_trickling_peers_time_out() {
    // Silent: connects and says nothing.
    let t0 = Instant::now();
    let (l, addr) = listener();
    let _silent = TcpStream::connect(addr).unwrap();
    let mut o = opts(0, 1);
    o.handshake_timeout = Duration::from_millis(300);
    let e = ControlChannel::accept(&l, &o, &|_| true).unwrap_err();
    assert!(matches!(e, ChannelError::Wire(WireError::Timeout)), "{e:?}");
    assert!(t0.elapsed() < Duration::from_secs(2));

    // Trickling: one byte every 50 ms never resets the handshake deadline.
    let (l, addr) = listener();
    let trickle = thread::spawn(move || {
        let mut c = TcpStream::connect(addr).unwrap();
        for b in (Message::Hello {
            node_id: 1,
            nonce: [0; 32],
            protocol: wire::PROTOCOL,
        })
        .encode_frame()
        {
            if c.write_all(&[b]).is_err() {
                break;
            }
            thread::sleep(Duration::from_millis(50));
        }
    });
    let t0 = Instant::now();
    let e = ControlChannel::accept(&l, &o, &|_| true).unwrap_err();
    let took = t0.elapsed();
    assert!(matches!(e, ChannelError::Wire(WireError::Timeout)), "{e:?}");
    assert!(
        took < Duration::from_millis(1500),
        "deadline reset by trickling: took {took:?}"
    );
    let _ = trickle.join();

    // No one dials: the rendezvous gives up and names who is missing.
    let (l, _) = listener();
    let e = Rendezvous::coordinate(&l, &[0, 1, 2], &opts(0, 1), Duration::from_millis(200))
        .err()
        .unwrap();
    assert!(
        matches!(&e, ChannelError::Timeout(what) if what.contains("[1, 2]")),
        "{e}"
    );

    // A member that never reaches the barrier: the coordinator times out.
    let (l, addr) = listener();
    let member = thread::spawn(move || {
        let rv = Rendezvous::join(addr, 0, &opts(1, 1), Duration::from_secs(5)).unwrap();
        thread::sleep(Duration::from_millis(800));
        drop(rv);
    });
    let mut o = opts(0, 1);
    o.barrier_timeout = Duration::from_millis(200);
    let mut rv = Rendezvous::coordinate(&l, &[0, 1], &o, Duration::from_secs(5)).unwrap();
    let t0 = Instant::now();
    let e = rv.barrier("never").unwrap_err();
    assert!(matches!(e, ChannelError::Wire(WireError::Timeout)), "{e:?}");
    assert!(t0.elapsed() < Duration::from_millis(2000));
    member.join().unwrap();
}

#[test]
fn a_member_that_leaves_fails_the_barrier_instead_of_hanging() {
    let (l, addr) = listener();
    let member = thread::spawn(move || {
        let rv = Rendezvous::join(addr, 0, &opts(1, 1), Duration::from_secs(5)).unwrap();
        rv.close();
    });
    let mut rv = Rendezvous::coordinate(&l, &[0, 1], &opts(0, 1), Duration::from_secs(5)).unwrap();
    member.join().unwrap();
    let e = rv.barrier("b").unwrap_err();
    assert!(
        matches!(&e, ChannelError::Protocol { peer: 1, why } if why.contains("Bye")),
        "{e}"
    );
}

/// A final barrier outlasts the barrier timeout (a late member is waited
/// for); a member that leaves counts as arrived, and the others are still
/// waited for and released; a member fails when its coordinator leaves;
/// a stop request ends it.
#[test]
fn a_final_barrier_waits_past_the_timeout_and_counts_a_member_that_left_as_arrived() {
    let (l, addr) = listener();
    let short = |id| {
        let (mut o, flag) = cancellable(id);
        o.barrier_timeout = Duration::from_millis(200);
        (o, flag)
    };
    let (co, _) = short(0);
    let member = |id: u32, late_ms: [u64; 2], leaves: bool| {
        thread::spawn(move || {
            let (mo, _) = short(id);
            let mut rv = Rendezvous::join(addr, 0, &mo, Duration::from_secs(5)).unwrap();
            thread::sleep(Duration::from_millis(late_ms[0]));
            assert_eq!(rv.final_barrier("done-1").unwrap(), Vec::<u32>::new());
            thread::sleep(Duration::from_millis(late_ms[1]));
            if leaves {
                rv.close();
            } else {
                rv.final_barrier("done-2").unwrap();
            }
        })
    };
    // Member 1 five barrier timeouts late at the first; it leaves instead
    // of meeting the second, at which member 2 is late.
    let one = member(1, [1000, 0], true);
    let two = member(2, [0, 1000], false);
    let mut rv = Rendezvous::coordinate(&l, &[0, 1, 2], &co, Duration::from_secs(5)).unwrap();
    let t = Instant::now();
    assert_eq!(rv.final_barrier("done-1").unwrap(), Vec::<u32>::new());
    // Past the 200 ms timeout, with room for a slow scheduler.
    assert!(t.elapsed() >= Duration::from_millis(500), "it waited");
    let t = Instant::now();
    assert_eq!(rv.final_barrier("done-2").unwrap(), vec![1]);
    assert!(t.elapsed() >= Duration::from_millis(400), "it waited for 2");
    one.join().unwrap();
    two.join().unwrap();

    // A member whose coordinator leaves fails; a stop request ends the
    // wait within the poll.
    for stop in [false, true] {
        let (l, addr) = listener();
        let (hold_tx, hold_rx) = std::sync::mpsc::channel::<()>();
        let coord = thread::spawn(move || {
            let rv =
                Rendezvous::coordinate(&l, &[0, 1], &opts(0, 1), Duration::from_secs(5)).unwrap();
            let hold = if stop { 10_000 } else { 300 };
            let _ = hold_rx.recv_timeout(Duration::from_millis(hold));
            rv.close();
        });
        let (mo, flag) = short(1);
        let mut rv = Rendezvous::join(addr, 0, &mo, Duration::from_secs(5)).unwrap();
        if stop {
            let raised = raise_after(&flag, 500);
            assert_cancelled_promptly(rv.final_barrier("never-released"), raised);
            hold_tx.send(()).unwrap();
        } else {
            let e = rv.final_barrier("never-released").unwrap_err();
            assert!(
                matches!(&e, ChannelError::Protocol { peer: 0, why } if why.contains("Bye")),
                "{e}"
            );
        }
        coord.join().unwrap();
    }
}

/// A telling final barrier names, at the coordinator, the members it
/// still waits for: once the arrivals already in are read, again when one
/// leaves, and between times at its period; it counts the one that left
/// as arrived and releases the others. A stop request ends it.
#[test]
fn a_telling_final_barrier_names_whom_it_waits_for() {
    let (l, addr) = listener();
    // (id, when it meets the barrier or leaves, whether it leaves)
    let member = |id: u32, after_ms: u64, leaves: bool| {
        thread::spawn(move || {
            let mut rv = Rendezvous::join(addr, 0, &opts(id, 1), Duration::from_secs(5)).unwrap();
            thread::sleep(Duration::from_millis(after_ms));
            if leaves {
                rv.close();
            } else {
                let told = Cell::new(false);
                let left = rv
                    .final_barrier_telling("done", Duration::from_millis(50), |_, _| told.set(true))
                    .unwrap();
                assert!(left.is_empty() && !told.get(), "a member tells nothing");
            }
        })
    };
    let members = [
        member(1, 0, false),
        member(2, 1000, false),
        member(3, 500, true),
    ];
    let mut rv =
        Rendezvous::coordinate(&l, &[0, 1, 2, 3], &opts(0, 1), Duration::from_secs(5)).unwrap();
    // Member 1's arrival is in before the coordinator comes.
    thread::sleep(Duration::from_millis(200));
    let mut told: Vec<(Vec<u32>, Duration)> = Vec::new();
    let left = rv
        .final_barrier_telling("done", Duration::from_millis(100), |ids, waited| {
            told.push((ids.to_vec(), waited))
        })
        .unwrap();
    assert_eq!(left, vec![3]);
    for m in members {
        m.join().unwrap();
    }
    let mut sets: Vec<&[u32]> = told.iter().map(|(ids, _)| &ids[..]).collect();
    let while_three = sets.iter().filter(|s| **s == [2, 3]).count();
    sets.dedup();
    assert_eq!(sets, [&[2, 3][..], &[2]], "{told:?}");
    // Told at once, then about every 100 ms until member 3 left.
    assert!(told[0].1 < Duration::from_millis(100), "{told:?}");
    assert!(while_three >= 2, "{told:?}");
    assert!(told.windows(2).all(|w| w[0].1 <= w[1].1), "{told:?}");

    // A stop request ends the coordinator's wait within the poll.
    let (l, addr) = listener();
    let (hold_tx, hold_rx) = std::sync::mpsc::channel::<()>();
    let m = thread::spawn(move || {
        let rv = Rendezvous::join(addr, 0, &opts(1, 1), Duration::from_secs(5)).unwrap();
        let _ = hold_rx.recv_timeout(Duration::from_secs(10));
        rv.close();
    });
    let (co, flag) = cancellable(0);
    let mut rv = Rendezvous::coordinate(&l, &[0, 1], &co, Duration::from_secs(5)).unwrap();
    let raised = raise_after(&flag, 300);
    let r = rv.final_barrier_telling("never", Duration::from_secs(1), |_, _| {});
    assert_cancelled_promptly(r, raised);
    hold_tx.send(()).unwrap();
    m.join().unwrap();
}

/// Options whose waits end when the returned flag is raised.
fn cancellable(id: u32) -> (ChannelOptions, Arc<AtomicBool>) {
    let flag = Arc::new(AtomicBool::new(false));
    let mut o = opts(id, 1);
    let f = flag.clone();
    // Acquire pairs with the Release store in `raise_after`.
    o.cancel = Some(Cancel::new(move || f.load(Ordering::Acquire)));
    (o, flag)
}

/// Raises `flag` after `ms` milliseconds, from another thread (as a signal
/// handler would).
fn raise_after(flag: &Arc<AtomicBool>, ms: u64) -> thread::JoinHandle<Instant> {
    let f = flag.clone();
    thread::spawn(move || {
        thread::sleep(Duration::from_millis(ms));
        f.store(true, Ordering::Release);
        Instant::now()
    })
}

/// Asserts `r` is `Cancelled` and came within 300 ms of the flag.
fn assert_cancelled_promptly<T>(r: Result<T, ChannelError>, raised: thread::JoinHandle<Instant>) {
    let done = Instant::now();
    let raised = raised.join().unwrap();
    match r {
        Err(ChannelError::Cancelled) => {}
        Err(e) => panic!("expected Cancelled, got {e:?}"),
        Ok(_) => panic!("expected Cancelled, the wait succeeded"),
    }
    let late = done.saturating_duration_since(raised);
    assert!(late < Duration::from_millis(300), "cancel took {late:?}");
}

#[test]
fn a_cancelled_join_returns_promptly_while_nobody_listens() {
    // A port nobody listens on: `join` keeps redialing until cancelled.
    let (l, addr) = listener();
    drop(l);
    let (o, flag) = cancellable(1);
    let raised = raise_after(&flag, 200);
    let r = Rendezvous::join(addr, 0, &o, Duration::from_secs(30));
    assert_cancelled_promptly(r, raised);
    assert!(ChannelError::Cancelled.to_string().contains("cancelled"));
}

#[test]
fn a_cancelled_coordinator_stops_waiting_for_members() {
    let (l, _) = listener();
    let (o, flag) = cancellable(0);
    let raised = raise_after(&flag, 200);
    let r = Rendezvous::coordinate(&l, &[0, 1, 2], &o, Duration::from_secs(30));
    assert_cancelled_promptly(r, raised);
}

#[test]
fn a_cancelled_barrier_stops_waiting_for_the_release() {
    let (l, addr) = listener();
    let (mut o, flag) = cancellable(1);
    o.barrier_timeout = Duration::from_secs(30);
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    // The coordinator joins but never reaches the barrier until told.
    let coord = thread::spawn(move || {
        let rv = Rendezvous::coordinate(&l, &[0, 1], &opts(0, 1), Duration::from_secs(5)).unwrap();
        let _ = done_rx.recv_timeout(Duration::from_secs(10));
        drop(rv);
    });
    let mut rv = Rendezvous::join(addr, 0, &o, Duration::from_secs(5)).unwrap();
    let raised = raise_after(&flag, 200);
    let r = rv.barrier("never-released");
    assert_cancelled_promptly(r, raised);
    done_tx.send(()).unwrap();
    coord.join().unwrap();
}

/// A barrier past a stop: with the stop already requested on both sides,
/// the meeting still happens (the member waits for a late coordinator and
/// the coordinator for a late member), and the next plain barrier ends on
/// the stop again.
#[test]
fn a_barrier_past_stop_waits_through_a_stop_request() {
    let (l, addr) = listener();
    let (mut mo, mflag) = cancellable(1);
    mo.barrier_timeout = Duration::from_secs(30);
    let coord = thread::spawn(move || {
        let (mut co, cflag) = cancellable(0);
        co.barrier_timeout = Duration::from_secs(30);
        let mut rv = Rendezvous::coordinate(&l, &[0, 1], &co, Duration::from_secs(5)).unwrap();
        // Release pairs with the Acquire load in `cancellable`.
        cflag.store(true, Ordering::Release);
        // Late: the member waits at the first barrier past its stop.
        thread::sleep(Duration::from_millis(400));
        rv.barrier_past_stop("checked-1").unwrap();
        // Early: this side waits for the late member.
        rv.barrier_past_stop("checked-2").unwrap();
        let t = Instant::now();
        let r = rv.barrier("plain");
        assert!(matches!(r, Err(ChannelError::Cancelled)), "{r:?}");
        assert!(t.elapsed() < Duration::from_secs(5));
    });
    let mut rv = Rendezvous::join(addr, 0, &mo, Duration::from_secs(5)).unwrap();
    mflag.store(true, Ordering::Release);
    let t = Instant::now();
    rv.barrier_past_stop("checked-1").unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "it waited for the coordinator"
    );
    thread::sleep(Duration::from_millis(400));
    rv.barrier_past_stop("checked-2").unwrap();
    // The hooks hold again: a plain barrier ends on the stop.
    let t = Instant::now();
    let r = rv.barrier("plain");
    assert!(matches!(r, Err(ChannelError::Cancelled)), "{r:?}");
    assert!(t.elapsed() < Duration::from_secs(5));
    coord.join().unwrap();
}

/// Nodes 0..values.len() meet at an `agree` barrier, node i holding
/// `values[i]`; what each returned.
fn agree_among(values: &[Option<&'static str>]) -> Vec<Result<Option<String>, ChannelError>> {
    let n = values.len() as u32;
    let (l, addr) = listener();
    let mut handles = Vec::new();
    for id in 1..n {
        let v = values[id as usize];
        handles.push(thread::spawn(move || {
            let mut rv = Rendezvous::join(addr, 0, &opts(id, 1), Duration::from_secs(5)).unwrap();
            let r = rv.agree("ready", v);
            rv.close();
            r
        }));
    }
    let ids: Vec<u32> = (0..n).collect();
    let mut rv = Rendezvous::coordinate(&l, &ids, &opts(0, 1), Duration::from_secs(5)).unwrap();
    let mut out = vec![rv.agree("ready", values[0])];
    rv.close();
    out.extend(handles.into_iter().map(|h| h.join().unwrap()));
    out
}

#[test]
fn an_agree_barrier_passes_one_value_and_refuses_two() {
    // The coordinator holds no value (a memory node), the others agree.
    let r = agree_among(&[None, Some("tree 1000"), None, Some("tree 1000")]);
    for x in &r {
        assert_eq!(x.as_ref().unwrap().as_deref(), Some("tree 1000"));
    }
    // Nobody holds one.
    for x in agree_among(&[None, None]) {
        assert_eq!(x.unwrap(), None);
    }
    // Two values: every node fails, each told who held what.
    for x in agree_among(&[None, Some("tree 1000"), Some("hash 1000")]) {
        match x {
            Err(ChannelError::Disagreed(why)) => {
                assert!(
                    why.contains("node 1: tree 1000") && why.contains("node 2: hash 1000"),
                    "{why}"
                );
            }
            other => panic!("expected a disagreement, got {other:?}"),
        }
    }
}

/// A value too long for a frame, given to every node (as flags from a
/// command line are), fails on every node with the limit, not a panic,
/// and nothing is sent; one that fits exactly passes.
#[test]
fn an_agree_value_too_long_for_a_frame_is_an_error_on_every_node() {
    let room = wire::NAME_BYTES_MAX - "ready=".len();
    let fits: &'static str = Box::leak("x".repeat(room).into_boxed_str());
    assert!(agreement_fits("ready", fits).is_ok());
    for x in agree_among(&[Some(fits), Some(fits)]) {
        assert_eq!(x.unwrap().as_deref(), Some(fits));
    }
    let long: &'static str = Box::leak("x".repeat(room + 1).into_boxed_str());
    let why = agreement_fits("ready", long).unwrap_err();
    assert!(
        why.contains(&format!("{} bytes", room + 1)) && why.contains(&format!("at most {room}")),
        "{why}"
    );
    for x in agree_among(&[Some(long), Some(long)]) {
        match x {
            Err(ChannelError::Limit(w)) => assert_eq!(w, why),
            other => panic!("expected the limit, got {other:?}"),
        }
    }
}

/// A coordinator given more members than a rendezvous holds says so
/// before it waits for any.
#[test]
fn a_rendezvous_of_more_than_nodes_max_is_refused() {
    let (l, _) = listener();
    let ids: Vec<u32> = (0..=NODES_MAX as u32).collect();
    let t = Instant::now();
    match Rendezvous::coordinate(&l, &ids, &opts(0, 1), Duration::from_secs(5)) {
        Err(ChannelError::Limit(why)) => assert!(
            why.contains(&format!("{} nodes", NODES_MAX + 1)) && why.contains("at most 1024"),
            "{why}"
        ),
        Err(e) => panic!("expected the limit, got {e}"),
        Ok(_) => panic!("expected the limit, got a rendezvous"),
    }
    assert!(t.elapsed() < Duration::from_secs(1));
    // NODES_MAX of them is allowed: it waits for them (and times out).
    let ids: Vec<u32> = (0..NODES_MAX as u32).collect();
    let r = Rendezvous::coordinate(&l, &ids, &opts(0, 1), Duration::from_millis(50));
    assert!(matches!(r, Err(ChannelError::Timeout(_))));
}

/// Options whose barrier timeout is far longer than the test waits, so
/// that a node failing in time failed on the withdrawal, not the timeout.
fn patient(id: u32) -> ChannelOptions {
    let mut o = opts(id, 1);
    o.barrier_timeout = Duration::from_secs(120);
    o
}

fn withdrew(r: &Result<(), ChannelError>, node: u32, why: &str) -> bool {
    matches!(r, Err(ChannelError::Withdrew { node: n, why: w }) if *n == node && w == why)
}

/// A member that withdraws, before the exchange or at a later barrier,
/// fails that meeting on every other node at once, each naming it and its
/// reason: the coordinator reads it and passes it on.
#[test]
fn a_member_that_withdraws_fails_every_other_node_naming_it_and_why() {
    const WHY: &str = "--records must be 1..=100000000, got 0";
    for at_barrier in [false, true] {
        let (l, addr) = listener();
        let t0 = Instant::now();
        let mut handles = Vec::new();
        for id in 1..4u32 {
            handles.push(thread::spawn(move || {
                let mut rv =
                    Rendezvous::join(addr, 0, &patient(id), Duration::from_secs(5)).unwrap();
                if at_barrier {
                    rv.exchange(&records(id, 4)).unwrap();
                }
                if id == 2 {
                    // Late, so the others wait for it first.
                    thread::sleep(Duration::from_millis(200));
                    rv.withdraw(WHY).unwrap();
                    return Ok(());
                }
                if at_barrier {
                    rv.barrier("loaded")
                } else {
                    rv.exchange(&records(id, 4)).map(drop)
                }
            }));
        }
        let mut rv =
            Rendezvous::coordinate(&l, &[0, 1, 2, 3], &patient(0), Duration::from_secs(5)).unwrap();
        let mine = if at_barrier {
            rv.exchange(&records(0, 4)).unwrap();
            rv.barrier("loaded")
        } else {
            rv.exchange(&records(0, 4)).map(drop)
        };
        assert!(
            withdrew(&mine, 2, WHY),
            "coordinator, at_barrier {at_barrier}: {mine:?}"
        );
        drop(rv);
        for (id, h) in (1..4u32).zip(handles) {
            let r = h.join().unwrap();
            if id == 2 {
                assert!(r.is_ok(), "{r:?}");
            } else {
                assert!(
                    withdrew(&r, 2, WHY),
                    "node {id}, at_barrier {at_barrier}: {r:?}"
                );
            }
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "{:?}", t0.elapsed());
    }
}

/// A member that comes to the exchange only after the coordinator passed
/// a withdrawal on and closed meets a broken pipe sending its records;
/// it still fails naming the node that withdrew and why, which was
/// waiting in its socket, not with the pipe.
#[test]
fn a_member_sending_after_the_coordinator_left_hears_the_withdrawal() {
    const WHY: &str = "--tasks must be 1..=64";
    let (l, addr) = listener();
    let (gone_tx, gone_rx) = std::sync::mpsc::channel::<()>();
    let withdrawing = thread::spawn(move || {
        let rv = Rendezvous::join(addr, 0, &patient(1), Duration::from_secs(5)).unwrap();
        rv.withdraw(WHY).unwrap();
    });
    let late = thread::spawn(move || {
        let mut rv = Rendezvous::join(addr, 0, &patient(2), Duration::from_secs(5)).unwrap();
        gone_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        // Many records, a frame each: the first draws the reset.
        rv.exchange(&records(2, 64)).map(drop)
    });
    let mut rv =
        Rendezvous::coordinate(&l, &[0, 1, 2], &patient(0), Duration::from_secs(5)).unwrap();
    let mine = rv.exchange(&records(0, 3)).map(drop);
    assert!(withdrew(&mine, 1, WHY), "coordinator: {mine:?}");
    drop(rv);
    withdrawing.join().unwrap();
    gone_tx.send(()).unwrap();
    let r = late.join().unwrap();
    assert!(withdrew(&r, 1, WHY), "the late member: {r:?}");
}

/// A coordinator that will not run tells each member as it joins, the
/// late one too, and returns once all were told; one that never joins is
/// named when the wait ends. A coordinator that withdraws after the
/// members joined tells them all.
#[test]
fn a_coordinator_that_withdraws_tells_each_member() {
    const WHY: &str = "node 0 failed its preflight";
    let (l, addr) = listener();
    let members: Vec<_> = (1..3u32)
        .map(|id| {
            thread::spawn(move || {
                thread::sleep(Duration::from_millis(300 * u64::from(id - 1)));
                let mut rv =
                    Rendezvous::join(addr, 0, &patient(id), Duration::from_secs(5)).unwrap();
                rv.exchange(&records(id, 3)).map(drop)
            })
        })
        .collect();
    Rendezvous::turn_away(&l, &[0, 1, 2], &patient(0), Duration::from_secs(10), WHY).unwrap();
    for (id, h) in (1..3u32).zip(members) {
        let r = h.join().unwrap();
        assert!(withdrew(&r, 0, WHY), "node {id}: {r:?}");
    }
    let e = Rendezvous::turn_away(&l, &[0, 1], &patient(0), Duration::from_millis(300), WHY)
        .unwrap_err();
    assert!(
        matches!(&e, ChannelError::Timeout(w) if w.contains("[1]")),
        "{e}"
    );

    let members: Vec<_> = (1..3u32)
        .map(|id| {
            thread::spawn(move || {
                let mut rv =
                    Rendezvous::join(addr, 0, &patient(id), Duration::from_secs(5)).unwrap();
                rv.barrier("loaded")
            })
        })
        .collect();
    let rv = Rendezvous::coordinate(&l, &[0, 1, 2], &patient(0), Duration::from_secs(5)).unwrap();
    rv.withdraw(WHY).unwrap();
    for (id, h) in (1..3u32).zip(members) {
        let r = h.join().unwrap();
        assert!(withdrew(&r, 0, WHY), "node {id}: {r:?}");
    }
}

/// Connections that send nothing do not hold up the nodes behind them:
/// the coordinator runs handshakes side by side. Five silent connections
/// come first, each held to a 2 s handshake bound; the two members dial
/// after them and are admitted well inside one bound (one at a time, they
/// waited 10 s behind the five, past the rendezvous's 6 s timeout). The
/// silent ones are refused once their bounds pass, or dropped with the
/// finished admission.
#[test]
fn silent_connections_do_not_hold_up_the_nodes_behind_them() {
    let (l, addr) = listener();
    let silent: Vec<TcpStream> = (0..5).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let mut o = opts(0, 1);
    o.handshake_timeout = Duration::from_secs(2);
    let members: Vec<_> = [1u32, 2]
        .into_iter()
        .map(|id| {
            thread::spawn(move || {
                // After the silent ones are queued.
                thread::sleep(Duration::from_millis(100));
                Rendezvous::join(addr, 0, &opts(id, 1), Duration::from_secs(6)).map(drop)
            })
        })
        .collect();
    let t0 = Instant::now();
    let rv = Rendezvous::coordinate(&l, &[0, 1, 2], &o, Duration::from_secs(6));
    let took = t0.elapsed();
    assert!(rv.is_ok(), "{:?}", rv.err());
    assert!(
        took < Duration::from_millis(1500),
        "the members waited behind the silent connections: {took:?}"
    );
    for m in members {
        m.join().unwrap().unwrap();
    }
    drop(silent);
}

/// A peer that opens and closes connections, unauthenticated, for as long
/// as the admission runs is counted, and only the last few refusals are
/// kept (the list grew with every connection); the member behind it joins.
#[test]
fn refused_handshakes_are_counted_and_the_last_few_kept() {
    use bootstrap::channel::REFUSALS_KEPT;
    let (l, addr) = listener();
    let coord = thread::spawn(move || {
        let rv = Rendezvous::coordinate(&l, &[0, 1], &opts(0, 1), Duration::from_secs(20)).unwrap();
        (
            rv.refused_count(),
            rv.refused().len(),
            rv.refused().last().map(|e| e.to_string()),
        )
    });
    let knocks = 3 * REFUSALS_KEPT as u64;
    for _ in 0..knocks {
        let mut s = TcpStream::connect(addr).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        // The coordinator drops the connection once its handshake failed.
        read_all(&mut s);
    }
    // The last refusal is on its way to the admission: let it land first.
    thread::sleep(Duration::from_millis(100));
    let member = Rendezvous::join(addr, 0, &opts(1, 1), Duration::from_secs(5)).unwrap();
    let (count, kept, last) = coord.join().unwrap();
    assert_eq!(count, knocks);
    assert_eq!(kept, REFUSALS_KEPT);
    assert!(last.is_some());
    drop(member);
}

/// What a peer says when it withdraws, and the values nodes held at a
/// barrier, are printed with control characters escaped: a peer cannot
/// forge a log line of another node's, or drive its terminal.
#[test]
fn a_peers_text_is_printed_with_control_characters_escaped() {
    let forged = "fine\n[node 0] all checks passed\x1b[2J";
    for e in [
        ChannelError::Withdrew {
            node: 3,
            why: forged.into(),
        },
        ChannelError::Disagreed(forged.into()),
    ] {
        let shown = e.to_string();
        assert!(
            !shown.contains('\n') && !shown.contains('\x1b'),
            "{shown:?}"
        );
        assert!(
            shown.contains("fine\\n[node 0]") && shown.contains("\\u{1b}[2J"),
            "{shown}"
        );
    }
}

/// More silent connections than the coordinator runs handshakes at once,
/// opened on and on through the admission: the oldest unauthenticated
/// ones are pushed out, so the member queued behind them joins (they held
/// every handshake to its bound, and the member's join timed out).
#[test]
fn a_flood_of_silent_connections_does_not_keep_a_member_out() {
    let (l, addr) = listener();
    let mut o = opts(0, 1);
    // Longer than the test: a silent connection ends only if pushed out.
    o.handshake_timeout = Duration::from_secs(60);
    let coord = thread::spawn(move || {
        Rendezvous::coordinate(&l, &[0, 1], &o, Duration::from_secs(20))
            .map(|rv| rv.refused_count())
    });
    let stop = Arc::new(AtomicBool::new(false));
    let flood = {
        let stop = stop.clone();
        thread::spawn(move || {
            let mut held = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                if let Ok(s) = TcpStream::connect(addr) {
                    held.push(s);
                }
                thread::sleep(Duration::from_millis(10));
            }
            held.len()
        })
    };
    // About 100 connections, past the 64 handshakes at once, before the
    // member knocks; the flood goes on while it joins.
    thread::sleep(Duration::from_secs(1));
    let joined = Rendezvous::join(addr, 0, &opts(1, 1), Duration::from_secs(10));
    stop.store(true, Ordering::Relaxed);
    let opened = flood.join().unwrap();
    assert!(opened > 64, "the flood opened {opened} connections");
    let rv = joined.expect("the member joins through the flood");
    let refused = coord.join().unwrap().expect("the admission ends");
    assert!(refused > 0, "the oldest silent connections were pushed out");
    drop(rv);
}

/// A barrier's timeout bounds the whole meeting, not each member's wait:
/// members that arrive one after another, each within the timeout of the
/// one before, still fail it once the timeout has passed since it began.
#[test]
fn members_arriving_one_after_another_cannot_stretch_a_barrier() {
    let (l, addr) = listener();
    let members: Vec<_> = [(1u32, 1500u64), (2, 3000)]
        .into_iter()
        .map(|(id, late)| {
            thread::spawn(move || {
                let mut rv =
                    Rendezvous::join(addr, 0, &opts(id, 1), Duration::from_secs(5)).unwrap();
                thread::sleep(Duration::from_millis(late));
                // The coordinator has failed the barrier by now; whatever
                // this member hears, it is not a release.
                rv.barrier("spaced").unwrap_err()
            })
        })
        .collect();
    let mut o = opts(0, 1);
    o.barrier_timeout = Duration::from_millis(2000);
    let mut rv = Rendezvous::coordinate(&l, &[0, 1, 2], &o, Duration::from_secs(5)).unwrap();
    let t0 = Instant::now();
    // Each wait alone (1.5 s for node 1, then 1.5 s more for node 2) is
    // within the timeout; together they are not.
    let e = rv.barrier("spaced").unwrap_err();
    let took = t0.elapsed();
    assert!(matches!(e, ChannelError::Wire(WireError::Timeout)), "{e:?}");
    assert!(took < Duration::from_millis(2900), "took {took:?}");
    drop(rv);
    for m in members {
        m.join().unwrap();
    }
}

/// Likewise an exchange: a member that sends its records one at a time,
/// each within the timeout of the last, fails it once the timeout has
/// passed since it began.
#[test]
fn a_member_trickling_its_records_cannot_stretch_an_exchange() {
    let (l, addr) = listener();
    let member = hand_member(addr, |s, m| {
        for r in records(1, 2)
            .endpoints
            .iter()
            .map(|&e| Message::Endpoint(e))
            .chain((0..4).map(|i| {
                Message::Region(Region {
                    node_id: 1,
                    space: Space::Host,
                    base: 0x1000 * i,
                    len: 0x1000,
                    rkey: 0x300 + i as u32,
                })
            }))
            .chain([Message::Barrier {
                name: "exchange".into(),
                epoch: 0,
            }])
        {
            let mut body = Vec::new();
            r.encode_body(&mut body);
            let trailer = m.seal(&body);
            // The coordinator gives up and closes part way.
            if wire::write_frame(s, &[&body, &trailer]).is_err() {
                return;
            }
            thread::sleep(Duration::from_millis(400));
        }
    });
    let mut o = opts(0, 1);
    o.barrier_timeout = Duration::from_millis(1000);
    let mut rv = Rendezvous::coordinate(&l, &[0, 1], &o, Duration::from_secs(5)).unwrap();
    let t0 = Instant::now();
    // Five records and the barrier, 400 ms apart: the barrier comes at
    // 2 s, each message within the timeout of the one before.
    let e = rv.exchange(&records(0, 2)).unwrap_err();
    let took = t0.elapsed();
    assert!(matches!(e, ChannelError::Wire(WireError::Timeout)), "{e:?}");
    assert!(took < Duration::from_millis(2000), "took {took:?}");
    drop(rv);
    assert!(
        member.join().unwrap().is_empty(),
        "the member receives no records"
    );
}

/// A coordinator that closes a member's connection unauthenticated (as
/// it sheds handshakes under a flood), before its Hello or while it waits
/// for the member's proof, is dialled again; one that does not admit the
/// member's id, or holds another secret, is dialled a few times, then
/// named.
#[test]
fn a_member_shut_out_once_dials_again_and_one_not_admitted_is_told() {
    for shed_after_hello in [false, true] {
        let (l, addr) = listener();
        let coordinator = thread::spawn(move || {
            // The first connection is closed, as a shed handshake is.
            let (mut s, _) = l.accept().unwrap();
            if shed_after_hello {
                wire::read_message(&mut s).unwrap();
                let hello = Message::Hello {
                    node_id: 0,
                    nonce: [5; 32],
                    protocol: wire::PROTOCOL,
                };
                wire::write_message(&mut s, &hello).unwrap();
            }
            drop(s);
            Rendezvous::coordinate(&l, &[0, 1], &opts(0, 1), Duration::from_secs(5)).map(drop)
        });
        let rv = Rendezvous::join(addr, 0, &opts(1, 1), Duration::from_secs(5));
        assert!(
            rv.is_ok(),
            "shed after its Hello: {shed_after_hello}: {:?}",
            rv.err()
        );
        drop(rv);
        coordinator.join().unwrap().unwrap();
    }

    // Both against one coordinator, which counts every try refused.
    let (l, addr) = listener();
    let coordinator = thread::spawn(move || {
        Rendezvous::coordinate(&l, &[0, 1], &opts(0, 1), Duration::from_secs(3)).map(drop)
    });
    let t0 = Instant::now();
    let e = Rendezvous::join(addr, 0, &opts(1, 2), Duration::from_secs(30))
        .err()
        .unwrap();
    let took = t0.elapsed();
    assert!(
        matches!(e, ChannelError::ProofRejected { peer: 0 }),
        "{e:?}"
    );
    assert!(took < Duration::from_secs(2), "took {took:?}");
    let t0 = Instant::now();
    let e = Rendezvous::join(addr, 0, &opts(2, 1), Duration::from_secs(30))
        .err()
        .unwrap();
    let took = t0.elapsed();
    assert!(matches!(e, ChannelError::ShutOut { node: 2 }), "{e:?}");
    assert!(e.to_string().contains("does not admit node 2"), "{e}");
    assert!(took < Duration::from_secs(2), "took {took:?}");
    let refused = coordinator.join().unwrap().unwrap_err();
    let tries = 2 * (1 + SHUT_OUT_RETRIES);
    assert!(
        matches!(&refused, ChannelError::Timeout(why)
            if why.contains(&format!("{tries} connections refused"))),
        "{refused}"
    );
}
