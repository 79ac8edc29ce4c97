//! Machines in the simulator: what only it can show about timers and
//! write waits (exact wake-ups, no events while idle, a stuck world still
//! reported stalled), whole-machine crashes and partitions.

use nicdrv::sim::{parse_fault, Fault, FaultKind, RunEnd, SimConfig, World};
use nicdrv::*;
use std::cell::{Cell, RefCell};
use std::rc::Rc;

/// Two machines (nodes 0 and 1) and a compute-only node 2.
fn world(seed: u64) -> World {
    World::new(SimConfig {
        seed,
        memory_nodes: 2,
        compute_nodes: 3,
        machines: 2,
        host_bytes: 1 << 20,
        ..Default::default()
    })
    .unwrap()
}

fn thread(w: &mut World, node: u16, slots: usize) -> u32 {
    w.add_thread(
        node,
        ExecutorConfig {
            slots,
            ..Default::default()
        },
    )
    .unwrap()
}

/// How `pollers` tasks on machine 0 wait for one word each, written by
/// node 2 after `idle_ns`: by spinning (a local load and a yield per
/// step) or by waiting for the write. Returns the events the world took
/// and its virtual end time.
fn pollers(pollers: u64, idle_ns: u64, spin: bool) -> (u64, u64) {
    let mut w = world(1);
    let per = 8;
    let mut threads = Vec::new();
    for _ in 0..pollers.div_ceil(per) {
        threads.push(thread(&mut w, 0, per as usize));
    }
    for p in 0..pollers {
        let t = threads[(p / per) as usize];
        w.spawn(t, move |ctx| async move {
            let off = 4096 + 64 * p;
            loop {
                if ctx.local().load(off).unwrap() == p + 1 {
                    break;
                }
                if spin {
                    ctx.yield_now().await;
                } else {
                    ctx.wait_for_write(off, 8, None).unwrap().await;
                }
            }
        })
        .unwrap();
    }
    let writer = thread(&mut w, 2, 1);
    w.spawn(writer, move |ctx| async move {
        ctx.sleep(idle_ns).unwrap().await;
        let mut b = ctx.batch();
        for p in 0..pollers {
            b.write_u64(GlobalAddr::host(0, 4096 + 64 * p), p + 1);
            if b.len() == nicdrv::exec::MAX_BATCH {
                b.submit().await.unwrap();
                b = ctx.batch();
            }
        }
        if !b.is_empty() {
            b.submit().await.unwrap();
        }
    })
    .unwrap();
    assert_eq!(w.run(), RunEnd::Done);
    (w.events(), w.now_ns())
}

/// 64 idle pollers over 1 virtual ms: spinning costs an event per poller
/// step, waiting for the write costs almost nothing until the writes come.
#[test]
fn idle_pollers_cost_no_events_while_they_wait() {
    let idle = 1_000_000;
    let (spin_events, spin_end) = pollers(64, idle, true);
    let (wait_events, wait_end) = pollers(64, idle, false);
    eprintln!(
        "64 pollers idle for 1 virtual ms: spinning {spin_events} events ({:.0}/virtual ms), waiting {wait_events} ({:.0}/virtual ms)",
        spin_events as f64 * 1e6 / spin_end as f64,
        wait_events as f64 * 1e6 / wait_end as f64
    );
    assert!(spin_end >= idle && wait_end >= idle);
    assert!(
        wait_events * 20 < spin_events,
        "waiting took {wait_events} events, spinning {spin_events}"
    );
    assert!(wait_events < 400, "{wait_events} events");
}

/// A sleep costs one timer event, not a spin; sleepers wake exactly at
/// their deadline; a task that waits for a write nobody makes leaves the
/// world stalled, and one that also has a deadline ends there.
#[test]
fn sleeps_wake_on_time_and_a_stuck_waiter_is_stalled() {
    let mut w = world(3);
    let t = thread(&mut w, 0, 3);
    let woke = Rc::new(RefCell::new(Vec::new()));
    for (i, ns) in [(0u64, 7_000_000u64), (1, 3_000_000), (2, 5_000_000)] {
        let woke = woke.clone();
        w.spawn(t, move |ctx| async move {
            let at = ctx.now_ns() + ns;
            ctx.sleep_until(at).unwrap().await;
            woke.borrow_mut().push((i, at, ctx.now_ns()));
        })
        .unwrap();
    }
    let before = w.events();
    assert_eq!(w.run(), RunEnd::Done);
    let events = w.events() - before;
    let woke = woke.borrow();
    assert_eq!(woke.iter().map(|w| w.0).collect::<Vec<_>>(), [1, 2, 0]);
    for &(i, at, now) in woke.iter() {
        // A turn starts when the timer fires; the CPU of one step (and
        // of the tasks woken before it in the turn) may come first.
        assert!(
            now >= at && now - at < 1_000,
            "task {i}: at {at}, woke {now}"
        );
    }
    assert!(events < 20, "three sleeps took {events} events");

    // Nobody writes: stalled, not spinning for ever.
    let mut w = world(3);
    let t = thread(&mut w, 1, 2);
    w.spawn(t, |ctx| async move {
        ctx.wait_for_write(0, 8, None).unwrap().await;
    })
    .unwrap();
    let ended = Rc::new(Cell::new(None));
    let e = ended.clone();
    w.spawn(t, move |ctx| async move {
        let d = ctx.now_ns() + 2_000_000;
        let r = ctx.wait_for_write(64, 8, Some(d)).unwrap().await;
        e.set(Some((r, ctx.now_ns() >= d)));
    })
    .unwrap();
    assert_eq!(w.run(), RunEnd::Stalled);
    assert_eq!(ended.get(), Some((Woken::Deadline, true)));
}

/// In the simulator a wait ends for a write into its range only: writes
/// next to it, remote or local, do not wake it.
#[test]
fn writes_outside_the_range_do_not_wake_a_waiter() {
    let mut w = world(5);
    let waiter = thread(&mut w, 0, 2);
    let wakes = Rc::new(Cell::new(0u32));
    let k = wakes.clone();
    w.spawn(waiter, move |ctx| async move {
        while ctx.local().load(1024).unwrap() != 7 {
            ctx.wait_for_write(1024, 8, None).unwrap().await;
            k.set(k.get() + 1);
        }
    })
    .unwrap();
    // A neighbour on the same core stores just outside the range.
    w.spawn(waiter, |ctx| async move {
        for i in 0..10u64 {
            ctx.local().store(1016, i).unwrap();
            ctx.local().store(1032, i).unwrap();
            ctx.sleep(10_000).unwrap().await;
        }
    })
    .unwrap();
    let writer = thread(&mut w, 2, 1);
    w.spawn(writer, |ctx| async move {
        for i in 0..10u64 {
            ctx.write(GlobalAddr::host(0, 960), &[i as u8; 64])
                .await
                .unwrap();
            ctx.write(GlobalAddr::host(0, 1032), &[i as u8; 64])
                .await
                .unwrap();
        }
        // One WRITE over the range at last (a 64-byte line holding it).
        let mut line = [0u8; 64];
        line[..8].copy_from_slice(&7u64.to_le_bytes());
        ctx.write(GlobalAddr::host(0, 1024), &line).await.unwrap();
    })
    .unwrap();
    assert_eq!(w.run(), RunEnd::Done);
    assert_eq!(wakes.get(), 1, "woken by writes outside its range");
}

/// A machine crash stops its threads and loses its memory at once; the
/// other machine goes on. A partition cuts exactly the links across it,
/// both ways, until it heals.
#[test]
fn machine_crashes_and_partitions() {
    let mut w = world(7);
    let t0 = thread(&mut w, 0, 1);
    let steps = Rc::new(Cell::new(0u64));
    let s = steps.clone();
    // Machine 0 counts in its own memory until it dies.
    w.spawn(t0, move |ctx| async move {
        loop {
            let v = ctx.local().load(0).unwrap();
            ctx.local().store(0, v + 1).unwrap();
            s.set(v + 1);
            ctx.sleep(100_000).unwrap().await;
        }
    })
    .unwrap();
    w.add_faults(&[Fault {
        at_ns: 1_050_000,
        kind: FaultKind::CrashMachine { machine: 0 },
    }])
    .unwrap();
    let t2 = thread(&mut w, 2, 1);
    let seen = Rc::new(RefCell::new(Vec::new()));
    let s2 = seen.clone();
    w.spawn(t2, move |ctx| async move {
        ctx.sleep(2_000_000).unwrap().await;
        let dead = ctx
            .read(GlobalAddr::host(0, 0), 8)
            .await
            .map(|b| b.u64_at(0));
        let alive = ctx.faa(GlobalAddr::host(1, 0), 1).await;
        s2.borrow_mut().push((dead.is_err(), alive.is_ok()));
    })
    .unwrap();
    // The counter's task never ends: the run stalls once node 2 is done.
    assert_eq!(w.run(), RunEnd::Stalled);
    assert_eq!(*seen.borrow(), [(true, true)]);
    assert_eq!(
        steps.get(),
        11,
        "steps at 0, 0.1, ..., 1.0 ms, none after the crash"
    );
    assert!(
        w.add_faults(&[Fault {
            at_ns: w.now_ns(),
            kind: FaultKind::CrashMachine { machine: 2 },
        }])
        .is_err(),
        "node 2 is no machine"
    );

    // Partition machine 0 off, then heal it.
    let mut w = world(8);
    w.add_faults(&parse_fault("partition@1ms:0/2ms").unwrap())
        .unwrap();
    let t1 = thread(&mut w, 1, 1);
    let out = Rc::new(RefCell::new(Vec::new()));
    let o = out.clone();
    w.spawn(t1, move |ctx| async move {
        for at in [500_000u64, 1_500_000, 3_500_000] {
            ctx.sleep_until(at).unwrap().await;
            let across = ctx.faa(GlobalAddr::host(0, 8), 1).await.is_ok();
            let own = ctx.faa(GlobalAddr::host(1, 8), 1).await.is_ok();
            o.borrow_mut().push((across, own));
        }
    })
    .unwrap();
    let t0 = thread(&mut w, 0, 1);
    let o = out.clone();
    w.spawn(t0, move |ctx| async move {
        ctx.sleep_until(1_600_000).unwrap().await;
        let own = ctx.faa(GlobalAddr::host(0, 16), 1).await.is_ok();
        let across = ctx.faa(GlobalAddr::host(1, 16), 1).await.is_ok();
        o.borrow_mut().push((across, own));
    })
    .unwrap();
    assert_eq!(w.run(), RunEnd::Done);
    assert_eq!(
        *out.borrow(),
        [(true, true), (false, true), (false, true), (true, true)],
        "before, during (both sides), after the partition"
    );
}

#[test]
fn machine_faults_parse_and_are_checked() {
    assert_eq!(
        parse_fault("machine-crash@2ms:1").unwrap(),
        [Fault {
            at_ns: 2_000_000,
            kind: FaultKind::CrashMachine { machine: 1 }
        }]
    );
    let p = parse_fault("partition@1us:0+2/5us").unwrap();
    assert_eq!(p.len(), 2);
    assert_eq!(p[0].kind, FaultKind::Partition { side: 0b101 });
    assert_eq!(
        p[1],
        Fault {
            at_ns: 6_000,
            kind: FaultKind::HealPartition { side: 0b101 }
        }
    );
    assert!(parse_fault("partition@1us:64").is_err());
    assert!(parse_fault("partition@1us:a+b").is_err());
    // More machines than nodes, or a crash of a machine that is none.
    assert!(World::new(SimConfig {
        machines: 3,
        memory_nodes: 2,
        compute_nodes: 3,
        ..Default::default()
    })
    .is_err());
    assert!(World::new(SimConfig {
        machines: 1,
        memory_nodes: 2,
        compute_nodes: 2,
        faults: parse_fault("machine-crash@1ms:1").unwrap(),
        ..Default::default()
    })
    .is_err());
}

/// Polls two futures to the end, as a join does: the task's one slot
/// wakes both.
async fn join2<A: std::future::Future, B: std::future::Future>(
    a: A,
    b: B,
) -> (A::Output, B::Output) {
    use std::task::Poll;
    let (mut a, mut b) = (Box::pin(a), Box::pin(b));
    let (mut ra, mut rb) = (None, None);
    std::future::poll_fn(move |cx| {
        if ra.is_none() {
            if let Poll::Ready(v) = a.as_mut().poll(cx) {
                ra = Some(v);
            }
        }
        if rb.is_none() {
            if let Poll::Ready(v) = b.as_mut().poll(cx) {
                rb = Some(v);
            }
        }
        if ra.is_some() && rb.is_some() {
            Poll::Ready((ra.take().unwrap(), rb.take().unwrap()))
        } else {
            Poll::Pending
        }
    })
    .await
}

/// A task that sleeps and waits for a write at once: the sleep's deadline
/// does not outlive it (no spinning, no lost timers afterwards); a second
/// write wait while one is live is refused.
#[test]
fn a_sleep_beside_a_write_wait_leaves_no_deadline_behind() {
    let mut w = world(11);
    let t = thread(&mut w, 0, 1);
    let out = Rc::new(RefCell::new(Vec::new()));
    let o = out.clone();
    w.spawn(t, move |ctx| async move {
        let (_, woke) = join2(ctx.sleep(1_000_000).unwrap(), async {
            let r = ctx.wait_for_write(512, 8, None).unwrap().await;
            o.borrow_mut().push(("written", ctx.now_ns()));
            r
        })
        .await;
        assert_eq!(woke, Woken::Written);
        // The timers still work: a later sleep wakes on time.
        let at = ctx.now_ns() + 2_000_000;
        ctx.sleep_until(at).unwrap().await;
        o.borrow_mut().push(("slept", ctx.now_ns()));
        // One write wait at a time.
        let first = ctx.wait_for_write(512, 8, Some(ctx.now_ns() + 10)).unwrap();
        let second = ctx.wait_for_write(600, 8, None);
        drop(first);
        assert!(second.is_ok(), "the first was never polled, so not live");
        let _live = {
            let mut f = Box::pin(
                ctx.wait_for_write(512, 8, Some(ctx.now_ns() + 1_000))
                    .unwrap(),
            );
            let waker = std::task::Waker::noop();
            let _ =
                std::future::Future::poll(f.as_mut(), &mut std::task::Context::from_waker(waker));
            assert!(matches!(
                ctx.wait_for_write(600, 8, None),
                Err(nicdrv::WaitError::Busy)
            ));
            f.await
        };
    })
    .unwrap();
    let writer = thread(&mut w, 2, 1);
    w.spawn(writer, |ctx| async move {
        ctx.sleep_until(3_000_000).unwrap().await;
        ctx.write(GlobalAddr::host(0, 512), &9u64.to_le_bytes())
            .await
            .unwrap();
    })
    .unwrap();
    let before = w.events();
    assert_eq!(w.run(), RunEnd::Done);
    let events = w.events() - before;
    let out = out.borrow();
    assert_eq!(out.len(), 2);
    assert!(out[0].1 >= 3_000_000 && out[0].1 < 3_010_000, "{out:?}");
    assert!(
        out[1].1 >= out[0].1 + 2_000_000 && out[1].1 < out[0].1 + 2_010_000,
        "{out:?}"
    );
    assert!(
        events < 60,
        "{events} events: a stale deadline made the task spin"
    );
}

/// `submit_first` returns once the first doorbell completed: a small
/// WRITE to node 0 beside a large one to node 1 returns before the large
/// one lands; `settle` waits for the rest and reports its failure; the
/// next batch waits for the background doorbell before it posts.
#[test]
fn submit_first_returns_at_the_first_doorbell_and_settle_reports_the_rest() {
    let mut w = world(3);
    let t = thread(&mut w, 2, 1);
    let seen = Rc::new(RefCell::new(Vec::new()));
    let s = seen.clone();
    w.spawn(t, move |ctx| async move {
        let t0 = ctx.now_ns();
        let mut b = ctx.batch();
        b.write_bytes(GlobalAddr::host(0, 0), &[1u8; 64]);
        b.write_bytes(GlobalAddr::host(1, 0), &[2u8; 32 << 10]);
        b.submit_first().await.unwrap();
        let first = ctx.now_ns() - t0;
        ctx.settle().await.unwrap();
        let all = ctx.now_ns() - t0;
        // The large WRITE is in place once settled.
        let r = ctx
            .read(GlobalAddr::host(1, (32 << 10) - 8), 8)
            .await
            .unwrap();
        assert_eq!(r.u64_at(0), u64::from_le_bytes([2; 8]));
        // A failure in a background doorbell: a WRITE past node 1's memory.
        let mut b = ctx.batch();
        b.write_bytes(GlobalAddr::host(0, 64), &[3u8; 64]);
        b.write_bytes(GlobalAddr::host(1, (1 << 20) - 8), &[4u8; 4096]);
        let first_ok = b.submit_first().await;
        let settled = ctx.settle().await;
        // The next batch posts after the background one, and works.
        let r = ctx.read(GlobalAddr::host(0, 64), 8).await.unwrap();
        assert_eq!(r.u64_at(0), u64::from_le_bytes([3; 8]));
        s.borrow_mut().push((
            first,
            all,
            first_ok.is_ok(),
            settled.map_err(|e| e.is_node_dead()),
        ));
        assert_eq!(ctx.counters().writes, 4);
    })
    .unwrap();
    assert_eq!(w.run(), RunEnd::Done);
    let got = seen.borrow();
    let (first, all, first_ok, settled) = got[0];
    assert!(
        first < all,
        "the first doorbell came back first ({first} vs {all} ns)"
    );
    assert!(first_ok, "the small WRITE's doorbell succeeded");
    assert_eq!(
        settled,
        Err(false),
        "settle reports the failed WRITE (not a dead node)"
    );
}
