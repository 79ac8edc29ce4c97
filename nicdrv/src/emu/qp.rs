//! The emu device context, its completion queues and queue pairs.

use super::node::EmuEndpoint;
use super::EmuConfig;
use crate::addr::NodeId;
use crate::nic::{
    CompletionQueue, CqId, Mr, Nic, QpState, QueuePair, RecoverError, RegError, RegisterableMemory,
    Registration, RemoteRegion,
};
use crate::verbs::{
    Access, Caps, Completion, LKey, PostError, RKey, Sge, WcStatus, WorkRequest, WrOp,
};
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

const MAX_LOCAL_MRS: usize = 1024;
const LKEY_INDEX_MASK: u32 = (MAX_LOCAL_MRS as u32) - 1;

/// One entry of the process-local table of registered memory. `lkey` is
/// written last with Release on registration and cleared first on
/// deregistration, so a reader that sees a key (Acquire) sees its range.
struct LocalMrSlot {
    lkey: AtomicU32,
    base: AtomicU64,
    len: AtomicU64,
    access: AtomicU8,
}

struct NicInner {
    cfg: EmuConfig,
    mrs: Box<[LocalMrSlot]>,
    next_qp_num: AtomicU32,
    key_tag: AtomicU32,
}

/// The emu device context: one per process is enough; clones share it.
/// A clone made by [`EmuNic::on_machine`] also sees one memory node as its
/// machine's own memory (the local view).
#[derive(Clone)]
pub struct EmuNic {
    inner: Arc<NicInner>,
    local: Option<crate::local::MachineMemory>,
}

impl EmuNic {
    pub fn new(cfg: EmuConfig) -> EmuNic {
        let mrs = (0..MAX_LOCAL_MRS)
            .map(|_| LocalMrSlot {
                lkey: AtomicU32::new(0),
                base: AtomicU64::new(0),
                len: AtomicU64::new(0),
                access: AtomicU8::new(0),
            })
            .collect();
        EmuNic {
            inner: Arc::new(NicInner {
                cfg,
                mrs,
                next_qp_num: AtomicU32::new(1),
                key_tag: AtomicU32::new(1),
            }),
            local: None,
        }
    }

    /// This device as the cores of a machine that owns memory node `node`
    /// (created here or attached) see it: the same device, plus the node's
    /// host memory as the local view, through word atomics on the shared
    /// mapping (range writes through its line words). The mapping stays up
    /// while the returned value lives.
    pub fn on_machine(&self, node: &EmuEndpoint) -> EmuNic {
        // SAFETY: the Arc beside the view (an endpoint holding the map)
        // keeps the node mapped for as long as the view or a clone lives.
        let local = unsafe {
            crate::local::MachineMemory::new(
                crate::local::SharedLocal::with_lines(node.map.lines(crate::Space::Host).alias()),
                Arc::new(node.clone()),
            )
        };
        EmuNic {
            inner: self.inner.clone(),
            local: Some(local),
        }
    }

    pub fn config(&self) -> &EmuConfig {
        &self.inner.cfg
    }

    /// A completion queue of `capacity` entries (`ibv_create_cq`).
    pub fn create_cq(&self, capacity: u32) -> Result<EmuCq, RegError> {
        if capacity == 0 || capacity > self.inner.cfg.max_cqe {
            return Err(RegError::Device(format!(
                "a completion queue of {capacity} entries (1 ..= {} on this NIC)",
                self.inner.cfg.max_cqe
            )));
        }
        Ok(EmuCq {
            inner: Rc::new(CqInner {
                delay: self.inner.cfg.injects_delay(),
                nic: self.clone(),
                queue: RefCell::new(VecDeque::with_capacity(capacity as usize)),
                capacity,
                reserved: Cell::new(0),
                qps: RefCell::new(Vec::new()),
            }),
        })
    }

    /// A queue pair in the INIT state (`ibv_create_qp`); connect it to a
    /// memory node to make it ready. Its depth is reserved in the CQ so the
    /// CQ can never overflow.
    pub fn create_qp(&self, cq: &EmuCq, depth: u32) -> Result<EmuPreparedQp, RegError> {
        if depth == 0 || depth > self.inner.cfg.max_send_wr {
            return Err(RegError::Device(format!(
                "a queue pair of depth {depth} (1 ..= {} on this NIC)",
                self.inner.cfg.max_send_wr
            )));
        }
        let reserved = cq.inner.reserved.get().saturating_add(depth);
        if reserved > cq.inner.capacity {
            return Err(RegError::Device(format!(
                "completion queue of {} entries cannot serve another queue pair of depth {depth}",
                cq.inner.capacity
            )));
        }
        cq.inner.reserved.set(reserved);
        Ok(EmuPreparedQp {
            nic: self.clone(),
            cq: cq.inner.clone(),
            depth,
            qp_num: self.inner.next_qp_num.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// Registers raw memory.
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay valid until the returned registration drops.
    pub unsafe fn register_raw(
        &self,
        ptr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<EmuReg, RegError> {
        if ptr.is_null() || len == 0 {
            return Err(RegError::Empty);
        }
        for (idx, slot) in self.inner.mrs.iter().enumerate() {
            // Claim a free slot with a reserved marker so no reader sees a
            // half-written entry; the real key is published after the range.
            if slot
                .lkey
                .compare_exchange(0, u32::MAX, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                // Release fence: orders the marker before the range stores
                // below, so a `local_ok` that loads any of them sees the
                // old key gone at its recheck (a seqlock's writer side).
                std::sync::atomic::fence(Ordering::Release);
                let lkey = lkey_for(self.inner.key_tag.fetch_add(1, Ordering::Relaxed), idx);
                slot.base.store(ptr as u64, Ordering::Relaxed);
                slot.len.store(len as u64, Ordering::Relaxed);
                slot.access.store(access.bits(), Ordering::Relaxed);
                slot.lkey.store(lkey, Ordering::Release);
                return Ok(EmuReg {
                    nic: self.inner.clone(),
                    idx,
                    lkey,
                });
            }
        }
        Err(RegError::TooManyRegions)
    }

    /// True when `sge` lies inside a live region registered under its lkey
    /// that grants `need`.
    fn local_ok(&self, sge: &Sge, need: Access) -> bool {
        let idx = (sge.lkey.0 & LKEY_INDEX_MASK) as usize;
        let slot = &self.inner.mrs[idx];
        // 0 is no key and all ones the claim marker of a slot being
        // registered (whose range may still be the last region's): no
        // registration hands either out.
        if sge.lkey.0 == 0
            || sge.lkey.0 == u32::MAX
            || slot.lkey.load(Ordering::Acquire) != sge.lkey.0
        {
            return false;
        }
        let base = slot.base.load(Ordering::Relaxed);
        let len = slot.len.load(Ordering::Relaxed);
        let access = Access::from_bits_truncate(slot.access.load(Ordering::Relaxed));
        // Acquire fence, then the key again: if a range load above saw a
        // later registration's store (the slot freed and claimed anew
        // meanwhile), that claim's marker and Release fence came first, so
        // the key read now is no longer ours (a seqlock's reader side).
        std::sync::atomic::fence(Ordering::Acquire);
        if slot.lkey.load(Ordering::Relaxed) != sge.lkey.0 {
            return false;
        }
        access.contains(need)
            && crate::nic::range_within(base, len, sge.addr as u64, u64::from(sge.len))
    }
}

/// The lkey of slot `idx` for the `counter`-th registration: a tag in
/// the bits above the slot index, 1..=0x3f_fffe, so a key is never 0 (no
/// key) and never all ones (with slot 1023, the claim marker).
fn lkey_for(counter: u32, idx: usize) -> u32 {
    debug_assert!(idx < MAX_LOCAL_MRS);
    ((counter % 0x3f_fffe + 1) << 10) | idx as u32
}

/// A local registration; dropping it deregisters.
pub struct EmuReg {
    nic: Arc<NicInner>,
    idx: usize,
    lkey: u32,
}

impl Registration for EmuReg {
    fn lkey(&self) -> LKey {
        LKey(self.lkey)
    }
    fn rkey(&self) -> RKey {
        // Compute-side memory is not exposed to peers in emu.
        RKey(self.lkey)
    }
}

impl Drop for EmuReg {
    fn drop(&mut self) {
        // Release pairs with the Acquire claim in register_raw.
        self.nic.mrs[self.idx].lkey.store(0, Ordering::Release);
    }
}

impl Nic for EmuNic {
    type Qp = EmuQp;
    type Cq = EmuCq;
    type Reg = EmuReg;

    fn caps(&self) -> Caps {
        let c = &self.inner.cfg;
        Caps {
            masked_cas: c.masked_cas,
            max_inline_bytes: c.max_inline_bytes,
            max_msg_bytes: c.max_msg_bytes,
            max_send_wr: c.max_send_wr,
            max_cqe: c.max_cqe,
        }
    }

    fn now_ns(&self) -> u64 {
        crate::clock::now_ns()
    }

    /// `post_send` executes each request and queues its completion due at
    /// once unless a delay is injected.
    fn completes_at_post(&self) -> bool {
        !self.inner.cfg.injects_delay()
    }

    fn register<M: RegisterableMemory>(
        &self,
        mem: M,
        access: Access,
    ) -> Result<Mr<M, EmuReg>, RegError> {
        // SAFETY: the Mr owns `mem` and drops the registration first.
        let reg = unsafe { self.register_raw(mem.as_ptr(), mem.len(), access)? };
        Ok(Mr::new(reg, mem))
    }

    crate::local::shared_local_view!();
}

struct Pending {
    due_ns: u64,
    wc: Completion,
    qp_slot: u32,
    retire: u32,
}

struct QpShared {
    outstanding: Cell<u32>,
}

struct CqInner {
    nic: EmuNic,
    /// `cfg.injects_delay()`, fixed with the device's configuration.
    delay: bool,
    queue: RefCell<VecDeque<Pending>>,
    capacity: u32,
    reserved: Cell<u32>,
    qps: RefCell<Vec<Rc<QpShared>>>,
}

/// An emu completion queue. Not `Send`: a core makes its own at start.
pub struct EmuCq {
    inner: Rc<CqInner>,
}

impl CompletionQueue for EmuCq {
    fn id(&self) -> CqId {
        CqId(Rc::as_ptr(&self.inner) as usize, 0)
    }

    fn poll(&mut self, out: &mut [Completion]) -> usize {
        let inner = &*self.inner;
        let mut q = inner.queue.borrow_mut();
        let qps = inner.qps.borrow();
        // Without injected delay every queued completion is due: take as
        // many as fit in one pass.
        let n = if inner.delay {
            let now = inner.nic.now_ns();
            q.iter()
                .take(out.len())
                .take_while(|p| p.due_ns <= now)
                .count()
        } else {
            q.len().min(out.len())
        };
        // `pop_front` rather than `drain`: a drain builds and drops an
        // iterator over the ring's two halves, 50 instructions for one
        // completion.
        for o in &mut out[..n] {
            let Some(p) = q.pop_front() else {
                unreachable!("counted above")
            };
            let sh = &qps[p.qp_slot as usize];
            debug_assert!(sh.outstanding.get() >= p.retire);
            sh.outstanding.set(sh.outstanding.get() - p.retire);
            *o = p.wc;
        }
        n
    }
}

/// A queue pair made but not yet connected (INIT).
pub struct EmuPreparedQp {
    nic: EmuNic,
    cq: Rc<CqInner>,
    depth: u32,
    qp_num: u32,
}

impl EmuPreparedQp {
    /// Connects to a memory node (INIT → RTR → RTS), learning its regions.
    pub fn connect(mut self, peer: &EmuEndpoint) -> EmuQp {
        // The reservation passes to the connected queue pair (this one's
        // drop gives back none).
        let depth = std::mem::take(&mut self.depth);
        let shared = Rc::new(QpShared {
            outstanding: Cell::new(0),
        });
        // A dropped queue pair's slot is taken again (its drop took its
        // completions from the queue, and only the list still holds its
        // count), so the list is as long as the most queue pairs ever
        // connected at once, which the CQ's reservations bound.
        let slot = {
            let mut qps = self.cq.qps.borrow_mut();
            match qps.iter().position(|q| Rc::strong_count(q) == 1) {
                Some(free) => {
                    qps[free] = shared.clone();
                    free
                }
                None => {
                    qps.push(shared.clone());
                    qps.len() - 1
                }
            }
        };
        // Every connected queue pair reserves at least one entry of the
        // CQ's u32 capacity, so fewer than 2^32 are connected at once.
        let slot = u32::try_from(slot).expect("more queue pairs than CQ entries");
        let mut regions = Vec::with_capacity(super::MAX_REGIONS);
        let regions_gen = peer.map.read_regions(&mut regions);
        EmuQp {
            caps: self.nic.caps(),
            delay: self.nic.inner.cfg.injects_delay(),
            nic: self.nic.clone(),
            cq: self.cq.clone(),
            shared,
            slot,
            qp_num: self.qp_num,
            depth,
            peer: peer.clone(),
            regions,
            regions_gen,
            state: QpState::Ready,
            unsignaled: 0,
            busy_until_ns: 0,
        }
    }
}

/// A connected emu queue pair.
pub struct EmuQp {
    nic: EmuNic,
    caps: Caps,
    /// `cfg.injects_delay()`, fixed with the device's configuration.
    delay: bool,
    cq: Rc<CqInner>,
    shared: Rc<QpShared>,
    slot: u32,
    qp_num: u32,
    depth: u32,
    peer: EmuEndpoint,
    regions: Vec<RemoteRegion>,
    regions_gen: u64,
    state: QpState,
    /// Successful unsignaled requests not yet retired by a completion.
    unsignaled: u32,
    busy_until_ns: u64,
}

impl EmuQp {
    pub fn endpoint(&self) -> &EmuEndpoint {
        &self.peer
    }

    #[inline]
    fn push(&mut self, wr: &WorkRequest, status: WcStatus, due_ns: u64) {
        let retire = self.unsignaled + 1;
        self.unsignaled = 0;
        let wc = Completion {
            wr_id: wr.wr_id,
            status,
            opcode: wr.op.opcode(),
            byte_len: if status.is_ok() { wr.op.len() } else { 0 },
            qp_num: self.qp_num,
        };
        let mut q = self.cq.queue.borrow_mut();
        // The CQ reserved this QP's depth at creation and outstanding never
        // exceeds depth, so the queue cannot overflow.
        assert!(q.len() < self.cq.capacity as usize, "emu CQ overflow");
        q.push_back(Pending {
            due_ns,
            wc,
            qp_slot: self.slot,
            retire,
        });
    }

    /// When a request of `len` bytes posted now completes.
    fn due(&mut self, now_ns: u64, len: u32) -> u64 {
        if !self.delay {
            return 0;
        }
        let cfg = &self.nic.inner.cfg;
        let xfer = if cfg.bandwidth_bytes_per_sec == 0 {
            0
        } else {
            (len as u128 * 1_000_000_000 / cfg.bandwidth_bytes_per_sec as u128) as u64
        };
        // Saturating: a latency or transfer past u64's nanoseconds means
        // never, not a wrap to "already due".
        self.busy_until_ns = self.busy_until_ns.max(now_ns).saturating_add(xfer);
        self.busy_until_ns
            .saturating_add(cfg.latency_ns_one_way.saturating_mul(2))
    }

    /// Executes one request against the peer's memory: the responder's
    /// checks (rkey, bounds, rights, alignment), then the access.
    ///
    /// # Safety
    /// As for `post_send`: the local SGE is valid and unaliased.
    unsafe fn execute(&self, wr: &WorkRequest) -> WcStatus {
        // SAFETY: the caller upholds this function's `# Safety` contract, which is
        // what every unsafe operation below relies on (each argued in place).
        unsafe {
            let op = &wr.op;
            let status = crate::nic::responder_check(&self.regions, op);
            if !status.is_ok() {
                return status;
            }
            let local = op.local();
            if let Some(need) = op.local_access() {
                if !self.nic.local_ok(&local, need) {
                    return WcStatus::LocalProtection;
                }
            }
            let (space, off) = (op.remote().space(), op.remote().offset());
            let map = &self.peer.map;
            let mem = map.window(space);
            // The region table only holds ranges inside the window (register
            // checks), so these accesses are in bounds. READ and WRITE are
            // line-atomic (lines.rs); atomics are plain word RMWs outside the
            // seqlock, atomic only among themselves, as a NIC's are.
            let old = match *op {
                WrOp::Read { local, .. } => {
                    map.lines(space)
                        .read_into(off, local.addr, local.len as usize);
                    return WcStatus::Success;
                }
                WrOp::Write { local, .. } => {
                    map.lines(space)
                        .write_from(off, local.addr, local.len as usize);
                    return WcStatus::Success;
                }
                WrOp::Cas { compare, swap, .. } => mem.cas_u64(off, compare, swap),
                WrOp::Faa { add, .. } => mem.faa_u64(off, add),
                WrOp::MaskedCas {
                    compare,
                    compare_mask,
                    swap,
                    swap_mask,
                    ..
                } => mem.masked_cas_u64(off, compare, compare_mask, swap, swap_mask),
            };
            (local.addr as *mut u64).write_unaligned(old);
            WcStatus::Success
        }
    }
}

impl QueuePair for EmuQp {
    fn qp_num(&self) -> u32 {
        self.qp_num
    }

    fn peer(&self) -> NodeId {
        self.peer.node()
    }

    fn cq_id(&self) -> CqId {
        CqId(Rc::as_ptr(&self.cq) as usize, 0)
    }

    fn state(&self) -> QpState {
        self.state
    }

    fn outstanding(&self) -> u32 {
        self.shared.outstanding.get()
    }

    fn depth(&self) -> u32 {
        self.depth
    }

    fn remote_regions(&self) -> &[RemoteRegion] {
        &self.regions
    }

    unsafe fn post_send(&mut self, wrs: &[WorkRequest]) -> Result<(), PostError> {
        // SAFETY: the caller upholds `QueuePair::post_send`'s `# Safety` contract, which is
        // what every unsafe operation below relies on (each argued in place).
        unsafe {
            if self.state == QpState::Error {
                return Err(PostError::QpInError);
            }
            if wrs.is_empty() {
                return Err(PostError::EmptyBatch);
            }
            let outstanding = self.shared.outstanding.get();
            if outstanding as usize + wrs.len() > self.depth as usize {
                return Err(PostError::SendQueueFull { depth: self.depth });
            }
            let peer = self.peer.node();
            for wr in wrs {
                self.caps.check(&wr.op)?;
                if wr.op.remote().node() != peer {
                    return Err(PostError::WrongNode {
                        addr: wr.op.remote(),
                        peer,
                    });
                }
            }
            self.shared.outstanding.set(outstanding + wrs.len() as u32);
            let now = if self.delay { self.nic.now_ns() } else { 0 };
            let map = &self.peer.map;
            let gen = map.region_gen();
            if gen != self.regions_gen {
                self.regions_gen = map.read_regions(&mut self.regions);
            }
            // A dead peer answers nothing: the first request times out, the
            // rest are flushed (checked once per doorbell).
            let alive = map.is_alive();
            for (i, wr) in wrs.iter().enumerate() {
                let due = self.due(now, wr.op.len());
                let status = if alive {
                    self.execute(wr)
                } else {
                    WcStatus::RetryExceeded
                };
                if status.is_ok() {
                    if wr.signaled {
                        self.push(wr, status, due);
                    } else {
                        self.unsignaled += 1;
                    }
                    continue;
                }
                self.push(wr, status, due);
                for rest in &wrs[i + 1..] {
                    self.push(rest, WcStatus::Flushed, due);
                }
                self.state = QpState::Error;
                break;
            }
            Ok(())
        }
    }

    fn recover(&mut self) -> Result<(), RecoverError> {
        if self.state == QpState::Ready {
            return Ok(());
        }
        // In the error state every posted request has produced (or will
        // produce) a completion; recovery waits until all are polled.
        let outstanding = self.shared.outstanding.get();
        if outstanding > 0 {
            return Err(RecoverError::Busy { outstanding });
        }
        if !self.peer.is_alive() {
            return Err(RecoverError::PeerDead(self.peer.node()));
        }
        // RESET drops whatever the send queue still held.
        self.shared.outstanding.set(0);
        self.unsignaled = 0;
        self.state = QpState::Ready;
        Ok(())
    }
}

impl Drop for EmuPreparedQp {
    /// One never connected gives its reservation back.
    fn drop(&mut self) {
        self.cq.reserved.set(self.cq.reserved.get() - self.depth);
    }
}

impl Drop for EmuQp {
    /// Its completions not yet polled go with it: its depth goes back to
    /// the CQ for queue pairs made later, whose completions would
    /// otherwise find the queue fuller than the reservations say (an
    /// overflow, asserted in `push`).
    fn drop(&mut self) {
        self.cq
            .queue
            .borrow_mut()
            .retain(|p| p.qp_slot != self.slot);
        self.cq.reserved.set(self.cq.reserved.get() - self.depth);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key names its slot, and none is 0 or the claim marker,
    /// across the tag counter's wrap.
    #[test]
    fn lkeys_are_never_empty_or_the_marker() {
        for counter in [
            0,
            1,
            0x3f_fffd,
            0x3f_fffe,
            0x3f_ffff,
            u32::MAX - 1,
            u32::MAX,
        ] {
            for idx in [0, 1, MAX_LOCAL_MRS - 1] {
                let k = lkey_for(counter, idx);
                assert_ne!(k, 0, "counter {counter} slot {idx}");
                assert_ne!(k, u32::MAX, "counter {counter} slot {idx}");
                assert_eq!((k & LKEY_INDEX_MASK) as usize, idx);
            }
        }
    }

    /// Queue pairs connected and dropped one after another on one CQ take
    /// the same slot: its list does not grow with every connect (a 16-bit
    /// slot aliased the 65,537th), and a slot taken again starts with
    /// nothing outstanding.
    #[test]
    fn a_dropped_queue_pairs_slot_is_taken_again() {
        use super::super::{Backing, EmuNode, EmuNodeConfig};
        let node = EmuNode::create(&EmuNodeConfig {
            id: 0,
            host_bytes: 4096,
            dm_bytes: 0,
            backing: Backing::Memfd,
        })
        .unwrap();
        let ep = node.endpoint();
        let nic = EmuNic::new(EmuConfig::default());
        let cq = nic.create_cq(4).unwrap();
        let kept = nic.create_qp(&cq, 1).unwrap().connect(&ep);
        for _ in 0..100 {
            let qp = nic.create_qp(&cq, 2).unwrap().connect(&ep);
            assert_eq!(qp.slot, 1);
            assert_eq!(qp.shared.outstanding.get(), 0);
        }
        let (a, b) = (
            nic.create_qp(&cq, 1).unwrap().connect(&ep),
            nic.create_qp(&cq, 1).unwrap().connect(&ep),
        );
        assert_eq!((kept.slot, a.slot, b.slot), (0, 1, 2));
        drop(a);
        let c = nic.create_qp(&cq, 1).unwrap().connect(&ep);
        assert_eq!(c.slot, 1, "the lowest free slot");
        assert_eq!(cq.inner.qps.borrow().len(), 3);
    }

    /// An SGE naming the claim marker as its key is refused, though the
    /// last slot, mid-claim, holds that marker over the range of the
    /// region it held before.
    #[test]
    fn the_claim_marker_is_no_key() {
        let nic = EmuNic::new(EmuConfig::default());
        let mut mem = vec![0u8; 64];
        let slot = &nic.inner.mrs[MAX_LOCAL_MRS - 1];
        // As `register_raw` leaves the slot between its claim and its
        // range stores, over a range that was live before.
        slot.base.store(mem.as_mut_ptr() as u64, Ordering::Relaxed);
        slot.len.store(64, Ordering::Relaxed);
        slot.access
            .store(Access::LOCAL_WRITE.bits(), Ordering::Relaxed);
        slot.lkey.store(u32::MAX, Ordering::Release);
        let sge = Sge {
            addr: mem.as_mut_ptr(),
            len: 8,
            lkey: LKey(u32::MAX),
        };
        assert!(!nic.local_ok(&sge, Access::LOCAL_WRITE));
    }

    /// An SGE whose end wraps past 2^64 is outside its region, however its
    /// start compares; the region's own bytes pass, and none once it is
    /// deregistered.
    #[test]
    fn a_wrapping_sge_is_refused() {
        let nic = EmuNic::new(EmuConfig::default());
        let mut mem = vec![0u8; 4096];
        // SAFETY: `mem` outlives the registration (dropped first below).
        let reg =
            unsafe { nic.register_raw(mem.as_mut_ptr(), mem.len(), Access::LOCAL_WRITE) }.unwrap();
        let lkey = LKey(reg.lkey);
        let at = |addr: *mut u8, len: u32, lkey: LKey| Sge { addr, len, lkey };
        assert!(nic.local_ok(&at(mem.as_mut_ptr(), 4096, lkey), Access::LOCAL_WRITE));
        assert!(!nic.local_ok(&at(mem.as_mut_ptr(), 4097, lkey), Access::LOCAL_WRITE));
        // A region ending at the top of the address space. Registering
        // records its range only; nothing here reads or writes it.
        let top = (usize::MAX - 4095) as *mut u8;
        // SAFETY: emu's registration touches no memory, and no verb is
        // posted against it: `local_ok` only compares numbers.
        let high = unsafe { nic.register_raw(top, 4095, Access::LOCAL_WRITE) }.unwrap();
        let hk = LKey(high.lkey);
        assert!(nic.local_ok(&at(top.wrapping_add(8), 4087, hk), Access::LOCAL_WRITE));
        assert!(
            !nic.local_ok(&at(top.wrapping_add(8), 4096, hk), Access::LOCAL_WRITE),
            "its end wraps"
        );
        drop(high);
        drop(reg);
        assert!(!nic.local_ok(&at(mem.as_mut_ptr(), 8, lkey), Access::LOCAL_WRITE));
    }
}
