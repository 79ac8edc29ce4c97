//! Shared fixtures: a simulated world and an emu cluster (the cluster
//! crate's) to run index tasks on.
#![allow(dead_code)]

use cluster::{EmuCluster, EmuClusterConfig};
use index::tree::{TreeConfig, TreeKey, TreeOf};
use nicdrv::emu::{EmuConfig, EmuNic};
use nicdrv::sim::{RunEnd, SimConfig, SimNic, World};
use nicdrv::{Ctx, Executor, ExecutorConfig};
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

/// Executors with room for a tree operation on the largest nodes (16 KiB:
/// `Layout::op_scratch_bytes`).
pub fn exec_cfg(slots: usize) -> ExecutorConfig {
    ExecutorConfig {
        slots,
        scratch_bytes_per_slot: 6 * (16 << 10) + index::tree::layout::SMALL_SCRATCH,
        poll_batch: 32,
    }
}

/// Creates the tree on `w` (one task on a thread of compute node 0).
pub fn sim_create<K: TreeKey>(w: &mut World, tree: &Arc<TreeOf<K>>) {
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

/// An emu cluster of `n` in-process memory nodes of `HOST` host and `DM`
/// device memory each.
pub fn emu_cluster(n: usize) -> EmuCluster {
    EmuCluster::boot(&EmuClusterConfig {
        memory_nodes: n,
        host_bytes: HOST,
        dm_bytes: DM,
        emu: EmuConfig::default(),
    })
    .unwrap()
}

/// An executor with `slots` task slots on the calling thread.
pub fn emu_executor(emu: &EmuCluster, slots: usize) -> Executor<EmuNic> {
    emu.executor(exec_cfg(slots)).unwrap()
}

pub fn sherman() -> TreeConfig {
    TreeConfig::sherman(HOST)
}

/// Links cut now and then, drawn from `seed`: each compute node of
/// `computes` loses its link to a memory node (of the first `memories`)
/// `cuts` times, at an instant in `at`, for a time in `lasting`.
pub fn cut_links(
    seed: u64,
    computes: &[u16],
    memories: u64,
    cuts: usize,
    at: std::ops::Range<u64>,
    lasting: std::ops::Range<u64>,
) -> Vec<nicdrv::sim::Fault> {
    let mut rng = nicdrv::rng::Rng::stream(seed, nicdrv::rng::Domain::Faults, 0);
    let mut faults = Vec::new();
    for &compute in computes {
        for _ in 0..cuts {
            let memory = rng.below(memories) as u16;
            let at_ns = at.start + rng.below(at.end - at.start);
            let heal = at_ns + lasting.start + rng.below(lasting.end - lasting.start);
            faults.push(nicdrv::sim::Fault {
                at_ns,
                kind: nicdrv::sim::FaultKind::CutLink { compute, memory },
            });
            faults.push(nicdrv::sim::Fault {
                at_ns: heal,
                kind: nicdrv::sim::FaultKind::HealLink { compute, memory },
            });
        }
    }
    faults
}

/// Cuts the link between compute node `compute` and memory node `memory`
/// of `w` at `after` ns from now, for `lasting` ns; when it heals.
pub fn cut_for(w: &mut World, compute: u16, memory: u16, after: u64, lasting: u64) -> u64 {
    use nicdrv::sim::{Fault, FaultKind};
    let at = w.now_ns() + after;
    w.add_faults(&[
        Fault {
            at_ns: at,
            kind: FaultKind::CutLink { compute, memory },
        },
        Fault {
            at_ns: at + lasting,
            kind: FaultKind::HealLink { compute, memory },
        },
    ])
    .unwrap();
    at + lasting
}
