//! Reliable-connected queue pairs: creation, the RESET→INIT→RTR→RTS walk
//! from an exchanged [`Endpoint`] (attributes built by pure functions, so
//! they are tested without a device), doorbell chains of linked
//! `ibv_send_wr` with selective signaling, and recovery.
//!
//! Ordering: requests on one QP execute in posting order at the responder,
//! except that a WRITE may overtake an earlier READ or atomic whose response
//! is still outstanding (IBA 10.8.3.3, "fence"); such a WRITE is posted
//! with `IBV_SEND_FENCE`, so the contract's in-order promise holds.
//!
//! Errors: a QP learns it is in error when the error completion is polled
//! (the NIC has no synchronous state to read cheaply). Requests posted
//! between the failure and that poll are flushed by the NIC, each with its
//! own `Flushed` completion, so every posted request still retires. A QP
//! whose peer stopped answering (`RetryExceeded`) is dead to this
//! connection: `recover` says `PeerDead`, for the rest of the run. Other
//! errors are recovered by RESET→INIT→RTR→RTS with a fresh PSN, after the
//! peer's QP (which the responder moves to error on remote errors) is
//! re-armed through the installed [`Rearm`]. The in-process harness
//! (`cluster`'s mlx5 cluster, `loch-bench`) installs [`LoopbackRearm`](super::LoopbackRearm)
//! (node.rs); `loch node`'s processes install none yet (a re-arm service
//! over the control channel is not built), so there a QP in error leaves
//! its memory node dead to that core for the rest of the run.

use super::cq::{CqInner, Posted, QpShared};
use super::device::{Device, Mlx5Nic};
use super::endpoint::{Endpoint, QpEndpoint, RegionInfo};
use super::status::post_errno_to_error;
use super::{Mlx5Cq, Mlx5Error};
use crate::addr::{GlobalAddr, NodeId};
use crate::nic::{CqId, QpState, QueuePair, RecoverError, RemoteRegion};
use crate::verbs::{Caps, Opcode, PostError, WorkRequest, WrOp};
use rdma_sys::*;
use std::rc::Rc;
use std::sync::Arc;

/// Local ACK timeout exponent: 4.096 µs · 2^14 ≈ 67 ms per try.
pub const RTS_TIMEOUT: u8 = 14;
/// Transport retries before `RetryExceeded`: a dead peer is noticed after
/// about (7 + 1) · 67 ms ≈ 0.5 s.
pub const RTS_RETRY_CNT: u8 = 7;
/// RNR retries (7 = infinite); one-sided verbs never meet RNR.
const RNR_RETRY: u8 = 7;
/// Minimum RNR NAK timer (12 = 0.64 ms), per rdma-core's examples.
const MIN_RNR_TIMER: u8 = 12;
/// GRH hop limit for RoCE and global routes.
const HOP_LIMIT: u8 = 64;

/// The local side of a path: what the attribute builders need besides the
/// peer's endpoint.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct PathConfig {
    pub port: u8,
    pub gid_index: u8,
    /// Route with the GRH (RoCE always; InfiniBand only across subnets).
    pub global: bool,
    /// Our port's active MTU (`ibv_mtu`).
    pub mtu: u8,
    /// READs/atomics this QP may have in flight as requester.
    pub max_rd_atomic: u8,
    /// READs/atomics this QP may serve as responder.
    pub max_dest_rd_atomic: u8,
    /// Traffic class of the global route header (RoCE v2: DSCP << 2).
    pub traffic_class: u8,
}

/// A `ibv_qp_attr` with the mask of the fields it sets.
pub struct QpAttr {
    pub attr: ibv_qp_attr,
    pub mask: u32,
}

fn zeroed_attr() -> ibv_qp_attr {
    // SAFETY: ibv_qp_attr is plain C data (integers and unions of
    // integers); all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

/// Any → RESET: drops whatever the queues held.
pub fn reset_attr() -> QpAttr {
    let mut attr = zeroed_attr();
    attr.qp_state = ibv_qp_state::IBV_QPS_RESET;
    QpAttr {
        attr,
        mask: ibv_qp_attr_mask::IBV_QP_STATE.0,
    }
}

/// RESET → INIT: port, partition key 0, and the remote rights this QP
/// grants as a responder (READ, WRITE, atomics: a memory node's QP serves
/// all three; a compute node's grants the same, harmlessly, since it
/// exposes no region).
pub fn init_attr(path: &PathConfig) -> QpAttr {
    let mut attr = zeroed_attr();
    attr.qp_state = ibv_qp_state::IBV_QPS_INIT;
    attr.pkey_index = 0;
    attr.port_num = path.port;
    attr.qp_access_flags = ibv_access_flags::IBV_ACCESS_REMOTE_READ.0
        | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0
        | ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0;
    QpAttr {
        attr,
        mask: (ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
            | ibv_qp_attr_mask::IBV_QP_PORT
            | ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS)
            .0,
    }
}

/// INIT → RTR: the peer's QP number, first PSN and address; the path MTU
/// is the smaller of the two ports'.
pub fn rtr_attr(path: &PathConfig, peer: &QpEndpoint) -> QpAttr {
    let mut attr = zeroed_attr();
    attr.qp_state = ibv_qp_state::IBV_QPS_RTR;
    attr.path_mtu = path.mtu.min(peer.mtu) as ibv_mtu::Type;
    attr.dest_qp_num = peer.qpn;
    attr.rq_psn = peer.psn;
    attr.max_dest_rd_atomic = path.max_dest_rd_atomic;
    attr.min_rnr_timer = MIN_RNR_TIMER;
    attr.ah_attr.dlid = peer.lid;
    attr.ah_attr.sl = 0;
    attr.ah_attr.src_path_bits = 0;
    attr.ah_attr.port_num = path.port;
    if path.global {
        attr.ah_attr.is_global = 1;
        attr.ah_attr.grh.dgid = ibv_gid { raw: peer.gid };
        attr.ah_attr.grh.sgid_index = path.gid_index;
        attr.ah_attr.grh.hop_limit = HOP_LIMIT;
        attr.ah_attr.grh.traffic_class = path.traffic_class;
        attr.ah_attr.grh.flow_label = 0;
    }
    QpAttr {
        attr,
        mask: (ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_AV
            | ibv_qp_attr_mask::IBV_QP_PATH_MTU
            | ibv_qp_attr_mask::IBV_QP_DEST_QPN
            | ibv_qp_attr_mask::IBV_QP_RQ_PSN
            | ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC
            | ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER)
            .0,
    }
}

/// RTR → RTS: our first PSN, the ACK timeout and retry counts that bound
/// how long a dead peer takes to notice, and the READ/atomic depth: ours
/// as a requester, but no more than the peer serves (its `rd_atom`: a
/// responder may refuse the excess).
pub fn rts_attr(path: &PathConfig, local_psn: u32, peer: &QpEndpoint) -> QpAttr {
    let mut attr = zeroed_attr();
    attr.qp_state = ibv_qp_state::IBV_QPS_RTS;
    attr.sq_psn = local_psn;
    attr.timeout = RTS_TIMEOUT;
    attr.retry_cnt = RTS_RETRY_CNT;
    attr.rnr_retry = RNR_RETRY;
    attr.max_rd_atomic = path.max_rd_atomic.min(peer.rd_atom).max(1);
    QpAttr {
        attr,
        mask: (ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_TIMEOUT
            | ibv_qp_attr_mask::IBV_QP_RETRY_CNT
            | ibv_qp_attr_mask::IBV_QP_RNR_RETRY
            | ibv_qp_attr_mask::IBV_QP_SQ_PSN
            | ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC)
            .0,
    }
}

/// The verbs opcode of a contract operation; `None` for masked CAS, which
/// needs mlx5dv experimental verbs this backend does not use.
pub fn wr_opcode(op: Opcode) -> Option<ibv_wr_opcode::Type> {
    match op {
        Opcode::Read => Some(ibv_wr_opcode::IBV_WR_RDMA_READ),
        Opcode::Write => Some(ibv_wr_opcode::IBV_WR_RDMA_WRITE),
        Opcode::Cas => Some(ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP),
        Opcode::Faa => Some(ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD),
        Opcode::MaskedCas => None,
    }
}

/// Whether a request must carry `IBV_SEND_FENCE`: a WRITE posted while an
/// earlier READ or atomic on the QP may still be outstanding.
pub fn needs_fence(read_or_atomic_before: bool, op: Opcode) -> bool {
    read_or_atomic_before && op == Opcode::Write
}

/// The address the NIC names `addr` by: the base of the region of its
/// space that holds its offset, plus the offset into that region; else the
/// first region of its space (the responder then refuses the out-of-range
/// request with a remote access error, as the contract wants); else the
/// bare offset.
pub fn remote_va(regions: &[RegionInfo], addr: GlobalAddr) -> u64 {
    let (space, off) = (addr.space(), addr.offset());
    let of_space = |r: &&RegionInfo| r.region.space == space;
    let r = regions
        .iter()
        .filter(of_space)
        .find(|r| off >= r.region.offset && off - r.region.offset < r.region.len)
        .or_else(|| regions.iter().find(of_space));
    match r {
        Some(r) => r.base.wrapping_add(off.wrapping_sub(r.region.offset)),
        None => off,
    }
}

/// A fresh 24-bit initial PSN (any value works; distinct ones make stale
/// packets from an earlier connection fall outside the window).
pub(crate) fn fresh_psn_for(salt: u32) -> u32 {
    let x = crate::clock::now_ns() ^ ((salt as u64) << 17);
    (x.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as u32 & 0xff_ffff
}

/// Applies one transition.
///
/// # Safety
/// `qp` must be a live QP.
pub(crate) unsafe fn modify(
    qp: *mut ibv_qp,
    a: QpAttr,
    call: &'static str,
) -> Result<(), Mlx5Error> {
    let mut attr = a.attr;
    // SAFETY: the caller guarantees `qp` is live; attr is a valid pointer.
    let rc = unsafe { ibv_modify_qp(qp, &mut attr, a.mask as i32) };
    if rc != 0 {
        return Err(Mlx5Error::errno(call, rc));
    }
    Ok(())
}

/// Creates an RC QP on `cq` (send and receive sides) with `depth` send
/// slots, one SGE, and `inline` bytes of inline payload; returns it with
/// the inline size the driver granted.
///
/// # Safety
/// `pd` and `cq` must be live and of one context.
pub(crate) unsafe fn create_rc_qp(
    pd: *mut ibv_pd,
    cq: *mut ibv_cq,
    depth: u32,
    inline: u32,
) -> Result<(*mut ibv_qp, u32), Mlx5Error> {
    // SAFETY: plain C data; zero is valid.
    let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
    init.send_cq = cq;
    init.recv_cq = cq;
    init.qp_type = ibv_qp_type::IBV_QPT_RC;
    init.sq_sig_all = 0;
    init.cap.max_send_wr = depth;
    init.cap.max_recv_wr = 1;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    init.cap.max_inline_data = inline;
    // SAFETY: the caller guarantees pd and cq; init is a valid pointer and
    // the driver writes the granted caps back into it.
    let qp = unsafe { ibv_create_qp(pd, &mut init) };
    if qp.is_null() {
        return Err(Mlx5Error::last_os("ibv_create_qp"));
    }
    Ok((qp, init.cap.max_inline_data))
}

/// The QP itself. Dropped in dependency order: the QP is destroyed, then
/// its CQ reference and device reference are released.
struct QpHandle {
    qp: *mut ibv_qp,
    depth: u32,
    cq: Rc<CqInner>,
    _dev: Arc<Device>,
}

impl Drop for QpHandle {
    fn drop(&mut self) {
        // SAFETY: created in create_qp; destroyed once, before the CQ and
        // PD it uses (still held by the fields below).
        let qpn = unsafe { (*self.qp).qp_num };
        // SAFETY: as above.
        if unsafe { ibv_destroy_qp(self.qp) } != 0 {
            log::error!("ibv_destroy_qp failed: {}", std::io::Error::last_os_error());
        }
        self.cq.qps.borrow_mut().retain(|s| s.qp_num != qpn);
        self.cq.reserved.set(self.cq.reserved.get() - self.depth);
    }
}

impl Mlx5Nic {
    /// A completion queue of `capacity` entries (`ibv_create_cq`).
    pub fn create_cq(&self, capacity: u32) -> Result<Mlx5Cq, Mlx5Error> {
        Mlx5Cq::create(&self.dev, capacity)
    }

    /// The path settings of this device's port.
    pub fn path(&self) -> PathConfig {
        let p = self.dev.port;
        let a = self.dev.attrs;
        PathConfig {
            port: p.port,
            gid_index: p.gid_index,
            global: p.roce || p.lid == 0,
            mtu: p.mtu,
            max_rd_atomic: a.max_qp_init_rd_atom.clamp(1, 16),
            max_dest_rd_atomic: a.max_qp_rd_atom.clamp(1, 16),
            traffic_class: self.dev.traffic_class,
        }
    }

    /// A queue pair in INIT on `cq` with `depth` send slots, whose depth is
    /// reserved in the CQ so the CQ can never overflow. Exchange its
    /// [`Mlx5PreparedQp::endpoint`], then [`connect`](Mlx5PreparedQp::connect).
    pub fn create_qp(&self, cq: &Mlx5Cq, depth: u32) -> Result<Mlx5PreparedQp, Mlx5Error> {
        let max = self.dev.attrs.max_qp_wr;
        if depth == 0 || depth > max {
            return Err(Mlx5Error::BadSize {
                what: "send queue depth",
                got: depth as u64,
                max: max as u64,
            });
        }
        let inner = &cq.inner;
        // A QP and its CQ must share a context (verbs would refuse, or
        // worse, on some providers).
        if !Arc::ptr_eq(&inner.dev, &self.dev) {
            return Err(Mlx5Error::OtherContext {
                what: "the completion queue",
            });
        }
        let reserved = inner.reserved.get() + depth;
        if reserved > inner.capacity {
            return Err(Mlx5Error::BadSize {
                what: "send slots reserved on the completion queue",
                got: reserved as u64,
                max: inner.capacity as u64,
            });
        }
        let inline = self.dev.inline_bytes;
        // SAFETY: the PD and CQ are live and of this device.
        let (qp, max_inline) = unsafe { create_rc_qp(self.dev.pd, inner.cq, depth, inline) }
            .map_err(|e| match e {
                // The driver sizes a send queue from its depth and each
                // entry's room, inline bytes included: the inline size
                // probed at depth 1 may not fit at this depth.
                Mlx5Error::Verbs { errno, .. } if errno == libc::EINVAL && depth > 1 => {
                    Mlx5Error::QueueTooLarge {
                        depth,
                        inline,
                        errno,
                    }
                }
                e => e,
            })?;
        inner.reserved.set(reserved);
        let handle = QpHandle {
            qp,
            depth,
            cq: inner.clone(),
            _dev: self.dev.clone(),
        };
        let path = self.path();
        // SAFETY: the QP is live (held by `handle`).
        unsafe { modify(qp, init_attr(&path), "ibv_modify_qp(INIT)")? };
        // SAFETY: as above.
        let qpn = unsafe { (*qp).qp_num };
        Ok(Mlx5PreparedQp {
            caps: Caps {
                max_inline_bytes: max_inline,
                ..crate::nic::Nic::caps(self)
            },
            path,
            local: self.endpoint(qpn, fresh_psn_for(qpn)),
            handle,
        })
    }

    /// This device's QP `qpn` as a peer connects to it, sending from
    /// `psn`: the port's address and MTU, and the READ/atomic depth it
    /// serves (what memory nodes' responders and compute QPs both send).
    pub(crate) fn endpoint(&self, qpn: u32, psn: u32) -> QpEndpoint {
        let p = self.dev.port;
        QpEndpoint {
            qpn,
            psn,
            lid: p.lid,
            gid: p.gid,
            mtu: p.mtu,
            rd_atom: self.path().max_dest_rd_atomic,
        }
    }
}

/// Re-arms the peer's side of a connection during recovery: told our QP's
/// new endpoint (fresh PSN), it resets the peer QP, connects it back, and
/// returns the peer's endpoint; `None` if the peer is gone. The loopback
/// harness implements it directly ([`LoopbackRearm`](super::LoopbackRearm)); nothing implements
/// it across processes yet.
pub trait Rearm {
    fn rearm(&mut self, ours: &QpEndpoint) -> Option<QpEndpoint>;
}

/// A queue pair in INIT, not yet connected.
pub struct Mlx5PreparedQp {
    handle: QpHandle,
    caps: Caps,
    path: PathConfig,
    /// What the peer needs to connect to this QP.
    local: QpEndpoint,
}

impl Mlx5PreparedQp {
    /// What the peer needs to connect to this QP.
    pub fn endpoint(&self) -> QpEndpoint {
        self.local
    }

    /// INIT → RTR → RTS towards `peer`, learning its regions.
    pub fn connect(self, peer: &Endpoint) -> Result<Mlx5Qp, Mlx5Error> {
        let qp = self.handle.qp;
        // SAFETY: the QP is live (held by self.handle).
        unsafe {
            modify(qp, rtr_attr(&self.path, &peer.qp), "ibv_modify_qp(RTR)")?;
            modify(
                qp,
                rts_attr(&self.path, self.local.psn, &peer.qp),
                "ibv_modify_qp(RTS)",
            )?;
        }
        let local = self.endpoint();
        let depth = self.handle.depth;
        let shared = Rc::new(QpShared::new(local.qpn, depth));
        self.handle.cq.qps.borrow_mut().push(shared.clone());
        let blank_sge = ibv_sge {
            addr: 0,
            length: 0,
            lkey: 0,
        };
        Ok(Mlx5Qp {
            handle: self.handle,
            shared,
            caps: self.caps,
            path: self.path,
            local,
            peer: peer.clone(),
            regions: peer.remote_regions(),
            wrs: (0..depth)
                // SAFETY: ibv_send_wr is plain C data; zero is valid.
                .map(|_| unsafe { std::mem::zeroed::<ibv_send_wr>() })
                .collect(),
            sges: vec![blank_sge; depth as usize].into_boxed_slice(),
            read_or_atomic_in_flight: false,
            peer_dead: false,
            rearm: None,
        })
    }
}

/// A connected (RTS) mlx5 queue pair.
pub struct Mlx5Qp {
    handle: QpHandle,
    shared: Rc<QpShared>,
    caps: Caps,
    path: PathConfig,
    local: QpEndpoint,
    peer: Endpoint,
    regions: Vec<RemoteRegion>,
    /// Preallocated doorbell chain: nothing allocates on the data path.
    wrs: Box<[ibv_send_wr]>,
    sges: Box<[ibv_sge]>,
    read_or_atomic_in_flight: bool,
    peer_dead: bool,
    rearm: Option<Box<dyn Rearm>>,
}

impl Mlx5Qp {
    /// Installs how the peer's side is re-armed when this QP recovers.
    pub fn set_rearm(&mut self, rearm: Box<dyn Rearm>) {
        self.rearm = Some(rearm);
    }

    /// Our endpoint as last connected.
    pub fn local_endpoint(&self) -> QpEndpoint {
        self.local
    }

    fn reconnect(&mut self) -> Result<(), RecoverError> {
        let dead = RecoverError::PeerDead(self.peer.node);
        let Some(rearm) = self.rearm.as_mut() else {
            // Said once: the QP stays dead, and later posts are refused
            // without another try.
            self.peer_dead = true;
            log::warn!(
                "QP {} to node {} cannot recover: no way to re-arm the peer's QP",
                self.local.qpn,
                self.peer.node
            );
            return Err(dead);
        };
        let qp = self.handle.qp;
        let psn = fresh_psn_for(self.local.psn);
        // SAFETY: the QP is live (held by self.handle).
        let r = unsafe {
            modify(qp, reset_attr(), "ibv_modify_qp(RESET)")
                .and_then(|_| modify(qp, init_attr(&self.path), "ibv_modify_qp(INIT)"))
        };
        if let Err(e) = r {
            log::error!("recovering QP {}: {e}", self.local.qpn);
            return Err(dead);
        }
        let ours = QpEndpoint { psn, ..self.local };
        let Some(theirs) = rearm.rearm(&ours) else {
            self.peer_dead = true;
            return Err(dead);
        };
        // SAFETY: as above.
        let r = unsafe {
            modify(qp, rtr_attr(&self.path, &theirs), "ibv_modify_qp(RTR)")
                .and_then(|_| modify(qp, rts_attr(&self.path, psn, &theirs), "ibv_modify_qp(RTS)"))
        };
        if let Err(e) = r {
            log::error!("recovering QP {}: {e}", self.local.qpn);
            return Err(dead);
        }
        self.local = ours;
        self.peer.qp = theirs;
        Ok(())
    }
}

impl Mlx5Qp {
    /// Everything the driver would refuse, refused here before any request
    /// reaches the send queue: a refused batch executes nothing.
    fn refusal(&self, wrs: &[WorkRequest], outstanding: u32) -> Result<(), PostError> {
        let depth = self.handle.depth;
        if outstanding as usize + wrs.len() > depth as usize {
            return Err(PostError::SendQueueFull { depth });
        }
        let peer = self.peer.node;
        let atomics = self.handle.cq.dev.attrs.atomics;
        for wr in wrs {
            self.caps.check(&wr.op)?;
            let op = wr.op.opcode();
            // libmlx5 takes atomics only on a device that reports them
            // (`atomic_cap` IBV_ATOMIC_HCA; EOPNOTSUPP otherwise, and a
            // batch cut there would be drained as a failure).
            if wr_opcode(op).is_none() || (op.is_atomic() && !atomics) {
                return Err(PostError::Unsupported(op));
            }
            if wr.op.remote().node() != peer {
                return Err(PostError::WrongNode {
                    addr: wr.op.remote(),
                    peer,
                });
            }
        }
        Ok(())
    }

    /// Links the first `n` work requests into a chain, each with its SGE,
    /// and returns its head. Done last, from one base pointer per array,
    /// so no later borrow of the arrays invalidates the links before the
    /// doorbell.
    fn link_chain(&mut self, n: usize) -> *mut ibv_send_wr {
        assert!(
            n <= self.wrs.len() && n <= self.sges.len(),
            "chain within the arrays"
        );
        let wr_base = self.wrs.as_mut_ptr();
        let sge_base = self.sges.as_mut_ptr();
        for i in 0..n {
            // SAFETY: i < n <= wrs.len() == sges.len() (asserted above), so
            // every pointer is in bounds.
            unsafe {
                let w = &mut *wr_base.add(i);
                w.sg_list = sge_base.add(i);
                w.next = if i + 1 < n {
                    wr_base.add(i + 1)
                } else {
                    std::ptr::null_mut()
                };
            }
        }
        wr_base
    }

    /// The driver took `posted` of the batch's requests, then refused the
    /// rest (`err`). Cannot happen while [`Mlx5Qp::refusal`] matches the
    /// driver's checks. If it does, the first `posted` requests are on the
    /// send queue, none of them signaled (the executor signals a group's
    /// last), and a caller told "refused" would reuse their memory while
    /// the NIC may still write it. So the batch is reported posted, and
    /// failed: the QP is forced to error, and one signaled request goes in
    /// behind the accepted ones carrying the batch's last `wr_id` (a
    /// zero-length WRITE; on a QP in error it is flushed, never executed:
    /// the drain `ib_drain_sq` uses). Its completion comes after every
    /// accepted request retired (one QP completes in order), so the
    /// caller's completion for the batch arrives only once the NIC is done
    /// with its memory. Should either step fail, nothing could tell when
    /// that is: the process aborts rather than let memory be reused under
    /// a NIC's writes. (A driver that refused for want of send-queue room
    /// has none for the drain either: that cause ends in the abort.)
    fn partly_posted(&mut self, head: u64, posted: usize, wrs: &[WorkRequest], err: &PostError) {
        let n = wrs.len();
        log::error!(
            "ibv_post_send took {posted} of {n} requests then refused: {err}; \
             moving QP {} to error and draining it",
            self.local.qpn
        );
        // `refusal` made room for all `n` (> posted): the drain's slot is
        // free.
        let last = &wrs[n - 1];
        let seq = self.shared.stage_drain(
            head,
            posted as u64,
            Posted {
                wr_id: last.wr_id,
                opcode: last.op.opcode(),
                len: last.op.len(),
            },
        );
        let mut attr = reset_attr();
        attr.attr.qp_state = ibv_qp_state::IBV_QPS_ERR;
        // SAFETY: the QP is live.
        if let Err(e) = unsafe { modify(self.handle.qp, attr, "ibv_modify_qp(ERR)") } {
            abort_drain(self.local.qpn, &e.to_string());
        }
        // SAFETY: ibv_send_wr is plain C data; all-zero is a valid value
        // (no SGE list, no next).
        let mut drain: ibv_send_wr = unsafe { std::mem::zeroed() };
        drain.wr_id = seq;
        drain.num_sge = 0;
        drain.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE;
        drain.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the QP is live; the request has no SGE (nothing local is
        // read or written) and lives until the call returns.
        let rc = unsafe { ibv_post_send(self.handle.qp, &mut drain, &mut bad) };
        if rc != 0 {
            abort_drain(
                self.local.qpn,
                &std::io::Error::from_raw_os_error(rc.abs()).to_string(),
            );
        }
    }
}

/// A partial post that could not be drained: requests whose memory the
/// NIC may still write are on a queue pair nothing can flush.
fn abort_drain(qpn: u32, why: &str) -> ! {
    log::error!("QP {qpn}: cannot drain a partly posted batch ({why}); aborting");
    eprintln!("loch: QP {qpn}: cannot drain a partly posted batch ({why}); aborting");
    std::process::abort()
}

/// The remote side of a work request: address and rkey, and for an atomic
/// its operands.
fn set_remote(w: &mut ibv_send_wr, op: &WrOp, remote_addr: u64) {
    let rkey = op.rkey().0;
    match *op {
        WrOp::Read { .. } | WrOp::Write { .. } => {
            w.wr.rdma = rdma_t { remote_addr, rkey };
        }
        WrOp::Cas { compare, swap, .. } => {
            w.wr.atomic = atomic_t {
                remote_addr,
                compare_add: compare,
                swap,
                rkey,
            };
        }
        WrOp::Faa { add, .. } => {
            w.wr.atomic = atomic_t {
                remote_addr,
                compare_add: add,
                swap: 0,
                rkey,
            };
        }
        WrOp::MaskedCas { .. } => unreachable!("refused before posting"),
    }
}

impl QueuePair for Mlx5Qp {
    fn qp_num(&self) -> u32 {
        self.local.qpn
    }

    fn peer(&self) -> NodeId {
        self.peer.node
    }

    fn cq_id(&self) -> CqId {
        CqId(Rc::as_ptr(&self.handle.cq) as usize, 0)
    }

    fn state(&self) -> QpState {
        self.shared.state.get()
    }

    fn outstanding(&self) -> u32 {
        self.shared.outstanding()
    }

    fn depth(&self) -> u32 {
        self.handle.depth
    }

    fn remote_regions(&self) -> &[RemoteRegion] {
        &self.regions
    }

    unsafe fn post_send(&mut self, wrs: &[WorkRequest]) -> Result<(), PostError> {
        if self.shared.state.get() == QpState::Error {
            return Err(PostError::QpInError);
        }
        if wrs.is_empty() {
            return Err(PostError::EmptyBatch);
        }
        let depth = self.handle.depth;
        let outstanding = self.shared.outstanding();
        self.refusal(wrs, outstanding)?;
        let head = self.shared.head.get();
        let mut before = self.read_or_atomic_in_flight && outstanding > 0;
        let n = wrs.len();
        {
            let mut ring = self.shared.ring.borrow_mut();
            for (i, wr) in wrs.iter().enumerate() {
                let seq = head + i as u64;
                let op = wr.op.opcode();
                ring[(seq % depth as u64) as usize] = Posted {
                    wr_id: wr.wr_id,
                    opcode: op,
                    len: wr.op.len(),
                };
                let local = wr.op.local();
                self.sges[i] = ibv_sge {
                    addr: local.addr as u64,
                    length: local.len,
                    lkey: local.lkey.0,
                };
                let mut flags = 0;
                if wr.signaled {
                    flags |= ibv_send_flags::IBV_SEND_SIGNALED.0;
                }
                if let WrOp::Write { inline: true, .. } = wr.op {
                    flags |= ibv_send_flags::IBV_SEND_INLINE.0;
                }
                if needs_fence(before, op) {
                    flags |= ibv_send_flags::IBV_SEND_FENCE.0;
                }
                before |= op != Opcode::Write;
                let remote_addr = remote_va(&self.peer.regions, wr.op.remote());
                let w = &mut self.wrs[i];
                w.wr_id = seq;
                w.num_sge = 1;
                w.opcode = wr_opcode(op).expect("checked above");
                w.send_flags = flags;
                set_remote(w, &wr.op, remote_addr);
            }
        }
        self.read_or_atomic_in_flight = before;
        let wr_base = self.link_chain(n);
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the QP is live; the chain of `n` linked requests and their
        // SGEs live in self until ibv_post_send returns (the driver copies
        // them into the send queue); the caller keeps the local memory valid
        // until completion (this function's contract).
        let rc = unsafe { ibv_post_send(self.handle.qp, wr_base, &mut bad) };
        if rc == 0 {
            self.shared.head.set(head + n as u64);
            return Ok(());
        }
        let posted = if bad.is_null() {
            0
        } else {
            // SAFETY: the driver points `bad` into our chain.
            // At most n - 1: with rc != 0 the driver refused one at least.
            unsafe { bad.offset_from(wr_base) }.clamp(0, n as isize - 1) as usize
        };
        let failed = &wrs[posted.min(n - 1)].op;
        let err = post_errno_to_error(rc, failed, depth, self.caps.max_inline_bytes);
        if posted > 0 {
            // Reported posted: the batch completes, flushed (see there).
            self.partly_posted(head, posted, wrs, &err);
            return Ok(());
        }
        Err(err)
    }

    fn recover(&mut self) -> Result<(), RecoverError> {
        if self.shared.state.get() == QpState::Ready {
            return Ok(());
        }
        let outstanding = self.shared.outstanding();
        if outstanding > 0 {
            return Err(RecoverError::Busy { outstanding });
        }
        // A peer that stopped answering is dead to this QP for the rest
        // of the run.
        if self.peer_dead
            || self.shared.first_error.get() == Some(crate::verbs::WcStatus::RetryExceeded)
        {
            self.peer_dead = true;
            return Err(RecoverError::PeerDead(self.peer.node));
        }
        self.reconnect()?;
        self.read_or_atomic_in_flight = false;
        self.shared.first_error.set(None);
        self.shared.state.set(QpState::Ready);
        Ok(())
    }
}
