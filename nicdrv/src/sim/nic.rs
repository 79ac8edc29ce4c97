//! The simulator's device: the `Nic`, queue pairs and completion queues
//! that the ordinary executor runs on. Posting charges the posting thread's
//! virtual CPU and hands the requests to the simulated fabric.

use super::fault::{Fault, FaultKind};
use super::state::{Ev, SimCluster, NO_THREAD};
use crate::addr::NodeId;
use crate::local::{check_range, LocalError};
use crate::nic::{
    CompletionQueue, CqId, Mr, Nic, QpState, QueuePair, RecoverError, RegError, RegisterableMemory,
    Registration, RemoteRegion,
};
use crate::verbs::{Access, Caps, Completion, LKey, PostError, RKey, WorkRequest};
use std::rc::Rc;

/// Limits of the simulated NIC (those of a ConnectX-5).
pub const SIM_CAPS: Caps = Caps {
    masked_cas: true,
    max_inline_bytes: 220,
    max_msg_bytes: 1 << 30,
    max_send_wr: 16 * 1024,
    max_cqe: 1 << 22,
};

/// A simulated device as one compute thread (or a raw test rig) sees it.
#[derive(Clone)]
pub struct SimNic {
    pub(crate) shared: Rc<SimCluster>,
    pub(crate) thread: u32,
}

impl SimNic {
    /// The simulated thread this device belongs to (`None` for raw rigs).
    pub fn thread(&self) -> Option<u32> {
        (self.thread != NO_THREAD).then_some(self.thread)
    }

    /// Schedules `kind` at this thread's present virtual time: it strikes
    /// once the thread's turn ends, before anything else happens at that
    /// instant is answered. For tests that fail a machine at a chosen step
    /// of a protocol (a commit's LOCK, say) rather than at a fixed time.
    /// Checked as [`super::World::add_faults`] checks a planned fault,
    /// except for thread stalls, which are checked when they fire.
    pub fn inject(&self, kind: FaultKind) -> Result<(), String> {
        self.inject_after(kind, 0)
    }

    /// As [`SimNic::inject`], `delay_ns` after this thread's present
    /// virtual time (a cut link healed later, say).
    pub fn inject_after(&self, kind: FaultKind, delay_ns: u64) -> Result<(), String> {
        let f = Fault {
            at_ns: Nic::now_ns(self).saturating_add(delay_ns),
            kind,
        };
        let compute_nodes = self.shared.cut.borrow().len() / self.shared.memory_nodes.max(1);
        f.check_machines(
            self.shared.memory_nodes,
            compute_nodes,
            self.shared.machines,
        )?;
        let i = {
            let mut all = self.shared.faults.borrow_mut();
            all.push(f);
            all.len() - 1
        };
        self.shared.schedule(f.at_ns, Ev::Fault(i as u32));
        Ok(())
    }
}

/// A local registration in the simulator; dropping it deregisters.
pub struct SimReg {
    shared: Rc<SimCluster>,
    lkey: LKey,
}

impl Registration for SimReg {
    fn lkey(&self) -> LKey {
        self.lkey
    }
    fn rkey(&self) -> RKey {
        RKey(self.lkey.0)
    }
}

impl Drop for SimReg {
    fn drop(&mut self) {
        let mut mrs = self.shared.local_mrs.borrow_mut();
        if let Some(m) = ((self.lkey.0 & 0xffff) as usize)
            .checked_sub(1)
            .and_then(|i| mrs.get_mut(i))
        {
            m.lkey = 0;
        }
    }
}

impl Nic for SimNic {
    const ASSERTS_INVARIANTS: bool = true;

    type Qp = SimQp;
    type Cq = SimCq;
    type Reg = SimReg;

    fn caps(&self) -> Caps {
        SIM_CAPS
    }

    /// Virtual time: the thread's CPU clock during its turn.
    fn now_ns(&self) -> u64 {
        if self.thread == NO_THREAD {
            self.shared.now.get()
        } else {
            self.shared.threads.borrow()[self.thread as usize].clock
        }
    }

    fn register<M: RegisterableMemory>(
        &self,
        mem: M,
        access: Access,
    ) -> Result<Mr<M, SimReg>, RegError> {
        if mem.is_empty() || mem.as_ptr().is_null() {
            return Err(RegError::Empty);
        }
        let lkey = self
            .shared
            .new_lkey(mem.as_ptr() as u64, mem.len() as u64, access);
        Ok(Mr::new(
            SimReg {
                shared: self.shared.clone(),
                lkey,
            },
            mem,
        ))
    }

    fn charge_turn(&self, completions: usize, task_polls: usize) {
        let m = &self.shared.model;
        self.charge_cpu(completions as u64 * m.cpu_poll_ns + task_polls as u64 * m.cpu_step_ns);
    }

    fn charge_cpu(&self, ns: u64) {
        if self.thread != NO_THREAD {
            self.shared.threads.borrow_mut()[self.thread as usize].clock += ns;
        }
    }

    fn drain_on_drop(&self) -> bool {
        false
    }

    fn local_bytes(&self) -> Option<u64> {
        let node = self.shared.machine_of(self.thread)?;
        Some(self.shared.mem.borrow()[node as usize].host.len() as u64)
    }

    fn local_load(&self, off: u64) -> Result<u64, LocalError> {
        let mut b = [0u8; 8];
        self.local_access(off, 8, true, |m| b.copy_from_slice(&m[..8]))?;
        Ok(u64::from_le_bytes(b))
    }

    fn local_store(&self, off: u64, v: u64) -> Result<(), LocalError> {
        self.local_access(off, 8, true, |m| m[..8].copy_from_slice(&v.to_le_bytes()))?;
        self.local_wrote(off, 8);
        Ok(())
    }

    fn local_cas(&self, off: u64, compare: u64, swap: u64) -> Result<u64, LocalError> {
        let mut old = 0;
        self.local_access(off, 8, true, |m| {
            old = u64::from_le_bytes(m[..8].try_into().expect("8 bytes"));
            if old == compare {
                m[..8].copy_from_slice(&swap.to_le_bytes());
            }
        })?;
        if old == compare {
            self.local_wrote(off, 8);
        }
        Ok(old)
    }

    fn local_read(&self, off: u64, buf: &mut [u8]) -> Result<(), LocalError> {
        let n = buf.len();
        self.local_access(off, n as u64, false, |m| buf.copy_from_slice(&m[..n]))
    }

    fn local_write(&self, off: u64, data: &[u8]) -> Result<(), LocalError> {
        let n = data.len();
        self.local_access(off, n as u64, false, |m| m[..n].copy_from_slice(data))?;
        self.local_wrote(off, n as u64);
        Ok(())
    }

    fn watch_writes(&self, slot: usize, off: u64, len: u64) {
        if let Some(node) = self.shared.machine_of(self.thread) {
            self.shared
                .watch(self.thread, slot as u32, node, off, off.saturating_add(len));
        }
    }

    fn unwatch_writes(&self, slot: usize) {
        self.shared.unwatch(self.thread, slot as u32);
    }

    fn write_seen(&self, slot: usize) -> bool {
        self.shared.write_seen(self.thread, slot as u32)
    }

    fn timer_due(&self, at_ns: u64) {
        if self.thread != NO_THREAD {
            self.shared.timer_due(self.thread, at_ns);
        }
    }
}

impl SimNic {
    /// Runs `f` on `off..off+len` of the thread's machine memory, checked,
    /// and charges the thread's CPU per line touched. The access happens at
    /// the turn's event time: a turn is one event, so it interleaves with
    /// remote line accesses in event order.
    fn local_access(
        &self,
        off: u64,
        len: u64,
        word: bool,
        f: impl FnOnce(&mut [u8]),
    ) -> Result<(), LocalError> {
        let node = self
            .shared
            .machine_of(self.thread)
            .ok_or(LocalError::NotAMachine)?;
        {
            let mut mems = self.shared.mem.borrow_mut();
            let m = &mut mems[node as usize];
            if m.crashed {
                return Err(LocalError::Gone);
            }
            check_range(off, len, m.host.len() as u64, word)?;
            f(&mut m.host[off as usize..(off + len) as usize]);
        }
        let lines = if len == 0 {
            0
        } else {
            (off + len - 1) / 64 - off / 64 + 1
        };
        self.charge_cpu(lines * self.shared.model.cpu_local_line_ns);
        Ok(())
    }

    /// A local write landed: watches of the machine's memory see it.
    fn local_wrote(&self, off: u64, len: u64) {
        if let Some(node) = self.shared.machine_of(self.thread) {
            self.shared.note_write(node, off, off + len);
        }
    }
}

/// A simulated completion queue.
pub struct SimCq {
    pub(crate) shared: Rc<SimCluster>,
    pub(crate) idx: u32,
}

impl CompletionQueue for SimCq {
    fn id(&self) -> CqId {
        CqId(Rc::as_ptr(&self.shared) as usize, self.idx)
    }

    fn poll(&mut self, out: &mut [Completion]) -> usize {
        let mut cqs = self.shared.cqs.borrow_mut();
        let cq = &mut cqs[self.idx as usize];
        let mut qps = self.shared.qps.borrow_mut();
        let mut n = 0;
        while n < out.len() {
            let Some((wc, qp, retire)) = cq.entries.pop_front() else {
                break;
            };
            let q = &mut qps[qp as usize];
            debug_assert!(q.outstanding >= retire);
            q.outstanding -= retire;
            out[n] = wc;
            n += 1;
        }
        n
    }
}

/// A simulated reliable-connected queue pair.
pub struct SimQp {
    pub(crate) shared: Rc<SimCluster>,
    pub(crate) idx: u32,
    pub(crate) thread: u32,
    pub(crate) peer: NodeId,
    pub(crate) regions: Vec<RemoteRegion>,
}

impl QueuePair for SimQp {
    fn qp_num(&self) -> u32 {
        self.idx + 1
    }

    fn peer(&self) -> NodeId {
        self.peer
    }

    fn cq_id(&self) -> CqId {
        let cq = self.shared.qps.borrow()[self.idx as usize].cq;
        CqId(Rc::as_ptr(&self.shared) as usize, cq)
    }

    fn state(&self) -> QpState {
        self.shared.qps.borrow()[self.idx as usize].life
    }

    fn outstanding(&self) -> u32 {
        self.shared.qps.borrow()[self.idx as usize].outstanding
    }

    fn depth(&self) -> u32 {
        self.shared.qps.borrow()[self.idx as usize].depth
    }

    fn remote_regions(&self) -> &[RemoteRegion] {
        &self.regions
    }

    unsafe fn post_send(&mut self, wrs: &[WorkRequest]) -> Result<(), PostError> {
        {
            let qps = self.shared.qps.borrow();
            let q = &qps[self.idx as usize];
            if q.life == QpState::Error {
                return Err(PostError::QpInError);
            }
            if wrs.is_empty() {
                return Err(PostError::EmptyBatch);
            }
            if q.outstanding as usize + wrs.len() > q.depth as usize
                || self.shared.queue_full(self.idx, self.thread)
            {
                return Err(PostError::SendQueueFull { depth: q.depth });
            }
        }
        for wr in wrs {
            SIM_CAPS.check(&wr.op)?;
            if wr.op.remote().node() != self.peer {
                return Err(PostError::WrongNode {
                    addr: wr.op.remote(),
                    peer: self.peer,
                });
            }
        }
        // SAFETY: the SGEs are as `post_send` requires: the caller's
        // contract, which `SimCluster::post` asks for in turn.
        unsafe { self.shared.post(self.idx, self.thread, wrs) };
        Ok(())
    }

    fn recover(&mut self) -> Result<(), RecoverError> {
        self.shared.reset_qp(self.idx)
    }
}
