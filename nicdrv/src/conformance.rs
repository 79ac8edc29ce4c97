//! The backend conformance suite: the NIC contract (`nic.rs`, `verbs.rs`), written once
//! and run against every backend. A backend's test file implements
//! [`Harness`] and expands [`conformance_suite!`](crate::conformance_suite),
//! which makes one `#[test]` per case.
//!
//! Cases check whole outcomes (exact totals, the full set of values atomics
//! returned, memory before and after) rather than spot values, so a backend
//! that reorders, drops or duplicates a request fails them.

use crate::addr::{GlobalAddr, NodeId, Space};
use crate::exec::{Ctx, Executor, VerbError, MAX_BATCH};
use crate::nic::{CompletionQueue, HeapMem, Mr, Nic, QpState, QueuePair};
use crate::verbs::{Completion, Opcode, PostError, RKey, Sge, WcStatus, WorkRequest, WrOp};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

mod machines;
pub use machines::{local_view_matches_remote_verbs, timers, wait_for_write};

/// Makes one task per (thread, task) pair, inside the thread that runs it.
pub type TaskFactory<N> =
    Arc<dyn Fn(Ctx<N>, usize, usize) -> Pin<Box<dyn Future<Output = ()>>> + Send + Sync>;

/// Starts `tasks` tasks made by `f` for thread `th` on `ex` and runs them
/// to the end: one [`Harness::parallel`] thread on a backend whose threads
/// are OS threads.
pub fn run_factory<N: Nic>(ex: &mut Executor<N>, th: usize, tasks: usize, f: &TaskFactory<N>) {
    for tk in 0..tasks {
        let f = f.clone();
        ex.spawn(move |ctx| f(ctx, th, tk))
            .expect("parallel: one slot per task");
    }
    ex.run();
}

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
    /// As [`Harness::parallel`], one thread per entry of `machines`: thread
    /// `i` on the machine that owns memory node `machines[i]` (its local
    /// view is that node's host memory), or on a compute-only node (`None`).
    fn parallel_on(&self, machines: &[Option<NodeId>], tasks: usize, f: TaskFactory<Self::N>);
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
    run_task_in_company(h, false, f)
}

/// [`run_task`], with `company`: a second task on the same thread that
/// only yields until the first is done. A task alone may see a batch
/// complete at its post ([`Nic::completes_at_post`]); one with company
/// returns to its executor after every post, so a case that holds a
/// batch in flight finds it in flight on every backend.
fn run_task_in_company<H: Harness, T, F, Fut>(h: &H, company: bool, f: F) -> T
where
    T: Send + 'static,
    F: FnOnce(Ctx<H::N>) -> Fut + Send + 'static,
    Fut: Future<Output = T> + 'static,
{
    let f = Mutex::new(Some(f));
    let out: Arc<Mutex<Option<T>>> = Arc::new(Mutex::new(None));
    let (o, d) = (out.clone(), Arc::new(AtomicBool::new(false)));
    h.parallel(
        1,
        1 + company as usize,
        Arc::new(move |ctx, _, task| {
            // Relaxed: both tasks run on this one executor thread.
            let d = d.clone();
            if task == 1 {
                return Box::pin(async move {
                    while !d.load(Relaxed) {
                        ctx.yield_now().await;
                    }
                });
            }
            let f = f.lock().unwrap().take().expect("run_task's task runs once");
            let o = o.clone();
            let fut = f(ctx);
            Box::pin(async move {
                let v = fut.await;
                *o.lock().unwrap() = Some(v);
                d.store(true, Relaxed);
            })
        }),
    );
    let v = out.lock().unwrap().take();
    v.expect("task finished")
}

pub(crate) fn two_nodes<H: Harness>(h: &H) -> (NodeId, NodeId) {
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

/// A batch's life outside the happy path: a batch superseded by a newer
/// one, or refused because another of the task's batches is in flight,
/// reports it at submit and posts nothing; a batch dropped unsubmitted,
/// or whose submit future is dropped unpolled, gives its scratch back; a
/// submit future dropped after posting leaves its buffers to the NIC
/// until the next batch, which waits for them; `submit_first` returns at
/// the first doorbell and `settle` at the last.
pub fn batch_lifecycle<H: Harness>(h: &H) {
    let (a, b) = two_nodes(h);
    let word = |node, i: u64| GlobalAddr::host(node, 8192 + 8 * i);
    run_task_in_company(h, true, move |ctx| async move {
        let base = ctx.scratch_used();
        let before = ctx.counters();
        // Superseded: the older batch's FAA never runs.
        let mut old = ctx.batch();
        old.faa(word(a, 0), 1);
        let mut new = ctx.batch();
        new.faa(word(a, 1), 1);
        assert_eq!(old.submit().await.err(), Some(VerbError::BatchSuperseded));
        new.submit().await.expect("the newer batch runs");
        // Dropped unsubmitted, and submitted but dropped unpolled: their
        // buffers come back and nothing is posted.
        let mut dropped = ctx.batch();
        dropped.read_new(word(a, 0), 4096);
        assert!(ctx.scratch_used() >= base + 4096);
        drop(dropped);
        assert_eq!(ctx.scratch_used(), base, "a dropped batch freed its buffer");
        let mut unpolled = ctx.batch();
        unpolled.read_new(word(a, 0), 4096);
        drop(unpolled.submit());
        assert_eq!(
            ctx.scratch_used(),
            base,
            "a dropped submit freed its buffer"
        );
        assert_eq!((ctx.counters() - before).round_trips, 1);
        // In flight: a second batch of the same task is refused.
        let mut first = ctx.batch();
        first.faa(word(b, 2), 5);
        let mut fut = std::pin::pin!(first.submit());
        let mut polled = false;
        std::future::poll_fn(|cx| {
            if !polled {
                polled = true;
                // Posted now (the completion comes at a later turn).
                if fut.as_mut().poll(cx).is_ready() {
                    return std::task::Poll::Ready(());
                }
                let mut second = ctx.batch();
                second.faa(word(b, 3), 1);
                assert_refused(second.submit(), cx, "batch");
            }
            fut.as_mut().poll(cx).map(|r| {
                r.expect("the first batch runs");
            })
        })
        .await;
        // Dropped after posting: the next batch waits for the NIC, then
        // sees the dropped batch's FAA done.
        let mut posted = ctx.batch();
        posted.faa(word(b, 4), 7);
        let mut fut = Box::pin(posted.submit());
        std::future::poll_fn(|cx| {
            let _ = fut.as_mut().poll(cx);
            std::task::Poll::Ready(())
        })
        .await;
        drop(fut);
        let mut check = ctx.batch();
        let ops: Vec<_> = (0..5).map(|i| check.read_new(word(b, i), 8)).collect();
        let d = check.submit().await.expect("read back");
        let got: Vec<u64> = ops.into_iter().map(|op| d.word(op)).collect();
        assert_eq!(got, vec![0, 0, 5, 0, 7], "only the posted FAAs ran");
        drop(d);
        // submit_first on two nodes, then settle.
        let mut bt = ctx.batch();
        bt.write_u64(word(a, 5), 11);
        bt.write_u64(word(b, 5), 12);
        bt.submit_first()
            .await
            .expect("the first doorbell succeeds");
        ctx.settle().await.expect("and the other");
        let mut check = ctx.batch();
        let x = check.read_new(word(a, 5), 8);
        let y = check.read_new(word(b, 5), 8);
        let d = check.submit().await.expect("read back");
        assert_eq!((d.word(x), d.word(y)), (11, 12));
        drop(d);
        assert_eq!(ctx.scratch_used(), base, "every buffer came back");
    });
}

/// Polls `f` once: it must be refused at once (`BatchInProgress`), another
/// batch of the task being in flight.
fn assert_refused<T>(
    f: impl Future<Output = Result<T, VerbError>>,
    cx: &mut std::task::Context<'_>,
    what: &str,
) {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(cx) {
        std::task::Poll::Ready(r) => {
            assert_eq!(r.err(), Some(VerbError::BatchInProgress), "a {what}")
        }
        std::task::Poll::Pending => panic!("a refused {what} waits for nothing"),
    }
}

/// [`Ctx::read_into`] is a batch of one READ: the same bytes, counters and
/// errors. It starts a batch as `Ctx::batch` does: it supersedes one being
/// built, is refused while one is in flight and refuses others while it
/// is; dropped in flight, the next batch waits for it, and its buffer
/// comes back.
pub fn read_into<H: Harness>(h: &H) {
    let (a, b) = two_nodes(h);
    let x = GlobalAddr::host(a, 0xc000);
    let word = move |i: u64| GlobalAddr::host(b, 0xc000 + 8 * i);
    let host = h.host_bytes(a);
    run_task_in_company(h, true, move |ctx| async move {
        let base = ctx.scratch_used();
        let data: Vec<u8> = (0..256u32).map(|i| (i * 7 + 3) as u8).collect();
        ctx.write(x, &data).await.unwrap();
        let before = ctx.counters();
        let buf = ctx.read_into(x, ctx.alloc(256).unwrap()).await.unwrap();
        assert_eq!(buf.as_slice(), &data[..]);
        let alone = ctx.counters() - before;
        let before = ctx.counters();
        let mut bt = ctx.batch();
        let op = bt.read(x, buf);
        let buf = bt.submit().await.unwrap().take_buf(op);
        assert_eq!(alone, ctx.counters() - before, "counted as a batch of one");
        drop(buf);
        // The responder's error, as a READ's; then it works again.
        let e = ctx
            .read_into(GlobalAddr::host(a, host - 8), ctx.alloc(16).unwrap())
            .await
            .expect_err("out of bounds");
        assert_eq!(e.status(), Some(WcStatus::RemoteAccess), "{e}");
        assert!(
            matches!(e, VerbError::Failed { node, op: 0, opcode: Opcode::Read, .. } if node == a),
            "{e:?}"
        );
        let buf = ctx.read_into(x, ctx.alloc(8).unwrap()).await.unwrap();
        assert_eq!(buf.as_slice(), &data[..8]);
        // A batch being built is superseded; its FAA never runs.
        let mut old = ctx.batch();
        old.faa(word(0), 1);
        let buf = ctx.read_into(x, buf).await.unwrap();
        assert_eq!(old.submit().await.err(), Some(VerbError::BatchSuperseded));
        drop(buf);
        // Refused while a batch is in flight.
        let mut first = ctx.batch();
        first.faa(word(1), 5);
        let mut fut = std::pin::pin!(first.submit());
        let mut polled = false;
        std::future::poll_fn(|cx| {
            if !polled {
                polled = true;
                assert!(fut.as_mut().poll(cx).is_pending(), "posted, not done");
                assert_refused(ctx.read_into(x, ctx.alloc(8).unwrap()), cx, "READ");
                // Refused as such even with no scratch left for its buffer.
                let free = match ctx.alloc(usize::MAX >> 1) {
                    Err(VerbError::Scratch { free, .. }) => free,
                    other => panic!("{other:?}"),
                };
                let hog = ctx.alloc(free).expect("the rest of the scratch");
                assert_refused(ctx.read(x, 8), cx, "READ with a buffer to find");
                drop(hog);
            }
            fut.as_mut().poll(cx).map(|r| {
                r.expect("the batch runs");
            })
        })
        .await;
        // In flight, it refuses a batch; dropped, the next batch waits for
        // it and runs.
        let mut r = Box::pin(ctx.read_into(x, ctx.alloc(64).unwrap()));
        std::future::poll_fn(|cx| {
            assert!(r.as_mut().poll(cx).is_pending(), "posted, not done");
            let mut second = ctx.batch();
            second.faa(word(2), 1);
            assert_refused(second.submit(), cx, "batch");
            std::task::Poll::Ready(())
        })
        .await;
        drop(r);
        let mut after = ctx.batch();
        after.faa(word(3), 9);
        after
            .submit()
            .await
            .expect("the batch after a dropped READ");
        let mut check = ctx.batch();
        let ops: Vec<_> = (0..4).map(|i| check.read_new(word(i), 8)).collect();
        let d = check.submit().await.expect("read back");
        let got: Vec<u64> = ops.into_iter().map(|op| d.word(op)).collect();
        assert_eq!(got, vec![0, 5, 0, 9], "only the posted FAAs ran");
        drop(d);
        // Refused for want of a route, it still supersedes a batch being
        // built, as `Ctx::batch` does.
        let mut old = ctx.batch();
        old.faa(word(4), 1);
        let e = ctx
            .read_into(GlobalAddr::host(999, 0), ctx.alloc(8).unwrap())
            .await
            .expect_err("no queue pair to node 999");
        assert_eq!(e, VerbError::NoRoute { node: 999 });
        assert_eq!(old.submit().await.err(), Some(VerbError::BatchSuperseded));
        // Behind a batch dropped in flight it waits for that doorbell,
        // then reads what the batch did.
        let mut bt = ctx.batch();
        bt.faa(word(5), 3);
        let mut sub = Box::pin(bt.submit());
        std::future::poll_fn(|cx| {
            assert!(sub.as_mut().poll(cx).is_pending(), "posted, not done");
            std::task::Poll::Ready(())
        })
        .await;
        drop(sub);
        let mut r = Box::pin(ctx.read_into(word(5), ctx.alloc(8).unwrap()));
        std::future::poll_fn(|cx| {
            let waits = r.as_mut().poll(cx).is_pending();
            assert!(waits, "waits for the dropped batch's doorbell");
            std::task::Poll::Ready(())
        })
        .await;
        assert_eq!(r.await.unwrap().u64_at(0), 3);
        // Behind `submit_first`'s doorbells still in flight, likewise.
        let mut bt = ctx.batch();
        bt.faa(GlobalAddr::host(a, 0xd000), 1);
        bt.faa(word(6), 4);
        bt.submit_first().await.expect("the first doorbell");
        let buf = ctx.read_into(word(6), ctx.alloc(8).unwrap()).await;
        assert_eq!(buf.unwrap().u64_at(0), 4);
        // Dropped in flight and failing, it is reported by `settle` as the
        // READ it was, whatever the slot's previous batch held.
        ctx.faa(word(7), 1).await.unwrap();
        let bad = GlobalAddr::host(a, host - 8);
        let mut r = Box::pin(ctx.read_into(bad, ctx.alloc(16).unwrap()));
        std::future::poll_fn(|cx| {
            assert!(r.as_mut().poll(cx).is_pending(), "posted, not done");
            std::task::Poll::Ready(())
        })
        .await;
        drop(r);
        let e = ctx.settle().await.expect_err("the dropped READ failed");
        assert!(
            matches!(
                e,
                VerbError::Failed {
                    op: 0,
                    opcode: Opcode::Read,
                    status: WcStatus::RemoteAccess,
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(ctx.scratch_used(), base, "every buffer came back");
    });
}

/// A task's verbs take only buffers it allocated: another task's
/// buffers, handed over on the same executor, are refused by a lone READ
/// and by a batch, and nothing is posted. (Posted and then dropped in
/// flight, such a buffer would go back to its owner's arena, which knows
/// nothing of the READ, and be handed out while the NIC may still write
/// it.)
pub fn foreign_buffers<H: Harness>(h: &H) {
    let (a, _) = two_nodes(h);
    let x = GlobalAddr::host(a, 0xe000);
    thread_local! {
        static HANDED: std::cell::RefCell<Vec<crate::exec::Buf>> =
            const { std::cell::RefCell::new(Vec::new()) };
    }
    let seen: Arc<Mutex<Vec<Option<VerbError>>>> = Arc::new(Mutex::new(Vec::new()));
    let done = Arc::new(AtomicBool::new(false));
    let (s, d) = (seen.clone(), done.clone());
    h.parallel(
        1,
        2,
        Arc::new(move |ctx, _, task| {
            let (s, d) = (s.clone(), d.clone());
            Box::pin(async move {
                if task == 0 {
                    // The owner: two buffers handed over; once the other
                    // task is done with them, all its scratch is back.
                    let base = ctx.scratch_used();
                    let bufs = [ctx.alloc(8).unwrap(), ctx.alloc(8).unwrap()];
                    HANDED.with(|h| h.borrow_mut().extend(bufs));
                    // Relaxed: both tasks run on this one executor thread.
                    while !d.load(Relaxed) {
                        ctx.yield_now().await;
                    }
                    assert_eq!(ctx.scratch_used(), base, "the owner's bytes are free");
                    return;
                }
                let (b1, b2) = loop {
                    let got = HANDED.with(|h| {
                        let mut h = h.borrow_mut();
                        (h.len() == 2).then(|| (h.remove(0), h.remove(0)))
                    });
                    if let Some(b) = got {
                        break b;
                    }
                    ctx.yield_now().await;
                };
                let before = ctx.counters();
                let lone = ctx.read_into(x, b1).await.err();
                let mut bt = ctx.batch();
                bt.read(x, b2);
                let batch = bt.submit().await.err();
                let posted = ctx.counters() - before;
                assert_eq!(posted.doorbells, 0, "nothing posted: {posted:?}");
                s.lock().unwrap().extend([lone, batch]);
                d.store(true, Relaxed);
            })
        }),
    );
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![Some(VerbError::ForeignBuffer); 2],
        "a lone READ, then a batch"
    );
}

/// A raw rig of at least `bytes` of registered local memory: the tests
/// below write its words through raw pointers, so a harness that returned
/// less would have them write past it.
fn raw<H: Harness>(h: &H, node: NodeId, bytes: usize) -> RawRig<H::N> {
    let rig = h.raw(node, bytes);
    assert!(
        rig.mr.len() >= bytes,
        "Harness::raw returned {} bytes of local memory, not the {bytes} asked",
        rig.mr.len()
    );
    rig
}

fn sge<N: Nic>(rig: &RawRig<N>, off: usize, len: u32) -> Sge {
    assert!(off + len as usize <= rig.mr.len());
    Sge {
        // SAFETY: in bounds of the registered region (asserted).
        addr: unsafe { rig.mr.as_ptr().add(off) },
        len,
        lkey: rig.mr.lkey(),
    }
}

/// The rkey of the host memory of the node `qp` is connected to (for
/// verbs posted by hand). Panics if the node exposes none: the case cannot
/// run.
pub fn host_rkey(qp: &impl QueuePair) -> RKey {
    qp.remote_regions()
        .iter()
        .find(|r| r.space == Space::Host)
        .expect("node exposes host memory")
        .rkey
}

/// Only signaled requests complete; one completion retires the unsignaled
/// requests before it, freeing their send-queue slots.
pub fn selective_signaling<H: Harness>(h: &H) {
    let (a, _) = two_nodes(h);
    let mut rig = raw(h, a, 4096);
    let rkey = host_rkey(&rig.qp);
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
    let mut rig = raw(h, a, 4096);
    let rkey = host_rkey(&rig.qp);
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
    let mut rig = raw(h, a, 4096);
    let rkey = host_rkey(&rig.qp);
    let remote = GlobalAddr::host(a, 0xd000);
    // The oversized READ below (u32::MAX bytes into a 4 KiB rig) is safe
    // to post only while the device refuses it by length.
    let max_msg = run_task(h, |ctx| async move { ctx.caps().max_msg_bytes });
    assert!(
        max_msg < u32::MAX,
        "a device taking u32::MAX-byte messages cannot run this check"
    );
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
        // except the oversized one, which is refused by length (above the
        // device's `max_msg_bytes`: asserted at the top).
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

/// Sets its flag when dropped: a reader task that finishes, or panics on a
/// check, stops the writers it raced, so a failing case fails instead of
/// spinning forever.
pub struct StopOnDrop(pub Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Relaxed);
    }
}

/// A READ racing WRITEs can observe a torn mix of old and new lines (upper
/// layers must never assume otherwise), while no aligned 64-byte line is ever
/// torn (the contract: transfers land in whole cacheline units). Each WRITE
/// fills the whole block with one fresh value; the reader checks every line
/// of every READ until it has seen 16 torn READs or done `max_reads`.
pub fn torn_reads_observable<H: Harness>(h: &H, block: usize, max_reads: u64) {
    let (a, _) = two_nodes(h);
    let at = GlobalAddr::host(a, 0x40000);
    assert!(at.offset().is_multiple_of(64) && block.is_multiple_of(64));
    let stats = Arc::new(Mutex::new((0u64, 0u64))); // (reads, torn)
    let s = stats.clone();
    let stop = Arc::new(AtomicBool::new(false));
    h.parallel(
        2,
        1,
        Arc::new(move |ctx, th, _| {
            let s = s.clone();
            let stop = stop.clone();
            Box::pin(async move {
                if th == 0 {
                    let mut pat = vec![0u8; block];
                    let mut v = 0u8;
                    while !stop.load(Relaxed) {
                        v = v.wrapping_add(1).max(1);
                        pat.fill(v);
                        ctx.write(at, &pat).await.expect("write");
                    }
                } else {
                    let _stop = StopOnDrop(stop);
                    let (mut reads, mut torn) = (0, 0);
                    while reads < max_reads && torn < 16 {
                        let buf = ctx.read(at, block).await.expect("read");
                        let bytes = buf.as_slice();
                        for (i, l) in bytes.chunks_exact(64).enumerate() {
                            assert!(
                                l.iter().all(|&x| x == l[0]),
                                "line {i} of a READ was torn: {l:?}"
                            );
                        }
                        if bytes.iter().any(|&x| x != bytes[0]) {
                            torn += 1;
                        }
                        reads += 1;
                    }
                    *s.lock().unwrap() = (reads, torn);
                }
            })
        }),
    );
    let (reads, torn) = *stats.lock().unwrap();
    assert!(
        torn > 0,
        "no READ mixing lines of two WRITEs in {reads} reads of {block} bytes racing WRITEs"
    );
}

/// Where `lines_are_atomic` works (64-byte aligned, clear of other cases).
pub const LINES_AT: u64 = 0x60000;
/// Writer A of `lines_are_atomic` writes values 1..128 (0 is the cleared
/// state, as if A had written it); writer B writes 128..=255.
const A_VALUES: u8 = 128;

/// The (head, tail) values of one line written only by [`line_writer_a`]
/// and [`line_writer_b`], or why no sequence of whole-line writes leaves
/// it. A writes whole lines with values below 128; B writes bytes 0..40 of
/// a line, or a span from byte 40 of one line to byte 40 of a later one,
/// with values from 128. So bytes 0..40 (head) come from one write, bytes
/// 40..64 (tail) from one write, and when both are A's it is the same
/// write: the line is [a x64], [b x40, a x24], [a x40, b x24] or
/// [b x40, b' x24] (b = b' when a span covered the whole line).
pub fn line_state(line: &[u8]) -> Result<(u8, u8), String> {
    assert_eq!(line.len(), 64);
    let (head, tail) = line.split_at(40);
    let (h, t) = (head[0], tail[0]);
    if head.iter().any(|&x| x != h) {
        return Err(format!("bytes 0..40 mix writes: {line:?}"));
    }
    if tail.iter().any(|&x| x != t) {
        return Err(format!("bytes 40..64 mix writes: {line:?}"));
    }
    if h < A_VALUES && t < A_VALUES && h != t {
        return Err(format!(
            "two whole-line writes mixed ({h} and {t}): {line:?}"
        ));
    }
    Ok((h, t))
}

/// Writer A of `lines_are_atomic`: WRITEs random runs of whole lines of
/// `lines` lines at `at`, each with a fresh value in 1..128, until `stop`.
pub async fn line_writer_a<N: Nic>(
    ctx: &Ctx<N>,
    at: GlobalAddr,
    lines: u64,
    seed: u64,
    stop: &AtomicBool,
) {
    let mut rng = crate::rng::Rng::new(seed);
    let mut v = 0u8;
    let mut buf = vec![0u8; 64 * lines as usize];
    while !stop.load(Relaxed) {
        v = v % (A_VALUES - 1) + 1;
        let first = rng.below(lines);
        let n = 1 + rng.below(lines - first);
        let span = &mut buf[..64 * n as usize];
        span.fill(v);
        ctx.write(at.add(64 * first), span).await.expect("write A");
    }
}

/// Writer B of `lines_are_atomic`: WRITEs 40-byte line heads and unaligned
/// spans of 64·m bytes (the last 24 bytes of a line, m-1 whole lines, the
/// first 40 bytes of the next), each with a fresh value from 128, until
/// `stop`.
pub async fn line_writer_b<N: Nic>(
    ctx: &Ctx<N>,
    at: GlobalAddr,
    lines: u64,
    seed: u64,
    stop: &AtomicBool,
) {
    assert!(lines >= 2);
    let mut rng = crate::rng::Rng::new(seed);
    let mut v = A_VALUES;
    let mut buf = vec![0u8; 64 * lines as usize];
    while !stop.load(Relaxed) {
        v = v.wrapping_add(1).max(A_VALUES);
        let k = rng.below(lines);
        if k + 1 < lines && rng.below(2) == 0 {
            let m = 1 + rng.below(lines - 1 - k);
            let span = &mut buf[..64 * m as usize];
            span.fill(v);
            ctx.write(at.add(64 * k + 40), span)
                .await
                .expect("write B span");
        } else {
            ctx.write(at.add(64 * k), &[v; 40])
                .await
                .expect("write B head");
        }
    }
}

/// What a `lines_are_atomic` reader saw, in lines.
#[derive(Clone, Copy, Debug, Default)]
pub struct LineStats {
    pub reads: u64,
    /// [b x40, a x24] with a ≠ 0: B's head over a line A wrote.
    pub b_over_a: u64,
    /// [a x40, b x24]: B's span tail over A's line (or the cleared one).
    pub a_under_b: u64,
    /// [b x40, b' x24]: head and tail from B writes.
    pub two_b: u64,
}

impl LineStats {
    /// True once a partial WRITE was seen over a line A wrote whole, and
    /// the tail of one of B's unaligned spans was seen: both writers ran
    /// and their writes met inside lines. (Which other shapes show up
    /// depends on the scheduler: with fewer cores than threads the writers
    /// rarely run together.)
    pub fn saw_partial_overwrites(&self) -> bool {
        self.b_over_a > 0 && self.a_under_b + self.two_b > 0
    }
}

/// The reader of `lines_are_atomic`: READs all `lines` lines at once,
/// checks every line with [`line_state`] (panicking on a torn one), until it
/// has done `min_reads` after first seeing partial overwrites (so the
/// writers are running), or `max_reads` in all.
pub async fn line_reader<N: Nic>(
    ctx: &Ctx<N>,
    at: GlobalAddr,
    lines: u64,
    min_reads: u64,
    max_reads: u64,
) -> LineStats {
    let mut st = LineStats::default();
    let mut racing_reads = 0;
    while st.reads < max_reads && racing_reads < min_reads {
        let buf = ctx.read(at, 64 * lines as usize).await.expect("read");
        for (i, l) in buf.as_slice().chunks_exact(64).enumerate() {
            let (h, t) = line_state(l).unwrap_or_else(|e| {
                panic!(
                    "READ {} line {i}: no sequence of whole-line WRITEs leaves it: {e}",
                    st.reads
                )
            });
            match (h >= A_VALUES, t >= A_VALUES) {
                (true, false) if t != 0 => st.b_over_a += 1,
                (false, true) => st.a_under_b += 1,
                (true, true) => st.two_b += 1,
                _ => {}
            }
        }
        st.reads += 1;
        racing_reads += st.saw_partial_overwrites() as u64;
    }
    st
}

/// Each aligned 64-byte line is atomic: writer A (whole lines) and writer B
/// (40-byte heads and unaligned spans over several lines) race on other
/// threads while a reader READs the lines; every line read must be one that
/// some order of whole-line writes leaves ([`line_state`]), and the reader
/// must see partial writes over whole ones (so the check was exercised).
pub fn lines_are_atomic<H: Harness>(h: &H, lines: u64, min_reads: u64, max_reads: u64) {
    let (a, _) = two_nodes(h);
    let at = GlobalAddr::host(a, LINES_AT);
    run_task(h, move |ctx| async move {
        ctx.write(at, &vec![0u8; 64 * lines as usize])
            .await
            .expect("clear");
    });
    let stats = Arc::new(Mutex::new(LineStats::default()));
    let s = stats.clone();
    let stop = Arc::new(AtomicBool::new(false));
    h.parallel(
        3,
        1,
        Arc::new(move |ctx, th, _| {
            let s = s.clone();
            let stop = stop.clone();
            Box::pin(async move {
                match th {
                    0 => line_writer_a(&ctx, at, lines, 0xA, &stop).await,
                    1 => line_writer_b(&ctx, at, lines, 0xB, &stop).await,
                    _ => {
                        let _stop = StopOnDrop(stop.clone());
                        let st = line_reader(&ctx, at, lines, min_reads, max_reads).await;
                        *s.lock().unwrap() = st;
                    }
                }
            })
        }),
    );
    let st = *stats.lock().unwrap();
    eprintln!("lines_are_atomic: {st:?}");
    assert!(
        st.saw_partial_overwrites(),
        "in {} READs no partial WRITE was seen over a whole-line one: {st:?}",
        st.reads
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
        fn conformance_local_view_matches_remote_verbs() {
            $crate::conformance::local_view_matches_remote_verbs(&$make);
        }
        #[test]
        fn conformance_timers() {
            $crate::conformance::timers(&$make);
        }
        #[test]
        fn conformance_wait_for_write() {
            $crate::conformance::wait_for_write(&$make);
        }
        #[test]
        fn conformance_ordering_within_qp() {
            $crate::conformance::ordering_within_qp(&$make);
        }
        #[test]
        fn conformance_batch_semantics() {
            $crate::conformance::batch_semantics(&$make);
        }
        #[test]
        fn conformance_batch_lifecycle() {
            $crate::conformance::batch_lifecycle(&$make);
        }
        #[test]
        fn conformance_read_into() {
            $crate::conformance::read_into(&$make);
        }

        #[test]
        fn conformance_foreign_buffers() {
            $crate::conformance::foreign_buffers(&$make);
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
        fn conformance_lines_are_atomic() {
            $crate::conformance::lines_are_atomic(&$make, 8, 20_000, 2_000_000);
        }
        #[test]
        fn conformance_dead_node() {
            $crate::conformance::dead_node(&mut $make);
        }
    };
}
