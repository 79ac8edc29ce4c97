//! The backend conformance suite: the contract of design.md §2, written once
//! and run against every backend. A backend's test file implements
//! [`Harness`] and expands [`conformance_suite!`](crate::conformance_suite),
//! which makes one `#[test]` per case.
//!
//! Cases check whole outcomes (exact totals, the full set of values atomics
//! returned, memory before and after) rather than spot values, so a backend
//! that reorders, drops or duplicates a request fails them.

use crate::addr::{GlobalAddr, NodeId, Space};
use crate::exec::{Ctx, VerbError, MAX_BATCH};
use crate::nic::{CompletionQueue, HeapMem, Mr, Nic, QpState, QueuePair};
use crate::verbs::{Completion, Opcode, PostError, RKey, Sge, WcStatus, WorkRequest, WrOp};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

/// Makes one task per (thread, task) pair, inside the thread that runs it.
pub type TaskFactory<N> =
    Arc<dyn Fn(Ctx<N>, usize, usize) -> Pin<Box<dyn Future<Output = ()>>> + Send + Sync>;

/// A queue pair, its completion queue and registered local memory, for the
/// cases that speak verbs directly.
pub struct RawRig<N: Nic> {
    pub cq: N::Cq,
    pub qp: N::Qp,
    pub mr: Mr<HeapMem, N::Reg>,
}

/// What a backend provides to be tested.
pub trait Harness {
    type N: Nic;
    /// The memory nodes of the fixture: at least two, each with host memory
    /// of at least 1 MiB and device memory of at least 4 KiB.
    fn memory_nodes(&self) -> Vec<NodeId>;
    fn host_bytes(&self, node: NodeId) -> u64;
    fn dm_bytes(&self, node: NodeId) -> u64;
    /// Runs `threads` executors in parallel (OS threads, or simulated
    /// threads), each with `tasks` tasks made by `f`, to completion.
    fn parallel(&self, threads: usize, tasks: usize, f: TaskFactory<Self::N>);
    /// A raw queue pair to `node` with `local_bytes` of registered memory.
    fn raw(&self, node: NodeId, local_bytes: usize) -> RawRig<Self::N>;
    /// Polls `cq` until `want` completions are gathered into `out` or the
    /// backend's patience runs out; returns how many were gathered.
    fn poll_until(
        &self,
        cq: &mut <Self::N as Nic>::Cq,
        out: &mut Vec<Completion>,
        want: usize,
    ) -> usize {
        let mut buf = [Completion::EMPTY; 16];
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while out.len() < want && std::time::Instant::now() < deadline {
            let n = cq.poll(&mut buf);
            out.extend_from_slice(&buf[..n]);
        }
        out.len()
    }
    /// Gathers whatever else arrives on `cq` within a short while (used to
    /// check that nothing more arrives).
    fn settle(&self, cq: &mut <Self::N as Nic>::Cq, out: &mut Vec<Completion>) {
        let mut buf = [Completion::EMPTY; 16];
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(50);
        while std::time::Instant::now() < deadline {
            let n = cq.poll(&mut buf);
            out.extend_from_slice(&buf[..n]);
        }
    }
    /// Makes `node` fail as a crashed memory node does, and returns once
    /// verbs to it may be expected to fail (bounded by the backend's
    /// detection time).
    fn kill_node(&mut self, node: NodeId);
}

/// Runs one task (on one thread of the harness) and returns what it
/// produced.
pub fn run_task<H: Harness, T, F, Fut>(h: &H, f: F) -> T
where
    T: Send + 'static,
    F: FnOnce(Ctx<H::N>) -> Fut + Send + 'static,
    Fut: Future<Output = T> + 'static,
{
    let f = Mutex::new(Some(f));
    let out: Arc<Mutex<Option<T>>> = Arc::new(Mutex::new(None));
    let o = out.clone();
    h.parallel(
        1,
        1,
        Arc::new(move |ctx, _, _| {
            let f = f.lock().unwrap().take().expect("run_task's task runs once");
            let o = o.clone();
            let fut = f(ctx);
            Box::pin(async move {
                let v = fut.await;
                *o.lock().unwrap() = Some(v);
            })
        }),
    );
    let v = out.lock().unwrap().take();
    v.expect("task finished")
}

fn two_nodes<H: Harness>(h: &H) -> (NodeId, NodeId) {
    let n = h.memory_nodes();
    assert!(
        n.len() >= 2,
        "the conformance fixture needs two memory nodes"
    );
    (n[0], n[1])
}

/// Requests to one queue pair execute in posting order: reads see the
/// writes and atomics posted before them in the same batch.
pub fn ordering_within_qp<H: Harness>(h: &H) {
    let (a, _) = two_nodes(h);
    let x = GlobalAddr::host(a, 4096);
    let (r1, r2, old, r3) = run_task(h, move |ctx| async move {
        let mut b = ctx.batch();
        b.write_u64(x, 1);
        let r1 = b.read_new(x, 8);
        b.write_u64(x, 2);
        let r2 = b.read_new(x, 8);
        let f = b.faa(x, 10);
        let r3 = b.read_new(x, 8);
        let d = b.submit().await.expect("batch succeeds");
        let w = |op| d.word(op);
        (w(r1), w(r2), d.old(f), w(r3))
    });
    assert_eq!(
        (r1, r2, old, r3),
        (1, 2, 2, 12),
        "requests on one QP ran out of posting order"
    );
}

/// A batch over two nodes is two doorbells and one round trip; every
/// request's result comes back; an empty batch costs nothing; an
/// over-full batch is refused whole.
pub fn batch_semantics<H: Harness>(h: &H) {
    let (a, b) = two_nodes(h);
    let counters = run_task(h, move |ctx| async move {
        let before = ctx.counters();
        let mut bt = ctx.batch();
        let mut ids = Vec::new();
        for i in 0..8u64 {
            let node = if i % 2 == 0 { a } else { b };
            ids.push((bt.faa(GlobalAddr::host(node, 8192 + 8 * i), 100 + i), node));
        }
        let d = bt.submit().await.expect("batch succeeds");
        for (op, _) in &ids {
            assert_eq!(d.old(*op), 0, "each word starts at zero");
        }
        let after_one = ctx.counters() - before;
        assert_eq!(after_one.round_trips, 1);
        assert_eq!(after_one.doorbells, 2, "one doorbell per node");
        assert_eq!(after_one.faa, 8);
        // Empty batch: no round trip.
        let e = ctx.batch().submit().await.expect("empty batch is fine");
        assert!(e.is_empty());
        assert_eq!((ctx.counters() - before).round_trips, 1);
        // Over-full batch: refused, nothing executed.
        let mut over = ctx.batch();
        for i in 0..=MAX_BATCH as u64 {
            over.faa(GlobalAddr::host(a, 8192 + 8 * (i % 8)), 1);
        }
        assert_eq!(
            over.submit().await.err(),
            Some(VerbError::BatchFull { max: MAX_BATCH })
        );
        let mut check = ctx.batch();
        let reads: Vec<_> = (0..8u64)
            .map(|i| {
                check.read_new(
                    GlobalAddr::host(if i % 2 == 0 { a } else { b }, 8192 + 8 * i),
                    8,
                )
            })
            .collect();
        let d = check.submit().await.expect("read back");
        for (i, op) in reads.into_iter().enumerate() {
            assert_eq!(
                d.word(op),
                100 + i as u64,
                "word {i} changed by a refused batch"
            );
        }
        ctx.counters() - before
    });
    assert_eq!(counters.round_trips, 2);
}

fn sge<N: Nic>(rig: &RawRig<N>, off: usize, len: u32) -> Sge {
    assert!(off + len as usize <= rig.mr.len());
    // SAFETY: in bounds of the registered region (asserted).
    Sge {
        addr: unsafe { rig.mr.as_ptr().add(off) },
        len,
        lkey: rig.mr.lkey(),
    }
}

fn host_rkey<N: Nic>(rig: &RawRig<N>) -> RKey {
    rig.qp
        .remote_regions()
        .iter()
        .find(|r| r.space == Space::Host)
        .expect("node exposes host memory")
        .rkey
}

/// Only signaled requests complete; one completion retires the unsignaled
/// requests before it, freeing their send-queue slots.
pub fn selective_signaling<H: Harness>(h: &H) {
    let (a, _) = two_nodes(h);
    let mut rig = h.raw(a, 4096);
    let rkey = host_rkey(&rig);
    let mut wrs = Vec::new();
    for i in 0..4u64 {
        wrs.push(WorkRequest {
            wr_id: 100 + i,
            signaled: i == 3,
            op: WrOp::Faa {
                remote: GlobalAddr::host(a, 8 * i + 4096),
                rkey,
                add: 1,
                local: sge(&rig, 8 * i as usize, 8),
            },
        });
    }
    // SAFETY: the SGEs lie in rig.mr, alive and untouched until polled.
    unsafe { rig.qp.post_send(&wrs) }.expect("post accepted");
    let mut out = Vec::new();
    assert_eq!(h.poll_until(&mut rig.cq, &mut out, 1), 1);
    // Nothing more may arrive.
    h.settle(&mut rig.cq, &mut out);
    assert_eq!(out.len(), 1, "an unsignaled request completed");
    assert_eq!(out[0].wr_id, 103);
    assert_eq!(out[0].status, WcStatus::Success);
    assert_eq!(out[0].opcode, Opcode::Faa);
    assert_eq!(
        rig.qp.outstanding(),
        0,
        "the signaled completion retires the unsignaled ones"
    );
    // A full send queue is refused without executing anything.
    let depth = rig.qp.depth() as usize;
    let many: Vec<_> = (0..depth + 1)
        .map(|i| WorkRequest {
            wr_id: i as u64,
            signaled: true,
            op: WrOp::Faa {
                remote: GlobalAddr::host(a, 4096),
                rkey,
                add: 1,
                local: sge(&rig, 0, 8),
            },
        })
        .collect();
    // SAFETY: as above.
    let r = unsafe { rig.qp.post_send(&many) };
    assert!(
        matches!(r, Err(PostError::SendQueueFull { .. })),
        "got {r:?}"
    );
}

/// N threads × K tasks × M FAAs on one word: the total is exact and the
/// old values returned are exactly 0..N·K·M, each once.
pub fn faa_exact_totals<H: Harness>(h: &H, threads: usize, tasks: usize, per_task: u64) {
    let (a, _) = two_nodes(h);
    let word = GlobalAddr::host(a, 16384);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    h.parallel(
        threads,
        tasks,
        Arc::new(move |ctx, _, _| {
            let s = s.clone();
            Box::pin(async move {
                let mut mine = Vec::with_capacity(per_task as usize);
                for _ in 0..per_task {
                    mine.push(ctx.faa(word, 1).await.expect("faa"));
                }
                s.lock().unwrap().extend(mine);
            })
        }),
    );
    let total = threads as u64 * tasks as u64 * per_task;
    let mut olds = std::mem::take(&mut *seen.lock().unwrap());
    olds.sort_unstable();
    assert_eq!(olds.len() as u64, total);
    assert!(
        olds.iter().copied().eq(0..total),
        "FAA returned a duplicate or skipped value"
    );
    let fin = run_task(h, move |ctx| async move {
        ctx.read(word, 8).await.expect("read").u64_at(0)
    });
    assert_eq!(fin, total);
}

/// CAS races: a CAS-increment loop never loses or duplicates an update;
/// and a CAS spin lock released by a WRITE protects a READ-modify-WRITE
/// counter (the release WRITE publishes what came before it).
pub fn cas_races<H: Harness>(h: &H, threads: usize, tasks: usize, per_task: u64) {
    let (a, b) = two_nodes(h);
    let ctr = GlobalAddr::host(a, 24576);
    let lock = GlobalAddr::host(b, 0x8000);
    let data = GlobalAddr::host(a, 0x9000);
    let wins = Arc::new(Mutex::new(Vec::new()));
    let w = wins.clone();
    h.parallel(
        threads,
        tasks,
        Arc::new(move |ctx, th, tk| {
            let w = w.clone();
            Box::pin(async move {
                let me = (th * 1000 + tk + 1) as u64;
                let mut mine = Vec::new();
                let mut cur = 0;
                while (mine.len() as u64) < per_task {
                    let old = ctx.cas(ctr, cur, cur + 1).await.expect("cas");
                    if old == cur {
                        mine.push(old);
                        cur += 1;
                    } else {
                        cur = old;
                    }
                }
                for _ in 0..per_task {
                    while ctx.cas(lock, 0, me).await.expect("lock") != 0 {
                        ctx.yield_now().await;
                    }
                    let v = ctx.read(data, 8).await.expect("read").u64_at(0);
                    let mut bt = ctx.batch();
                    bt.write_u64(data, v + 1);
                    bt.write_u64(lock, 0);
                    bt.submit().await.expect("write and release");
                }
                w.lock().unwrap().extend(mine);
            })
        }),
    );
    let total = threads as u64 * tasks as u64 * per_task;
    let mut olds = std::mem::take(&mut *wins.lock().unwrap());
    olds.sort_unstable();
    assert!(
        olds.iter().copied().eq(0..total),
        "two CASes won with the same old value"
    );
    let (c, d, l) = run_task(h, move |ctx| async move {
        (
            ctx.read(ctr, 8).await.unwrap().u64_at(0),
            ctx.read(data, 8).await.unwrap().u64_at(0),
            ctx.read(lock, 8).await.unwrap().u64_at(0),
        )
    });
    assert_eq!(
        (c, d, l),
        (total, total, 0),
        "lost update under the CAS lock"
    );
}

/// Masked CAS does what it says, or the backend says `Unsupported`.
pub fn masked_cas<H: Harness>(h: &H) {
    let (a, _) = two_nodes(h);
    let x = GlobalAddr::host(a, 0xa000);
    let supported = run_task(h, |ctx| async move { ctx.caps().masked_cas });
    let (r1, r2, fin) = run_task(h, move |ctx| async move {
        ctx.write(x, &0x1122_3344_5566_7788u64.to_le_bytes())
            .await
            .unwrap();
        let mut b = ctx.batch();
        // Compare the low byte (0x88): matches; swap only the high byte.
        let ok = b.masked_cas(x, 0x88, 0xff, 0xaa00_0000_0000_0000, 0xff00_0000_0000_0000);
        let r1 = b.submit().await.map(|d| d.old(ok));
        let mut b = ctx.batch();
        let bad = b.masked_cas(x, 0x77, 0xff, 0, u64::MAX);
        let r2 = b.submit().await.map(|d| d.old(bad));
        (r1, r2, ctx.read(x, 8).await.unwrap().u64_at(0))
    });
    if supported {
        assert_eq!(r1, Ok(0x1122_3344_5566_7788));
        assert_eq!(r2, Ok(0xaa22_3344_5566_7788));
        assert_eq!(
            fin, 0xaa22_3344_5566_7788,
            "a failed masked CAS changed memory"
        );
    } else {
        let unsupported = |r: Result<u64, VerbError>| {
            matches!(
                r,
                Err(VerbError::Post {
                    error: PostError::Unsupported(Opcode::MaskedCas),
                    ..
                })
            )
        };
        assert!(unsupported(r1) && unsupported(r2));
        assert_eq!(fin, 0x1122_3344_5566_7788);
    }
}

/// A wrong rkey, an out-of-bounds range (host and device memory) and a
/// misaligned atomic each complete with the responder's error and change
/// nothing; the queue pair recovers and the next request succeeds.
pub fn remote_errors<H: Harness>(h: &H) {
    let (a, _) = two_nodes(h);
    let host = h.host_bytes(a);
    let dm = h.dm_bytes(a);
    let x = GlobalAddr::host(a, 0xb000);
    run_task(h, move |ctx| async move {
        ctx.write(x, &7u64.to_le_bytes()).await.unwrap();
        // Wrong key.
        let mut b = ctx.batch();
        let w = b.write_u64(x, 99);
        b.set_rkey(w, RKey(0xdead_beef));
        let e = b.submit().await.err().expect("wrong key fails");
        assert_eq!(e.status(), Some(WcStatus::RemoteAccess), "{e}");
        // Out of bounds, host and device.
        let e = ctx
            .read(GlobalAddr::host(a, host - 8), 16)
            .await
            .expect_err("oob fails");
        assert_eq!(e.status(), Some(WcStatus::RemoteAccess), "{e}");
        let e = ctx
            .faa(GlobalAddr::device(a, dm), 1)
            .await
            .expect_err("dm oob fails");
        assert_eq!(e.status(), Some(WcStatus::RemoteAccess), "{e}");
        // Misaligned atomic.
        let e = ctx.cas(x.add(4), 0, 1).await.expect_err("misaligned fails");
        assert_eq!(e.status(), Some(WcStatus::RemoteInvalidRequest), "{e}");
        // Nothing changed, and the queue pair works again.
        assert_eq!(ctx.read(x, 8).await.unwrap().u64_at(0), 7);
        // Device memory works in bounds.
        assert_eq!(ctx.faa(GlobalAddr::device(a, dm - 8), 5).await.unwrap(), 0);
        assert_eq!(ctx.faa(GlobalAddr::device(a, dm - 8), 0).await.unwrap(), 5);
        let c = ctx.counters();
        assert_eq!(c.errors, 4, "each failing request counted once");
    });
}

/// The first failure in a doorbell completes with its status, later
/// requests are flushed and do not execute, earlier ones did; a queue pair
/// in error refuses posts until recovered.
pub fn flush_on_error<H: Harness>(h: &H) {
    let (a, _) = two_nodes(h);
    let mut rig = h.raw(a, 4096);
    let rkey = host_rkey(&rig);
    let base = 0xc000u64;
    // Local words 0..3 hold the payloads 11, 22, 33.
    for (i, v) in [11u64, 22, 33].iter().enumerate() {
        // SAFETY: the rig's memory is ours while nothing is posted.
        unsafe { (rig.mr.as_ptr() as *mut u64).add(i).write_unaligned(*v) };
    }
    let write = |i: u64, key: RKey, signaled: bool, rig: &RawRig<H::N>| WorkRequest {
        wr_id: i,
        signaled,
        op: WrOp::Write {
            remote: GlobalAddr::host(a, base + 8 * i),
            rkey: key,
            local: sge(rig, 8 * i as usize, 8),
            inline: false,
        },
    };
    let wrs = [
        write(0, rkey, false, &rig),
        write(1, RKey(rkey.0 ^ 0x5555), false, &rig),
        write(2, rkey, true, &rig),
    ];
    // SAFETY: SGEs in rig.mr, which outlives the completions.
    unsafe { rig.qp.post_send(&wrs) }.expect("post accepted");
    let mut out = Vec::new();
    assert_eq!(h.poll_until(&mut rig.cq, &mut out, 2), 2);
    assert_eq!((out[0].wr_id, out[0].status), (1, WcStatus::RemoteAccess));
    assert_eq!((out[1].wr_id, out[1].status), (2, WcStatus::Flushed));
    assert_eq!(rig.qp.state(), QpState::Error);
    // SAFETY: as above.
    let again = unsafe { rig.qp.post_send(&wrs[..1]) };
    assert_eq!(again, Err(PostError::QpInError));
    rig.qp
        .recover()
        .expect("recovers once all completions are polled");
    let read = WorkRequest {
        wr_id: 9,
        signaled: true,
        op: WrOp::Read {
            remote: GlobalAddr::host(a, base),
            rkey,
            local: sge(&rig, 64, 24),
        },
    };
    // SAFETY: as above.
    unsafe { rig.qp.post_send(&[read]) }.expect("post after recovery");
    out.clear();
    assert_eq!(h.poll_until(&mut rig.cq, &mut out, 1), 1);
    assert_eq!(out[0].status, WcStatus::Success);
    let mut got = [0u64; 3];
    for (i, g) in got.iter_mut().enumerate() {
        // SAFETY: the READ completed; the words are ours again.
        *g = unsafe {
            (rig.mr.as_ptr().add(64) as *const u64)
                .add(i)
                .read_unaligned()
        };
    }
    assert_eq!(
        got,
        [11, 0, 0],
        "the request before the failure ran; those after did not"
    );
}

/// Refusals at post time: zero length, oversized, inline too long, atomics
/// with a wrong local size, an address on another node.
pub fn post_refusals<H: Harness>(h: &H) {
    let (a, b) = two_nodes(h);
    let mut rig = h.raw(a, 4096);
    let rkey = host_rkey(&rig);
    let remote = GlobalAddr::host(a, 0xd000);
    type Expect = fn(&PostError) -> bool;
    let cases: Vec<(WrOp, Expect)> = vec![
        (
            WrOp::Read {
                remote,
                rkey,
                local: sge(&rig, 0, 0),
            },
            |e| *e == PostError::ZeroLength,
        ),
        (
            WrOp::Read {
                remote,
                rkey,
                local: Sge {
                    len: u32::MAX,
                    ..sge(&rig, 0, 8)
                },
            },
            |e| matches!(e, PostError::MessageTooLong { .. }),
        ),
        (
            WrOp::Write {
                remote,
                rkey,
                local: sge(&rig, 0, 4096),
                inline: true,
            },
            |e| matches!(e, PostError::InlineTooLong { .. }),
        ),
        (
            WrOp::Cas {
                remote,
                rkey,
                compare: 0,
                swap: 1,
                local: sge(&rig, 0, 4),
            },
            |e| matches!(e, PostError::AtomicLocalLength { len: 4 }),
        ),
        (
            WrOp::Faa {
                remote: GlobalAddr::host(b, 0xd000),
                rkey,
                add: 1,
                local: sge(&rig, 0, 8),
            },
            |e| matches!(e, PostError::WrongNode { .. }),
        ),
    ];
    for (op, ok) in cases {
        let wr = WorkRequest {
            wr_id: 1,
            signaled: true,
            op,
        };
        // SAFETY: refused before touching memory; SGEs are in rig.mr anyway
        // except the oversized one, which is refused by length.
        let r = unsafe { rig.qp.post_send(&[wr]) };
        match r {
            Err(e) if ok(&e) => {}
            other => panic!("{op:?}: expected a refusal, got {other:?}"),
        }
        assert_eq!(
            rig.qp.state(),
            QpState::Ready,
            "a refused post must not break the QP"
        );
    }
    // SAFETY: an empty batch touches nothing.
    assert_eq!(unsafe { rig.qp.post_send(&[]) }, Err(PostError::EmptyBatch));
    // Through the executor the same refusals are errors, not panics.
    run_task(h, move |ctx| async move {
        let e = ctx
            .read(remote, 0)
            .await
            .expect_err("zero-length read refused");
        assert!(
            matches!(
                e,
                VerbError::Post {
                    error: PostError::ZeroLength,
                    ..
                }
            ),
            "{e}"
        );
        let e = ctx
            .read(GlobalAddr::host(999, 0), 8)
            .await
            .expect_err("unknown node refused");
        assert_eq!(e, VerbError::NoRoute { node: 999 });
        let e = ctx.alloc(usize::MAX / 2).expect_err("huge scratch refused");
        assert!(matches!(e, VerbError::Scratch { .. }));
    });
}

/// A READ racing WRITEs can observe a torn mix of two patterns (upper layers
/// must never assume otherwise), while no aligned 8-byte word is ever torn.
pub fn torn_reads_observable<H: Harness>(h: &H, block: usize, max_reads: u64) {
    let (a, _) = two_nodes(h);
    let at = GlobalAddr::host(a, 0x40000);
    let stats = Arc::new(Mutex::new((0u64, 0u64))); // (reads, torn)
    let s = stats.clone();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    h.parallel(
        2,
        1,
        Arc::new(move |ctx, th, _| {
            let s = s.clone();
            let stop = stop.clone();
            Box::pin(async move {
                use std::sync::atomic::Ordering::Relaxed;
                if th == 0 {
                    let a_pat = vec![0xAAu8; block];
                    let b_pat = vec![0x55u8; block];
                    let mut i = 0u64;
                    while !stop.load(Relaxed) {
                        let pat = if i.is_multiple_of(2) { &a_pat } else { &b_pat };
                        ctx.write(at, pat).await.expect("write");
                        i += 1;
                    }
                } else {
                    let (mut reads, mut torn) = (0, 0);
                    while reads < max_reads && torn == 0 {
                        let buf = ctx.read(at, block).await.expect("read");
                        let bytes = buf.as_slice();
                        for w in bytes.chunks_exact(8) {
                            assert!(
                                w.iter().all(|&x| x == w[0]),
                                "an aligned 8-byte word was torn"
                            );
                        }
                        let first = bytes[0];
                        if bytes.iter().any(|&x| x != first) {
                            torn += 1;
                        }
                        reads += 1;
                    }
                    *s.lock().unwrap() = (reads, torn);
                    stop.store(true, Relaxed);
                }
            })
        }),
    );
    let (reads, torn) = *stats.lock().unwrap();
    assert!(
        torn > 0,
        "no torn READ observed in {reads} reads of {block} bytes racing WRITEs"
    );
}

/// Verbs to a dead node fail with a node-dead error instead of touching
/// stale memory; the other node keeps working.
pub fn dead_node<H: Harness>(h: &mut H) {
    let (a, b) = two_nodes(h);
    let x = GlobalAddr::host(a, 0xe000);
    let y = GlobalAddr::host(b, 0xe000);
    run_task(h, move |ctx| async move {
        ctx.faa(x, 1).await.expect("alive at first");
    });
    h.kill_node(a);
    run_task(h, move |ctx| async move {
        let e = ctx.faa(x, 1).await.expect_err("verbs to a dead node fail");
        assert!(e.is_node_dead(), "expected a node-dead error, got {e}");
        let e = ctx.read(x, 64).await.expect_err("and keep failing");
        assert!(e.is_node_dead(), "expected a node-dead error, got {e}");
        assert_eq!(ctx.faa(y, 1).await.expect("the other node works"), 0);
    });
}

/// Expands one `#[test]` per conformance case for a harness constructor.
/// `$make` is an expression evaluated afresh by each test.
#[macro_export]
macro_rules! conformance_suite {
    ($make:expr) => {
        #[test]
        fn conformance_ordering_within_qp() {
            $crate::conformance::ordering_within_qp(&$make);
        }
        #[test]
        fn conformance_batch_semantics() {
            $crate::conformance::batch_semantics(&$make);
        }
        #[test]
        fn conformance_selective_signaling() {
            $crate::conformance::selective_signaling(&$make);
        }
        #[test]
        fn conformance_faa_exact_totals() {
            $crate::conformance::faa_exact_totals(&$make, 2, 4, 2000);
        }
        #[test]
        fn conformance_cas_races() {
            $crate::conformance::cas_races(&$make, 2, 3, 300);
        }
        #[test]
        fn conformance_masked_cas() {
            $crate::conformance::masked_cas(&$make);
        }
        #[test]
        fn conformance_remote_errors() {
            $crate::conformance::remote_errors(&$make);
        }
        #[test]
        fn conformance_flush_on_error() {
            $crate::conformance::flush_on_error(&$make);
        }
        #[test]
        fn conformance_post_refusals() {
            $crate::conformance::post_refusals(&$make);
        }
        #[test]
        fn conformance_torn_reads_observable() {
            $crate::conformance::torn_reads_observable(&$make, 64 * 1024, 200_000);
        }
        #[test]
        fn conformance_dead_node() {
            $crate::conformance::dead_node(&mut $make);
        }
    };
}
