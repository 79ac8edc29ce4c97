//! The memory-node side: registers host memory and device memory with
//! remote READ/WRITE/atomic rights, publishes them as regions, and answers
//! each compute queue pair with a responder queue pair of its own (RC is
//! point to point). After that the node's CPU stays out of the data path:
//! responders post nothing and complete nothing.

use super::device::{Device, DeviceMemory, Mlx5Nic};
use super::endpoint::{Endpoint, QpEndpoint, RegionInfo};
use super::mr::Mlx5Reg;
use super::qp::{create_rc_qp, fresh_psn_for, init_attr, modify, reset_attr, rtr_attr, rts_attr};
use super::{Mlx5Error, Rearm};
use crate::addr::{NodeId, Space};
use crate::nic::{HeapMem, Mr, Nic, RegisterableMemory, RemoteRegion};
use crate::verbs::Access;
use rdma_sys::*;
use std::sync::{Arc, Mutex};

/// A CQ the responders are created on; never polled (one-sided verbs
/// produce no responder completions).
struct RawCq {
    cq: *mut ibv_cq,
    _dev: Arc<Device>,
}

// SAFETY: a CQ handle is usable from any thread; only Drop frees it.
unsafe impl Send for RawCq {}
// SAFETY: shared references only read the pointer.
unsafe impl Sync for RawCq {}

impl Drop for RawCq {
    fn drop(&mut self) {
        // SAFETY: created in Mlx5MemoryNode::new; every responder on it holds
        // an Arc and is destroyed first.
        unsafe { ibv_destroy_cq(self.cq) };
    }
}

/// One responder QP, destroyed before the CQ and device it holds.
struct Responder {
    qp: *mut ibv_qp,
    _cq: Arc<RawCq>,
    _dev: Arc<Device>,
}

// SAFETY: a QP handle may move between threads; only Drop frees it.
unsafe impl Send for Responder {}

impl Drop for Responder {
    fn drop(&mut self) {
        // SAFETY: created in accept, destroyed once.
        unsafe { ibv_destroy_qp(self.qp) };
    }
}

impl Responder {
    fn qpn(&self) -> u32 {
        // SAFETY: the QP is live while self is.
        unsafe { (*self.qp).qp_num }
    }
}

/// The node's host memory, whatever allocated it (huge pages from
/// mempool, or the heap), with its pointer and length read once so that
/// shared access never calls into the owner.
struct HostMem {
    ptr: *mut u8,
    len: usize,
    _owner: Box<dyn RegisterableMemory + Send>,
}

// SAFETY: `ptr..ptr+len` is the owner's memory, valid and unmoving while
// the owner lives (RegisterableMemory's contract); the owner is kept here
// and dropped with this value, after the registration (Mr's field order).
unsafe impl RegisterableMemory for HostMem {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
}

/// A memory node on a real NIC.
pub struct Mlx5MemoryNode {
    node: NodeId,
    // Field order is drop order: responder QPs, their CQ, then the MRs.
    responders: Mutex<Option<Vec<Responder>>>,
    cq: Arc<RawCq>,
    host: Mr<HostMem, Mlx5Reg>,
    dm: DeviceMemory,
    nic: Mlx5Nic,
}

// SAFETY: shared access reads immutable keys, addresses and lengths, or
// takes the responders' mutex; verbs objects are thread-safe.
unsafe impl Sync for Mlx5MemoryNode {}
// SAFETY: every field is Send or a device handle usable from any thread.
unsafe impl Send for Mlx5MemoryNode {}

/// What a memory node grants compute nodes.
const GRANT: Access = Access::REMOTE_ALL;

impl Mlx5MemoryNode {
    /// Registers `host_bytes` of host memory and up to `dm_bytes` of device
    /// memory (host memory where the NIC has none, with a warning).
    pub fn new(
        nic: &Mlx5Nic,
        node: NodeId,
        host_bytes: usize,
        dm_bytes: u64,
    ) -> Result<Mlx5MemoryNode, Mlx5Error> {
        let mem = HeapMem::zeroed(host_bytes).ok_or(Mlx5Error::BadSize {
            what: "host memory bytes",
            got: host_bytes as u64,
            max: isize::MAX as u64,
        })?;
        Mlx5MemoryNode::with_memory(nic, node, mem, dm_bytes)
    }

    /// As [`new`](Self::new), over memory the caller allocated (huge pages:
    /// `mempool::HugeMem`); all of `mem` is registered and exposed. The
    /// memory must be 8-byte aligned: the machine's cores reach its words
    /// with CPU atomics ([`Mlx5Nic::on_machine`]).
    pub fn with_memory<M: RegisterableMemory + Send + 'static>(
        nic: &Mlx5Nic,
        node: NodeId,
        mem: M,
        dm_bytes: u64,
    ) -> Result<Mlx5MemoryNode, Mlx5Error> {
        let addr = mem.as_ptr() as usize;
        if !addr.is_multiple_of(8) {
            return Err(Mlx5Error::Misaligned {
                what: "memory node host memory",
                addr: addr as u64,
                align: 8,
            });
        }
        let mem = HostMem {
            ptr: mem.as_ptr(),
            len: mem.len(),
            _owner: Box::new(mem),
        };
        let host = nic.register(mem, GRANT).map_err(Mlx5Error::Register)?;
        let dm = nic.alloc_device_memory(dm_bytes, GRANT)?;
        // SAFETY: the context is live; a CQ without channel or vector.
        let cq = unsafe {
            ibv_create_cq(
                nic.dev.ctx,
                1,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        if cq.is_null() {
            return Err(Mlx5Error::last_os("ibv_create_cq (memory node)"));
        }
        Ok(Mlx5MemoryNode {
            node,
            responders: Mutex::new(Some(Vec::new())),
            cq: Arc::new(RawCq {
                cq,
                _dev: nic.dev.clone(),
            }),
            host,
            dm,
            nic: nic.clone(),
        })
    }

    pub fn node(&self) -> NodeId {
        self.node
    }

    pub fn host_bytes(&self) -> u64 {
        self.host.len() as u64
    }

    pub fn dm_bytes(&self) -> u64 {
        self.dm.len()
    }

    /// Whether the device-memory region is on the NIC (false: the host
    /// fallback).
    pub fn dm_on_device(&self) -> bool {
        self.dm.on_device()
    }

    /// The node's host memory, for its own CPU (which the NIC's atomics are
    /// not atomic with respect to: the NIC contract).
    pub fn host_ptr(&self) -> *mut u8 {
        self.host.as_ptr()
    }

    /// The regions this node exposes, as an endpoint carries them.
    pub fn regions(&self) -> Vec<RegionInfo> {
        vec![
            RegionInfo {
                region: RemoteRegion {
                    space: Space::Host,
                    offset: 0,
                    len: self.host.len() as u64,
                    rkey: self.host.rkey(),
                    access: GRANT,
                },
                base: self.host.as_ptr() as u64,
            },
            RegionInfo {
                region: RemoteRegion {
                    space: Space::Device,
                    offset: 0,
                    len: self.dm.len(),
                    rkey: self.dm.rkey(),
                    access: GRANT,
                },
                base: self.dm.remote_base(),
            },
        ]
    }

    /// Makes a responder QP connected to `client` and returns the endpoint
    /// the client connects to.
    pub fn accept(&self, client: &QpEndpoint) -> Result<Endpoint, Mlx5Error> {
        let mut guard = self.responders.lock().expect("responders lock");
        let Some(list) = guard.as_mut() else {
            return Err(Mlx5Error::Verbs {
                call: "accept (memory node is shut down)",
                errno: libc::ECONNREFUSED,
            });
        };
        // SAFETY: PD and CQ are live and of one context.
        let (qp, _) = unsafe { create_rc_qp(self.nic.dev.pd, self.cq.cq, 1, 0)? };
        let r = Responder {
            qp,
            _cq: self.cq.clone(),
            _dev: self.nic.dev.clone(),
        };
        let psn = fresh_psn_for(r.qpn());
        self.connect_responder(&r, client, psn)?;
        let ep = Endpoint {
            node: self.node,
            qp: self.nic.endpoint(r.qpn(), psn),
            regions: self.regions(),
        };
        list.push(r);
        Ok(ep)
    }

    fn connect_responder(
        &self,
        r: &Responder,
        client: &QpEndpoint,
        psn: u32,
    ) -> Result<(), Mlx5Error> {
        let path = self.nic.path();
        // SAFETY: the responder's QP is live while `r` is.
        unsafe {
            modify(r.qp, init_attr(&path), "ibv_modify_qp(INIT)")?;
            modify(r.qp, rtr_attr(&path, client), "ibv_modify_qp(RTR)")?;
            modify(r.qp, rts_attr(&path, psn, client), "ibv_modify_qp(RTS)")?;
        }
        Ok(())
    }

    /// Resets responder `qpn` and connects it to the client's new endpoint
    /// (the client recovered its QP); `None` when the node is shut down or
    /// has no such responder.
    pub fn rearm(&self, qpn: u32, client: &QpEndpoint) -> Option<QpEndpoint> {
        let guard = self.responders.lock().expect("responders lock");
        let r = guard.as_ref()?.iter().find(|r| r.qpn() == qpn)?;
        let psn = fresh_psn_for(qpn ^ client.psn);
        // SAFETY: the QP is live while listed.
        if let Err(e) = unsafe { modify(r.qp, reset_attr(), "ibv_modify_qp(RESET)") } {
            log::error!("re-arming responder {qpn}: {e}");
            return None;
        }
        match self.connect_responder(r, client, psn) {
            Ok(()) => Some(self.nic.endpoint(qpn, psn)),
            Err(e) => {
                log::error!("re-arming responder {qpn}: {e}");
                None
            }
        }
    }

    /// Destroys every responder made so far and goes on accepting: a node
    /// that serves compute runs one after another drops the queue pairs of
    /// runs whose compute nodes have left (a compute QP still using one
    /// sees `RetryExceeded`). Returns how many were destroyed; 0 once shut
    /// down.
    pub fn retire_responders(&self) -> usize {
        let mut guard = self.responders.lock().expect("responders lock");
        guard.as_mut().map_or(0, |list| list.drain(..).count())
    }

    /// How many responders are live (0 once shut down).
    pub fn responders(&self) -> usize {
        let guard = self.responders.lock().expect("responders lock");
        guard.as_ref().map_or(0, Vec::len)
    }

    /// Stops answering, as a crashed node does: every responder QP is
    /// destroyed, so compute QPs see `RetryExceeded`.
    pub fn shut_down(&self) {
        drop(self.responders.lock().expect("responders lock").take());
    }
}

/// Re-arms responder `qpn` of an in-process memory node (loopback setups
/// and tests).
pub struct LoopbackRearm {
    pub node: Arc<Mlx5MemoryNode>,
    pub responder_qpn: u32,
}

impl Rearm for LoopbackRearm {
    fn rearm(&mut self, ours: &QpEndpoint) -> Option<QpEndpoint> {
        self.node.rearm(self.responder_qpn, ours)
    }
}
