//! What a task sees: its context ([`Ctx`]), batches of verbs ([`Batch`])
//! and their results ([`Done`]).
//!
//! A batch is the unit of waiting. Its requests are grouped by memory node
//! in the order they were added; each group is posted on that node's queue
//! pair with one doorbell, with only its last request signaled, and the
//! batch completes when every group's last completion has arrived (a
//! reliable-connected queue pair completes in order, so the last one implies
//! the rest). One batch is one round trip however many nodes it spans.
//! Requests to one node execute in the order they were added; requests to
//! different nodes are unordered, as on a real fabric.

use super::arena::{self, Buf};
use super::error::VerbError;
use super::{Core, Slot};
use crate::addr::{GlobalAddr, NodeId};
use crate::counters::VerbCounters;
use crate::nic::{Nic, QpState, QueuePair, RecoverError};
use crate::verbs::{Caps, Opcode, RKey, Sge, WorkRequest, WrOp};
use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

/// Most requests in one batch.
pub const MAX_BATCH: usize = 16;

pub(crate) const LAST_BIT: u64 = 1 << 31;

pub(crate) fn encode_wr_id(slot: usize, seq: u16, op: usize, last: bool) -> u64 {
    ((slot as u64) << 48) | ((seq as u64) << 32) | if last { LAST_BIT } else { 0 } | op as u64
}

/// (slot, seq, request index, last-of-group).
pub(crate) fn decode_wr_id(id: u64) -> (usize, u16, u8, bool) {
    (
        (id >> 48) as usize,
        (id >> 32) as u16,
        id as u8,
        id & LAST_BIT != 0,
    )
}

/// A task's handle on its core: verbs, scratch buffers, the clock and its
/// counters. One per task slot; not cloneable, so a slot's batches are
/// posted one at a time.
pub struct Ctx<N: Nic> {
    core: Rc<Core<N>>,
    slot: usize,
    /// `&core.slots[slot]`, worked out once: every verb reaches its slot
    /// several times, and each index through the `Rc` and the boxed slice
    /// cost a load, a bounds check and a multiply (29 instructions of an
    /// 8-byte READ's 1,371 on emu).
    slot_ptr: std::ptr::NonNull<Slot>,
}

impl<N: Nic> Ctx<N> {
    pub(crate) fn new(core: Rc<Core<N>>, slot: usize) -> Ctx<N> {
        let slot_ptr = std::ptr::NonNull::from(&core.slots[slot]);
        Ctx {
            core,
            slot,
            slot_ptr,
        }
    }

    #[inline(always)]
    fn s(&self) -> &Slot {
        // SAFETY: `slot_ptr` points into `core.slots`, a boxed slice the
        // core never resizes or moves, and `self.core` keeps the core
        // alive for as long as this context (and so the returned borrow)
        // lives. Slots are only ever shared (`&Slot`; their state is in
        // cells), so no `&mut` to it can exist.
        unsafe { self.slot_ptr.as_ref() }
    }

    pub(crate) fn slot_state(&self) -> &Slot {
        self.s()
    }

    pub(crate) fn core_ref(&self) -> &Core<N> {
        &self.core
    }

    /// This task's slot number on its core.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// The time at the start of the current executor turn (ns): wall clock
    /// on real backends, virtual in the simulator; on a NIC that completes
    /// at post, read again after each batch the task saw complete so.
    /// Reading it is free.
    pub fn now_ns(&self) -> u64 {
        self.core.now_ns.get()
    }

    pub fn caps(&self) -> Caps {
        self.core.caps
    }

    /// The device this core runs on.
    pub fn nic(&self) -> &N {
        &self.core.nic
    }

    /// Memory nodes this core has a queue pair to (allocates: for setup,
    /// not the data path).
    pub fn nodes(&self) -> Vec<NodeId> {
        self.core
            .qps
            .borrow()
            .iter()
            .flatten()
            .map(|q| q.peer())
            .collect()
    }

    /// The regions of `node` this core knows (allocates: for setup, not
    /// the data path).
    pub fn remote_regions(&self, node: NodeId) -> Vec<crate::nic::RemoteRegion> {
        self.core
            .qps
            .borrow()
            .get(node as usize)
            .and_then(|q| q.as_ref())
            .map(|q| q.remote_regions().to_vec())
            .unwrap_or_default()
    }

    /// This task's counters so far.
    pub fn counters(&self) -> VerbCounters {
        self.s().counters.get()
    }

    /// A zeroed buffer of registered scratch memory.
    pub fn alloc(&self, len: usize) -> Result<Buf, VerbError> {
        arena::alloc(&self.s().arena, len).ok_or_else(|| self.no_scratch(len))
    }

    /// The error of a scratch request of `len` bytes that does not fit.
    fn no_scratch(&self, len: usize) -> VerbError {
        VerbError::Scratch {
            requested: len,
            free: self.s().arena.free_bytes(),
        }
    }

    /// A buffer of registered scratch memory for a READ to fill, not
    /// zeroed: until the READ lands it holds whatever this task's earlier
    /// buffers left there (never another task's: the window is the
    /// slot's own). A READ that succeeds writes every byte; one that fails
    /// takes its buffers with the failed batch. Saves the zeroing
    /// [`Ctx::alloc`] does (70 instructions for a 1 KiB node).
    pub fn alloc_for_read(&self, len: usize) -> Result<Buf, VerbError> {
        arena::alloc_raw(&self.s().arena, len).ok_or_else(|| self.no_scratch(len))
    }

    /// Bytes of this task's scratch window in use: live buffers and the
    /// holes below the topmost. An operation that returns no buffer leaves
    /// this where it found it once it has finished (index operations check
    /// it; see [`Ctx::scratch_balanced`]).
    pub fn scratch_used(&self) -> usize {
        self.s().arena.used()
    }

    /// The most bytes of this task's scratch window in use at once, over
    /// the life of its slot (as [`Ctx::scratch_used`] counts them): what an
    /// operation needs of [`crate::ExecutorConfig::scratch_bytes_per_slot`].
    pub fn scratch_peak(&self) -> usize {
        self.s().arena.peak()
    }

    /// Whether the scratch window is back at `before` (a value of
    /// [`Ctx::scratch_used`] taken when an operation began). Debug builds and
    /// the simulator ([`Nic::ASSERTS_INVARIANTS`]) assert it.
    pub fn scratch_balanced(&self, before: usize) -> bool {
        let now = self.scratch_used();
        if cfg!(debug_assertions) || N::ASSERTS_INVARIANTS {
            assert_eq!(
                now, before,
                "an operation left {now} bytes of task scratch in use (it began with {before})"
            );
        }
        now == before
    }

    /// Starts a batch (and ends the validity of the previous batch's
    /// results).
    pub fn batch(&self) -> Batch<'_, N> {
        Batch::new(self)
    }

    /// Waits until this task's last batch has wholly completed (one sent
    /// with [`Batch::submit_first`] may still have doorbells in flight)
    /// and returns its first failure, if any; `Ok` at once when nothing is
    /// in flight. Call it before another batch, which would forget the
    /// failure.
    pub async fn settle(&self) -> Result<(), VerbError> {
        let slot = self.s();
        SlotIdle { slot }.await;
        failure_of(slot).map_or(Ok(()), Err)
    }

    /// After this task's last batch completed (or failed, or settled):
    /// the nodes (bit n for node n) its groups were posted to, and those
    /// of them a request failed on. A WRITE to a node posted and not
    /// failed surely landed; one to a node not posted never left (a post
    /// stops at the first refusal; a batch that failed as it was built
    /// posted to none). None when the batch reached a node numbered 64 or
    /// more (not tracked) or is still in flight. Ask before the next
    /// batch.
    pub fn last_batch_nodes(&self) -> Option<(u64, u64)> {
        let slot = self.s();
        if slot.wide.get() || slot.pending.get() > 0 {
            return None;
        }
        Some((slot.posted_nodes.get(), slot.failed_nodes.get()))
    }

    /// Gives the other tasks on this core a turn.
    pub fn yield_now(&self) -> YieldNow {
        YieldNow { yielded: false }
    }

    /// READ of `len` bytes at `addr`, in one round trip.
    pub async fn read(&self, addr: GlobalAddr, len: usize) -> Result<Buf, VerbError> {
        // The refusal `read_into` would give, before a buffer is sought
        // (which might fail first, for a different reason).
        if self.s().busy.get() {
            return Err(VerbError::BatchInProgress);
        }
        self.read_into(addr, self.alloc_for_read(len)?).await
    }

    /// READ into `buf` (its whole length) at `addr`, in one round trip;
    /// the buffer comes back. What a batch of this one READ does, without
    /// the batch: no storage, stages or results to build and take apart
    /// (a tree lookup's only verb, where they were 430 of its 2,900
    /// instructions on emu). It starts a batch as [`Ctx::batch`] does:
    /// the previous batch's results are no longer valid, and while one of
    /// the task's batches is in flight it fails with `BatchInProgress`.
    pub fn read_into(&self, addr: GlobalAddr, buf: Buf) -> ReadInto<'_, N> {
        ReadInto {
            ctx: self,
            addr,
            buf: Some(buf),
            gen: 0,
            over: false,
        }
    }

    /// WRITE of `data` at `addr`, in one round trip.
    pub async fn write(&self, addr: GlobalAddr, data: &[u8]) -> Result<(), VerbError> {
        let mut b = self.batch();
        b.write_bytes(addr, data);
        b.submit().await.map(drop)
    }

    /// 8-byte CAS; returns the old value (success iff it equals `compare`).
    pub async fn cas(&self, addr: GlobalAddr, compare: u64, swap: u64) -> Result<u64, VerbError> {
        let mut b = self.batch();
        let op = b.cas(addr, compare, swap);
        Ok(b.submit().await?.old(op))
    }

    /// 8-byte fetch-and-add; returns the old value.
    pub async fn faa(&self, addr: GlobalAddr, add: u64) -> Result<u64, VerbError> {
        let mut b = self.batch();
        let op = b.faa(addr, add);
        Ok(b.submit().await?.old(op))
    }

    /// The rkey covering `len` bytes at `addr`, as the queue pair knows it.
    /// An address outside every region still gets its space's key, so that
    /// the responder — not the client — rejects it, as a real NIC would.
    /// The route table's hit is inline; the search of every region is not.
    #[inline(always)]
    fn rkey_for(&self, addr: GlobalAddr, len: u64) -> Result<RKey, VerbError> {
        let (space, off) = (addr.space(), addr.offset());
        if let Some(Some(r)) = self
            .core
            .routes
            .get(addr.node() as usize)
            .map(|r| &r[space.index()])
        {
            if r.contains(space, off, len) {
                return Ok(r.rkey);
            }
        }
        self.rkey_search(addr, len)
    }

    #[cold]
    #[inline(never)]
    fn rkey_search(&self, addr: GlobalAddr, len: u64) -> Result<RKey, VerbError> {
        let (space, off) = (addr.space(), addr.offset());
        let qps = self.core.qps.borrow();
        let qp = qps
            .get(addr.node() as usize)
            .and_then(|q| q.as_ref())
            .ok_or(VerbError::NoRoute { node: addr.node() })?;
        let regions = qp.remote_regions();
        Ok(regions
            .iter()
            .find(|r| r.contains(space, off, len))
            .or_else(|| regions.iter().find(|r| r.space == space))
            .map_or(RKey(0), |r| r.rkey))
    }

    /// Posts one group on `node`'s queue pair, recovering it first if an
    /// earlier failure left it in error.
    ///
    /// # Safety
    /// Every local SGE in `wrs` must satisfy `QueuePair::post_send`'s
    /// contract (the batch machinery guarantees it; see `submit`).
    pub(crate) unsafe fn post(&self, node: NodeId, wrs: &[WorkRequest]) -> Result<(), VerbError> {
        let mut qps = self.core.qps.borrow_mut();
        let qp = qps
            .get_mut(node as usize)
            .and_then(|q| q.as_mut())
            .ok_or(VerbError::NoRoute { node })?;
        if qp.state() == QpState::Error {
            match qp.recover() {
                Ok(()) => {}
                Err(RecoverError::PeerDead(_)) => return Err(VerbError::NodeDead { node }),
                Err(RecoverError::Busy { .. }) => {
                    return Err(VerbError::Post {
                        node,
                        error: crate::verbs::PostError::QpInError,
                    })
                }
            }
        }
        // SAFETY: the SGEs are as `QueuePair::post_send` requires: this
        // function's own contract, which the caller upholds.
        unsafe { qp.post_send(wrs) }.map_err(|error| VerbError::Post { node, error })
    }
}

/// Handle of one request in a batch, to fetch its result from [`Done`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct OpId(u8);

/// Requests being gathered for one doorbell-and-wait.
///
/// The requests, their count and the first problem met while adding them
/// live in the slot (`Slot::building`), made at start, so a batch is two
/// words and moving it or its future copies almost nothing. A task builds
/// one batch at a time: starting a new batch invalidates an unsubmitted
/// one and the results of the previous one. Builder calls never fail on
/// the spot: the first problem is remembered and returned by
/// [`submit`](Batch::submit), and then nothing is posted.
#[must_use = "a batch does nothing until it is submitted"]
pub struct Batch<'a, N: Nic> {
    ctx: &'a Ctx<N>,
    /// The slot generation this batch owns; 0 for a batch refused at its
    /// start because another of the task's batches was in flight.
    gen: u32,
}

/// Where the slot's current batch stands (from its start to its result).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Being built, or submitted and not yet polled.
    Building,
    /// Submitted; waiting for an earlier batch of the slot (one whose
    /// future was dropped, or the background groups of a `submit_first`)
    /// to finish: its buffers are still the NIC's.
    Idle,
    /// Posted; waiting for the first group (`submit_first`).
    First,
    /// Posted; waiting for every group.
    All,
    /// Its result was returned, or its future dropped.
    Over,
}

/// The slot's state for the batch being built or posted, reset by each
/// new batch. Cells: the slot belongs to one executor thread.
pub(crate) struct Building {
    pub(crate) len: Cell<u8>,
    /// The first problem met while building.
    pub(crate) error: Cell<Option<VerbError>>,
    pub(crate) stage: Cell<Stage>,
    /// Groups posted (a batch has at most `MAX_BATCH`).
    pub(crate) groups: Cell<u8>,
}

impl Building {
    pub(crate) fn new() -> Building {
        Building {
            len: Cell::new(0),
            error: Cell::new(None),
            stage: Cell::new(Stage::Over),
            groups: Cell::new(0),
        }
    }
}

impl<N: Nic> Drop for Batch<'_, N> {
    fn drop(&mut self) {
        // A batch dropped before it was submitted posted nothing, so its
        // buffers are nobody's: free them now rather than leave them pinned
        // under buffers the task allocates before its next batch.
        if let Some(slot) = self.owned() {
            slot.building.stage.set(Stage::Over);
            slot.clear_storage();
        }
    }
}

impl<'a, N: Nic> Batch<'a, N> {
    pub(crate) fn new(ctx: &'a Ctx<N>) -> Batch<'a, N> {
        let slot = ctx.s();
        if slot.busy.get() {
            // Another sub-future of this task has a batch in flight; its
            // storage must not be touched.
            return Batch { ctx, gen: 0 };
        }
        let gen = slot.start_batch();
        let b = &slot.building;
        b.len.set(0);
        b.error.set(None);
        b.stage.set(Stage::Building);
        Batch { ctx, gen }
    }

    /// The slot, while this batch is the one it is building.
    fn owned(&self) -> Option<&'a Slot> {
        let slot = self.ctx.s();
        (self.gen != 0
            && slot.gen.get() == self.gen
            && slot.building.stage.get() == Stage::Building)
            .then_some(slot)
    }

    pub fn len(&self) -> usize {
        self.owned().map_or(0, |s| s.building.len.get() as usize)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn fail(&mut self, e: VerbError) -> OpId {
        if let Some(slot) = self.owned() {
            let error = &slot.building.error;
            if error.get().is_none() {
                error.set(Some(e));
            }
        }
        OpId(MAX_BATCH as u8)
    }

    fn push(
        &mut self,
        addr: GlobalAddr,
        len: u64,
        buf: Option<Buf>,
        make: impl FnOnce(RKey, Sge) -> WrOp,
    ) -> OpId {
        // A refused or superseded batch reports that at submit.
        let Some(slot) = self.owned() else {
            return OpId(MAX_BATCH as u8);
        };
        let b = &slot.building;
        if b.error.get().is_some() {
            return OpId(MAX_BATCH as u8);
        }
        let ix = b.len.get() as usize;
        if ix == MAX_BATCH {
            return self.fail(VerbError::BatchFull { max: MAX_BATCH });
        }
        let local = match &buf {
            Some(b) => match b.sge_for(&slot.arena) {
                Ok(sge) => sge,
                Err(e) => return self.fail(e),
            },
            None => Sge {
                // SAFETY: word `ix` of the slot's MAX_BATCH-word atomics area.
                addr: unsafe { slot.atomics.add(ix) } as *mut u8,
                len: 8,
                lkey: self.ctx.core.lkey,
            },
        };
        let rkey = match self.ctx.rkey_for(addr, len) {
            Ok(k) => k,
            Err(e) => return self.fail(e),
        };
        let wr = WorkRequest {
            wr_id: encode_wr_id(self.ctx.slot, 0, ix, false),
            signaled: false,
            op: make(rkey, local),
        };
        slot.store(ix, addr.node(), wr, buf);
        b.len.set(ix as u8 + 1);
        OpId(ix as u8)
    }

    /// READ into `buf` (its whole length); the buffer comes back through
    /// [`Done::take_buf`].
    pub fn read(&mut self, addr: GlobalAddr, buf: Buf) -> OpId {
        self.push(addr, buf.len() as u64, Some(buf), |rkey, local| {
            WrOp::Read {
                remote: addr,
                rkey,
                local,
            }
        })
    }

    /// READ of `len` bytes into a fresh scratch buffer.
    pub fn read_new(&mut self, addr: GlobalAddr, len: usize) -> OpId {
        match self.ctx.alloc_for_read(len) {
            Ok(b) => self.read(addr, b),
            Err(e) => self.fail(e),
        }
    }

    /// WRITE of `buf` (inline when it fits the device's inline limit).
    pub fn write(&mut self, addr: GlobalAddr, buf: Buf) -> OpId {
        let inline = buf.len() as u32 <= self.ctx.core.caps.max_inline_bytes;
        self.push(addr, buf.len() as u64, Some(buf), |rkey, local| {
            WrOp::Write {
                remote: addr,
                rkey,
                local,
                inline,
            }
        })
    }

    /// WRITE of a copy of `data`.
    pub fn write_bytes(&mut self, addr: GlobalAddr, data: &[u8]) -> OpId {
        match arena::alloc_copy(&self.ctx.s().arena, data) {
            Some(b) => self.write(addr, b),
            None => {
                let e = self.ctx.no_scratch(data.len());
                self.fail(e)
            }
        }
    }

    /// WRITE of one little-endian word.
    pub fn write_u64(&mut self, addr: GlobalAddr, v: u64) -> OpId {
        self.write_bytes(addr, &v.to_le_bytes())
    }

    pub fn cas(&mut self, addr: GlobalAddr, compare: u64, swap: u64) -> OpId {
        self.push(addr, 8, None, |rkey, local| WrOp::Cas {
            remote: addr,
            rkey,
            compare,
            swap,
            local,
        })
    }

    pub fn faa(&mut self, addr: GlobalAddr, add: u64) -> OpId {
        self.push(addr, 8, None, |rkey, local| WrOp::Faa {
            remote: addr,
            rkey,
            add,
            local,
        })
    }

    pub fn masked_cas(
        &mut self,
        addr: GlobalAddr,
        compare: u64,
        compare_mask: u64,
        swap: u64,
        swap_mask: u64,
    ) -> OpId {
        self.push(addr, 8, None, |rkey, local| WrOp::MaskedCas {
            remote: addr,
            rkey,
            compare,
            compare_mask,
            swap,
            swap_mask,
            local,
        })
    }

    /// Replaces the rkey of a request already added (tests of the
    /// responder's key check use it).
    pub fn set_rkey(&mut self, op: OpId, key: RKey) {
        if let Some(slot) = self.owned().filter(|s| op.0 < s.building.len.get()) {
            slot.with_wr(op.0 as usize, |wr| match &mut wr.op {
                WrOp::Read { rkey, .. }
                | WrOp::Write { rkey, .. }
                | WrOp::Cas { rkey, .. }
                | WrOp::Faa { rkey, .. }
                | WrOp::MaskedCas { rkey, .. } => *rkey = key,
            });
        }
    }

    /// Posts the batch and waits for it: one round trip. Succeeds only if
    /// every request succeeded; otherwise returns the first failure.
    pub fn submit(self) -> Submit<'a, N> {
        Submit(self.posting(false))
    }

    /// Posts the batch and waits until the first of its doorbells (one per
    /// node it reaches) completed, every request of that doorbell
    /// acknowledged: FaRM's coordinator reports a commit after the first
    /// COMMIT-PRIMARY acknowledgement. The other doorbells complete in the
    /// background; the task's next batch waits for them before it posts,
    /// and [`Ctx::settle`] waits for them and says whether they succeeded.
    /// `Ok` if every request completed so far succeeded. No results come
    /// back: use it for WRITEs.
    pub fn submit_first(self) -> SubmitFirst<'a, N> {
        SubmitFirst(self.posting(true))
    }

    fn posting(self, first: bool) -> Posting<'a, N> {
        let p = Posting {
            ctx: self.ctx,
            gen: self.gen,
            first,
        };
        // The posting owns the batch's storage now (a never-polled one
        // frees it when dropped, as the batch would have).
        std::mem::forget(self);
        p
    }
}

/// Future of [`Batch::submit`].
///
/// Written by hand rather than as an `async fn`, and two words: its state
/// is in the slot (`Building`). A task moves the future of every batch
/// it awaits into its own state; an `async fn`'s (the batch, a guard, the
/// nested waits: 140 bytes) was copied by a `memcpy` call twice per batch,
/// about a seventh of the CPU of an 8-byte READ on emu.
#[must_use = "futures do nothing unless awaited"]
pub struct Submit<'a, N: Nic>(Posting<'a, N>);

/// Future of [`Batch::submit_first`].
#[must_use = "futures do nothing unless awaited"]
pub struct SubmitFirst<'a, N: Nic>(Posting<'a, N>);

impl<'a, N: Nic> Future for Submit<'a, N> {
    type Output = Result<Done<'a>, VerbError>;
    #[inline(always)]
    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.0.step().map(|end| match end {
            End::Done => Ok(self.0.done()),
            End::InFlight => unreachable!("a whole submit waits for every group"),
            End::Failed => Err(self.0.error()),
        })
    }
}

impl<N: Nic> Future for SubmitFirst<'_, N> {
    type Output = Result<(), VerbError>;
    #[inline(always)]
    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.0.step().map(|end| match end {
            End::Done | End::InFlight => Ok(()),
            End::Failed => Err(self.0.error()),
        })
    }
}

/// How a posting ended. The error of a failed one waits in the slot
/// (`Building::error`), and the results are made from the slot by the
/// future: a one-byte answer passes in a register, where the whole
/// `Result` went through memory (a store-forwarding stall per batch).
#[derive(Copy, Clone, PartialEq, Eq)]
enum End {
    /// Every group completed, every request succeeded.
    Done,
    /// The first group completed and succeeded (`submit_first`); the
    /// others are in flight.
    InFlight,
    /// Something failed.
    Failed,
}

/// A batch being posted and waited for: the state machine behind
/// [`Submit`] and [`SubmitFirst`], its state in the slot. The slot's
/// `busy` flag is held from the post until the result (cleared on drop
/// too, when the future is dropped early), so another sub-future of the
/// task cannot start a batch over storage the NIC still owns.
struct Posting<'a, N: Nic> {
    ctx: &'a Ctx<N>,
    gen: u32,
    first: bool,
}

impl<N: Nic> Drop for Posting<'_, N> {
    fn drop(&mut self) {
        let Some(slot) = self.owned() else {
            return;
        };
        // Never polled: nothing was posted, the buffers are nobody's.
        // Posted: the storage stays the NIC's until the groups are in
        // (the next batch waits for that).
        if slot.building.stage.get() == Stage::Building {
            slot.clear_storage();
        }
        Self::end(slot);
    }
}

impl<'a, N: Nic> Posting<'a, N> {
    /// The slot, while this posting's batch is its current one.
    fn owned(&self) -> Option<&'a Slot> {
        let slot = self.ctx.s();
        (self.gen != 0 && slot.gen.get() == self.gen).then_some(slot)
    }

    /// Ends the posting: a posted one gives the slot's `busy` flag (and
    /// the per-group wake-ups of a `submit_first`) back.
    fn end(slot: &Slot) {
        if matches!(slot.building.stage.get(), Stage::First | Stage::All) {
            slot.busy.set(false);
            slot.wake_each.set(false);
        }
        slot.building.stage.set(Stage::Over);
    }

    /// Ends the posting with `end`. The slot is released first, so that
    /// the results (whose drop frees buffers only when the slot is not
    /// busy) and the next batch see it free.
    fn finish(slot: &Slot, end: End) -> Poll<End> {
        Self::end(slot);
        Poll::Ready(end)
    }

    /// The error of a failed posting (or of a refused or superseded one).
    fn error(&self) -> VerbError {
        if self.gen == 0 {
            return VerbError::BatchInProgress;
        }
        self.owned()
            .and_then(|s| s.building.error.take())
            .unwrap_or(VerbError::BatchSuperseded)
    }

    /// Advances as far as it can: the stages in order, each falling
    /// through to the next (straight-line tests rather than a `match` in
    /// a loop, whose indirect jump per stage the CPU mispredicted).
    fn step(&self) -> Poll<End> {
        let Some(slot) = self.owned() else {
            // Refused, or superseded ([`Posting::error`] says which).
            return Poll::Ready(End::Failed);
        };
        let b = &slot.building;
        let mut stage = b.stage.get();
        if stage == Stage::Building {
            if b.error.get().is_some() {
                // Nothing was posted: free the buffers this batch took,
                // and say so to `Ctx::last_batch_nodes` (which would
                // otherwise describe the batch before: a failed one's
                // nodes, taken for where this one's WRITEs failed or
                // landed). With an earlier batch's groups still in flight,
                // which nodes they reach is not this batch's to say: not
                // tracked.
                slot.clear_storage();
                if slot.pending.get() == 0 && slot.arena.inflight() == 0 {
                    slot.posted_nodes.set(0);
                    slot.failed_nodes.set(0);
                    slot.wide.set(false);
                } else {
                    slot.wide.set(true);
                }
                return Self::finish(slot, End::Failed);
            }
            if b.len.get() == 0 {
                return Self::finish(slot, End::Done);
            }
            stage = Stage::Idle;
            b.stage.set(stage);
        }
        if stage == Stage::Idle {
            // The executor wakes the slot when its last in-flight group
            // completes.
            if slot.arena.inflight() > 0 {
                return Poll::Pending;
            }
            stage = self.post(slot);
            // On a NIC that completes at post, the results are in the
            // queue already: a task alone on its core routes them now and
            // falls through to the wait.
            self.ctx.core_ref().complete_inline(slot);
        }
        if stage == Stage::First {
            if slot.pending.get() >= b.groups.get() as u32 {
                return Poll::Pending;
            }
            if b.error.get().is_none() && slot.failure.get().is_none() {
                // The rest completes in the background: this batch's
                // storage stays the NIC's until then.
                return Self::finish(slot, End::InFlight);
            }
            // What failed is known only once every group is in.
            slot.wake_each.set(false);
            stage = Stage::All;
            b.stage.set(stage);
        }
        if stage == Stage::All {
            if slot.pending.get() > 0 {
                return Poll::Pending;
            }
            return self.complete(slot);
        }
        panic!("a batch future polled after it returned")
    }

    /// Posts the stored requests, a doorbell per node, and moves to the
    /// wait: for every group, or the first (`submit_first`), or none when
    /// nothing could be posted. A refused post is kept as the batch's
    /// error, reported once the groups that did go out are in.
    fn post(&self, slot: &Slot) -> Stage {
        let ctx = self.ctx;
        let b = &slot.building;
        let seq = slot.begin_post();
        let (groups, post_err) = slot.post_groups(b.len.get() as usize, seq, |node, wrs| {
            // SAFETY: each local SGE is a Buf held in the slot's storage
            // until every group of the batch completed. If this future is
            // dropped first, or returns at the first group, a later batch
            // may clear the storage (it does so as it starts, before it
            // waits for the slot to be idle), but dropping a Buf while the
            // slot has requests in flight leaves its bytes a reserved hole
            // in the arena until nothing is in flight: no later Buf gets
            // them while the NIC may still write them. Or it is a word of
            // the slot's atomics area, which the next batch reuses only
            // after it waited for the slot to be idle.
            // All of it lies in the executor's registered scratch under the
            // core's lkey, kept alive by the arena's reference count.
            unsafe { ctx.post(node, wrs) }
        });
        slot.pending.set(groups);
        b.groups.set(groups as u8);
        // (The error is None here: a batch with one never posts.)
        if post_err.is_some() {
            b.error.set(post_err);
        }
        if groups > 0 {
            slot.bump(|c| c.round_trips += 1);
        }
        let stage = if self.first && groups > 0 && post_err.is_none() {
            slot.wake_each.set(true);
            Stage::First
        } else {
            Stage::All
        };
        b.stage.set(stage);
        stage
    }

    /// Every posted group is in: the batch's result.
    fn complete(&self, slot: &Slot) -> Poll<End> {
        // A failed batch's buffers are freed at once: every posted group
        // has completed, so the NIC is done with them, and holding them
        // until the next batch would pin arena space below buffers
        // allocated meanwhile.
        if slot.building.error.get().is_none() {
            slot.building.error.set(failure_of(slot));
        }
        if slot.building.error.get().is_some() {
            slot.clear_storage();
            return Self::finish(slot, End::Failed);
        }
        Self::finish(slot, End::Done)
    }

    /// The results of a posting that ended `Done`.
    fn done(&self) -> Done<'a> {
        let slot = self.ctx.s();
        Done {
            slot,
            gen: self.gen,
            len: slot.building.len.get(),
        }
    }
}

/// The slot's first failure of its current batch as an error, taken.
fn failure_of(slot: &Slot) -> Option<VerbError> {
    slot.failure
        .take()
        .map(|(op, status, node)| VerbError::Failed {
            node,
            op,
            opcode: slot.opcode_of(op as usize),
            status,
        })
}

/// Future of [`Ctx::read_into`].
#[must_use = "futures do nothing unless awaited"]
pub struct ReadInto<'a, N: Nic> {
    ctx: &'a Ctx<N>,
    addr: GlobalAddr,
    /// The buffer, until it is handed back (or dropped with the future).
    buf: Option<Buf>,
    /// The slot generation of the posted READ (never 0); 0 before the
    /// post.
    gen: u32,
    /// The result was returned.
    over: bool,
}

impl<N: Nic> ReadInto<'_, N> {
    /// Posts the READ; the error of a refused post (nothing in flight).
    fn post(&mut self, slot: &Slot) -> Result<(), VerbError> {
        let ctx = self.ctx;
        // First, as `Ctx::batch` does: whatever follows, a batch being
        // built is superseded.
        let gen = slot.start_batch();
        let buf = self.buf.as_ref().expect("a READ posts its buffer once");
        let local = buf.sge_for(&slot.arena)?;
        let rkey = ctx.rkey_for(self.addr, local.len as u64)?;
        let seq = slot.begin_post();
        let wr = [WorkRequest {
            wr_id: encode_wr_id(ctx.slot, seq, 0, true),
            signaled: true,
            op: WrOp::Read {
                remote: self.addr,
                rkey,
                local,
            },
        }];
        let node = self.addr.node();
        // SAFETY: the local SGE is `buf`, a buffer of the slot's arena in
        // the registered scratch under the core's lkey, kept alive by the
        // arena's reference count. This future holds it until the READ
        // completes; dropped earlier, the buffer's bytes are not handed
        // out again until the slot has nothing in flight (arena.rs).
        if let Err(e) = unsafe { ctx.post(node, &wr) } {
            slot.busy.set(false);
            return Err(e);
        }
        slot.posted(node, &wr);
        // Kept where a batch keeps its requests, so that a failure
        // reported later (`Ctx::settle` after this future was dropped)
        // names a READ.
        slot.with_wr(0, |w| *w = wr[0]);
        slot.bump(|c| c.round_trips += 1);
        slot.pending.set(1);
        self.gen = gen;
        ctx.core_ref().complete_inline(slot);
        Ok(())
    }
}

impl<N: Nic> Future for ReadInto<'_, N> {
    type Output = Result<Buf, VerbError>;

    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Unpin (references, an Option<Buf>, words): no pinning to keep.
        let this = self.get_mut();
        let slot = this.ctx.s();
        assert!(!this.over, "a READ future polled after it returned");
        if this.gen == 0 {
            if slot.busy.get() {
                this.over = true;
                return Poll::Ready(Err(VerbError::BatchInProgress));
            }
            // An earlier batch's doorbells (a dropped future's, or a
            // `submit_first`'s in the background) still own buffers: the
            // executor wakes the slot when the last completes.
            if slot.arena.inflight() > 0 {
                return Poll::Pending;
            }
            if let Err(e) = this.post(slot) {
                this.over = true;
                return Poll::Ready(Err(e));
            }
        }
        // No other batch can start while the slot is busy.
        debug_assert_eq!(slot.gen.get(), this.gen);
        if slot.pending.get() > 0 {
            return Poll::Pending;
        }
        slot.busy.set(false);
        this.over = true;
        if let Some((op, status, node)) = slot.failure.take() {
            return Poll::Ready(Err(VerbError::Failed {
                node,
                op,
                opcode: Opcode::Read,
                status,
            }));
        }
        Poll::Ready(Ok(this.buf.take().expect("taken once")))
    }
}

impl<N: Nic> Drop for ReadInto<'_, N> {
    fn drop(&mut self) {
        // Dropped in flight: the slot may start its next batch, which waits
        // for this READ's completion before posting; the buffer's bytes
        // stay reserved until then (arena.rs).
        let slot = self.ctx.s();
        if self.gen != 0 && !self.over {
            debug_assert!(slot.gen.get() == self.gen && slot.busy.get());
            slot.busy.set(false);
        }
    }
}

/// Until the slot has nothing in flight.
struct SlotIdle<'a> {
    slot: &'a Slot,
}

impl Future for SlotIdle<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        // The executor wakes the slot when its last in-flight group
        // completes.
        if self.slot.arena.inflight() > 0 {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    }
}

/// Results of a completed batch, valid until the task starts its next batch
/// (asking after that is a bug and panics). Buffers are moved out with
/// [`take_buf`](Done::take_buf); untaken ones are freed when the results are
/// dropped.
pub struct Done<'a> {
    slot: &'a Slot,
    gen: u32,
    len: u8,
}

impl Drop for Done<'_> {
    fn drop(&mut self) {
        // Untaken buffers are freed with the results rather than by the next
        // batch: the task may allocate before then, and a buffer freed under
        // a newer one would pin its bytes until that one is gone too. The
        // batch completed, so the NIC is done with them; a later batch (a
        // different generation) owns the storage now and is left alone.
        if self.slot.gen.get() == self.gen && !self.slot.busy.get() {
            self.slot.clear_storage();
        }
    }
}

impl Done<'_> {
    pub fn len(&self) -> usize {
        self.len as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn check(&self, op: OpId) -> usize {
        assert_eq!(
            self.slot.gen.get(),
            self.gen,
            "batch results used after the next batch was started"
        );
        assert!(op.0 < self.len, "request {} is not in this batch", op.0);
        op.0 as usize
    }

    /// Takes back the buffer of a READ or WRITE. Asking twice, or for an
    /// atomic, is a bug and panics.
    #[inline]
    pub fn take_buf(&mut self, op: OpId) -> Buf {
        let ix = self.check(op);
        self.slot
            .take_buf(ix)
            .expect("no buffer for this request (an atomic, or taken already)")
    }

    /// The old value an atomic returned.
    pub fn old(&self, op: OpId) -> u64 {
        let ix = self.check(op);
        assert!(
            self.slot.opcode_of(ix).is_atomic(),
            "request {ix} is not an atomic"
        );
        // SAFETY: the batch completed, so the NIC is done with word ix of the
        // atomics area, and no later batch has started (checked above).
        unsafe { self.slot.atomics.add(ix).read_unaligned() }
    }

    /// The first 8 bytes a READ returned, as a little-endian word (without
    /// taking the buffer).
    pub fn word(&self, op: OpId) -> u64 {
        let ix = self.check(op);
        self.slot.peek_word(ix).expect("no buffer for this request")
    }
}

/// Future of [`Ctx::yield_now`].
pub struct YieldNow {
    yielded: bool,
}

impl Future for YieldNow {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.yielded {
            return Poll::Ready(());
        }
        self.yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}
