//! The simulator's device: the `Nic`, queue pairs and completion queues
//! that the ordinary executor runs on. Posting charges the posting thread's
//! virtual CPU and hands the requests to the simulated fabric.

use super::state::{SimCluster, NO_THREAD};
use crate::addr::NodeId;
use crate::nic::{
    CompletionQueue, Mr, Nic, QpState, QueuePair, RecoverError, RegError, RegisterableMemory,
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
}

/// A simulated completion queue.
pub struct SimCq {
    pub(crate) shared: Rc<SimCluster>,
    pub(crate) idx: u32,
}

impl CompletionQueue for SimCq {
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
            if q.outstanding as usize + wrs.len() > q.depth as usize {
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
