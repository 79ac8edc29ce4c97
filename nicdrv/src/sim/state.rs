//! The simulated cluster's state and the handling of every network event.
//! Everything here lives in one thread; `RefCell` borrows are short and are
//! never held while an executor runs.

use super::fault::{Fault, FaultKind};
use super::model::SimModel;
use crate::addr::{NodeId, Space};
use crate::nic::{QpState as QpLife, RemoteRegion};
use crate::rng::{Domain, Rng};
use crate::verbs::{Access, Completion, LKey, Opcode, RKey, Sge, WcStatus, WorkRequest, WrOp};
use std::cell::{Cell, RefCell, RefMut};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

pub(crate) const NO_THREAD: u32 = u32::MAX;
const LINE: u64 = 64;

#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Ev {
    /// A compute thread runs one executor turn.
    Turn(u32),
    /// A request reaches its memory node.
    Arrive(u32, u32),
    /// A line (or the whole word) of a request touches memory.
    Access(u32, u32, u16),
    /// The answer to a request reaches its requester.
    Deliver(u32, u32),
    /// A request's transport timer fires.
    Timeout(u32, u32),
    /// A scheduled fault.
    Fault(u32),
    /// A thread's earliest timer is due: it runs a turn.
    Timer(u32),
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Event {
    pub time: u64,
    pub seq: u64,
    pub ev: Ev,
}

pub(crate) struct MemNode {
    pub host: Vec<u8>,
    pub dm: Vec<u8>,
    pub regions: Vec<RemoteRegion>,
    pub crashed: bool,
    /// When the NIC can take the next inbound message.
    pub nic_free: u64,
    /// When the NIC's egress is free.
    pub tx_free: u64,
    /// When the NIC's atomic unit can start another atomic.
    pub atomic_free: u64,
    /// Per space and slot, when the slot's last atomic ends.
    pub slot_free: Vec<u64>,
    /// End times of the atomics the NIC has taken and not yet finished
    /// (waiting for their slot or executing), earliest first.
    pub atomics_in_flight: std::collections::BinaryHeap<std::cmp::Reverse<u64>>,
}

impl MemNode {
    pub(crate) fn mem(&self, space: Space) -> &Vec<u8> {
        match space {
            Space::Host => &self.host,
            Space::Device => &self.dm,
        }
    }
    pub(crate) fn mem_mut(&mut self, space: Space) -> &mut Vec<u8> {
        match space {
            Space::Host => &mut self.host,
            Space::Device => &mut self.dm,
        }
    }
}

pub(crate) struct ComputeNode {
    pub tx_free: u64,
    pub crashed: bool,
}

pub(crate) struct ThreadState {
    pub node: u16,
    /// Virtual CPU time while a turn runs; equals `cpu_free` between turns.
    pub clock: u64,
    pub cpu_free: u64,
    pub scheduled: bool,
    pub cq: u32,
    /// Runs no more (`World::halt_thread`), as if its node had crashed.
    pub halted: bool,
    /// When the thread's pending `Ev::Timer` fires (`u64::MAX`: none).
    pub timer_at: u64,
}

/// A task waiting for a write to its machine's memory.
pub(crate) struct Watch {
    pub thread: u32,
    pub slot: u32,
    pub node: NodeId,
    pub lo: u64,
    pub hi: u64,
    /// A write landed in `lo..hi` since the watch began.
    pub seen: bool,
}

pub(crate) struct QpSim {
    pub cq: u32,
    pub cn: u16,
    pub mn: NodeId,
    pub life: QpLife,
    pub depth: u32,
    /// Posted and not yet retired by a polled completion.
    pub outstanding: u32,
    /// Successful unsignaled answers since the last completion.
    pub pending_retire: u32,
    /// Requests in posting order, not yet answered.
    pub inflight: VecDeque<u32>,
    /// The responder saw a failure: it executes nothing more until reset.
    pub resp_error: bool,
    /// End of the last memory access of this QP at the responder.
    pub resp_last_end: u64,
    /// Time of the last answer delivered (answers arrive in order).
    pub last_deliver: u64,
    /// Time the last request sent reaches the responder: requests arrive
    /// in order too, even when a latency spike ends between two of them.
    pub last_arrive: u64,
    /// Sequence number the next posted request gets (RC's PSN).
    pub next_psn: u32,
    /// Sequence number the responder executes next. A request that never
    /// reaches it (lost in a cut, or failed locally before leaving) leaves
    /// a gap: the responder drops every later one as out of sequence, so
    /// nothing behind a failure executes (they are flushed when the
    /// failure completes). Sound only because requests arrive in PSN
    /// order (`last_arrive`): an overtaken request would be dropped with no
    /// answer and no timer, and its QP would hang.
    pub resp_psn: u32,
}

pub(crate) struct CqSim {
    pub entries: VecDeque<(Completion, u32, u32)>,
    pub thread: u32,
}

pub(crate) struct Request {
    pub gen: u32,
    pub live: bool,
    pub qp: u32,
    pub wr: WorkRequest,
    pub payload: Vec<u8>,
    pub posted_at: u64,
    pub status: WcStatus,
    /// Answered by the responder (an answer may wait behind a lost one).
    pub answered: bool,
    pub lost: bool,
    pub lines_left: u16,
    /// Position in its QP's posting order (see `QpSim::next_psn`).
    pub psn: u32,
}

pub(crate) struct LocalMr {
    pub lkey: u32,
    pub base: u64,
    pub len: u64,
    pub access: Access,
}

#[derive(Default, Clone, Copy, Debug)]
pub(crate) struct Stats {
    pub events: u64,
    pub verbs: u64,
    pub trace: u64,
}

/// A request the memory NIC has taken in: which, on which queue pair,
/// and when it starts on it.
#[derive(Clone, Copy)]
struct Served {
    r: u32,
    gen: u32,
    qpi: u32,
    start: u64,
    /// End of the QP's previous memory access window: a request may touch
    /// memory on the spot only when that lies in the past. At the same
    /// instant, the previous request's last line may still wait in the
    /// event queue, and must go first (requests on one QP touch memory in
    /// posting order).
    prev_end: u64,
}

/// The simulated cluster, shared by the world, its devices and queue
/// pairs: the clock, the event queue, the memory and compute nodes.
pub(crate) struct SimCluster {
    pub model: SimModel,
    pub now: Cell<u64>,
    seq: Cell<u64>,
    pub events: RefCell<BinaryHeap<Reverse<Event>>>,
    pub rng: RefCell<Rng>,
    pub mem: RefCell<Vec<MemNode>>,
    pub cn: RefCell<Vec<ComputeNode>>,
    pub threads: RefCell<Vec<ThreadState>>,
    pub qps: RefCell<Vec<QpSim>>,
    pub cqs: RefCell<Vec<CqSim>>,
    pub reqs: RefCell<Vec<Request>>,
    free_reqs: RefCell<Vec<u32>>,
    pub local_mrs: RefCell<Vec<LocalMr>>,
    /// Cut links, indexed `compute * memory_nodes + memory`.
    pub cut: RefCell<Vec<bool>>,
    /// Latency spikes as (start, end, extra).
    pub spikes: RefCell<Vec<(u64, u64, u64)>>,
    /// Faults by index (events name them); more can be added while it runs.
    pub faults: RefCell<Vec<Fault>>,
    pub stats: Cell<Stats>,
    pub memory_nodes: usize,
    /// Node numbers below this are machines (memory and compute node).
    pub machines: usize,
    /// Live write watches, few (one per waiting task).
    pub watches: RefCell<Vec<Watch>>,
}

/// Mixes one value into the trace hash (FNV-1a over 64-bit words).
fn mix(h: u64, v: u64) -> u64 {
    (h ^ v).wrapping_mul(0x0000_0100_0000_01B3)
}

impl SimCluster {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        model: SimModel,
        seed: u64,
        mem: Vec<MemNode>,
        compute_nodes: usize,
        machines: usize,
        faults: Vec<Fault>,
    ) -> SimCluster {
        let memory_nodes = mem.len();
        SimCluster {
            model,
            now: Cell::new(0),
            seq: Cell::new(0),
            events: RefCell::new(BinaryHeap::new()),
            rng: RefCell::new(Rng::stream(seed, Domain::Simulator, 0)),
            mem: RefCell::new(mem),
            cn: RefCell::new(
                (0..compute_nodes)
                    .map(|_| ComputeNode {
                        tx_free: 0,
                        crashed: false,
                    })
                    .collect(),
            ),
            threads: RefCell::new(Vec::new()),
            qps: RefCell::new(Vec::new()),
            cqs: RefCell::new(Vec::new()),
            reqs: RefCell::new(Vec::new()),
            free_reqs: RefCell::new(Vec::new()),
            local_mrs: RefCell::new(Vec::new()),
            cut: RefCell::new(vec![false; compute_nodes * memory_nodes]),
            spikes: RefCell::new(Vec::new()),
            faults: RefCell::new(faults),
            stats: Cell::new(Stats {
                trace: 0xcbf2_9ce4_8422_2325,
                ..Default::default()
            }),
            memory_nodes,
            machines,
            watches: RefCell::new(Vec::new()),
        }
    }

    pub(crate) fn schedule(&self, time: u64, ev: Ev) {
        let seq = self.seq.get();
        self.seq.set(seq + 1);
        debug_assert!(time >= self.now.get(), "event scheduled in the past");
        self.events.borrow_mut().push(Reverse(Event {
            time: time.max(self.now.get()),
            seq,
            ev,
        }));
    }

    pub(crate) fn pop(&self, limit_ns: u64) -> Option<Event> {
        let mut q = self.events.borrow_mut();
        match q.peek() {
            Some(Reverse(e)) if e.time <= limit_ns => {}
            _ => return None,
        }
        let Reverse(e) = q.pop().expect("peeked");
        drop(q);
        self.now.set(e.time);
        let mut s = self.stats.get();
        s.events += 1;
        let tag = match e.ev {
            Ev::Turn(t) => (1u64 << 56) | t as u64,
            Ev::Arrive(r, _) => (2 << 56) | r as u64,
            Ev::Access(r, _, l) => (3 << 56) | ((l as u64) << 32) | r as u64,
            Ev::Deliver(r, _) => (4 << 56) | r as u64,
            Ev::Timeout(r, _) => (5 << 56) | r as u64,
            Ev::Fault(i) => (6 << 56) | i as u64,
            Ev::Timer(t) => (7 << 56) | t as u64,
        };
        s.trace = mix(mix(s.trace, e.time), tag);
        self.stats.set(s);
        Some(e)
    }

    /// Whether a post by `thread` on QP `qpi` now meets a
    /// `FaultKind::QueueFull` on its link. Read from the fault list by the
    /// thread's own clock, not applied when the fault's event runs: a
    /// thread's turn runs ahead of the events, and a fault injected during
    /// it (a test's trap) must refuse the posts later in that same turn.
    pub(crate) fn queue_full(&self, qpi: u32, thread: u32) -> bool {
        let now = if thread == NO_THREAD {
            self.now.get()
        } else {
            self.threads.borrow()[thread as usize].clock
        };
        let (cn, mn) = {
            let q = &self.qps.borrow()[qpi as usize];
            (q.cn, q.mn)
        };
        self.faults.borrow().iter().any(|f| match f.kind {
            FaultKind::QueueFull {
                compute,
                memory,
                duration_ns,
            } => {
                compute == cn
                    && memory == mn
                    && (f.at_ns..f.at_ns.saturating_add(duration_ns)).contains(&now)
            }
            _ => false,
        })
    }

    fn link_cut(&self, cn: u16, mn: NodeId) -> bool {
        self.cut.borrow()[cn as usize * self.memory_nodes + mn as usize]
    }

    fn latency(&self, at: u64) -> u64 {
        // Each spike is at most a century (`Fault::check`), but spikes
        // that overlap add up: their sum is held to a century too, so the
        // times made from it stay far from wrapping.
        let extra = self
            .spikes
            .borrow()
            .iter()
            .filter(|(s, e, _)| at >= *s && at < *e)
            .fold(0u64, |sum, (_, _, x)| sum.saturating_add(*x))
            .min(super::fault::MAX_TIME_NS);
        self.model.link_latency_ns_one_way + extra
    }

    // ---- local memory registration ----

    pub(crate) fn local_ok(&self, sge: &Sge, need: Access) -> bool {
        let mrs = self.local_mrs.borrow();
        let idx = (sge.lkey.0 & 0xffff) as usize;
        let Some(m) = idx.checked_sub(1).and_then(|i| mrs.get(i)) else {
            return false;
        };
        m.lkey == sge.lkey.0
            && m.access.contains(need)
            && crate::nic::range_within(m.base, m.len, sge.addr as u64, u64::from(sge.len))
    }

    // ---- requests ----

    fn alloc_req(&self) -> u32 {
        if let Some(i) = self.free_reqs.borrow_mut().pop() {
            return i;
        }
        let mut reqs = self.reqs.borrow_mut();
        reqs.push(Request {
            gen: 0,
            live: false,
            qp: 0,
            wr: crate::verbs::PLACEHOLDER_WR,
            payload: Vec::new(),
            posted_at: 0,
            status: WcStatus::Success,
            answered: false,
            lost: false,
            lines_left: 0,
            psn: 0,
        });
        (reqs.len() - 1) as u32
    }

    fn free_req(&self, r: u32) {
        let mut reqs = self.reqs.borrow_mut();
        let q = &mut reqs[r as usize];
        debug_assert!(q.live);
        q.live = false;
        q.gen = q.gen.wrapping_add(1);
        drop(reqs);
        self.free_reqs.borrow_mut().push(r);
    }

    /// The request if `gen` still names it.
    fn req_live(&self, r: u32, gen: u32) -> bool {
        let reqs = self.reqs.borrow();
        reqs[r as usize].live && reqs[r as usize].gen == gen
    }

    /// Posts one doorbell from `thread` (or a raw queue pair) on `qp`.
    ///
    /// # Safety
    /// The local SGEs must satisfy `QueuePair::post_send`'s contract.
    pub(crate) unsafe fn post(&self, qpi: u32, thread: u32, wrs: &[WorkRequest]) {
        let m = &self.model;
        let cpu = if thread == NO_THREAD {
            self.now.get()
        } else {
            let mut th = self.threads.borrow_mut();
            let t = &mut th[thread as usize];
            t.clock += m.cpu_post_ns + m.cpu_post_extra_wr_ns * (wrs.len() as u64 - 1);
            t.clock
        };
        let (cn, mn) = {
            let mut qps = self.qps.borrow_mut();
            let q = &mut qps[qpi as usize];
            q.outstanding += wrs.len() as u32;
            (q.cn, q.mn)
        };
        let mut failed = false;
        for wr in wrs {
            let r = self.alloc_req();
            let psn = {
                let mut qps = self.qps.borrow_mut();
                let q = &mut qps[qpi as usize];
                q.next_psn = q.next_psn.wrapping_add(1);
                q.next_psn.wrapping_sub(1)
            };
            let gen = {
                let mut reqs = self.reqs.borrow_mut();
                let q = &mut reqs[r as usize];
                q.live = true;
                q.qp = qpi;
                q.wr = *wr;
                q.posted_at = cpu;
                q.status = WcStatus::Success;
                q.answered = false;
                q.lost = false;
                q.lines_left = 0;
                q.psn = psn;
                q.payload.clear();
                q.gen
            };
            self.qps.borrow_mut()[qpi as usize].inflight.push_back(r);
            let mut s = self.stats.get();
            s.verbs += 1;
            self.stats.set(s);
            if failed {
                // After a local failure nothing more leaves this doorbell:
                // these complete flushed right behind it.
                self.answer(r, WcStatus::Flushed, cpu);
                continue;
            }
            let op = wr.op;
            let local = op.local();
            let local_need = op.local_access();
            if local_need.is_some_and(|need| !self.local_ok(&local, need)) {
                failed = true;
                self.answer(r, WcStatus::LocalProtection, cpu);
                continue;
            }
            let mut out_bytes = m.header_bytes;
            if let WrOp::Write { local, .. } = op {
                // The NIC reads the payload now (inline: copied at post).
                let mut reqs = self.reqs.borrow_mut();
                let p = &mut reqs[r as usize].payload;
                // SAFETY: the caller guarantees the SGE is valid for reads.
                p.extend_from_slice(unsafe {
                    std::slice::from_raw_parts(local.addr, local.len as usize)
                });
                out_bytes += local.len as u64;
            } else if op.opcode().is_atomic() {
                out_bytes += 16;
            }
            let depart = {
                let mut cns = self.cn.borrow_mut();
                let c = &mut cns[cn as usize];
                c.tx_free = c.tx_free.max(cpu) + m.xfer_ns(out_bytes);
                c.tx_free
            };
            if self.link_cut(cn, mn) || self.cn.borrow()[cn as usize].crashed {
                self.lose(r, gen);
            } else {
                // A spike that ends between two requests of this QP must not
                // let the later one overtake the earlier one and execute
                // first: RC delivers a QP's packets in order.
                let arrive = depart + self.latency(depart);
                let arrive = {
                    let mut qps = self.qps.borrow_mut();
                    let q = &mut qps[qpi as usize];
                    q.last_arrive = q.last_arrive.max(arrive);
                    q.last_arrive
                };
                self.schedule(arrive, Ev::Arrive(r, gen));
            }
        }
    }

    /// Marks a request lost: its requester times out.
    fn lose(&self, r: u32, gen: u32) {
        let posted = {
            let mut reqs = self.reqs.borrow_mut();
            let q = &mut reqs[r as usize];
            if q.lost {
                return;
            }
            q.lost = true;
            q.posted_at
        };
        let at = (posted + self.model.transport_timeout_ns).max(self.now.get());
        self.schedule(at, Ev::Timeout(r, gen));
    }

    /// The responder's answer to `r` is on its way: it reaches the requester
    /// at `at` or later (answers on a QP arrive in order).
    fn answer(&self, r: u32, status: WcStatus, at: u64) {
        let (qpi, gen) = {
            let mut reqs = self.reqs.borrow_mut();
            let q = &mut reqs[r as usize];
            q.status = status;
            (q.qp, q.gen)
        };
        let at = {
            let mut qps = self.qps.borrow_mut();
            let q = &mut qps[qpi as usize];
            let at = at.max(q.last_deliver);
            q.last_deliver = at;
            at
        };
        self.schedule(at, Ev::Deliver(r, gen));
    }

    /// A request reaches its memory node's NIC: dropped if the node crashed
    /// or the responder is out of sequence, answered with an error if the
    /// responder refuses it, else served ([`SimCluster::serve_transfer`],
    /// [`SimCluster::serve_atomic`]).
    pub(crate) fn on_arrive(&self, r: u32, gen: u32) {
        if !self.req_live(r, gen) {
            return;
        }
        let (qpi, wr, psn) = {
            let reqs = self.reqs.borrow();
            let q = &reqs[r as usize];
            (q.qp, q.wr, q.psn)
        };
        let (mn, resp_error, last_end, in_sequence) = {
            let qps = self.qps.borrow();
            let q = &qps[qpi as usize];
            (q.mn, q.resp_error, q.resp_last_end, q.resp_psn == psn)
        };
        let mut mems = self.mem.borrow_mut();
        let node = &mut mems[mn as usize];
        if node.crashed {
            drop(mems);
            self.lose(r, gen);
            return;
        }
        if resp_error || !in_sequence {
            // The responder's QP is in error, or an earlier request never
            // reached it: it drops the request; the requester flushes it
            // when the earlier failure completes (its answer or timeout).
            return;
        }
        {
            let mut qps = self.qps.borrow_mut();
            let q = &mut qps[qpi as usize];
            q.resp_psn = q.resp_psn.wrapping_add(1);
        }
        let start = self.admit(node, wr.op.opcode()).max(last_end);
        let status = crate::nic::responder_check(&node.regions, &wr.op);
        if status != WcStatus::Success {
            drop(mems);
            self.qps.borrow_mut()[qpi as usize].resp_error = true;
            self.answer(r, status, start + self.latency(start));
            return;
        }
        let served = Served {
            r,
            gen,
            qpi,
            start,
            prev_end: last_end,
        };
        match wr.op.opcode() {
            Opcode::Read | Opcode::Write => self.serve_transfer(served, mems, mn, &wr.op),
            _ => self.serve_atomic(served, mems, mn, &wr.op),
        }
    }

    /// The memory NIC takes a request in: when it can start on it, after
    /// the requests before it and (an atomic) a free place in its window.
    fn admit(&self, node: &mut MemNode, opcode: Opcode) -> u64 {
        let m = &self.model;
        let mut start = self.now.get().max(node.nic_free);
        if opcode.is_atomic() && m.atomic_window > 0 {
            // The NIC tracks at most `atomic_window` atomics at once; one
            // arriving when all are taken waits for the earliest to finish,
            // and as the NIC takes inbound requests in order, everything
            // behind it waits too (model.rs, `atomic_window`).
            let inflight = &mut node.atomics_in_flight;
            while inflight.peek().is_some_and(|e| e.0 <= start) {
                inflight.pop();
            }
            if inflight.len() >= m.atomic_window as usize {
                let first_free = inflight.pop().map_or(start, |e| e.0);
                start = start.max(first_free);
            }
        }
        node.nic_free = start + SimModel::per_op_ns(m.nic_msg_rate_per_sec);
        start
    }

    /// A READ or WRITE: its lines touch memory over the transfer window
    /// (in order, or at random times within it), and the answer departs
    /// when the data (READ) or the window (WRITE) is through.
    fn serve_transfer(&self, s: Served, mut mems: RefMut<'_, Vec<MemNode>>, mn: NodeId, op: &WrOp) {
        let (m, now, start) = (&self.model, self.now.get(), s.start);
        let node = &mut mems[mn as usize];
        let remote = op.remote();
        let (space, off, len) = (remote.space(), remote.offset(), op.len() as u64);
        let opcode = op.opcode();
        let xfer = m.xfer_ns(len);
        let first = off / LINE;
        let last = (off + len - 1) / LINE;
        let lines = (last - first + 1) as u16;
        let window_end = start + xfer;
        let depart = if opcode == Opcode::Read {
            let pcie = if space == Space::Host {
                m.pcie_read_ns(len)
            } else {
                0
            };
            node.tx_free = node.tx_free.max(start + pcie) + m.xfer_ns(len + m.header_bytes);
            node.tx_free
        } else {
            window_end
        };
        drop(mems);
        self.reqs.borrow_mut()[s.r as usize].lines_left = lines;
        if lines == 1 {
            // One line: it touches memory as the NIC takes it.
            if start == now && s.prev_end < now {
                self.on_access(s.r, s.gen, 0);
            } else {
                self.schedule(start, Ev::Access(s.r, s.gen, 0));
            }
        } else {
            let in_order = m.in_order_reads && opcode == Opcode::Read;
            for l in 0..lines {
                let t = if in_order {
                    start + xfer * l as u64 / (lines as u64 - 1)
                } else {
                    start + self.rng.borrow_mut().below(xfer + 1)
                };
                self.schedule(t, Ev::Access(s.r, s.gen, l));
            }
        }
        self.qps.borrow_mut()[s.qpi as usize].resp_last_end = window_end;
        self.answer(s.r, WcStatus::Success, depart + self.latency(depart));
    }

    /// An atomic: issued at the NIC's atomic rate, then serialized on its
    /// slot; answered once it has executed.
    fn serve_atomic(&self, s: Served, mut mems: RefMut<'_, Vec<MemNode>>, mn: NodeId, op: &WrOp) {
        let (m, now) = (&self.model, self.now.get());
        let node = &mut mems[mn as usize];
        let remote = op.remote();
        let (space, off) = (remote.space(), remote.offset());
        let slots = m.atomic_slots as u64;
        let slot = (space.index() as u64 * slots + (off / 8) % slots) as usize;
        // The atomic unit issues at most nic_atomic_rate atomics per
        // second; each then waits for its slot. Slots serialize only
        // their own atomics, so a busy slot does not hold up atomics
        // to other slots.
        let issue = s.start.max(node.atomic_free);
        node.atomic_free = issue + SimModel::per_op_ns(m.nic_atomic_rate_per_sec);
        let exec = issue.max(node.slot_free[slot]);
        let cost = if space == Space::Host {
            m.host_atomic_ns
        } else {
            m.dm_atomic_ns
        };
        node.slot_free[slot] = exec + cost;
        if m.atomic_window > 0 {
            node.atomics_in_flight.push(std::cmp::Reverse(exec + cost));
        }
        drop(mems);
        self.reqs.borrow_mut()[s.r as usize].lines_left = 1;
        if exec == now && s.prev_end < now {
            self.on_access(s.r, s.gen, 0);
        } else {
            self.schedule(exec, Ev::Access(s.r, s.gen, 0));
        }
        self.qps.borrow_mut()[s.qpi as usize].resp_last_end = exec;
        let done = exec + cost;
        self.answer(s.r, WcStatus::Success, done + self.latency(done));
    }

    /// One line (or the atomic) of a request touches memory.
    pub(crate) fn on_access(&self, r: u32, gen: u32, line: u16) {
        if !self.req_live(r, gen) {
            return;
        }
        let (qpi, wr) = {
            let reqs = self.reqs.borrow();
            (reqs[r as usize].qp, reqs[r as usize].wr)
        };
        let mn = self.qps.borrow()[qpi as usize].mn;
        let mut mems = self.mem.borrow_mut();
        let node = &mut mems[mn as usize];
        if node.crashed {
            drop(mems);
            self.lose(r, gen);
            return;
        }
        let op = wr.op;
        let remote = op.remote();
        let (space, off) = (remote.space(), remote.offset() as usize);
        let mem = node.mem_mut(space);
        let mut written = None;
        if op.opcode().is_atomic() {
            written = Some((off as u64, off as u64 + 8));
        }
        match op {
            WrOp::Read { local, .. } | WrOp::Write { local, .. } => {
                let len = local.len as usize;
                let first = off / LINE as usize;
                let lo = ((first + line as usize) * LINE as usize).max(off);
                let hi = ((first + line as usize + 1) * LINE as usize).min(off + len);
                if let WrOp::Read { .. } = op {
                    // SAFETY: the local buffer is the request's READ target,
                    // valid and untouched by the CPU until its completion is
                    // polled (post_send's contract); the request is live, so
                    // that completion has not been delivered.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            mem[lo..hi].as_ptr(),
                            local.addr.add(lo - off),
                            hi - lo,
                        );
                    }
                } else {
                    let reqs = self.reqs.borrow();
                    mem[lo..hi].copy_from_slice(&reqs[r as usize].payload[lo - off..hi - off]);
                    written = Some((lo as u64, hi as u64));
                }
            }
            WrOp::Cas {
                compare,
                swap,
                local,
                ..
            } => {
                let old = word(mem, off);
                if old == compare {
                    set_word(mem, off, swap);
                }
                // SAFETY: the 8-byte local result word, as for READ targets.
                unsafe { (local.addr as *mut u64).write_unaligned(old) };
            }
            WrOp::Faa { add, local, .. } => {
                let old = word(mem, off);
                set_word(mem, off, old.wrapping_add(add));
                // SAFETY: as above.
                unsafe { (local.addr as *mut u64).write_unaligned(old) };
            }
            WrOp::MaskedCas {
                compare,
                compare_mask,
                swap,
                swap_mask,
                local,
                ..
            } => {
                let old = word(mem, off);
                if (old ^ compare) & compare_mask == 0 {
                    set_word(mem, off, (old & !swap_mask) | (swap & swap_mask));
                }
                // SAFETY: as above.
                unsafe { (local.addr as *mut u64).write_unaligned(old) };
            }
        }
        drop(mems);
        self.reqs.borrow_mut()[r as usize].lines_left -= 1;
        if let (Some((lo, hi)), Space::Host) = (written, space) {
            self.note_write(mn, lo, hi);
        }
    }

    // ---- machines: writes that waiting tasks watch, timers ----

    /// A write landed in `lo..hi` of memory node `node`'s host memory:
    /// every watch it overlaps has seen a write, and its thread runs.
    pub(crate) fn note_write(&self, node: NodeId, lo: u64, hi: u64) {
        let mut woken = Vec::new();
        for w in self.watches.borrow_mut().iter_mut() {
            if w.node == node && !w.seen && w.lo < hi && lo < w.hi {
                w.seen = true;
                woken.push(w.thread);
            }
        }
        for t in woken {
            self.wake(t);
        }
    }

    /// Slot `slot` of `thread` watches `lo..hi` of `node` (replacing a
    /// watch it had).
    pub(crate) fn watch(&self, thread: u32, slot: u32, node: NodeId, lo: u64, hi: u64) {
        let mut ws = self.watches.borrow_mut();
        ws.retain(|w| !(w.thread == thread && w.slot == slot));
        ws.push(Watch {
            thread,
            slot,
            node,
            lo,
            hi,
            seen: false,
        });
    }

    pub(crate) fn unwatch(&self, thread: u32, slot: u32) {
        self.watches
            .borrow_mut()
            .retain(|w| !(w.thread == thread && w.slot == slot));
    }

    pub(crate) fn write_seen(&self, thread: u32, slot: u32) -> bool {
        self.watches
            .borrow()
            .iter()
            .any(|w| w.thread == thread && w.slot == slot && w.seen)
    }

    /// `thread`'s earliest timer is due at `at`: one `Ev::Timer` then,
    /// unless one at or before it is pending already.
    pub(crate) fn timer_due(&self, thread: u32, at: u64) {
        // A deadline already past is due now (never an event in the past).
        let at = at.max(self.now.get());
        {
            let mut th = self.threads.borrow_mut();
            let t = &mut th[thread as usize];
            if t.timer_at <= at {
                return;
            }
            t.timer_at = at;
        }
        self.schedule(at, Ev::Timer(thread));
    }

    pub(crate) fn on_timer(&self, thread: u32) {
        {
            let mut th = self.threads.borrow_mut();
            let t = &mut th[thread as usize];
            if t.timer_at <= self.now.get() {
                t.timer_at = u64::MAX;
            }
        }
        self.wake(thread);
    }

    /// The memory node of `thread`'s machine, if its compute node is one.
    pub(crate) fn machine_of(&self, thread: u32) -> Option<NodeId> {
        let th = self.threads.borrow();
        let node = th.get(thread as usize)?.node as usize;
        (node < self.machines).then_some(node as NodeId)
    }

    /// Memory node `node` stops answering, and its memory is gone.
    pub(crate) fn crash_memory(&self, node: NodeId) {
        let mut mems = self.mem.borrow_mut();
        let n = &mut mems[node as usize];
        n.crashed = true;
        n.host = Vec::new();
        n.dm = Vec::new();
    }

    /// Machine `m` fails whole: memory gone, NIC silent, threads stopped.
    pub(crate) fn crash_machine(&self, m: u16) {
        self.crash_memory(m);
        self.cn.borrow_mut()[m as usize].crashed = true;
        self.watches.borrow_mut().retain(|w| w.node != m);
    }

    /// Cuts (or heals) every link between a node numbered in `side` and
    /// one outside it.
    fn partition(&self, side: u64, cut: bool) {
        let inside = |n: usize| n < 64 && side & (1 << n) != 0;
        let mut links = self.cut.borrow_mut();
        let compute_nodes = links.len() / self.memory_nodes.max(1);
        for c in 0..compute_nodes {
            for m in 0..self.memory_nodes {
                if inside(c) != inside(m) {
                    links[c * self.memory_nodes + m] = cut;
                }
            }
        }
    }

    /// An answer reaches the requester.
    pub(crate) fn on_deliver(&self, r: u32, gen: u32) {
        if !self.req_live(r, gen) {
            return;
        }
        let qpi = self.reqs.borrow()[r as usize].qp;
        let (cn, mn) = {
            let qps = self.qps.borrow();
            (qps[qpi as usize].cn, qps[qpi as usize].mn)
        };
        let status = self.reqs.borrow()[r as usize].status;
        let remote = status != WcStatus::LocalProtection && status != WcStatus::Flushed;
        if remote && (self.link_cut(cn, mn) || self.cn.borrow()[cn as usize].crashed) {
            self.lose(r, gen);
            return;
        }
        if self.reqs.borrow()[r as usize].lost {
            return;
        }
        debug_assert!(
            status != WcStatus::Success || self.reqs.borrow()[r as usize].lines_left == 0
        );
        self.reqs.borrow_mut()[r as usize].answered = true;
        self.retire_answered(qpi);
    }

    /// Completes the answered requests at the front of a QP, in order.
    fn retire_answered(&self, qpi: u32) {
        loop {
            let front = self.qps.borrow()[qpi as usize].inflight.front().copied();
            let Some(r) = front else { return };
            let (answered, status) = {
                let reqs = self.reqs.borrow();
                (reqs[r as usize].answered, reqs[r as usize].status)
            };
            if !answered {
                return;
            }
            if status == WcStatus::Success {
                self.qps.borrow_mut()[qpi as usize].inflight.pop_front();
                let signaled = self.reqs.borrow()[r as usize].wr.signaled;
                if signaled {
                    self.complete(qpi, r, status);
                } else {
                    self.qps.borrow_mut()[qpi as usize].pending_retire += 1;
                }
                self.free_req(r);
            } else {
                self.fail_qp(qpi, status);
                return;
            }
        }
    }

    /// The front request failed with `status`: complete it, flush every
    /// later one, and put the QP in error.
    fn fail_qp(&self, qpi: u32, status: WcStatus) {
        let inflight: Vec<u32> = {
            let mut qps = self.qps.borrow_mut();
            let q = &mut qps[qpi as usize];
            q.life = QpLife::Error;
            q.inflight.drain(..).collect()
        };
        for (i, r) in inflight.into_iter().enumerate() {
            self.complete(qpi, r, if i == 0 { status } else { WcStatus::Flushed });
            self.free_req(r);
        }
    }

    pub(crate) fn on_timeout(&self, r: u32, gen: u32) {
        if !self.req_live(r, gen) {
            return;
        }
        let qpi = self.reqs.borrow()[r as usize].qp;
        let front = self.qps.borrow()[qpi as usize].inflight.front().copied();
        if front != Some(r) {
            // An earlier request is still on its way; decide after it.
            self.schedule(self.now.get() + 1_000, Ev::Timeout(r, gen));
            return;
        }
        self.fail_qp(qpi, WcStatus::RetryExceeded);
    }

    /// Pushes a completion for `r` on its QP's CQ and wakes the CQ's thread.
    fn complete(&self, qpi: u32, r: u32, status: WcStatus) {
        let wr = self.reqs.borrow()[r as usize].wr;
        let (cq, retire) = {
            let mut qps = self.qps.borrow_mut();
            let q = &mut qps[qpi as usize];
            let retire = q.pending_retire + 1;
            q.pending_retire = 0;
            (q.cq, retire)
        };
        let wc = Completion {
            wr_id: wr.wr_id,
            status,
            opcode: wr.op.opcode(),
            byte_len: if status.is_ok() { wr.op.len() } else { 0 },
            qp_num: qpi + 1,
        };
        let thread = {
            let mut cqs = self.cqs.borrow_mut();
            let c = &mut cqs[cq as usize];
            c.entries.push_back((wc, qpi, retire));
            c.thread
        };
        if thread != NO_THREAD {
            self.wake(thread);
        }
    }

    pub(crate) fn thread_cq(&self, thread: u32) -> u32 {
        self.threads.borrow()[thread as usize].cq
    }

    /// Schedules a turn for `thread` if none is pending.
    pub(crate) fn wake(&self, thread: u32) {
        let at = {
            let mut th = self.threads.borrow_mut();
            let t = &mut th[thread as usize];
            if t.scheduled || t.halted || self.cn.borrow()[t.node as usize].crashed {
                return;
            }
            t.scheduled = true;
            t.cpu_free.max(self.now.get())
        };
        self.schedule(at, Ev::Turn(thread));
    }

    pub(crate) fn on_fault(&self, i: u32) {
        let f = self.faults.borrow()[i as usize];
        let now = self.now.get();
        log::debug!("sim fault at {now} ns: {f}");
        match f.kind {
            FaultKind::CrashMemoryNode { node } => self.crash_memory(node),
            FaultKind::CrashComputeNode { node } => {
                self.cn.borrow_mut()[node as usize].crashed = true
            }
            FaultKind::CutLink { compute, memory } => {
                self.cut.borrow_mut()[compute as usize * self.memory_nodes + memory as usize] = true
            }
            FaultKind::HealLink { compute, memory } => {
                self.cut.borrow_mut()[compute as usize * self.memory_nodes + memory as usize] =
                    false
            }
            // Read by `queue_full` from the fault list itself.
            FaultKind::QueueFull { .. } => {}
            FaultKind::LatencySpike {
                extra_ns,
                duration_ns,
            } => self
                .spikes
                .borrow_mut()
                .push((now, now + duration_ns, extra_ns)),
            FaultKind::StallThread {
                thread,
                duration_ns,
            } => {
                let mut th = self.threads.borrow_mut();
                match th.get_mut(thread as usize) {
                    Some(t) => t.cpu_free = t.cpu_free.max(now) + duration_ns,
                    None => log::warn!("sim fault {f}: no thread {thread}; ignored"),
                }
            }
            FaultKind::CrashMachine { machine } => self.crash_machine(machine),
            FaultKind::Partition { side } => self.partition(side, true),
            FaultKind::HealPartition { side } => self.partition(side, false),
        }
    }

    /// Resets a QP in error (both ends) once its completions are polled.
    pub(crate) fn reset_qp(&self, qpi: u32) -> Result<(), crate::nic::RecoverError> {
        let mut qps = self.qps.borrow_mut();
        let q = &mut qps[qpi as usize];
        if q.life == QpLife::Ready {
            return Ok(());
        }
        if q.outstanding > 0 {
            return Err(crate::nic::RecoverError::Busy {
                outstanding: q.outstanding,
            });
        }
        if self.mem.borrow()[q.mn as usize].crashed {
            return Err(crate::nic::RecoverError::PeerDead(q.mn));
        }
        q.life = QpLife::Ready;
        q.resp_error = false;
        q.pending_retire = 0;
        // Both ends start again in sequence (requests of before the reset
        // were all flushed; their events are stale by generation).
        q.resp_psn = q.next_psn;
        Ok(())
    }

    /// A new random rkey (never 0).
    pub(crate) fn new_key(&self) -> RKey {
        RKey((self.rng.borrow_mut().next_u64() as u32) | 1)
    }

    pub(crate) fn new_lkey(&self, base: u64, len: u64, access: Access) -> LKey {
        let mut mrs = self.local_mrs.borrow_mut();
        let tag = (self.rng.borrow_mut().next_u64() as u32) & 0xffff_0000;
        let lkey = tag | (mrs.len() as u32 + 1);
        mrs.push(LocalMr {
            lkey,
            base,
            len,
            access,
        });
        LKey(lkey)
    }
}

fn word(mem: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(mem[off..off + 8].try_into().expect("8 bytes"))
}

fn set_word(mem: &mut [u8], off: usize, v: u64) {
    mem[off..off + 8].copy_from_slice(&v.to_le_bytes());
}
