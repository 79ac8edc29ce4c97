//! The ring, written once and run on the simulator (over seeds: random
//! line order) and on emu: order, wrap-around, back-pressure,
//! reservation, torn and truncated records never accepted, and a
//! receiver's restart from its persisted head.

mod common;

use common::{task, Emu, Machines, Sim};
use nicdrv::sim::for_each_seed;
use nicdrv::{GlobalAddr, Nic};
use std::sync::{Arc, Mutex};
use txn::ring::{encode, record_bytes, Receiver, RingError, RingLayout, Sender};

/// Sender machine 0, receiver machine 1, a ring of `capacity` bytes.
fn layout(capacity: u64) -> RingLayout {
    RingLayout {
        receiver: 1,
        ring_off: 64 << 10,
        capacity,
        receiver_head_off: 0,
        sender: 0,
        sender_head_off: 0,
        sender_tail_off: 8,
    }
}

/// A word of the receiver's memory, outside the ring, that a test's sender
/// sets to let its receiver start.
const GO: u64 = 32;

/// A word of the sender's memory its receiver sets when the sender of a
/// test may restart.
const RESTART: u64 = 40;

/// How long a test's receiver waits for a record before it fails (so a
/// broken sender fails the test instead of hanging it).
fn patience<N: Nic>(ctx: &nicdrv::Ctx<N>) -> u64 {
    ctx.now_ns() + 5_000_000_000
}

/// Record `i`'s payload: its length varies (0 to 200 bytes) and every byte
/// names the record.
fn payload(i: u64) -> Vec<u8> {
    let len = (i * 37 % 201) as usize;
    (0..len)
        .map(|k| (i as u8).wrapping_add((k as u8).wrapping_mul(3)))
        .collect()
}

/// `n` records through a 1 KiB ring: the receiver gets each once, in
/// order, whole; the ring wraps many times and the sender waits for room.
fn order_wraparound_backpressure<M: Machines>(m: &M, n: u64) {
    let l = layout(1024);
    let got: Arc<Mutex<Vec<Vec<u8>>>> = Arc::new(Mutex::new(Vec::new()));
    let g = got.clone();
    let waited = Arc::new(Mutex::new(0u64));
    let w = waited.clone();
    m.run(vec![
        (
            0,
            task(move |ctx| async move {
                let mut s = Sender::open(&ctx, l).unwrap();
                let mut last = 0;
                for i in 0..n {
                    let p = payload(i);
                    match s.try_append(&ctx, &p).await {
                        Ok(pos) => last = pos,
                        Err(RingError::Full { .. }) => {
                            *w.lock().unwrap() += 1;
                            last = s.append(&ctx, &p, None).await.unwrap();
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
                assert!(last > 10 * l.capacity, "the ring wrapped ({last})");
            }),
        ),
        (
            1,
            task(move |ctx| async move {
                let mut r = Receiver::open(&ctx, l).unwrap();
                let mut prev = None;
                for i in 0..n {
                    // A slow receiver now and then: the sender fills the ring.
                    if i % 50 == 49 {
                        ctx.sleep(20_000).unwrap().await;
                    }
                    let rec = r.recv(&ctx, Some(patience(&ctx))).await.unwrap();
                    assert!(prev.is_none_or(|p| rec.pos > p), "positions increase");
                    prev = Some(rec.pos);
                    g.lock().unwrap().push(rec.payload);
                }
                // Nothing more is there.
                assert_eq!(r.try_recv(&ctx).unwrap(), None);
            }),
        ),
    ]);
    let got = got.lock().unwrap();
    let want: Vec<Vec<u8>> = (0..n).map(payload).collect();
    assert!(
        *got == want,
        "records lost, duplicated, reordered or altered"
    );
    assert!(
        *waited.lock().unwrap() > 0,
        "the sender never met a full ring"
    );
}

/// Reservations: reserved room is kept from other appends, used by the
/// reservation's own, and released; oversized records and reservations
/// are errors that lose nothing.
fn reservation<M: Machines>(m: &M) {
    let l = layout(1024);
    let got: Arc<Mutex<Vec<Vec<u8>>>> = Arc::new(Mutex::new(Vec::new()));
    let g = got.clone();
    let sent: Arc<Mutex<Vec<Vec<u8>>>> = Arc::new(Mutex::new(Vec::new()));
    let st = sent.clone();
    m.run(vec![
        (
            0,
            task(move |ctx| async move {
                let mut s = Sender::open(&ctx, l).unwrap();
                let mut sent = Vec::new();
                // Too large for the ring, and a reservation beyond it.
                let big = vec![1u8; 600];
                assert_eq!(
                    s.try_append(&ctx, &big).await,
                    Err(RingError::TooLarge { len: 600, max: 496 })
                );
                assert!(matches!(
                    s.reserve(&ctx, &[400, 400]),
                    Err(RingError::ReservationTooLarge { .. })
                ));
                // 3 records of 128 bytes + 128 of slack: 512 of 1024.
                let mut r = s.reserve(&ctx, &[100, 100, 100]).unwrap();
                assert_eq!(r.left(), 512);
                assert_eq!(s.free(&ctx).unwrap(), 1024 - 512);
                // Others' appends fill the rest, not the reservation.
                let other = vec![9u8; 200];
                let mut fits = 0;
                loop {
                    match s.try_append(&ctx, &other).await {
                        Ok(_) => {
                            sent.push(other.clone());
                            fits += 1;
                        }
                        Err(RingError::Full { .. }) => break,
                        Err(e) => panic!("{e}"),
                    }
                }
                assert_eq!(fits, 2, "two 224-byte records fit beside 512 reserved");
                for k in 0..3u8 {
                    let p = vec![k; 100];
                    s.append_reserved(&ctx, &mut r, &p).await.unwrap();
                    sent.push(p);
                }
                assert!(matches!(
                    s.append_reserved(&ctx, &mut r, &[0; 200]).await,
                    Err(RingError::ReservationExhausted { .. })
                ));
                s.release(r).unwrap();
                // Only now may the receiver start (a word in its memory).
                ctx.write(GlobalAddr::host(l.receiver, GO), &1u64.to_le_bytes())
                    .await
                    .unwrap();
                // After the receiver drains, the whole ring is free again.
                let last = vec![7u8; 496];
                s.append(&ctx, &last, None).await.unwrap();
                sent.push(last);
                *st.lock().unwrap() = sent;
            }),
        ),
        (
            1,
            task(move |ctx| async move {
                let mut r = Receiver::open(&ctx, l).unwrap();
                while ctx.local().load(GO).unwrap() == 0 {
                    let d = Some(patience(&ctx));
                    ctx.wait_for_write(GO, 8, d).unwrap().await;
                }
                for _ in 0..6 {
                    let p = r.recv(&ctx, Some(patience(&ctx))).await.unwrap().payload;
                    g.lock().unwrap().push(p);
                }
            }),
        ),
    ]);
    assert!(*got.lock().unwrap() == *sent.lock().unwrap());
}

/// A record whose lines land one at a time, and one cut short for good by
/// a sender that "crashed" mid-WRITE: the receiver never accepts either
/// until it is whole; the restarted sender (from its persisted tail)
/// writes a new record over the truncated one, and that is what arrives.
/// Then the receiver restarts from its persisted head and goes on where
/// it stopped.
fn torn_truncated_and_restart<M: Machines>(m: &M) {
    let l = layout(4096);
    let got: Arc<Mutex<Vec<Vec<u8>>>> = Arc::new(Mutex::new(Vec::new()));
    let g = got.clone();
    m.run(vec![
        (
            0,
            task(move |ctx| async move {
                let ring = |pos: u64| GlobalAddr::host(l.receiver, l.ring_off + pos % l.capacity);
                // Record 0 by hand, 200 bytes of payload (4 lines), landing
                // line by line, last line first, slowly.
                let first = vec![0xa5u8; 200];
                let mut rec = vec![0u8; record_bytes(200) as usize];
                encode(0, &first, None, &mut rec);
                for line in (0..rec.len().div_ceil(64)).rev() {
                    let end = (64 * line + 64).min(rec.len());
                    ctx.write(ring(64 * line as u64), &rec[64 * line..end])
                        .await
                        .unwrap();
                    ctx.sleep(200_000).unwrap().await;
                }
                // The sender's own tail after it (as Sender would persist).
                ctx.local()
                    .store(l.sender_tail_off, rec.len() as u64)
                    .unwrap();
                // Record 1, cut short: header and first line only, then the
                // "crash" (this sender's state is dropped unpersisted).
                let doomed = vec![0x5au8; 300];
                let mut rec2 = vec![0u8; record_bytes(300) as usize];
                let pos = rec.len() as u64;
                encode(pos, &doomed, None, &mut rec2);
                ctx.write(ring(pos), &rec2[..64]).await.unwrap();
                // Down until the receiver has waited in vain for it.
                while ctx.local().load(RESTART).unwrap() == 0 {
                    let d = Some(patience(&ctx));
                    ctx.wait_for_write(RESTART, 8, d).unwrap().await;
                }
                // Restart: the sender opens from its persisted tail and
                // appends anew at the same position.
                let mut s = Sender::open(&ctx, l).unwrap();
                assert_eq!(s.tail(), pos);
                for i in 0..6u64 {
                    s.append(&ctx, &payload(i), None).await.unwrap();
                }
            }),
        ),
        (
            1,
            task(move |ctx| async move {
                let mut r = Receiver::open(&ctx, l).unwrap();
                // While record 0 lands line by line nothing is accepted;
                // the first record taken is the whole one.
                let rec = r.recv(&ctx, Some(patience(&ctx))).await.unwrap();
                assert_eq!(rec.pos, 0);
                g.lock().unwrap().push(rec.payload);
                // The truncated record is never accepted: 1 ms of waiting
                // and nothing comes; then the sender may restart.
                let d = ctx.now_ns() + 1_000_000;
                assert_eq!(r.recv(&ctx, Some(d)).await, Err(RingError::Deadline));
                // It was seen in part (its header landed within microseconds)
                // for about the whole wait.
                let torn = r.torn_for(ctx.now_ns());
                assert!(
                    torn.is_some_and(|t| t > 500_000),
                    "seen in part for {torn:?} ns"
                );
                ctx.write(GlobalAddr::host(l.sender, RESTART), &1u64.to_le_bytes())
                    .await
                    .unwrap();
                // Two records, then a restart of the receiver.
                for _ in 0..2 {
                    let p = r.recv(&ctx, Some(patience(&ctx))).await.unwrap().payload;
                    g.lock().unwrap().push(p);
                }
                assert_eq!(
                    r.torn_for(ctx.now_ns()),
                    None,
                    "the record at the head is a new one, not seen in part"
                );
                let head = r.head();
                // The receiver restarts: a new one from the persisted head.
                let mut r = Receiver::open(&ctx, l).unwrap();
                assert_eq!(r.head(), head, "the head was persisted");
                for _ in 0..4 {
                    let p = r.recv(&ctx, Some(patience(&ctx))).await.unwrap().payload;
                    g.lock().unwrap().push(p);
                }
            }),
        ),
    ]);
    let got = got.lock().unwrap();
    let mut want = vec![vec![0xa5u8; 200]];
    want.extend((0..6).map(payload));
    assert!(
        *got == want,
        "got {} records, not the 7 sent whole",
        got.len()
    );
}

/// In the simulator a WRITE's lines land at random instants: a receiver
/// that looks at every step sees records in part, and accepts each only
/// whole. Over the seeds, parts are seen (the check is exercised) and no
/// record is ever wrong.
#[test]
fn sim_ring_torn_records_are_seen_and_never_accepted() {
    let torn = Arc::new(Mutex::new(0u64));
    for_each_seed(
        "sim_ring_torn_records_are_seen_and_never_accepted",
        20,
        |seed| {
            let l = layout(8192);
            let t = torn.clone();
            let n = 200u64;
            let big = |i: u64| vec![i as u8; 480 + (i % 3) as usize * 8];
            Sim { seed }.run(vec![
                (
                    0,
                    task(move |ctx| async move {
                        let mut s = Sender::open(&ctx, l).unwrap();
                        for i in 0..n {
                            s.append(&ctx, &big(i), None).await.unwrap();
                        }
                    }),
                ),
                (
                    1,
                    task(move |ctx| async move {
                        let mut r = Receiver::open(&ctx, l).unwrap();
                        let mut i = 0;
                        while i < n {
                            match r.try_recv(&ctx).unwrap() {
                                Some(rec) => {
                                    assert_eq!(rec.payload, big(i), "seed {seed}: record {i}");
                                    i += 1;
                                    r.report_head(&ctx, false).await.unwrap();
                                }
                                None => {
                                    r.report_head(&ctx, true).await.unwrap();
                                    ctx.yield_now().await;
                                }
                            }
                        }
                        *t.lock().unwrap() += r.torn_looks();
                    }),
                ),
            ]);
        },
    );
    assert!(*torn.lock().unwrap() > 0, "no record was ever seen in part");
}

/// A failed append poisons its sender (which of its WRITEs landed is not
/// known); reservations are their sender's; deadlines already past end a
/// wait at once; impossible layouts are refused.
#[test]
fn sim_ring_failures_and_misuse_are_errors() {
    let l = layout(1024);
    let mut w = nicdrv::sim::World::new(nicdrv::sim::SimConfig {
        memory_nodes: 2,
        compute_nodes: 2,
        machines: 2,
        host_bytes: common::HOST,
        // Machine 0 (the sender) cut off from machine 1 at 1 ms.
        faults: nicdrv::sim::parse_fault("partition@1ms:0").unwrap(),
        ..Default::default()
    })
    .unwrap();
    let t = w
        .add_thread(
            0,
            nicdrv::ExecutorConfig {
                slots: 1,
                ..Default::default()
            },
        )
        .unwrap();
    let done = Arc::new(Mutex::new(false));
    let d = done.clone();
    w.spawn(t, move |ctx| async move {
        let mut s = Sender::open(&ctx, l).unwrap();
        let mut other = Sender::open(
            &ctx,
            RingLayout {
                sender_tail_off: 16,
                ..l
            },
        )
        .unwrap();
        let mut r = other.reserve(&ctx, &[10]).unwrap();
        assert_eq!(
            s.append_reserved(&ctx, &mut r, b"x").await,
            Err(RingError::NotOurs)
        );
        assert_eq!(
            s.release(other.reserve(&ctx, &[10]).unwrap()),
            Err(RingError::NotOurs)
        );
        other.release(r).unwrap();
        s.append(&ctx, b"before", None).await.unwrap();
        // A deadline already past: an at-once Deadline, not a timer error.
        let past = ctx.now_ns();
        ctx.sleep(10).unwrap().await;
        let mut full = Sender::open(
            &ctx,
            RingLayout {
                sender_tail_off: 24,
                ..l
            },
        )
        .unwrap();
        while full.try_append(&ctx, &[0; 400]).await.is_ok() {}
        assert_eq!(
            full.append(&ctx, &[0; 400], Some(past)).await,
            Err(RingError::Deadline)
        );
        ctx.sleep_until(2_000_000).unwrap().await;
        // Cut off: the WRITE fails, and the sender is poisoned.
        assert!(matches!(
            s.append(&ctx, b"during", None).await,
            Err(RingError::Verb(_))
        ));
        assert_eq!(
            s.append(&ctx, b"after", None).await,
            Err(RingError::Poisoned)
        );
        *d.lock().unwrap() = true;
    })
    .unwrap();
    assert_eq!(w.run(), nicdrv::sim::RunEnd::Done);
    assert!(*done.lock().unwrap());
    for bad in [
        RingLayout {
            capacity: 1 << 32,
            ..l
        },
        RingLayout {
            ring_off: u64::MAX - 15,
            ..l
        },
        RingLayout {
            sender_tail_off: l.sender_head_off,
            ..l
        },
    ] {
        assert!(matches!(bad.check(), Err(RingError::Layout(_))), "{bad:?}");
    }
}

/// Records in flight that must never be taken are made void: a batch of
/// three (a PAD before the last, at the lap's end) fails on a cut link;
/// of its records the first and the last land (written here by hand) and
/// the middle one never does, so the receiver takes the first and waits
/// at the second for good. The sender makes the records from the
/// receiver's head on void, past it first: the receiver skips them and
/// takes the sender's next record, never the last record that had
/// landed. A head where no record in flight starts is refused.
#[test]
fn sim_ring_records_in_flight_are_made_void() {
    for_each_seed("sim_ring_records_in_flight_are_made_void", 10, |seed| {
        let l = layout(1024);
        let mut w = nicdrv::sim::World::new(nicdrv::sim::SimConfig {
            seed,
            memory_nodes: 2,
            compute_nodes: 2,
            machines: 2,
            host_bytes: common::HOST,
            // The sender's verbs to the receiver's memory fail from 1 ms
            // to 10 ms.
            faults: nicdrv::sim::parse_fault("link-cut@1ms:0-1/9ms").unwrap(),
            ..Default::default()
        })
        .unwrap();
        let cfg = nicdrv::ExecutorConfig {
            slots: 1,
            ..Default::default()
        };
        let (ts, tr) = (w.add_thread(0, cfg).unwrap(), w.add_thread(1, cfg).unwrap());
        let got: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
        let g = got.clone();
        let sent = Arc::new(Mutex::new(false));
        let s2 = sent.clone();
        w.spawn(ts, move |ctx| async move {
            let mut s = Sender::open(&ctx, l).unwrap();
            for i in 0..3 {
                s.append(&ctx, &[i; 200], None).await.unwrap();
            }
            assert_eq!(s.tail(), 672);
            ctx.sleep_until(2_000_000).unwrap().await;
            let (a, b, c) = ([10u8; 100], [11u8; 150], [12u8; 50]);
            assert!(matches!(
                s.append_many(&ctx, &[&a, &b, &c], None).await,
                Err(RingError::Verb(_))
            ));
            let at: Vec<u64> = s.in_flight_positions().unwrap().collect();
            // A at 672, B at 800, the PAD at 976, C at 1024, the end.
            assert_eq!(at, [672, 800, 976, 1024, 1104]);
            ctx.sleep_until(11_000_000).unwrap().await;
            let mut bt = ctx.batch();
            for (pos, p) in [(672, &a[..]), (1024, &c[..])] {
                let mut buf = ctx.alloc(record_bytes(p.len() as u64) as usize).unwrap();
                encode(pos, p, None, buf.as_mut_slice());
                bt.write(GlobalAddr::host(1, l.ring_off + pos % l.capacity), buf);
            }
            bt.submit().await.unwrap();
            // The receiver took A and stops at B.
            ctx.sleep_until(12_000_000).unwrap().await;
            let mut bt = ctx.batch();
            let op = bt.read_new(GlobalAddr::host(1, l.receiver_head_off), 8);
            let head = bt.submit().await.unwrap().word(op);
            assert_eq!(head, 800);
            let mut bt = ctx.batch();
            assert!(matches!(
                s.stage_voids(&ctx, &mut bt, head + 16, true),
                Err(RingError::Corrupt(_))
            ));
            for (past, n) in [(true, 2), (false, 1)] {
                let mut bt = ctx.batch();
                assert_eq!(s.stage_voids(&ctx, &mut bt, head, past).unwrap(), n);
                bt.submit().await.unwrap();
            }
            s.landed(&ctx).unwrap();
            assert!(!s.is_poisoned());
            s.append(&ctx, b"after", None).await.unwrap();
            *s2.lock().unwrap() = true;
        })
        .unwrap();
        w.spawn(tr, move |ctx| async move {
            let mut r = Receiver::open(&ctx, l).unwrap();
            loop {
                let rec = r.recv(&ctx, Some(patience(&ctx))).await.unwrap();
                let last = rec.payload == b"after";
                g.lock().unwrap().push(rec.payload);
                if last {
                    break;
                }
            }
        })
        .unwrap();
        assert_eq!(w.run(), nicdrv::sim::RunEnd::Done);
        assert!(*sent.lock().unwrap(), "seed {seed}");
        let want: Vec<Vec<u8>> = vec![
            vec![0; 200],
            vec![1; 200],
            vec![2; 200],
            vec![10; 100],
            b"after".to_vec(),
        ];
        assert_eq!(*got.lock().unwrap(), want, "seed {seed}");
    });
}

/// Corrupt persisted state and bad input are errors, never panics.
fn bad_state<M: Machines>(m: &M) {
    let l = layout(1024);
    m.run(vec![(
        0,
        task(move |ctx: nicdrv::Ctx<M::N>| async move {
            // The sender's view: a head beyond the tail.
            ctx.local().store(l.sender_head_off, 64).unwrap();
            assert!(matches!(Sender::open(&ctx, l), Err(RingError::Corrupt(_))));
            ctx.local().store(l.sender_head_off, 0).unwrap();
            assert!(Sender::open(&ctx, RingLayout { capacity: 100, ..l }).is_err());
            // A receiver on a machine whose head word is out of memory.
            let far = RingLayout {
                receiver_head_off: ctx.nic().local_bytes().unwrap(),
                ..l
            };
            assert!(matches!(
                Receiver::open(&ctx, far),
                Err(RingError::Local(_))
            ));
            let odd = RingLayout {
                receiver_head_off: 24,
                ..l
            };
            ctx.local().store(24, 3).unwrap();
            assert!(matches!(
                Receiver::open(&ctx, odd),
                Err(RingError::Corrupt(_))
            ));
            // Positions near the end of u64: their next sum overflowed.
            ctx.local().store(24, u64::MAX - 15).unwrap();
            assert!(matches!(
                Receiver::open(&ctx, odd),
                Err(RingError::Corrupt(_))
            ));
            let end = u64::MAX - 15;
            ctx.local().store(l.sender_tail_off, end).unwrap();
            ctx.local().store(l.sender_head_off, end).unwrap();
            assert!(matches!(Sender::open(&ctx, l), Err(RingError::Corrupt(_))));
            ctx.local().store(l.sender_tail_off, 0).unwrap();
            ctx.local().store(l.sender_head_off, 0).unwrap();
        }),
    )]);
}

#[test]
fn sim_ring_order_wraparound_backpressure() {
    for_each_seed("sim_ring_order_wraparound_backpressure", 20, |seed| {
        order_wraparound_backpressure(&Sim { seed }, 400)
    });
}

#[test]
fn emu_ring_order_wraparound_backpressure() {
    order_wraparound_backpressure(&Emu::new(), 20_000);
}

#[test]
fn sim_ring_reservation() {
    reservation(&Sim { seed: 1 });
}

#[test]
fn emu_ring_reservation() {
    reservation(&Emu::new());
}

#[test]
fn sim_ring_torn_truncated_and_restart() {
    for_each_seed("sim_ring_torn_truncated_and_restart", 20, |seed| {
        torn_truncated_and_restart(&Sim { seed })
    });
}

#[test]
fn emu_ring_torn_truncated_and_restart() {
    torn_truncated_and_restart(&Emu::new());
}

#[test]
fn ring_bad_state_is_an_error() {
    bad_state(&Sim { seed: 1 });
    bad_state(&Emu::new());
}

#[cfg(feature = "mlx5")]
mod on_mlx5 {
    use super::*;
    use common::Mlx5;

    #[test]
    fn mlx5_ring_order_wraparound_backpressure() {
        if let Some(m) = Mlx5::new() {
            order_wraparound_backpressure(&m, 20_000);
        }
    }

    #[test]
    fn mlx5_ring_reservation() {
        if let Some(m) = Mlx5::new() {
            reservation(&m);
        }
    }

    #[test]
    fn mlx5_ring_torn_truncated_and_restart() {
        if let Some(m) = Mlx5::new() {
            torn_truncated_and_restart(&m);
        }
    }

    #[test]
    fn mlx5_ring_bad_state_is_an_error() {
        if let Some(m) = Mlx5::new() {
            bad_state(&m);
        }
    }
}

/// A simulated cluster of two machines (0 and 1) with no threads yet, and
/// a one-task executor's configuration.
fn two_machines() -> (nicdrv::sim::World, nicdrv::ExecutorConfig) {
    let w = nicdrv::sim::World::new(nicdrv::sim::SimConfig {
        memory_nodes: 2,
        compute_nodes: 2,
        machines: 2,
        host_bytes: common::HOST,
        ..Default::default()
    })
    .unwrap();
    let cfg = nicdrv::ExecutorConfig {
        slots: 1,
        ..Default::default()
    };
    (w, cfg)
}

/// A reply whose append timed out did not tell the sender the head it
/// carried: that head stays unreported, so the next report sends it (it
/// was counted as told, and a sender waiting for room could wait on a
/// report that never came).
#[test]
fn sim_a_reply_that_did_not_go_leaves_its_head_unreported() {
    use txn::records::{Envelope, Record, TxId};
    // Machine 0 sends on `to` to machine 1, which sends back on `back`.
    let to = layout(1024);
    let back = RingLayout {
        receiver: 0,
        ring_off: 128 << 10,
        capacity: 1024,
        receiver_head_off: 48,
        sender: 1,
        sender_head_off: 16,
        sender_tail_off: 24,
    };
    back.check().unwrap();
    let (mut w, cfg) = two_machines();
    let t1 = w.add_thread(1, cfg).unwrap();
    w.spawn(t1, move |ctx| async move {
        let mut s = Sender::open(&ctx, back).unwrap();
        s.append(&ctx, b"a record to consume", None).await.unwrap();
    })
    .unwrap();
    let t0 = w.add_thread(0, cfg).unwrap();
    let done = Arc::new(Mutex::new(false));
    let d = done.clone();
    w.spawn(t0, move |ctx| async move {
        let mut r = Receiver::open(&ctx, back).unwrap();
        r.recv(&ctx, Some(patience(&ctx))).await.unwrap();
        assert!(r.head() > 0);
        // Nobody reads `to`: fill it to the last record's room, so the
        // reply cannot go.
        let mut s = Sender::open(&ctx, to).unwrap();
        while s.try_append(&ctx, &[0; 400]).await.is_ok() {}
        while s.try_append(&ctx, &[0; 1]).await.is_ok() {}
        let tx = TxId {
            config: 1,
            machine: 0,
            thread: 0,
            local: 7,
        };
        let reply = Record::LockReply { tx, ok: true };
        let sent = Envelope::send(&ctx, &mut s, &mut r, reply, 1_000).await;
        assert!(sent.is_err(), "{sent:?}");
        assert_eq!(
            r.report_head(&ctx, true).await,
            Ok(true),
            "the head the failed reply carried is still to report"
        );
        *d.lock().unwrap() = true;
    })
    .unwrap();
    assert_eq!(w.run(), nicdrv::sim::RunEnd::Done);
    assert!(*done.lock().unwrap());
}

/// A sender short of room whose receiver only polls and reports each
/// quarter ring (a server's log rings: a backup sends no reply to
/// piggyback a head on) READs the head the receiver persists
/// (`Sender::wait_for_head`) after waiting `FETCH_HEAD_NS`, rather than
/// waiting for a report that never comes. In a 1 KiB ring: records of
/// 384 bytes (reported: a quarter) and 240 (consumed, not reported), then
/// an append of 496 bytes that, with the PAD to the lap's end, needs 896
/// against 784 that look free (waiting inside `append`); then a record
/// of 240 bytes, and a reservation of 832 bytes against 784 that look
/// free, waiting as a coordinator does. Each waits less than `bound_ns`
/// for its room, against a deadline of 10 s.
fn short_of_room<M: Machines>(m: &M, bound_ns: u64) {
    let l = layout(1024);
    let waited = Arc::new(Mutex::new(Vec::new()));
    let wt = waited.clone();
    let sender = task(move |ctx: nicdrv::Ctx<M::N>| async move {
        const DEADLINE_NS: u64 = 10_000_000_000;
        let mut s = Sender::open(&ctx, l).unwrap();
        assert_eq!(record_bytes(224), 240);
        // 384 bytes, reported (a quarter), then 240, not: the tail at 624.
        s.append(&ctx, &[7; 368], None).await.unwrap();
        // The receiver polls each 5 us: it takes and reports these first.
        let t = ctx.now_ns();
        while s.free(&ctx).unwrap() < 1024 {
            assert!(ctx.now_ns() - t < DEADLINE_NS, "no report came");
            ctx.sleep(20_000).unwrap().await;
        }
        s.append(&ctx, &[7; 224], None).await.unwrap();
        ctx.sleep(20_000).unwrap().await;
        // 496 bytes do not fit the lap's last 400: with the PAD, 896
        // against 784 that look free.
        let t = ctx.now_ns();
        s.append(&ctx, &[9; 480], Some(t + DEADLINE_NS))
            .await
            .unwrap();
        wt.lock().unwrap().push(ctx.now_ns() - t);
        // Consumed past a quarter: reported. Then 240 bytes, not.
        let t = ctx.now_ns();
        while s.free(&ctx).unwrap() < 1024 {
            assert!(ctx.now_ns() - t < DEADLINE_NS, "no report came");
            ctx.sleep(20_000).unwrap().await;
        }
        s.append(&ctx, &[7; 224], None).await.unwrap();
        ctx.sleep(20_000).unwrap().await;
        // As the coordinator's reserve does: wait for a report, and READ
        // the head when none comes (`wait_for_head`). 832 bytes against
        // 784.
        let t = ctx.now_ns();
        let mut read_news = false;
        let mut r = loop {
            match s.reserve(&ctx, &[400]) {
                Ok(r) => break r,
                Err(RingError::ReservationTooLarge { want: 832, .. }) => {
                    read_news |= s.wait_for_head(&ctx, Some(t + DEADLINE_NS)).await.unwrap();
                    assert!(ctx.now_ns() - t < DEADLINE_NS, "no room came");
                }
                Err(e) => panic!("{e}"),
            }
        };
        assert!(read_news, "the room came by a READ of the head");
        wt.lock().unwrap().push(ctx.now_ns() - t);
        s.append_reserved(&ctx, &mut r, &[8; 400]).await.unwrap();
        s.release(r).unwrap();
    });
    let receiver = task(move |ctx: nicdrv::Ctx<M::N>| async move {
        let mut r = Receiver::open(&ctx, l).unwrap();
        let (mut got, mut buf) = (0, Vec::new());
        let deadline = patience(&ctx);
        while got < 5 {
            while r.try_recv_into(&ctx, &mut buf).unwrap().is_some() {
                got += 1;
            }
            r.report_head(&ctx, false).await.unwrap();
            assert!(ctx.now_ns() < deadline, "the records never came");
            ctx.sleep(5_000).unwrap().await;
        }
        assert_eq!(buf, vec![8; 400]);
    });
    m.run(vec![(0, sender), (1, receiver)]);
    let waited = waited.lock().unwrap().clone();
    assert_eq!(waited.len(), 2);
    for t in waited {
        assert!(t < bound_ns, "waited {t} ns for room");
    }
}

#[test]
fn sim_a_sender_short_of_room_reads_the_head_a_polling_receiver_left() {
    short_of_room(&Sim { seed: 1 }, 2 * txn::ring::FETCH_HEAD_NS);
}

/// On emu, whose waits for a write wake every turn (it cannot watch
/// writes land): the READ still comes after `FETCH_HEAD_NS` (about 50 µs
/// here), where a wait that returned at each spurious wake-up READ only
/// when a turn happened to fall past its deadline (1 to 43 ms seen). The
/// bound is wide, for a loaded host's clock: it fails only a wait that
/// never READ before the deadline.
#[test]
fn emu_a_sender_short_of_room_reads_the_head_a_polling_receiver_left() {
    short_of_room(&Emu::new(), 2_000_000_000);
}
