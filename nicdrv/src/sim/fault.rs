//! Faults the simulator can inject, at a virtual time chosen by the test or
//! drawn from the seed.

use crate::rng::{Domain, Rng};
use std::fmt;

/// What goes wrong.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// A memory node stops answering; its memory is gone. Requests to it
    /// complete `RetryExceeded` after the transport timeout.
    CrashMemoryNode { node: u16 },
    /// A compute node stops: its threads run no more, its requests still
    /// in the network finish at the memory nodes, their answers are lost.
    CrashComputeNode { node: u16 },
    /// Packets between a compute node and a memory node are dropped.
    CutLink { compute: u16, memory: u16 },
    /// The link carries packets again.
    HealLink { compute: u16, memory: u16 },
    /// Every packet sent during the next `duration_ns` takes `extra_ns`
    /// longer.
    LatencySpike { extra_ns: u64, duration_ns: u64 },
    /// A compute thread runs nothing for `duration_ns` (a page fault or a
    /// preemption).
    StallThread { thread: u32, duration_ns: u64 },
}

/// A fault at a virtual time.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    pub at_ns: u64,
    pub kind: FaultKind,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} at {} ns", self.kind, self.at_ns)
    }
}

/// Largest virtual time a fault may name: a century of nanoseconds leaves
/// headroom for any sum the simulator makes with it.
pub const MAX_TIME_NS: u64 = 100 * 365 * 24 * 3600 * 1_000_000_000;

impl Fault {
    /// Checks the fault against the cluster's shape.
    pub fn check(&self, memory_nodes: usize, compute_nodes: usize) -> Result<(), String> {
        let dur = match self.kind {
            FaultKind::LatencySpike { duration_ns, .. }
            | FaultKind::StallThread { duration_ns, .. } => duration_ns,
            _ => 0,
        };
        if self.at_ns > MAX_TIME_NS || dur > MAX_TIME_NS {
            return Err(format!("fault {self}: time beyond {MAX_TIME_NS} ns"));
        }
        let mem_ok = |n: u16| (n as usize) < memory_nodes;
        let cn_ok = |n: u16| (n as usize) < compute_nodes;
        let ok = match self.kind {
            FaultKind::CrashMemoryNode { node } => mem_ok(node),
            FaultKind::CrashComputeNode { node } => cn_ok(node),
            FaultKind::CutLink { compute, memory } | FaultKind::HealLink { compute, memory } => {
                cn_ok(compute) && mem_ok(memory)
            }
            FaultKind::LatencySpike { extra_ns, .. } => extra_ns <= MAX_TIME_NS,
            // Threads are made after the world; checked when the fault fires.
            FaultKind::StallThread { .. } => true,
        };
        if ok {
            Ok(())
        } else {
            Err(format!(
                "fault {self} names a node that does not exist ({memory_nodes} memory nodes, {compute_nodes} compute nodes)"
            ))
        }
    }

    /// `count` faults drawn from `seed`, at times in `[0, horizon_ns)`:
    /// latency spikes, thread stalls and link cuts that heal again (crashes
    /// are left to tests that expect them).
    pub fn random_plan(
        seed: u64,
        count: usize,
        horizon_ns: u64,
        memory_nodes: u16,
        compute_nodes: u16,
        threads: u32,
    ) -> Vec<Fault> {
        let mut rng = Rng::stream(seed, Domain::Faults, 0);
        let mut v = Vec::with_capacity(count * 2);
        for _ in 0..count {
            let at_ns = rng.below(horizon_ns.max(1));
            match rng.below(3) {
                0 => v.push(Fault {
                    at_ns,
                    kind: FaultKind::LatencySpike {
                        extra_ns: 1_000 + rng.below(50_000),
                        duration_ns: 1_000 + rng.below(200_000),
                    },
                }),
                1 if threads > 0 => v.push(Fault {
                    at_ns,
                    kind: FaultKind::StallThread {
                        thread: rng.below(threads as u64) as u32,
                        duration_ns: 1_000 + rng.below(500_000),
                    },
                }),
                _ => {
                    let compute = rng.below(compute_nodes.max(1) as u64) as u16;
                    let memory = rng.below(memory_nodes.max(1) as u64) as u16;
                    v.push(Fault {
                        at_ns,
                        kind: FaultKind::CutLink { compute, memory },
                    });
                    v.push(Fault {
                        at_ns: at_ns + 10_000 + rng.below(100_000),
                        kind: FaultKind::HealLink { compute, memory },
                    });
                }
            }
        }
        v
    }
}
