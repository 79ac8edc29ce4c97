//! The per-core run-to-completion executor.
//!
//! One executor runs on one pinned core. It owns a fixed set of task slots
//! made at start, one completion queue and one queue pair per memory node.
//! A turn reads the clock once, polls the completion queue for a bounded
//! number of completions, routes each to the slot that posted it, and polls
//! the slots that were woken. Tasks are `async` code that builds batches of
//! verbs through their [`Ctx`]; each batch is one or more doorbells and one
//! wait. No allocation happens after start: futures are boxed once when a
//! task is spawned, work requests are built on the stack, and buffers come
//! from the slot's registered scratch ([`arena`]).
//!
//! The same executor runs over any [`Nic`]: the emu backend in wall-clock
//! time, and the simulator in virtual time.

pub mod arena;
mod ctx;
mod error;
pub(crate) mod storage;
mod wait;
mod waker;

pub use arena::Buf;
pub use ctx::{Batch, Ctx, Done, OpId, ReadInto, Submit, SubmitFirst, YieldNow, MAX_BATCH};
pub use error::VerbError;
pub use wait::{Local, Sleep, WaitWrite};

use crate::addr::NodeId;
use crate::counters::VerbCounters;
use crate::nic::{CompletionQueue, CqId, Mr, Nic, QpState, QueuePair, RegisterableMemory};
use crate::verbs::{Caps, Completion};
use arena::SlotArena;
use std::cell::{Cell, RefCell};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Waker};
use waker::SlotWake;

/// Sizes of an executor, fixed at start.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ExecutorConfig {
    /// Task slots (coroutines) on this core.
    pub slots: usize,
    /// Registered scratch each slot may hold at once.
    pub scratch_bytes_per_slot: usize,
    /// Completions taken from the queue per turn (bounded work).
    pub poll_batch: usize,
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        ExecutorConfig {
            slots: 8,
            scratch_bytes_per_slot: 64 * 1024,
            poll_batch: 32,
        }
    }
}

impl ExecutorConfig {
    /// Bytes of registered scratch memory the executor needs (saturating;
    /// [`check`](Self::check) rejects configurations that overflow).
    pub fn scratch_bytes(&self) -> usize {
        self.checked_scratch_bytes().unwrap_or(usize::MAX)
    }

    fn checked_scratch_bytes(&self) -> Option<usize> {
        self.scratch_bytes_per_slot
            .checked_add(MAX_BATCH * 8)?
            .checked_mul(self.slots)
    }

    /// Rejects configurations an executor cannot be made with.
    pub fn check(&self) -> Result<(), ExecError> {
        let bad = |s: String| Err(ExecError::BadConfig(s));
        if self.slots == 0 || self.slots > u16::MAX as usize {
            return bad(format!("slots must be 1..=65535, got {}", self.slots));
        }
        if self.poll_batch == 0 {
            return bad("poll_batch must be positive".into());
        }
        if !self.scratch_bytes_per_slot.is_multiple_of(8) {
            return bad(format!(
                "scratch_bytes_per_slot must be a multiple of 8, got {}",
                self.scratch_bytes_per_slot
            ));
        }
        if self.checked_scratch_bytes().is_none() || self.scratch_bytes_per_slot > u32::MAX as usize
        {
            return bad(format!(
                "scratch_bytes_per_slot of {} is too large",
                self.scratch_bytes_per_slot
            ));
        }
        if self.slots * MAX_BATCH > u32::MAX as usize {
            return bad("too many slots for a queue pair's depth".into());
        }
        Ok(())
    }

    /// Send-queue depth each queue pair needs: every slot may have a full
    /// batch on it.
    pub fn qp_depth(&self) -> u32 {
        (self.slots * MAX_BATCH) as u32
    }
}

/// Why an executor could not be made or a task spawned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExecError {
    BadConfig(String),
    ScratchTooSmall {
        have: usize,
        need: usize,
    },
    QpTooShallow {
        node: NodeId,
        depth: u32,
        need: u32,
    },
    DuplicateQp(NodeId),
    /// A queue pair that completes on another completion queue: its
    /// completions would reach another executor, and this one's batches
    /// would never see them (or that one would count them as its own).
    ForeignQp(NodeId),
    NoFreeSlot,
}

impl fmt::Display for ExecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExecError::BadConfig(s) => write!(f, "invalid executor configuration: {s}"),
            ExecError::ScratchTooSmall { have, need } => {
                write!(f, "scratch region of {have} bytes, executor needs {need}")
            }
            ExecError::QpTooShallow { node, depth, need } => write!(
                f,
                "queue pair to node {node} has depth {depth}, executor needs {need}"
            ),
            ExecError::DuplicateQp(n) => write!(f, "two queue pairs to node {n}"),
            ExecError::ForeignQp(n) => write!(
                f,
                "the queue pair to node {n} completes on another completion queue than the executor's"
            ),
            ExecError::NoFreeSlot => write!(f, "no free task slot"),
        }
    }
}

impl std::error::Error for ExecError {}

pub(crate) struct Slot {
    /// Set by wakers, which may be on any thread.
    pub(crate) wake: Arc<SlotWake>,
    /// Set by the executor's own wakes (a completion routed, a spawn, a
    /// deadline passed): a plain store, where the shared flag costs the
    /// turn a locked swap to clear, once per verb on emu.
    pub(crate) woken_here: Cell<bool>,
    pub(crate) arena: Rc<SlotArena>,
    /// Sequence number of the slot's current batch.
    pub(crate) seq: Cell<u16>,
    /// Queue-pair groups of the current batch still to complete.
    pub(crate) pending: Cell<u32>,
    /// First failure of the current batch: (request index, status, node).
    pub(crate) failure: Cell<Option<(u8, crate::verbs::WcStatus, NodeId)>>,
    /// Nodes (bit n for node n < 64) the current batch's groups were
    /// posted to, and those of them a request failed on; whether it
    /// reached a node numbered 64 or more.
    pub(crate) posted_nodes: Cell<u64>,
    pub(crate) failed_nodes: Cell<u64>,
    pub(crate) wide: Cell<bool>,
    /// The 8-byte words atomics of the current batch return into.
    pub(crate) atomics: *mut u64,
    pub(crate) counters: Cell<VerbCounters>,
    /// A batch of this slot is between post and result.
    pub(crate) busy: Cell<bool>,
    /// Wake the task at every group's completion, not only the last's
    /// ([`ctx::Batch::submit_first`]).
    pub(crate) wake_each: Cell<bool>,
    /// Generation of the slot's batch storage; a new batch bumps it.
    pub(crate) gen: Cell<u32>,
    pub(crate) storage: storage::BatchStorage,
    /// The count, first problem and stage of the batch being built or
    /// posted (`ctx::Batch`, `ctx::Submit`).
    pub(crate) building: ctx::Building,
    /// The earliest deadline of the task's live waits ([`wait`]);
    /// `wait::NO_TIMER` when none.
    pub(crate) timer: Cell<u64>,
    /// The task waits for a write to its watched range.
    pub(crate) watching: Cell<bool>,
    /// The task's live waits (sleeps and write waits).
    pub(crate) waits: Cell<u32>,
    /// Batches the task may still see completed at their post in this
    /// poll ([`Core::inline`]); set at each poll.
    pub(crate) inline_left: Cell<u8>,
}

/// Batches a task may see completed at their post in one poll, on a NIC
/// that completes at post, before it waits for the next turn like any
/// other: the other tasks, the clock and the stop checks of `run_until`
/// get their turn at least every this many batches.
pub const INLINE_BUDGET: u8 = 16;

/// State shared by the executor and its tasks' contexts (one core, one
/// thread: `Rc` and `Cell`, no locks).
pub(crate) struct Core<N: Nic> {
    pub(crate) nic: N,
    /// The completion queue of every queue pair, and room to poll it
    /// into. A turn polls it, and so does a task that just posted when
    /// `inline`; neither holds a borrow beyond its poll.
    cq: RefCell<N::Cq>,
    wcs: RefCell<Box<[Completion]>>,
    /// The NIC completes a request as it posts it
    /// ([`Nic::completes_at_post`]).
    inline: bool,
    /// `inline`, and one task is live: it polls the queue as soon as it
    /// posted and goes on: it is all there is to run, and returning to
    /// the executor would only have a turn route its completion and poll
    /// it again, back down through its awaits (a tenth of the CPU of a
    /// tree lookup on emu). Several tasks return to the executor, which
    /// polls the queue and the clock once for all of them: the inline
    /// poll and clock read per batch made 16 tasks' 8-byte READs 20%
    /// slower per verb.
    pub(crate) inline_now: Cell<bool>,
    pub(crate) caps: Caps,
    pub(crate) qps: RefCell<Vec<Option<N::Qp>>>,
    /// Per node, the first region of each space as learnt at start: the
    /// fast path of rkey lookup (see `Ctx::rkey_for`).
    pub(crate) routes: Vec<[Option<crate::nic::RemoteRegion>; 2]>,
    pub(crate) slots: Box<[Slot]>,
    pub(crate) now_ns: Cell<u64>,
    pub(crate) lkey: crate::verbs::LKey,
    /// Set when an error completion arrived; the executor then recovers
    /// queue pairs whose requests have all been polled.
    pub(crate) qp_errors: Cell<bool>,
    /// Live waits (sleeps, write waits) over all slots: a turn looks at
    /// the slots' deadlines and watches only when there are some.
    pub(crate) waits: Cell<u32>,
}

impl Slot {
    /// Updates the slot's counters in place (they are 80 bytes; copying
    /// them out and back costs more than the update).
    pub(crate) fn bump(&self, f: impl FnOnce(&mut VerbCounters)) {
        // SAFETY: the Cell is !Sync and this thread is its only user; `f`
        // only edits the counters and cannot reach this Cell again.
        f(unsafe { &mut *self.counters.as_ptr() })
    }
}

impl<N: Nic> Core<N> {
    /// Polls the completion queue once (at most `poll_batch`) and routes
    /// what it took; how many.
    fn poll_cq(&self) -> usize {
        let mut wcs = self.wcs.borrow_mut();
        let n = self.cq.borrow_mut().poll(&mut wcs);
        for wc in &wcs[..n] {
            self.route(wc);
        }
        n
    }

    /// After a task posted: on a NIC that completes at post, with the
    /// task alone on its core (`inline_now`) and something of its batch
    /// in flight, routes the queue's completions, then reads the clock
    /// again, so that what the task stamps next is not earlier than what
    /// it just did. Bounded by the task's budget; once it is spent the
    /// task waits for a turn like any other.
    #[inline]
    pub(crate) fn complete_inline(&self, slot: &Slot) {
        let left = slot.inline_left.get();
        if !self.inline_now.get() || slot.pending.get() == 0 || left == 0 {
            return;
        }
        slot.inline_left.set(left - 1);
        self.poll_cq();
        self.now_ns.set(self.nic.now_ns());
    }

    /// Routes one completion to the slot that posted it.
    fn route(&self, wc: &Completion) {
        let (slot_ix, seq, op, last) = ctx::decode_wr_id(wc.wr_id);
        let Some(slot) = self.slots.get(slot_ix) else {
            debug_assert!(false, "completion for unknown slot {slot_ix}");
            return;
        };
        let current = slot.seq.get() == seq;
        if !wc.status.is_ok() {
            self.qp_errors.set(true);
            slot.bump(|c| c.errors += 1);
            if current {
                let node = self.node_of_qp(wc.qp_num);
                if slot.failure.get().is_none() {
                    slot.failure.set(Some((op, wc.status, node)));
                }
                if node < 64 {
                    slot.failed_nodes.set(slot.failed_nodes.get() | 1 << node);
                } else {
                    slot.wide.set(true);
                }
            }
        }
        if last {
            slot.arena.completed_group();
            if current {
                let p = slot.pending.get();
                debug_assert!(p > 0);
                slot.pending.set(p.saturating_sub(1));
                if p == 1 || slot.wake_each.get() {
                    slot.woken_here.set(true);
                }
            } else if slot.arena.inflight() == 0 {
                // A task waiting to post after a dropped batch may go on.
                slot.woken_here.set(true);
            }
        }
    }

    fn node_of_qp(&self, qp_num: u32) -> NodeId {
        self.qps
            .borrow()
            .iter()
            .flatten()
            .find(|q| q.qp_num() == qp_num)
            .map_or(NodeId::MAX, |q| q.peer())
    }

    /// Recovers errored queue pairs whose completions are all in. One whose
    /// peer is dead stays in error and is not retried here (a post to it
    /// retries, and reports the node dead), so a dead node costs nothing
    /// per turn.
    fn recover_qps(&self) {
        let mut qps = self.qps.borrow_mut();
        let mut busy = false;
        for qp in qps.iter_mut().flatten() {
            if qp.state() == QpState::Error {
                if let Err(crate::nic::RecoverError::Busy { .. }) = qp.recover() {
                    busy = true;
                }
            }
        }
        self.qp_errors.set(busy);
    }
}

type Task = Pin<Box<dyn Future<Output = ()>>>;

/// A run-to-completion executor for one core.
pub struct Executor<N: Nic> {
    core: Rc<Core<N>>,
    tasks: Vec<Option<Task>>,
    wakers: Vec<Waker>,
    live: usize,
    turns: u64,
}

/// The queue pairs indexed by their memory node: each at least `need`
/// deep, one per node, each completing on `cq`.
fn qps_by_node<Q: QueuePair>(
    qps: Vec<Q>,
    need: u32,
    cq: CqId,
) -> Result<Vec<Option<Q>>, ExecError> {
    let mut by_node: Vec<Option<Q>> = Vec::new();
    for qp in qps {
        let node = qp.peer();
        if qp.cq_id() != cq {
            return Err(ExecError::ForeignQp(node));
        }
        if qp.depth() < need {
            return Err(ExecError::QpTooShallow {
                node,
                depth: qp.depth(),
                need,
            });
        }
        if by_node.len() <= node as usize {
            by_node.resize_with(node as usize + 1, || None);
        }
        if by_node[node as usize].is_some() {
            return Err(ExecError::DuplicateQp(node));
        }
        by_node[node as usize] = Some(qp);
    }
    Ok(by_node)
}

impl<N: Nic> Executor<N> {
    /// Makes an executor over a completion queue, one connected queue pair
    /// per memory node (all on `cq`: [`ExecError::ForeignQp`] otherwise,
    /// since the scratch a batch used is reused once its completions are
    /// in, and those of a queue pair on another queue never come here),
    /// and a registered scratch region of at least
    /// [`ExecutorConfig::scratch_bytes`].
    pub fn new<M: RegisterableMemory + 'static>(
        nic: N,
        cq: N::Cq,
        qps: Vec<N::Qp>,
        scratch: Mr<M, N::Reg>,
        cfg: ExecutorConfig,
    ) -> Result<Executor<N>, ExecError>
    where
        N::Reg: 'static,
    {
        cfg.check()?;
        let need = cfg.scratch_bytes();
        if scratch.len() < need || !(scratch.as_ptr() as usize).is_multiple_of(8) {
            return Err(ExecError::ScratchTooSmall {
                have: scratch.len(),
                need,
            });
        }
        let by_node = qps_by_node(qps, cfg.qp_depth(), cq.id())?;
        let lkey = scratch.lkey();
        let base = scratch.as_ptr();
        let keep: Rc<dyn std::any::Any> = Rc::new(scratch);
        let per_slot = cfg.scratch_bytes_per_slot + MAX_BATCH * 8;
        let slots: Box<[Slot]> = (0..cfg.slots)
            .map(|i| {
                // SAFETY: slot i's window [i*per_slot, (i+1)*per_slot) lies in
                // the registered scratch (size checked above), is disjoint
                // from every other slot's, and `keep` keeps it alive. The
                // first MAX_BATCH words are the atomics area; the arena gets
                // the rest. `check` made per_slot a multiple of 8 and the
                // scratch base is 8-aligned (checked), so every window is.
                unsafe {
                    let w = base.add(i * per_slot);
                    let atomics = w as *mut u64;
                    let arena_base = w.add(MAX_BATCH * 8);
                    let arena_len = cfg.scratch_bytes_per_slot;
                    Slot {
                        wake: Arc::new(SlotWake {
                            woken: std::sync::atomic::AtomicBool::new(false),
                        }),
                        woken_here: Cell::new(false),
                        arena: Rc::new(SlotArena::new(arena_base, arena_len, lkey, keep.clone())),
                        seq: Cell::new(0),
                        pending: Cell::new(0),
                        failure: Cell::new(None),
                        posted_nodes: Cell::new(0),
                        failed_nodes: Cell::new(0),
                        wide: Cell::new(false),
                        atomics,
                        counters: Cell::new(VerbCounters::default()),
                        busy: Cell::new(false),
                        wake_each: Cell::new(false),
                        gen: Cell::new(0),
                        storage: storage::BatchStorage::new(),
                        building: ctx::Building::new(),
                        timer: Cell::new(wait::NO_TIMER),
                        watching: Cell::new(false),
                        waits: Cell::new(0),
                        inline_left: Cell::new(0),
                    }
                }
            })
            .collect();
        if !per_slot.is_multiple_of(8) {
            return Err(ExecError::BadConfig(
                "scratch_bytes_per_slot must be a multiple of 8".into(),
            ));
        }
        let wakers = slots.iter().map(|s| waker::waker_for(&s.wake)).collect();
        let routes = by_node
            .iter()
            .map(|q| {
                let mut r = [None, None];
                for reg in q.iter().flat_map(|q| q.remote_regions()) {
                    r[reg.space.index()].get_or_insert(*reg);
                }
                r
            })
            .collect();
        let core = Rc::new(Core {
            caps: nic.caps(),
            now_ns: Cell::new(nic.now_ns()),
            inline: nic.completes_at_post(),
            inline_now: Cell::new(false),
            cq: RefCell::new(cq),
            wcs: RefCell::new(vec![Completion::EMPTY; cfg.poll_batch].into_boxed_slice()),
            nic,
            qps: RefCell::new(by_node),
            routes,
            slots,
            lkey,
            qp_errors: Cell::new(false),
            waits: Cell::new(0),
        });
        Ok(Executor {
            core,
            tasks: (0..cfg.slots).map(|_| None).collect(),
            wakers,
            live: 0,
            turns: 0,
        })
    }

    /// Starts a task in a free slot. The future is boxed here, once; what it
    /// does afterwards allocates nothing.
    pub fn spawn<F, Fut>(&mut self, f: F) -> Result<usize, ExecError>
    where
        F: FnOnce(Ctx<N>) -> Fut,
        Fut: Future<Output = ()> + 'static,
    {
        let ix = (0..self.tasks.len())
            .find(|&i| self.tasks[i].is_none() && self.core.slots[i].arena.inflight() == 0)
            .ok_or(ExecError::NoFreeSlot)?;
        let ctx = Ctx::new(self.core.clone(), ix);
        self.tasks[ix] = Some(Box::pin(f(ctx)));
        self.live += 1;
        self.core.inline_now.set(self.core.inline && self.live == 1);
        self.core.slots[ix].woken_here.set(true);
        Ok(ix)
    }

    /// Whether some task is woken and waiting for a turn.
    pub fn has_ready(&self) -> bool {
        self.core
            .slots
            .iter()
            .any(|s| s.woken_here.get() || s.wake.woken.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Tasks that have not finished.
    pub fn live_tasks(&self) -> usize {
        self.live
    }

    pub fn slots(&self) -> usize {
        self.tasks.len()
    }

    /// Turns run so far.
    pub fn turns(&self) -> u64 {
        self.turns
    }

    /// One turn: read the clock, poll at most `poll_batch` completions, route
    /// them, then poll every woken task once. Returns whether anything
    /// happened (a completion or a task poll).
    pub fn turn(&mut self) -> bool {
        self.turns += 1;
        let core = &*self.core;
        core.now_ns.set(core.nic.now_ns());
        let n = core.poll_cq();
        if core.qp_errors.get() {
            core.recover_qps();
        }
        let waits = core.waits.get() > 0;
        if waits {
            let now = core.now_ns.get();
            for (i, s) in core.slots.iter().enumerate() {
                if s.wait_due(&core.nic, i, now) {
                    s.woken_here.set(true);
                }
            }
        }
        let mut polls = 0;
        for i in 0..self.tasks.len() {
            let s = &core.slots[i];
            // Both flags cleared (`|`, not `||`): one poll answers both.
            if !(s.woken_here.replace(false) | s.wake.take()) {
                continue;
            }
            let Some(task) = self.tasks[i].as_mut() else {
                continue;
            };
            polls += 1;
            // The task's live waits arm its deadline again as they are
            // polled (exec/wait.rs): none is left by a wait that ended.
            core.slots[i].timer.set(wait::NO_TIMER);
            s.inline_left.set(INLINE_BUDGET);
            let mut cx = Context::from_waker(&self.wakers[i]);
            if task.as_mut().poll(&mut cx).is_ready() {
                self.tasks[i] = None;
                self.live -= 1;
                core.inline_now.set(core.inline && self.live == 1);
            }
        }
        core.nic.charge_turn(n, polls);
        if core.waits.get() > 0 {
            let due = core.slots.iter().map(|s| s.timer.get()).min();
            if let Some(at) = due.filter(|&t| t != wait::NO_TIMER) {
                core.nic.timer_due(at);
            }
        }
        n > 0 || polls > 0
    }

    /// Runs turns until every task has finished.
    pub fn run(&mut self) {
        while self.live > 0 {
            self.turn();
        }
    }

    /// Runs turns until every task has finished or `stop()` says so
    /// (checked every 64 turns, so it may be a little costly).
    pub fn run_until(&mut self, mut stop: impl FnMut() -> bool) {
        while self.live > 0 {
            self.turn();
            if self.turns.is_multiple_of(64) && stop() {
                break;
            }
        }
    }

    /// Counters of one slot.
    pub fn slot_counters(&self, slot: usize) -> VerbCounters {
        self.core.slots[slot].counters.get()
    }

    /// Counters summed over the core.
    pub fn counters(&self) -> VerbCounters {
        self.core
            .slots
            .iter()
            .fold(VerbCounters::default(), |a, s| a + s.counters.get())
    }

    /// Largest scratch any slot used at once (bytes), to size the config.
    pub fn scratch_peak(&self) -> usize {
        self.core
            .slots
            .iter()
            .map(|s| s.arena.peak())
            .max()
            .unwrap_or(0)
    }

    /// The queue pairs, for backend-specific inspection.
    pub fn with_qp<R>(&self, node: NodeId, f: impl FnOnce(&N::Qp) -> R) -> Option<R> {
        self.core
            .qps
            .borrow()
            .get(node as usize)
            .and_then(|q| q.as_ref())
            .map(f)
    }

    /// Waits (polling, bounded by `max_turns`) until no slot has requests in
    /// flight. Returns false if some are still in flight.
    pub fn drain(&mut self, max_turns: u64) -> bool {
        for _ in 0..max_turns {
            if self.core.slots.iter().all(|s| s.arena.inflight() == 0) {
                return true;
            }
            if self.core.poll_cq() == 0 {
                std::hint::spin_loop();
            }
        }
        self.core.slots.iter().all(|s| s.arena.inflight() == 0)
    }
}

impl<N: Nic> Drop for Executor<N> {
    fn drop(&mut self) {
        // Futures own buffers the NIC may still write; their memory stays
        // alive through the arena's reference count, but the queue pairs must
        // be quiet before the registration goes. Drain what we can first.
        self.tasks.iter_mut().for_each(|t| *t = None);
        if self.core.nic.drain_on_drop() && !self.drain(1_000_000) {
            log::warn!("executor dropped with requests still in flight");
        }
    }
}

/// Pins the calling thread to CPU number `core`, one of those the process
/// may use. Returns false if it is not one of them or pinning failed.
pub fn pin_current_thread(core: usize) -> bool {
    core_affinity::get_core_ids()
        .and_then(|ids| ids.into_iter().find(|c| c.id == core))
        .is_some_and(core_affinity::set_for_current)
}
