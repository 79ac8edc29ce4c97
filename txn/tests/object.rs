//! Lock-free object reads under concurrent updates, on the simulator
//! (lines land in random order) over seeds: every value a reader accepts
//! is exactly one version's, versions never go back for a reader, and the
//! torn and locked copies it refused were really there.

use nicdrv::sim::{for_each_seed, RunEnd, SimConfig, World};
use nicdrv::{ExecutorConfig, GlobalAddr};
use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use txn::object::{self, decode, encode, object_bytes, Header, Inconsistent};

/// Version `v`'s payload: every byte names the version and its place.
fn value(v: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (v as u8).wrapping_mul(31) ^ (i as u8))
        .collect()
}

#[test]
fn lock_free_reads_accept_whole_versions_only() {
    let (torn, locked) = (Rc::new(Cell::new(0u64)), Rc::new(Cell::new(0u64)));
    for_each_seed("lock_free_reads_accept_whole_versions_only", 20, |seed| {
        let mut w = World::new(SimConfig {
            seed,
            memory_nodes: 1,
            compute_nodes: 2,
            host_bytes: 1 << 20,
            ..Default::default()
        })
        .unwrap();
        let len = 400; // 8 lines
        let at = GlobalAddr::host(0, 8192);
        let cfg = ExecutorConfig {
            slots: 1,
            ..Default::default()
        };
        let writer = w.add_thread(0, cfg).unwrap();
        w.spawn(writer, move |ctx| async move {
            let mut h = Header::new(1, 3);
            let mut buf = vec![0u8; object_bytes(len)];
            encode(h, &value(1, len), &mut buf).unwrap();
            ctx.write(at, &buf).await.unwrap();
            for v in 2..300u64 {
                let next = Header::new(v, 3);
                encode(next, &value(v, len), &mut buf).unwrap();
                if v % 3 == 0 {
                    // As a commit installs it: lock, the lines, then the
                    // header unlocked at the new version.
                    let old = ctx.cas(at, h.0, h.with_lock().0).await.unwrap();
                    assert_eq!(old, h.0, "only this writer writes");
                    ctx.write(at.add(64), &buf[64..]).await.unwrap();
                    ctx.write(at, &buf[..64]).await.unwrap();
                } else {
                    // One whole-object WRITE, lines landing in any order.
                    ctx.write(at, &buf).await.unwrap();
                }
                h = next;
            }
        })
        .unwrap();
        let reader = w.add_thread(1, cfg).unwrap();
        let (t, l) = (torn.clone(), locked.clone());
        w.spawn(reader, move |ctx| async move {
            let mut last = 0;
            let mut out = vec![0u8; len];
            for _ in 0..3000 {
                let copy = ctx.read(at, object_bytes(len)).await.unwrap();
                match decode(copy.as_slice(), &mut out).unwrap() {
                    Ok(h) if h.0 == 0 => {
                        // The initial state: memory not yet written.
                        assert!(
                            out.iter().all(|&b| b == 0),
                            "seed {seed}: version 0 not zero"
                        );
                        assert_eq!(last, 0, "seed {seed}: back to the initial state");
                    }
                    Ok(h) => {
                        assert_eq!(out, value(h.version(), len), "seed {seed}: a mixed value");
                        assert_eq!(h.incarnation(), 3);
                        assert!(h.version() >= last, "seed {seed}: a version went back");
                        last = h.version();
                    }
                    Err(Inconsistent::Torn { .. }) => t.set(t.get() + 1),
                    Err(Inconsistent::Locked) => l.set(l.get() + 1),
                }
            }
            // The retrying read gets a value in the end.
            let r = object::read(&ctx, at, len, 100).await.unwrap();
            assert_eq!(r.payload, value(r.header.version(), len));
        })
        .unwrap();
        assert_eq!(w.run(), RunEnd::Done);
    });
    assert!(
        torn.get() > 0,
        "no torn copy was ever read: the check went untested"
    );
    assert!(locked.get() > 0, "no locked copy was ever read");
}

/// On emu, the primary's own CPU installs versions through the local view
/// as COMMIT-PRIMARY does (lock by CAS, every line but the first, then the
/// first unlocking) while another machine READs the object: every copy
/// the reader accepts is exactly one version, never a mix of the lines
/// the CPU was writing.
#[test]
fn emu_reads_never_accept_a_half_installed_object() {
    let cluster = cluster::EmuCluster::boot(&cluster::emu::EmuClusterConfig {
        memory_nodes: 2,
        host_bytes: 1 << 20,
        dm_bytes: 4096,
        emu: Default::default(),
    })
    .unwrap()
    .with_machines(2)
    .unwrap();
    let len = 400; // 8 lines
    let off = 8192;
    let cfg = ExecutorConfig {
        slots: 1,
        ..Default::default()
    };
    let stop = Arc::new(AtomicBool::new(false));
    let accepted = Arc::new(AtomicU64::new(0));
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut ex = cluster.machine_executor(0, cfg).unwrap();
            let (stop, accepted) = (stop.clone(), accepted.clone());
            ex.spawn(|ctx| async move {
                // Stops the reader however this task ends (a panic too).
                struct Stop(Arc<AtomicBool>);
                impl Drop for Stop {
                    fn drop(&mut self) {
                        // Release: pairs with the reader's Acquire; only a flag.
                        self.0.store(true, Ordering::Release);
                    }
                }
                let _stop = Stop(stop);
                let l = ctx.local();
                let mut h = Header(0); // zeroed memory
                let mut buf = vec![0u8; object_bytes(len)];
                // Until the reader has taken many copies (it may start
                // late), at least 20 000 versions.
                let mut v = 0u64;
                // Relaxed: a count that only paces the writer, ordering
                // nothing.
                while v < 20_000 || (accepted.load(Ordering::Relaxed) < 1000 && v < 50_000_000) {
                    v += 1;
                    let next = Header::new(v, 3);
                    encode(next, &value(v, len), &mut buf).unwrap();
                    assert_eq!(l.cas(off, h.0, h.with_lock().0).unwrap(), h.0);
                    l.write(off + 64, &buf[64..]).unwrap();
                    l.write(off, &buf[..64]).unwrap();
                    h = next;
                    if v.is_multiple_of(64) {
                        ctx.yield_now().await;
                    }
                }
            })
            .unwrap();
            ex.run();
        });
        s.spawn(|| {
            let mut ex = cluster.machine_executor(1, cfg).unwrap();
            let (stop, accepted) = (stop.clone(), accepted.clone());
            ex.spawn(|ctx| async move {
                let at = GlobalAddr::host(0, off);
                let mut out = vec![0u8; len];
                // Acquire: pairs with the writer's Release; only a flag.
                while !stop.load(Ordering::Acquire) {
                    let copy = ctx.read(at, object_bytes(len)).await.unwrap();
                    if let Ok(h) = decode(copy.as_slice(), &mut out).unwrap() {
                        if h.0 != 0 {
                            assert_eq!(out, value(h.version(), len), "a mixed value");
                            // Relaxed: a count, ordering nothing.
                            accepted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
            .unwrap();
            ex.run();
        });
    });
    assert!(
        accepted.load(Ordering::Relaxed) > 0,
        "the reader never accepted a copy"
    );
}
