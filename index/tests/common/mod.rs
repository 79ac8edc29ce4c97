//! Shared fixtures: a simulated cluster and an emu cluster to run tree
//! tasks on.
#![allow(dead_code)]

use index::tree::{Tree, TreeConfig};
use nicdrv::emu::{Backing, EmuConfig, EmuNic, EmuNode, EmuNodeConfig};
use nicdrv::sim::{RunEnd, SimConfig, SimNic, World};
use nicdrv::{Access, Ctx, Executor, ExecutorConfig, HeapMem, Nic};
use std::future::Future;
use std::sync::Arc;

pub const HOST: u64 = 32 << 20;
pub const DM: u64 = 64 << 10;

pub fn sim_world(seed: u64, memory_nodes: usize, compute_nodes: usize) -> World {
    World::new(SimConfig {
        seed,
        memory_nodes,
        compute_nodes,
        host_bytes: HOST,
        dm_bytes: DM,
        ..Default::default()
    })
    .unwrap()
}

pub fn exec_cfg(slots: usize) -> ExecutorConfig {
    ExecutorConfig {
        slots,
        scratch_bytes_per_slot: 64 << 10,
        poll_batch: 32,
    }
}

/// Creates the tree on `w` (one task on a thread of compute node 0).
pub fn sim_create(w: &mut World, tree: &Arc<Tree>) {
    let t = w.add_thread(0, exec_cfg(1)).unwrap();
    let tr = tree.clone();
    w.spawn(t, move |ctx| async move {
        let mut c = tr.client(u64::MAX - 1).unwrap();
        c.create(&ctx).await.unwrap();
    })
    .unwrap();
    assert_eq!(w.run(), RunEnd::Done);
}

/// Runs one task on a fresh thread of `w` to completion.
pub fn sim_task<F, Fut>(w: &mut World, f: F)
where
    F: FnOnce(Ctx<SimNic>) -> Fut,
    Fut: Future<Output = ()> + 'static,
{
    let t = w.add_thread(0, exec_cfg(1)).unwrap();
    w.spawn(t, f).unwrap();
    assert_eq!(w.run(), RunEnd::Done);
}

/// An emu cluster of `n` in-process memory nodes.
pub struct Emu {
    pub nic: EmuNic,
    pub nodes: Vec<EmuNode>,
}

impl Emu {
    pub fn new(n: usize) -> Emu {
        let nodes = (0..n)
            .map(|id| {
                let node = EmuNode::create(&EmuNodeConfig {
                    id: id as u16,
                    host_bytes: HOST,
                    dm_bytes: DM,
                    backing: Backing::Memfd,
                })
                .unwrap();
                node.register_all().unwrap();
                node
            })
            .collect();
        Emu {
            nic: EmuNic::new(EmuConfig::default()),
            nodes,
        }
    }

    pub fn executor(&self, slots: usize) -> Executor<EmuNic> {
        let cfg = exec_cfg(slots);
        let cq = self
            .nic
            .create_cq(cfg.qp_depth() * self.nodes.len() as u32)
            .unwrap();
        let qps = self
            .nodes
            .iter()
            .map(|n| {
                self.nic
                    .create_qp(&cq, cfg.qp_depth())
                    .unwrap()
                    .connect(&n.endpoint())
            })
            .collect();
        let mr = self
            .nic
            .register(
                HeapMem::zeroed(cfg.scratch_bytes()).unwrap(),
                Access::LOCAL_WRITE,
            )
            .unwrap();
        Executor::new(self.nic.clone(), cq, qps, mr, cfg).unwrap()
    }
}

pub fn sherman() -> TreeConfig {
    TreeConfig::sherman(HOST)
}
