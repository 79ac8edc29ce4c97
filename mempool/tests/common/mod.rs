//! Fixtures shared by the emu tests: memory nodes, executors, and the
//! checker that validates a whole allocation history.

#![allow(dead_code)]

use mempool::{first_chunk_off, ChunkConfig, CorePool, CHUNK_CURSOR_OFF, SUPERBLOCK_BYTES};
use nicdrv::emu::{Backing, EmuConfig, EmuEndpoint, EmuNic, EmuNode, EmuNodeConfig};
use nicdrv::{Executor, ExecutorConfig, GlobalAddr, NodeId, Space};
use std::collections::{BTreeMap, BTreeSet};

/// Memory nodes with the host sizes `cfg` gives them, registered as a
/// memory node does at boot.
pub fn make_nodes(ids: &[NodeId], cfg: &ChunkConfig) -> Vec<EmuNode> {
    ids.iter()
        .map(|&id| {
            let node = EmuNode::create(&EmuNodeConfig {
                id,
                host_bytes: cfg.node_bytes_of(id),
                dm_bytes: 4096,
                backing: Backing::Memfd,
            })
            .expect("create emu node");
            node.register_all().expect("register node");
            node
        })
        .collect()
}

pub fn exec_cfg(slots: usize) -> ExecutorConfig {
    ExecutorConfig {
        slots,
        scratch_bytes_per_slot: 4096,
        poll_batch: 32,
    }
}

/// An executor on the calling thread with one queue pair per endpoint and
/// a `CorePool` scratch region.
pub fn executor(eps: &[EmuEndpoint], cfg: ExecutorConfig) -> Executor<EmuNic> {
    let nic = EmuNic::new(EmuConfig::default());
    let cq = nic
        .create_cq(cfg.qp_depth() * (eps.len() as u32).max(1))
        .expect("cq");
    let qps = eps
        .iter()
        .map(|ep| nic.create_qp(&cq, cfg.qp_depth()).expect("qp").connect(ep))
        .collect();
    let scratch = CorePool::new(&nic, &cfg).expect("core pool").into_scratch();
    Executor::new(nic, cq, qps, scratch, cfg).expect("executor")
}

/// One successful allocation as its caller saw it.
#[derive(Copy, Clone, Debug)]
pub struct Alloc {
    pub addr: GlobalAddr,
    pub bytes: u64,
    pub align: u64,
    /// Which allocator made it.
    pub allocator: usize,
}

/// (node, chunk index) of an address inside the chunk area.
pub fn chunk_of(cfg: &ChunkConfig, a: GlobalAddr) -> (NodeId, u64) {
    (a.node(), (a.offset() - first_chunk_off()) / cfg.chunk_bytes)
}

/// Checks a whole history: every allocation is in host memory, 8-byte
/// aligned and aligned as asked, inside its node's chunk area (so off the
/// superblock and never null), inside one chunk, and no two overlap.
/// Returns the chunks used, per node.
pub fn check_history(cfg: &ChunkConfig, allocs: &[Alloc]) -> BTreeMap<NodeId, BTreeSet<u64>> {
    let mut spans: Vec<(NodeId, u64, u64)> = Vec::with_capacity(allocs.len());
    let mut chunks: BTreeMap<NodeId, BTreeSet<u64>> = BTreeMap::new();
    for a in allocs {
        let (node, off) = (a.addr.node(), a.addr.offset());
        assert_eq!(a.addr.space(), Space::Host, "{a:?}");
        assert!(!a.addr.is_null());
        assert_eq!(off % 8, 0, "not 8-byte aligned: {a:?}");
        assert_eq!(off % a.align.max(1), 0, "misaligned: {a:?}");
        assert!(off >= SUPERBLOCK_BYTES, "inside the superblock: {a:?}");
        assert!(off >= first_chunk_off(), "before the first chunk: {a:?}");
        let end = off + a.bytes;
        let chunks_on = cfg.chunks_on(node);
        assert!(
            end <= first_chunk_off() + chunks_on * cfg.chunk_bytes,
            "past the node's chunks: {a:?}"
        );
        assert!(end <= cfg.node_bytes_of(node));
        let (_, c0) = chunk_of(cfg, a.addr);
        let c1 = (end - 1 - first_chunk_off()) / cfg.chunk_bytes;
        assert_eq!(c0, c1, "straddles chunks {c0} and {c1}: {a:?}");
        chunks.entry(node).or_default().insert(c0);
        spans.push((node, off, end));
    }
    spans.sort_unstable();
    for w in spans.windows(2) {
        let ((n0, _, e0), (n1, s1, _)) = (w[0], w[1]);
        assert!(
            n0 != n1 || e0 <= s1,
            "overlap on node {n0}: [{:#x}, {e0:#x}) and [{s1:#x}, ..)",
            w[0].1
        );
    }
    chunks
}

/// The cursor word of a node, read by its owner's CPU.
pub fn cursor(node: &EmuNode) -> u64 {
    node.host().load_u64(CHUNK_CURSOR_OFF)
}

/// A small deterministic generator (xorshift64*), so failures reproduce.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}
