//! The mlx5 backend: what can be checked without a device (struct layouts
//! and constants against the C headers, endpoint encoding, QP-attribute
//! builders, status mapping, the no-device path), and the conformance suite
//! on a loopback setup wherever an RDMA device exists. Without one each
//! conformance case prints "skipped: no RDMA device" and returns.
#![cfg(feature = "mlx5")]

use nicdrv::conformance::{self, Harness, RawRig, TaskFactory};
use nicdrv::mlx5::*;
use nicdrv::*;
use rdma_sys::{ibv_access_flags, ibv_qp_attr_mask as m, ibv_qp_state, ibv_wc_status as ws};
use std::sync::Arc;

// ---- layouts and constants against verbs.h (x86_64 / aarch64 Linux) ----

#[test]
fn struct_layouts_match_verbs_h() {
    use std::mem::{align_of, offset_of, size_of};
    // Sizes from rdma-core's verbs.h on LP64 (pahole of libibverbs).
    assert_eq!(size_of::<rdma_sys::ibv_sge>(), 16);
    assert_eq!(size_of::<rdma_sys::ibv_send_wr>(), 128);
    assert_eq!(align_of::<rdma_sys::ibv_send_wr>(), 8);
    assert_eq!(offset_of!(rdma_sys::ibv_send_wr, wr_id), 0);
    assert_eq!(offset_of!(rdma_sys::ibv_send_wr, next), 8);
    assert_eq!(offset_of!(rdma_sys::ibv_send_wr, sg_list), 16);
    assert_eq!(offset_of!(rdma_sys::ibv_send_wr, num_sge), 24);
    assert_eq!(offset_of!(rdma_sys::ibv_send_wr, opcode), 28);
    assert_eq!(offset_of!(rdma_sys::ibv_send_wr, send_flags), 32);
    assert_eq!(offset_of!(rdma_sys::ibv_send_wr, wr), 40);
    assert_eq!(size_of::<rdma_sys::ibv_wc>(), 48);
    assert_eq!(offset_of!(rdma_sys::ibv_wc, status), 8);
    assert_eq!(offset_of!(rdma_sys::ibv_wc, byte_len), 20);
    assert_eq!(offset_of!(rdma_sys::ibv_wc, qp_num), 28);
    assert_eq!(size_of::<rdma_sys::ibv_qp_attr>(), 144);
    assert_eq!(size_of::<rdma_sys::ibv_gid>(), 16);
    assert_eq!(size_of::<rdma_sys::ibv_ah_attr>(), 32);
    // The atomic arm of the wr union: remote_addr, compare_add, swap, rkey.
    assert_eq!(size_of::<rdma_sys::atomic_t>(), 32);
}

#[test]
fn opcode_and_access_mapping_equals_header_constants() {
    use rdma_sys::ibv_wr_opcode::*;
    // verbs.h: enum ibv_wr_opcode.
    assert_eq!(wr_opcode(Opcode::Write), Some(0));
    assert_eq!(wr_opcode(Opcode::Read), Some(4));
    assert_eq!(wr_opcode(Opcode::Cas), Some(5));
    assert_eq!(wr_opcode(Opcode::Faa), Some(6));
    assert_eq!(IBV_WR_RDMA_WRITE, 0);
    assert_eq!(IBV_WR_RDMA_READ, 4);
    assert_eq!(IBV_WR_ATOMIC_CMP_AND_SWP, 5);
    assert_eq!(IBV_WR_ATOMIC_FETCH_AND_ADD, 6);
    assert_eq!(wr_opcode(Opcode::MaskedCas), None);
    // verbs.h: enum ibv_access_flags; ours orders READ/WRITE the other way.
    assert_eq!(ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0, 1);
    assert_eq!(ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0, 2);
    assert_eq!(ibv_access_flags::IBV_ACCESS_REMOTE_READ.0, 4);
    assert_eq!(ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0, 8);
    assert_eq!(access_to_ibv(Access::LOCAL_WRITE), 1);
    assert_eq!(access_to_ibv(Access::REMOTE_READ), 4);
    // Remote write and atomic rights require local write (ibv_reg_mr(3)).
    assert_eq!(access_to_ibv(Access::REMOTE_WRITE), 2 | 1);
    assert_eq!(access_to_ibv(Access::REMOTE_ATOMIC), 8 | 1);
    assert_eq!(access_to_ibv(Access::REMOTE_ALL), 1 | 2 | 4 | 8);
    assert_eq!(access_to_ibv(Access::empty()), 0);
    use rdma_sys::ibv_send_flags as f;
    assert_eq!(
        (
            f::IBV_SEND_FENCE.0,
            f::IBV_SEND_SIGNALED.0,
            f::IBV_SEND_INLINE.0
        ),
        (1, 2, 8)
    );
}

#[test]
fn wc_status_mapping() {
    let cases = [
        (ws::IBV_WC_SUCCESS, WcStatus::Success),
        (ws::IBV_WC_LOC_LEN_ERR, WcStatus::LocalLength),
        (ws::IBV_WC_LOC_PROT_ERR, WcStatus::LocalProtection),
        (ws::IBV_WC_LOC_ACCESS_ERR, WcStatus::LocalProtection),
        (ws::IBV_WC_LOC_QP_OP_ERR, WcStatus::LocalProtection),
        (ws::IBV_WC_WR_FLUSH_ERR, WcStatus::Flushed),
        (ws::IBV_WC_REM_ACCESS_ERR, WcStatus::RemoteAccess),
        (ws::IBV_WC_REM_INV_REQ_ERR, WcStatus::RemoteInvalidRequest),
        (ws::IBV_WC_REM_OP_ERR, WcStatus::RemoteInvalidRequest),
        (
            ws::IBV_WC_REM_INV_RD_REQ_ERR,
            WcStatus::RemoteInvalidRequest,
        ),
        (ws::IBV_WC_RETRY_EXC_ERR, WcStatus::RetryExceeded),
        (ws::IBV_WC_RNR_RETRY_EXC_ERR, WcStatus::RetryExceeded),
        (ws::IBV_WC_RESP_TIMEOUT_ERR, WcStatus::RetryExceeded),
        (ws::IBV_WC_FATAL_ERR, WcStatus::LocalProtection),
        (ws::IBV_WC_GENERAL_ERR, WcStatus::LocalProtection),
    ];
    for (raw, want) in cases {
        assert_eq!(wc_status(raw), want, "ibv_wc_status {raw}");
    }
    // The header's numbering, which the match above relies on.
    assert_eq!(
        (ws::IBV_WC_REM_ACCESS_ERR, ws::IBV_WC_RETRY_EXC_ERR),
        (10, 12)
    );
}

#[test]
fn post_errnos_map_to_post_errors() {
    let sge = Sge {
        addr: std::ptr::null_mut(),
        len: 300,
        lkey: LKey(1),
    };
    let remote = GlobalAddr::host(0, 0);
    let write = |inline| WrOp::Write {
        remote,
        rkey: RKey(1),
        local: sge,
        inline,
    };
    assert_eq!(
        post_errno_to_error(libc::ENOMEM, &write(false), 64, 220),
        PostError::SendQueueFull { depth: 64 }
    );
    assert_eq!(
        post_errno_to_error(libc::EINVAL, &write(true), 64, 220),
        PostError::InlineTooLong { len: 300, max: 220 }
    );
    assert_eq!(
        post_errno_to_error(libc::EINVAL, &write(false), 64, 220),
        PostError::QpInError
    );
    // libmlx5 refuses an oversized inline payload with ENOMEM.
    assert_eq!(
        post_errno_to_error(libc::ENOMEM, &write(true), 64, 220),
        PostError::InlineTooLong { len: 300, max: 220 }
    );
    // An inline WRITE within the grant: ENOMEM is the queue again.
    assert_eq!(
        post_errno_to_error(libc::ENOMEM, &write(true), 64, 512),
        PostError::SendQueueFull { depth: 64 }
    );
    // Atomics on a device without them.
    let cas = WrOp::Cas {
        remote,
        rkey: RKey(1),
        local: Sge { len: 8, ..sge },
        compare: 0,
        swap: 1,
    };
    assert_eq!(
        post_errno_to_error(libc::EOPNOTSUPP, &cas, 64, 220),
        PostError::Unsupported(Opcode::Cas)
    );
}

/// A port's GID types read from a sysfs-shaped tree; an empty RoCE GID is
/// refused with the v2 entries to choose from, a populated one taken.
#[test]
fn roce_gids_are_checked_against_the_table() {
    let root = std::env::temp_dir().join(format!("loch-gid-types-{}", std::process::id()));
    let types = root.join("mlx5_0/ports/1/gid_attrs/types");
    std::fs::create_dir_all(&types).unwrap();
    for (i, t) in [
        (0, "IB/RoCE v1\n"),
        (1, "RoCE v2\n"),
        (3, "RoCE v2\n"),
        (4, ""),
    ] {
        std::fs::write(types.join(i.to_string()), t).unwrap();
    }
    std::fs::write(types.join("not-an-index"), "RoCE v2\n").unwrap();
    let got = nicdrv::gids::gid_types(&root, "mlx5_0", 1);
    assert_eq!(
        got,
        vec![
            (0, "IB/RoCE v1".to_string()),
            (1, "RoCE v2".to_string()),
            (3, "RoCE v2".to_string())
        ]
    );
    assert!(
        nicdrv::gids::gid_types(&root, "mlx5_0", 2).is_empty(),
        "no such port"
    );
    assert_eq!(nicdrv::gids::roce_v2(&got), vec![1, 3]);
    assert!(nicdrv::gids::is_roce_v1(&got, 0) && !nicdrv::gids::is_roce_v1(&got, 1));
    let empty = [0u8; 16];
    match check_roce_gid(&empty, "mlx5_0", 1, 2, &got) {
        Err(e @ Mlx5Error::EmptyGid { .. }) => {
            let s = e.to_string();
            assert!(s.contains("index 2") && s.contains("[1, 3]"), "{s}");
        }
        other => panic!("expected EmptyGid, got {other:?}"),
    }
    let mut gid = [0u8; 16];
    gid[10] = 0xff;
    gid[11] = 0xff;
    gid[12..].copy_from_slice(&[10, 0, 0, 1]);
    assert!(check_roce_gid(&gid, "mlx5_0", 1, 3, &got).is_ok());
    assert!(
        check_roce_gid(&gid, "mlx5_0", 1, 0, &got).is_ok(),
        "v1: a warning"
    );
    std::fs::remove_dir_all(&root).unwrap();
}

/// A queue the driver cannot size says what to lower; a foreign CQ says
/// whose it is.
#[test]
fn queue_errors_say_what_to_change() {
    let e = Mlx5Error::QueueTooLarge {
        depth: 8192,
        inline: 220,
        errno: libc::EINVAL,
    }
    .to_string();
    assert!(
        e.contains("8192 entries") && e.contains("220 inline") && e.contains("--depth"),
        "{e}"
    );
    let e = Mlx5Error::OtherContext {
        what: "the completion queue",
    }
    .to_string();
    assert_eq!(e, "the completion queue belongs to another device context");
}

#[test]
fn fence_only_writes_after_reads_or_atomics() {
    for op in Opcode::ALL {
        assert!(!needs_fence(false, op));
    }
    assert!(needs_fence(true, Opcode::Write));
    assert!(!needs_fence(true, Opcode::Read));
    assert!(!needs_fence(true, Opcode::Faa));
}

// ---- endpoint encoding ----

fn sample_endpoint() -> Endpoint {
    Endpoint {
        node: 7,
        qp: QpEndpoint {
            qpn: 0x1234,
            psn: 0xab_cdef,
            lid: 3,
            gid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8],
            mtu: 5,
            rd_atom: 16,
        },
        regions: vec![
            RegionInfo {
                region: RemoteRegion {
                    space: Space::Host,
                    offset: 0,
                    len: 1 << 30,
                    rkey: RKey(0xdead),
                    access: Access::REMOTE_ALL,
                },
                base: 0x7f00_0000_0000,
            },
            RegionInfo {
                region: RemoteRegion {
                    space: Space::Device,
                    offset: 0,
                    len: 256 << 10,
                    rkey: RKey(0xbeef),
                    access: Access::REMOTE_ATOMIC | Access::REMOTE_READ,
                },
                base: 0,
            },
        ],
    }
}

#[test]
fn endpoint_round_trips() {
    let ep = sample_endpoint();
    let bytes = ep.encode().unwrap();
    assert_eq!(bytes.len(), 37 + 2 * 30);
    assert_eq!(Endpoint::decode(&bytes).unwrap(), ep);
    let none = Endpoint {
        regions: vec![],
        ..ep
    };
    assert_eq!(Endpoint::decode(&none.encode().unwrap()).unwrap(), none);
}

#[test]
fn endpoint_rejects_truncated_and_garbage_bytes() {
    let bytes = sample_endpoint().encode().unwrap();
    for cut in 0..bytes.len() {
        let e = Endpoint::decode(&bytes[..cut]).expect_err("truncated accepted");
        assert!(
            matches!(e, EndpointError::Truncated { .. }),
            "cut {cut}: {e}"
        );
    }
    let mut long = bytes.clone();
    long.push(0);
    assert_eq!(
        Endpoint::decode(&long),
        Err(EndpointError::TrailingBytes { extra: 1 })
    );
    let mut bad = bytes.clone();
    bad[0] = b'X';
    assert_eq!(Endpoint::decode(&bad), Err(EndpointError::BadMagic));
    let mut bad = bytes.clone();
    bad[4] = 9;
    assert_eq!(Endpoint::decode(&bad), Err(EndpointError::BadVersion(9)));
    // Field offsets (wire format in endpoint.rs): mtu at 18, rd_atom at
    // 19, psn at 12, first region's space at 37, access at 38, len at 51.
    let field = |at: usize, v: &[u8]| {
        let mut b = bytes.clone();
        b[at..at + v.len()].copy_from_slice(v);
        Endpoint::decode(&b)
    };
    for (at, v, name) in [
        (18, &[0u8][..], "mtu"),
        (18, &[6u8][..], "mtu"),
        (19, &[0u8][..], "rd_atom"),
        (12, &0x0100_0000u32.to_le_bytes()[..], "psn"),
        (8, &0x0100_0000u32.to_le_bytes()[..], "qpn"),
        (37, &[2u8][..], "region space"),
        (38, &[0x10u8][..], "region access"),
        (51, &0u64.to_le_bytes()[..], "region len"),
        (43, &(1u64 << 47).to_le_bytes()[..], "region offset+len"),
    ] {
        match field(at, v) {
            Err(EndpointError::BadField { field, .. }) => assert_eq!(field, name),
            other => panic!("{name}: expected BadField, got {other:?}"),
        }
    }
    let mut many = sample_endpoint();
    many.regions = vec![many.regions[0]; MAX_ENDPOINT_REGIONS + 1];
    assert!(matches!(
        many.encode(),
        Err(EndpointError::TooManyRegions(_))
    ));
    // Random garbage never panics.
    let mut rng = nicdrv::rng::Rng::new(0x5eed);
    for _ in 0..20_000 {
        let len = rng.below(120) as usize;
        let mut b: Vec<u8> = (0..len).map(|_| rng.below(256) as u8).collect();
        if len >= 4 && rng.below(2) == 0 {
            b[..4].copy_from_slice(b"LCEP");
        }
        let _ = Endpoint::decode(&b);
    }
}

// ---- QP attribute builders ----

fn path(global: bool) -> PathConfig {
    PathConfig {
        port: 1,
        gid_index: 3,
        global,
        mtu: 5,
        max_rd_atomic: 16,
        max_dest_rd_atomic: 16,
        traffic_class: 106,
    }
}

#[test]
fn init_attr_sets_port_and_remote_rights() {
    let a = init_attr(&path(false));
    assert_eq!(
        a.mask,
        (m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS).0
    );
    assert_eq!(a.attr.qp_state, ibv_qp_state::IBV_QPS_INIT);
    assert_eq!(a.attr.port_num, 1);
    assert_eq!(a.attr.pkey_index, 0);
    assert_eq!(a.attr.qp_access_flags, 2 | 4 | 8);
}

#[test]
fn rtr_attr_names_the_peer() {
    let ep = sample_endpoint().qp;
    for global in [false, true] {
        let a = rtr_attr(
            &PathConfig {
                mtu: 3,
                ..path(global)
            },
            &ep,
        );
        assert_eq!(
            a.mask,
            (m::IBV_QP_STATE
                | m::IBV_QP_AV
                | m::IBV_QP_PATH_MTU
                | m::IBV_QP_DEST_QPN
                | m::IBV_QP_RQ_PSN
                | m::IBV_QP_MAX_DEST_RD_ATOMIC
                | m::IBV_QP_MIN_RNR_TIMER)
                .0
        );
        let at = &a.attr;
        assert_eq!(at.qp_state, ibv_qp_state::IBV_QPS_RTR);
        assert_eq!(at.path_mtu, 3, "the smaller of the two MTUs");
        assert_eq!(at.dest_qp_num, 0x1234);
        assert_eq!(at.rq_psn, 0xab_cdef);
        assert_eq!(at.max_dest_rd_atomic, 16);
        assert_eq!(at.ah_attr.dlid, 3);
        assert_eq!(at.ah_attr.port_num, 1);
        assert_eq!(at.ah_attr.is_global, global as u8);
        if global {
            // SAFETY: the union holds the raw gid written by rtr_attr.
            assert_eq!(unsafe { at.ah_attr.grh.dgid.raw }, ep.gid);
            assert_eq!(at.ah_attr.grh.sgid_index, 3);
            assert_eq!(at.ah_attr.grh.traffic_class, 106);
            assert!(at.ah_attr.grh.hop_limit > 0);
        }
    }
}

#[test]
fn rts_and_reset_attrs() {
    let peer = sample_endpoint().qp;
    let a = rts_attr(&path(false), 0x42, &peer);
    assert_eq!(
        a.mask,
        (m::IBV_QP_STATE
            | m::IBV_QP_TIMEOUT
            | m::IBV_QP_RETRY_CNT
            | m::IBV_QP_RNR_RETRY
            | m::IBV_QP_SQ_PSN
            | m::IBV_QP_MAX_QP_RD_ATOMIC)
            .0
    );
    assert_eq!(a.attr.qp_state, ibv_qp_state::IBV_QPS_RTS);
    assert_eq!(a.attr.sq_psn, 0x42);
    assert_eq!(
        (a.attr.timeout, a.attr.retry_cnt),
        (RTS_TIMEOUT, RTS_RETRY_CNT)
    );
    assert_eq!(a.attr.max_rd_atomic, 16);
    // A peer that serves fewer READs and atomics at once gets no more.
    let small = QpEndpoint { rd_atom: 4, ..peer };
    assert_eq!(rts_attr(&path(false), 0x42, &small).attr.max_rd_atomic, 4);
    let r = reset_attr();
    assert_eq!(r.mask, m::IBV_QP_STATE.0);
    assert_eq!(r.attr.qp_state, ibv_qp_state::IBV_QPS_RESET);
}

// ---- the no-device path ----

#[test]
fn device_list_outcomes() {
    assert_eq!(
        device_list_outcome(true, libc::ENOSYS, 0),
        Err(Mlx5Error::NoDevice)
    );
    assert_eq!(device_list_outcome(false, 0, 0), Err(Mlx5Error::NoDevice));
    assert_eq!(
        device_list_outcome(true, libc::EPERM, 0),
        Err(Mlx5Error::Verbs {
            call: "ibv_get_device_list",
            errno: libc::EPERM
        })
    );
    assert_eq!(device_list_outcome(false, 0, 2), Ok(()));
    assert!(Mlx5Error::NoDevice.to_string().contains("no RDMA device"));
}

#[test]
fn opening_without_a_device_is_the_no_device_error() {
    if std::path::Path::new("/sys/class/infiniband").exists() {
        eprintln!("skipped: this machine has RDMA devices");
        return;
    }
    match Mlx5Nic::open(&DeviceConfig::default()) {
        Err(e) => {
            assert_eq!(e, Mlx5Error::NoDevice);
            assert!(e.to_string().contains("no RDMA device"), "{e}");
        }
        Ok(nic) => panic!("opened {} without /sys/class/infiniband", nic.name()),
    }
    assert_eq!(device_names(), Err(Mlx5Error::NoDevice));
}

// ---- conformance on a loopback setup ----

const HOST: usize = 4 << 20;
const DM: u64 = 64 << 10;

struct Mlx5Harness {
    nic: Mlx5Nic,
    nodes: Vec<Arc<Mlx5MemoryNode>>,
}

/// A loopback fixture (two memory nodes and their compute QPs on one
/// device), or `None` (printing why) when this machine has no RDMA device.
fn harness() -> Option<Mlx5Harness> {
    let cfg = DeviceConfig::from_env().expect("the LOCH_MLX5_* variables");
    let nic = match Mlx5Nic::open(&cfg) {
        Ok(nic) => nic,
        Err(Mlx5Error::NoDevice) => {
            eprintln!("skipped: no RDMA device");
            return None;
        }
        Err(e) => panic!("an RDMA device exists but cannot be used: {e}"),
    };
    let nodes = (0..2)
        .map(|id| Arc::new(Mlx5MemoryNode::new(&nic, id, HOST, DM).expect("memory node")))
        .collect();
    Some(Mlx5Harness { nic, nodes })
}

impl Mlx5Harness {
    fn connect(&self, cq: &Mlx5Cq, node: NodeId, depth: u32) -> Mlx5Qp {
        let n = &self.nodes[node as usize];
        let prepared = self.nic.create_qp(cq, depth).expect("create QP");
        let ep = n.accept(&prepared.endpoint()).expect("accept");
        // The endpoint crosses the "wire" as bytes, as bootstrap sends it.
        let ep = Endpoint::decode(&ep.encode().unwrap()).unwrap();
        let mut qp = prepared.connect(&ep).expect("connect");
        qp.set_rearm(Box::new(LoopbackRearm {
            node: n.clone(),
            responder_qpn: ep.qp.qpn,
        }));
        qp
    }

    fn executor(&self, nic: &Mlx5Nic, cfg: ExecutorConfig) -> Executor<Mlx5Nic> {
        let depth = cfg.qp_depth();
        let cq = nic.create_cq(depth * self.nodes.len() as u32).expect("CQ");
        let qps = (0..self.nodes.len())
            .map(|n| self.connect(&cq, n as NodeId, depth))
            .collect();
        let mr = nic
            .register(
                HeapMem::zeroed(cfg.scratch_bytes()).unwrap(),
                Access::LOCAL_WRITE,
            )
            .expect("register scratch");
        Executor::new(nic.clone(), cq, qps, mr, cfg).expect("executor")
    }
}

impl Harness for Mlx5Harness {
    type N = Mlx5Nic;

    fn memory_nodes(&self) -> Vec<NodeId> {
        self.nodes.iter().map(|n| n.node()).collect()
    }
    fn host_bytes(&self, node: NodeId) -> u64 {
        self.nodes[node as usize].host_bytes()
    }
    fn dm_bytes(&self, node: NodeId) -> u64 {
        self.nodes[node as usize].dm_bytes()
    }
    fn parallel(&self, threads: usize, tasks: usize, f: TaskFactory<Mlx5Nic>) {
        cluster::cores::run_task_factory(
            threads,
            tasks,
            |_, cfg| self.executor(&self.nic, cfg),
            &f,
        );
    }
    fn parallel_on(&self, machines: &[Option<NodeId>], tasks: usize, f: TaskFactory<Mlx5Nic>) {
        cluster::cores::run_task_factory(
            machines.len(),
            tasks,
            |th, cfg| match machines[th] {
                Some(n) => self.executor(&self.nic.on_machine(&self.nodes[n as usize]), cfg),
                None => self.executor(&self.nic, cfg),
            },
            &f,
        );
    }
    fn raw(&self, node: NodeId, local_bytes: usize) -> RawRig<Mlx5Nic> {
        let cq = self.nic.create_cq(64).unwrap();
        let qp = self.connect(&cq, node, 16);
        let mr = self
            .nic
            .register(HeapMem::zeroed(local_bytes).unwrap(), Access::LOCAL_WRITE)
            .unwrap();
        RawRig { cq, qp, mr }
    }
    fn kill_node(&mut self, node: NodeId) {
        // Responders gone: requests to the node time out after about
        // (RTS_RETRY_CNT + 1) ACK timeouts and complete RetryExceeded.
        self.nodes[node as usize].shut_down();
    }
}

/// Runs `case` on a loopback fixture, or prints why it is skipped.
fn on_device(case: impl FnOnce(&mut Mlx5Harness)) {
    if let Some(mut h) = harness() {
        case(&mut h);
    }
}

#[test]
fn conformance_local_view_matches_remote_verbs() {
    on_device(|h| conformance::local_view_matches_remote_verbs(h));
}
#[test]
fn conformance_timers() {
    on_device(|h| conformance::timers(h));
}
#[test]
fn conformance_wait_for_write() {
    on_device(|h| conformance::wait_for_write(h));
}
#[test]
fn conformance_ordering_within_qp() {
    on_device(|h| conformance::ordering_within_qp(h));
}
#[test]
fn conformance_batch_semantics() {
    on_device(|h| conformance::batch_semantics(h));
}
#[test]
fn conformance_batch_lifecycle() {
    on_device(|h| conformance::batch_lifecycle(h));
}
#[test]
fn conformance_selective_signaling() {
    on_device(|h| conformance::selective_signaling(h));
}
#[test]
fn conformance_faa_exact_totals() {
    on_device(|h| conformance::faa_exact_totals(h, 2, 4, 2000));
}
#[test]
fn conformance_cas_races() {
    on_device(|h| conformance::cas_races(h, 2, 3, 300));
}
#[test]
fn conformance_masked_cas() {
    on_device(|h| conformance::masked_cas(h));
}
#[test]
fn conformance_remote_errors() {
    on_device(|h| conformance::remote_errors(h));
}
#[test]
fn conformance_flush_on_error() {
    on_device(|h| conformance::flush_on_error(h));
}
#[test]
fn conformance_post_refusals() {
    on_device(|h| conformance::post_refusals(h));
}
#[test]
fn conformance_torn_reads_observable() {
    on_device(|h| conformance::torn_reads_observable(h, 64 * 1024, 200_000));
}
#[test]
fn conformance_lines_are_atomic() {
    on_device(|h| conformance::lines_are_atomic(h, 8, 20_000, 2_000_000));
}
#[test]
fn conformance_dead_node() {
    on_device(conformance::dead_node);
}

/// Device memory is sized from the device and falls back to host memory
/// where the NIC has none; either way the region is usable remotely.
#[test]
fn device_memory_sized_from_the_device() {
    on_device(|h| {
        let max = h.nic.attrs().max_dm_size;
        let n = &h.nodes[0];
        if max == 0 {
            assert!(!n.dm_on_device());
            assert_eq!(n.dm_bytes(), DM);
        } else {
            assert!(n.dm_on_device());
            assert_eq!(n.dm_bytes(), DM.min(max) & !7);
        }
    });
}

/// A core's CQ and QPs travel to the core's thread as one value; the
/// device context is shared by every thread.
#[test]
fn per_core_links_are_send() {
    fn send<T: Send>() {}
    fn send_sync<T: Send + Sync>() {}
    send::<Mlx5CoreQps>();
    send_sync::<Mlx5Nic>();
    send_sync::<Mlx5MemoryNode>();
}

/// What `loch node` does per compute core: one bundle with a QP to each
/// memory node (which may sit in memory the caller allocated), connected
/// through endpoints that crossed the wire as bytes, moved to another
/// thread and run there by an executor: every FAA lands exactly once.
#[test]
fn per_core_links_connect_move_and_run() {
    on_device(|h| {
        let caller_mem = Arc::new(
            Mlx5MemoryNode::with_memory(&h.nic, 5, HeapMem::zeroed(HOST).unwrap(), DM)
                .expect("memory node over caller memory"),
        );
        assert_eq!(caller_mem.host_bytes(), HOST as u64);
        let nodes = [h.nodes[0].clone(), caller_mem];
        let ids: Vec<NodeId> = nodes.iter().map(|n| n.node()).collect();
        let cfg = ExecutorConfig {
            slots: 4,
            ..Default::default()
        };
        let mut core = Mlx5CoreQps::prepare(&h.nic, &ids, cfg.qp_depth()).expect("prepare");
        assert!(
            Mlx5CoreQps::prepare(&h.nic, &[1, 1], 16).is_err(),
            "two QPs to one node"
        );
        assert!(
            Mlx5CoreQps::prepare(&h.nic, &[], 16).is_err(),
            "no memory node"
        );
        let eps = core.endpoints();
        assert_eq!(eps.iter().map(|e| e.0).collect::<Vec<_>>(), ids);
        for (node, ep) in eps {
            let n = nodes.iter().find(|n| n.node() == node).unwrap();
            let theirs = n.accept(&ep).expect("accept");
            let theirs = Endpoint::decode(&theirs.encode().unwrap()).unwrap();
            assert!(!core.is_connected());
            core.connect(&theirs).expect("connect");
            assert!(core.connect(&theirs).is_err(), "connected twice");
        }
        assert!(core.is_connected());
        let nic = h.nic.clone();
        std::thread::spawn(move || {
            let (cq, qps) = core.into_parts().expect("all connected");
            let mr = nic
                .register(
                    HeapMem::zeroed(cfg.scratch_bytes()).unwrap(),
                    Access::LOCAL_WRITE,
                )
                .unwrap();
            let mut ex = Executor::new(nic, cq, qps, mr, cfg).expect("executor");
            for t in 0..4u64 {
                ex.spawn(move |ctx| async move {
                    for &n in &[0 as NodeId, 5] {
                        for _ in 0..100 {
                            ctx.faa(GlobalAddr::host(n, 64), 1).await.unwrap();
                        }
                        ctx.faa(GlobalAddr::device(n, 8 * t), 1).await.unwrap();
                    }
                })
                .unwrap();
            }
            ex.run();
        })
        .join()
        .unwrap();
        for n in &nodes {
            // SAFETY: every request completed; 8-aligned word in the region.
            let v = unsafe { std::ptr::read_volatile(n.host_ptr().add(64) as *const u64) };
            assert_eq!(v, 400, "node {}", n.node());
        }
    });
}

/// What a memory node serving compute runs one after another does: each
/// run's core pairs with a fresh responder, the node retires the run
/// before's responders before pairing the next, and its memory (what the
/// runs wrote) stays registered throughout.
#[test]
fn a_memory_node_serves_run_after_run() {
    on_device(|h| {
        let node = Arc::new(Mlx5MemoryNode::new(&h.nic, 3, HOST, DM).expect("memory node"));
        let cfg = ExecutorConfig {
            slots: 2,
            ..Default::default()
        };
        for run in 0..3u64 {
            assert_eq!(node.retire_responders(), usize::from(run > 0), "run {run}");
            assert_eq!(node.responders(), 0);
            let mut core = Mlx5CoreQps::prepare(&h.nic, &[3], cfg.qp_depth()).expect("prepare");
            for (_, ep) in core.endpoints() {
                core.connect(&node.accept(&ep).expect("accept"))
                    .expect("connect");
            }
            assert_eq!(node.responders(), 1);
            let (cq, qps) = core.into_parts().expect("connected");
            let mr = h
                .nic
                .register(
                    HeapMem::zeroed(cfg.scratch_bytes()).unwrap(),
                    Access::LOCAL_WRITE,
                )
                .unwrap();
            let mut ex = Executor::new(h.nic.clone(), cq, qps, mr, cfg).expect("executor");
            ex.spawn(move |ctx| async move {
                for _ in 0..100 {
                    ctx.faa(GlobalAddr::host(3, 128), 1).await.unwrap();
                }
            })
            .unwrap();
            ex.run();
            // SAFETY: every request completed; 8-aligned word in the region.
            let v = unsafe { std::ptr::read_volatile(node.host_ptr().add(128) as *const u64) };
            assert_eq!(v, 100 * (run + 1), "run {run}");
        }
        node.shut_down();
        assert_eq!((node.responders(), node.retire_responders()), (0, 0));
    });
}

/// Remote addresses become region base plus offset into the region; device
/// memory is zero-based; an offset outside every region still goes out (the
/// responder refuses it).
#[test]
fn remote_addresses_translate_through_regions() {
    let regions = sample_endpoint().regions;
    assert_eq!(
        remote_va(&regions, GlobalAddr::host(7, 0x1000)),
        0x7f00_0000_1000
    );
    assert_eq!(remote_va(&regions, GlobalAddr::device(7, 0x40)), 0x40);
    assert_eq!(
        remote_va(&regions, GlobalAddr::host(7, 1 << 31)),
        0x7f00_0000_0000 + (1 << 31)
    );
    assert_eq!(remote_va(&[], GlobalAddr::host(7, 0x18)), 0x18);
}

/// The layouts and constants above, checked against the installed
/// `<infiniband/verbs.h>` itself: a small C program prints sizeof, offsetof
/// and enum values, and each must equal what rdma-sys and this backend
/// use. Skipped (with the reason) where no C compiler is present.
#[test]
fn layouts_and_constants_match_the_installed_header() {
    use rdma_sys::*;
    use std::mem::{offset_of, size_of};
    let c = r#"
#include <stdio.h>
#include <stddef.h>
#include <infiniband/verbs.h>
#define P(name, v) printf("%s %lld\n", name, (long long)(v))
int main(void) {
  P("sizeof_send_wr", sizeof(struct ibv_send_wr));
  P("off_send_wr_opcode", offsetof(struct ibv_send_wr, opcode));
  P("off_send_wr_send_flags", offsetof(struct ibv_send_wr, send_flags));
  P("off_send_wr_wr", offsetof(struct ibv_send_wr, wr));
  P("sizeof_wc", sizeof(struct ibv_wc));
  P("off_wc_qp_num", offsetof(struct ibv_wc, qp_num));
  P("off_wc_byte_len", offsetof(struct ibv_wc, byte_len));
  P("sizeof_sge", sizeof(struct ibv_sge));
  P("sizeof_qp_attr", sizeof(struct ibv_qp_attr));
  P("off_qp_attr_ah_attr", offsetof(struct ibv_qp_attr, ah_attr));
  P("off_qp_attr_timeout", offsetof(struct ibv_qp_attr, timeout));
  P("IBV_WR_RDMA_WRITE", IBV_WR_RDMA_WRITE);
  P("IBV_WR_RDMA_READ", IBV_WR_RDMA_READ);
  P("IBV_WR_ATOMIC_CMP_AND_SWP", IBV_WR_ATOMIC_CMP_AND_SWP);
  P("IBV_WR_ATOMIC_FETCH_AND_ADD", IBV_WR_ATOMIC_FETCH_AND_ADD);
  P("IBV_ACCESS_LOCAL_WRITE", IBV_ACCESS_LOCAL_WRITE);
  P("IBV_ACCESS_REMOTE_WRITE", IBV_ACCESS_REMOTE_WRITE);
  P("IBV_ACCESS_REMOTE_READ", IBV_ACCESS_REMOTE_READ);
  P("IBV_ACCESS_REMOTE_ATOMIC", IBV_ACCESS_REMOTE_ATOMIC);
  P("IBV_ACCESS_ZERO_BASED", IBV_ACCESS_ZERO_BASED);
  P("IBV_SEND_FENCE", IBV_SEND_FENCE);
  P("IBV_SEND_SIGNALED", IBV_SEND_SIGNALED);
  P("IBV_SEND_INLINE", IBV_SEND_INLINE);
  P("IBV_WC_REM_ACCESS_ERR", IBV_WC_REM_ACCESS_ERR);
  P("IBV_WC_REM_INV_REQ_ERR", IBV_WC_REM_INV_REQ_ERR);
  P("IBV_WC_RETRY_EXC_ERR", IBV_WC_RETRY_EXC_ERR);
  P("IBV_WC_WR_FLUSH_ERR", IBV_WC_WR_FLUSH_ERR);
  P("IBV_WC_LOC_PROT_ERR", IBV_WC_LOC_PROT_ERR);
  P("IBV_QP_AV", IBV_QP_AV);
  P("IBV_QP_SQ_PSN", IBV_QP_SQ_PSN);
  P("IBV_QP_MAX_DEST_RD_ATOMIC", IBV_QP_MAX_DEST_RD_ATOMIC);
  P("IBV_QPS_RTS", IBV_QPS_RTS);
  P("IBV_MTU_4096", IBV_MTU_4096);
  P("IBV_LINK_LAYER_ETHERNET", IBV_LINK_LAYER_ETHERNET);
  return 0;
}
"#;
    let dir = std::env::temp_dir().join(format!("loch-verbs-h-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (src, exe) = (dir.join("probe.c"), dir.join("probe"));
    std::fs::write(&src, c).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = match std::process::Command::new(&cc)
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            eprintln!("skipped: no C compiler ({cc}: {e})");
            return;
        }
    };
    assert!(
        built.status.success(),
        "compiling against verbs.h failed: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let out = std::process::Command::new(&exe).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8(out.stdout).unwrap();
    let header: std::collections::HashMap<&str, i64> = text
        .lines()
        .map(|l| {
            let (k, v) = l.split_once(' ').unwrap();
            (k, v.parse().unwrap())
        })
        .collect();
    use ibv_qp_attr_mask as m;
    let ours: Vec<(&str, i64)> = vec![
        ("sizeof_send_wr", size_of::<ibv_send_wr>() as i64),
        ("off_send_wr_opcode", offset_of!(ibv_send_wr, opcode) as i64),
        (
            "off_send_wr_send_flags",
            offset_of!(ibv_send_wr, send_flags) as i64,
        ),
        ("off_send_wr_wr", offset_of!(ibv_send_wr, wr) as i64),
        ("sizeof_wc", size_of::<ibv_wc>() as i64),
        ("off_wc_qp_num", offset_of!(ibv_wc, qp_num) as i64),
        ("off_wc_byte_len", offset_of!(ibv_wc, byte_len) as i64),
        ("sizeof_sge", size_of::<ibv_sge>() as i64),
        ("sizeof_qp_attr", size_of::<ibv_qp_attr>() as i64),
        (
            "off_qp_attr_ah_attr",
            offset_of!(ibv_qp_attr, ah_attr) as i64,
        ),
        (
            "off_qp_attr_timeout",
            offset_of!(ibv_qp_attr, timeout) as i64,
        ),
        (
            "IBV_WR_RDMA_WRITE",
            wr_opcode(Opcode::Write).unwrap() as i64,
        ),
        ("IBV_WR_RDMA_READ", wr_opcode(Opcode::Read).unwrap() as i64),
        (
            "IBV_WR_ATOMIC_CMP_AND_SWP",
            wr_opcode(Opcode::Cas).unwrap() as i64,
        ),
        (
            "IBV_WR_ATOMIC_FETCH_AND_ADD",
            wr_opcode(Opcode::Faa).unwrap() as i64,
        ),
        (
            "IBV_ACCESS_LOCAL_WRITE",
            access_to_ibv(Access::LOCAL_WRITE) as i64,
        ),
        (
            "IBV_ACCESS_REMOTE_WRITE",
            (access_to_ibv(Access::REMOTE_WRITE) & !1) as i64,
        ),
        (
            "IBV_ACCESS_REMOTE_READ",
            access_to_ibv(Access::REMOTE_READ) as i64,
        ),
        (
            "IBV_ACCESS_REMOTE_ATOMIC",
            (access_to_ibv(Access::REMOTE_ATOMIC) & !1) as i64,
        ),
        (
            "IBV_ACCESS_ZERO_BASED",
            ibv_access_flags::IBV_ACCESS_ZERO_BASED.0 as i64,
        ),
        ("IBV_SEND_FENCE", ibv_send_flags::IBV_SEND_FENCE.0 as i64),
        (
            "IBV_SEND_SIGNALED",
            ibv_send_flags::IBV_SEND_SIGNALED.0 as i64,
        ),
        ("IBV_SEND_INLINE", ibv_send_flags::IBV_SEND_INLINE.0 as i64),
        ("IBV_WC_REM_ACCESS_ERR", ws::IBV_WC_REM_ACCESS_ERR as i64),
        ("IBV_WC_REM_INV_REQ_ERR", ws::IBV_WC_REM_INV_REQ_ERR as i64),
        ("IBV_WC_RETRY_EXC_ERR", ws::IBV_WC_RETRY_EXC_ERR as i64),
        ("IBV_WC_WR_FLUSH_ERR", ws::IBV_WC_WR_FLUSH_ERR as i64),
        ("IBV_WC_LOC_PROT_ERR", ws::IBV_WC_LOC_PROT_ERR as i64),
        ("IBV_QP_AV", m::IBV_QP_AV.0 as i64),
        ("IBV_QP_SQ_PSN", m::IBV_QP_SQ_PSN.0 as i64),
        (
            "IBV_QP_MAX_DEST_RD_ATOMIC",
            m::IBV_QP_MAX_DEST_RD_ATOMIC.0 as i64,
        ),
        ("IBV_QPS_RTS", ibv_qp_state::IBV_QPS_RTS as i64),
        ("IBV_MTU_4096", ibv_mtu::IBV_MTU_4096 as i64),
        ("IBV_LINK_LAYER_ETHERNET", LINK_LAYER_ETHERNET as i64),
    ];
    assert_eq!(header.len(), ours.len(), "probe printed {text}");
    for (name, v) in ours {
        assert_eq!(
            header[name], v,
            "{name}: verbs.h says {}, we use {v}",
            header[name]
        );
    }
}
