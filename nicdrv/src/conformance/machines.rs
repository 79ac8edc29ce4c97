//! Conformance of machines: the local view against remote verbs, timers,
//! and waiting for a write, on every backend ([`Harness::parallel_on`]).

use super::{two_nodes, Harness};
use crate::addr::GlobalAddr;
use crate::local::{LocalError, TimerError, WaitError, Woken, TIMER_HORIZON_NS};
use std::sync::{Arc, Mutex};

/// Where the machine cases work in a node's host memory (clear of the
/// other cases' addresses).
const AREA: u64 = 512 << 10;

/// The machine's local view and remote verbs to the same node see one
/// memory: a local store is what a remote READ returns, a remote WRITE and
/// FAA are what local loads and reads return, a local CAS succeeds and
/// fails on the word remote verbs left, and a range written locally reads
/// back whole remotely. Bad accesses are errors, never panics; a
/// compute-only core has no local view.
pub fn local_view_matches_remote_verbs<H: Harness>(h: &H) {
    let (a, _) = two_nodes(h);
    let size = h.host_bytes(a);
    h.parallel_on(
        &[Some(a), None],
        1,
        Arc::new(move |ctx, th, _| {
            Box::pin(async move {
                let l = ctx.local();
                if th == 1 {
                    assert_eq!(l.bytes(), None);
                    assert_eq!(l.load(0), Err(LocalError::NotAMachine));
                    assert_eq!(l.write(0, &[1]), Err(LocalError::NotAMachine));
                    assert!(matches!(
                        ctx.wait_for_write(0, 8, None),
                        Err(WaitError::Local(LocalError::NotAMachine))
                    ));
                    return;
                }
                assert_eq!(l.bytes(), Some(size));
                let at = |off: u64| GlobalAddr::host(a, AREA + off);
                // Local store, remote READ.
                l.store(AREA, 0x1111_2222_3333_4444).unwrap();
                let r = ctx.read(at(0), 8).await.unwrap();
                assert_eq!(r.u64_at(0), 0x1111_2222_3333_4444);
                // Remote WRITE of a range, local read and loads.
                let data: Vec<u8> = (0..200u8).collect();
                ctx.write(at(64), &data).await.unwrap();
                let mut back = vec![0u8; 200];
                l.read(AREA + 64, &mut back).unwrap();
                assert_eq!(back, data);
                assert_eq!(
                    l.load(AREA + 64).unwrap(),
                    u64::from_le_bytes(data[..8].try_into().unwrap())
                );
                // Remote FAA, local CAS on what it left.
                assert_eq!(ctx.faa(at(512), 5).await.unwrap(), 0);
                assert_eq!(
                    l.cas(AREA + 512, 4, 9),
                    Ok(5),
                    "a failed CAS returns the word"
                );
                assert_eq!(l.cas(AREA + 512, 5, 9), Ok(5));
                assert_eq!(ctx.read(at(512), 8).await.unwrap().u64_at(0), 9);
                // A remote CAS sees the local CAS's word.
                assert_eq!(ctx.cas(at(512), 9, 10).await.unwrap(), 9);
                assert_eq!(l.load(AREA + 512), Ok(10));
                // Local range write, remote READ.
                let pattern: Vec<u8> = (0..300u32).map(|i| (i * 7) as u8).collect();
                l.write(AREA + 1001, &pattern).unwrap();
                let r = ctx.read(at(1001), 300).await.unwrap();
                assert_eq!(r.as_slice(), &pattern[..]);
                // Bad input.
                assert_eq!(
                    l.load(AREA + 3),
                    Err(LocalError::Misaligned { off: AREA + 3 })
                );
                assert_eq!(
                    l.store(size, 1),
                    Err(LocalError::OutOfRange {
                        off: size,
                        len: 8,
                        size
                    })
                );
                assert!(matches!(
                    l.read(size - 4, &mut [0; 8]),
                    Err(LocalError::OutOfRange { .. })
                ));
                assert!(matches!(
                    l.write(u64::MAX, &[0; 2]),
                    Err(LocalError::OutOfRange { .. })
                ));
                assert!(matches!(
                    ctx.wait_for_write(size - 8, 16, None),
                    Err(WaitError::Local(LocalError::OutOfRange { .. }))
                ));
            })
        }),
    );
}

/// Timers: every sleeper wakes no earlier than its deadline, sleepers on
/// one core wake in deadline order whatever order they slept in (none
/// later than one with a later deadline), a sleep
/// interleaves with another task's verbs, and deadlines in the past or
/// beyond the horizon are refused.
pub fn timers<H: Harness>(h: &H) {
    let (a, _) = two_nodes(h);
    let woke: Arc<Mutex<Vec<(usize, u64, u64)>>> = Arc::new(Mutex::new(Vec::new()));
    let w = woke.clone();
    // Task k sleeps (4 - k) ms: the last spawned wakes first.
    h.parallel(
        1,
        5,
        Arc::new(move |ctx, _, tk| {
            let w = w.clone();
            Box::pin(async move {
                let start = ctx.now_ns();
                if tk == 4 {
                    // The verbs task: round trips while the others sleep.
                    for _ in 0..50 {
                        ctx.faa(GlobalAddr::host(a, AREA + 4096), 1).await.unwrap();
                    }
                    // Round trips took time: now > 0.
                    assert!(matches!(
                        ctx.sleep_until(ctx.now_ns() - 1).err(),
                        Some(TimerError::InPast { .. })
                    ));
                    assert!(matches!(
                        ctx.sleep(TIMER_HORIZON_NS + 1).err(),
                        Some(TimerError::BeyondHorizon { .. })
                    ));
                    ctx.sleep(0).unwrap().await;
                    return;
                }
                let ns = (4 - tk as u64) * 1_000_000;
                ctx.sleep(ns).unwrap().await;
                let now = ctx.now_ns();
                assert!(
                    now >= start + ns,
                    "task {tk} woke {} ns early",
                    start + ns - now
                );
                w.lock().unwrap().push((tk, start + ns, now));
            })
        }),
    );
    // Deadline order: a later deadline never woke at an earlier time (on a
    // loaded host two may come due in one turn and wake at one time).
    let mut woke = woke.lock().unwrap().clone();
    assert_eq!(woke.len(), 4);
    woke.sort_by_key(|w| w.1);
    assert_eq!(woke.iter().map(|w| w.0).collect::<Vec<_>>(), [3, 2, 1, 0]);
    assert!(
        woke.windows(2).all(|p| p[0].2 <= p[1].2),
        "a later deadline woke first: {woke:?}"
    );
}

/// Waiting for a write: a waiter on the machine wakes after another core's
/// remote WRITE lands in its range and then sees the value; a wait with a
/// deadline and no writer ends at the deadline; a deadline in the past is
/// refused. Several waiters on one core each get their own write.
pub fn wait_for_write<H: Harness>(h: &H) {
    let (a, _) = two_nodes(h);
    const WAITERS: u64 = 3;
    let base = AREA + (64 << 10);
    let seen: Arc<Mutex<Vec<(u64, u64)>>> = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    h.parallel_on(
        &[Some(a), None],
        WAITERS as usize + 1,
        Arc::new(move |ctx, th, tk| {
            let s = s.clone();
            Box::pin(async move {
                let tk = tk as u64;
                if th == 1 {
                    // The writer: after a while, one word per waiter, late
                    // ones first, each a distinct value.
                    if tk != 0 {
                        return;
                    }
                    for k in (0..WAITERS).rev() {
                        ctx.sleep(300_000).unwrap().await;
                        let v = 0xabc0 + k;
                        ctx.write(GlobalAddr::host(a, base + 64 * k), &v.to_le_bytes())
                            .await
                            .unwrap();
                    }
                    return;
                }
                let l = ctx.local();
                if tk == WAITERS {
                    // No writer for this range: the deadline ends the wait.
                    let d = ctx.now_ns() + 2_000_000;
                    let off = base + 64 * 100;
                    loop {
                        let w = ctx.wait_for_write(off, 8, Some(d)).unwrap().await;
                        if w == Woken::Deadline {
                            break;
                        }
                        assert!(ctx.now_ns() < d);
                    }
                    assert!(ctx.now_ns() >= d);
                    assert_eq!(l.load(off), Ok(0));
                    assert!(matches!(
                        ctx.wait_for_write(off, 8, Some(d - 1)),
                        Err(WaitError::Timer(TimerError::InPast { .. }))
                    ));
                    return;
                }
                let off = base + 64 * tk;
                let v = loop {
                    let v = l.load(off).unwrap();
                    if v != 0 {
                        break v;
                    }
                    let w = ctx.wait_for_write(off, 8, None).unwrap().await;
                    assert_eq!(w, Woken::Written);
                };
                s.lock().unwrap().push((tk, v));
            })
        }),
    );
    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    let want: Vec<(u64, u64)> = (0..WAITERS).map(|k| (k, 0xabc0 + k)).collect();
    assert_eq!(seen, want);
}
