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
    /// A whole machine fails at once: its memory node (memory gone, NIC
    /// silent) and its compute node (threads stopped).
    CrashMachine { machine: u16 },
    /// Every link between a node numbered in `side` (bit i: compute node i
    /// and memory node i, so machine i as a whole) and a node outside it is
    /// cut, both ways. Nodes numbered 64 or more are outside.
    Partition { side: u64 },
    /// The links a `Partition` of `side` cut carry packets again (a link
    /// across it that a `CutLink` cut too is healed as well).
    HealPartition { side: u64 },
    /// For `duration_ns`, the compute node's send queues to the memory
    /// node refuse every post as full (`PostError::SendQueueFull`: on
    /// mlx5, `ibv_post_send` failing with `ENOMEM`); a refused post sends
    /// nothing, and the requests posted before it go on.
    QueueFull {
        compute: u16,
        memory: u16,
        duration_ns: u64,
    },
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
        self.check_machines(memory_nodes, compute_nodes, 0)
    }

    /// [`Fault::check`] (which knows no machines: a machine crash fails it)
    /// in a cluster whose first `machines` nodes are
    /// machines (memory node i and compute node i in one failure domain).
    pub fn check_machines(
        &self,
        memory_nodes: usize,
        compute_nodes: usize,
        machines: usize,
    ) -> Result<(), String> {
        let dur = match self.kind {
            FaultKind::LatencySpike { duration_ns, .. }
            | FaultKind::StallThread { duration_ns, .. }
            | FaultKind::QueueFull { duration_ns, .. } => duration_ns,
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
            FaultKind::CutLink { compute, memory }
            | FaultKind::HealLink { compute, memory }
            | FaultKind::QueueFull {
                compute, memory, ..
            } => cn_ok(compute) && mem_ok(memory),
            FaultKind::LatencySpike { extra_ns, .. } => extra_ns <= MAX_TIME_NS,
            // Threads are made after the world; checked when the fault fires.
            FaultKind::StallThread { .. } => true,
            FaultKind::CrashMachine { machine } => (machine as usize) < machines,
            // Every node it names exists (bits above both counts name none).
            FaultKind::Partition { side } | FaultKind::HealPartition { side } => {
                let nodes = memory_nodes.max(compute_nodes).min(64);
                side != 0 && (nodes == 64 || side >> nodes == 0)
            }
        };
        match (ok, self.kind) {
            (true, _) => Ok(()),
            (false, FaultKind::CrashMachine { machine }) => Err(format!(
                "fault {self} names machine {machine}; this cluster has {machines} machines (memory and compute node in one)"
            )),
            (false, FaultKind::Partition { .. } | FaultKind::HealPartition { .. }) => Err(format!(
                "fault {self} names no node, or one that does not exist ({memory_nodes} memory nodes, {compute_nodes} compute nodes)"
            )),
            (false, _) => Err(format!(
                "fault {self} names a node that does not exist ({memory_nodes} memory nodes, {compute_nodes} compute nodes)"
            )),
        }
    }

    /// [`Fault::check`], and a thread stall against `threads` threads
    /// (numbered from 0).
    pub fn check_with_threads(
        &self,
        memory_nodes: usize,
        compute_nodes: usize,
        threads: usize,
    ) -> Result<(), String> {
        self.check(memory_nodes, compute_nodes)?;
        self.check_threads(threads)
    }

    /// A thread stall names one of `threads` threads (numbered from 0);
    /// other faults name no thread.
    pub fn check_threads(&self, threads: usize) -> Result<(), String> {
        match self.kind {
            FaultKind::StallThread { thread, .. } if thread as usize >= threads => Err(format!(
                "fault {self} names thread {thread}; there are {threads} threads"
            )),
            _ => Ok(()),
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
        let shape = (memory_nodes, compute_nodes, threads);
        draw_plan(seed, count, horizon_ns, shape, false)
    }

    /// As [`Fault::random_plan`], crashes included: each draw is a latency
    /// spike, a thread stall, a link cut that heals, a memory-node crash or
    /// a compute-node crash. At most one memory node and one compute node
    /// crash, and a compute node crashes only when another is left. Sorted
    /// by time.
    pub fn random_plan_with_crashes(
        seed: u64,
        count: usize,
        horizon_ns: u64,
        (memory_nodes, compute_nodes, threads): (u16, u16, u32),
    ) -> Vec<Fault> {
        let mut v = draw_plan(
            seed,
            count,
            horizon_ns,
            (memory_nodes, compute_nodes, threads),
            true,
        );
        v.sort_by_key(|f| f.at_ns);
        v
    }
}

/// The one drawing of fault plans: `(memory nodes, compute nodes, threads)`
/// is the cluster's shape; crashes only when `crashes`.
fn draw_plan(
    seed: u64,
    count: usize,
    horizon_ns: u64,
    (memory_nodes, compute_nodes, threads): (u16, u16, u32),
    crashes: bool,
) -> Vec<Fault> {
    let mut rng = Rng::stream(seed, Domain::Faults, u64::from(crashes));
    let mut v = Vec::with_capacity(count * 2);
    let (mut mem_crashed, mut cn_crashed) = (false, false);
    for _ in 0..count {
        let at_ns = rng.below(horizon_ns.max(1));
        match rng.below(if crashes { 5 } else { 3 }) {
            3 if !mem_crashed && memory_nodes > 0 => {
                mem_crashed = true;
                let node = rng.below(memory_nodes as u64) as u16;
                v.push(Fault {
                    at_ns,
                    kind: FaultKind::CrashMemoryNode { node },
                });
            }
            4 if !cn_crashed && compute_nodes > 1 => {
                cn_crashed = true;
                let node = rng.below(compute_nodes as u64) as u16;
                v.push(Fault {
                    at_ns,
                    kind: FaultKind::CrashComputeNode { node },
                });
            }
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

/// The fault kinds' names on a command line, in `KIND@TIME[:TARGET]`.
pub const FAULT_SYNTAX: &str = "memory-crash@TIME:NODE, compute-crash@TIME:NODE, \
link-cut@TIME:COMPUTE-MEMORY[/DURATION] (healed after DURATION if given), \
link-heal@TIME:COMPUTE-MEMORY, queue-full@TIME:COMPUTE-MEMORY/DURATION (posts refused), \
latency-spike@TIME:EXTRA/DURATION, \
thread-stall@TIME:THREAD/DURATION, machine-crash@TIME:MACHINE, \
partition@TIME:NODE+NODE+...[/DURATION] (those nodes, machines as a whole, cut off from the \
rest; healed after DURATION if given); times and durations take ns, us, ms or s \
(a bare number is ns)";

/// Parses a duration: a whole or decimal number with `ns`, `us`, `ms` or `s`
/// (no unit: nanoseconds).
pub fn parse_duration_ns(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix("ns") {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix("us") {
        (n, 1e3)
    } else if let Some(n) = t.strip_suffix("ms") {
        (n, 1e6)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1e9)
    } else {
        (t, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a duration (a number with ns, us, ms or s)"))?;
    let ns = v * scale;
    if !(ns.is_finite() && ns >= 0.0 && ns <= MAX_TIME_NS as f64) {
        return Err(format!("`{s}` is out of range (0 to {MAX_TIME_NS} ns)"));
    }
    Ok(ns.round() as u64)
}

/// Parses one `KIND@TIME[:TARGET]` fault ([`FAULT_SYNTAX`]); `at_ns` is the
/// time as written (the caller decides what it counts from). A link cut
/// with a duration gives its heal too.
pub fn parse_fault(spec: &str) -> Result<Vec<Fault>, String> {
    let bad = |why: String| format!("`{spec}`: {why} (faults: {FAULT_SYNTAX})");
    let (kind, rest) = spec
        .split_once('@')
        .ok_or_else(|| bad("no `@TIME`".into()))?;
    let (time, target) = match rest.split_once(':') {
        Some((t, g)) => (t, Some(g)),
        None => (rest, None),
    };
    let at_ns = parse_duration_ns(time).map_err(bad)?;
    let need = |what: &str| target.ok_or_else(|| bad(format!("`{kind}` needs `:{what}`")));
    let number = |s: &str, what: &str, max: u64| -> Result<u64, String> {
        match s.trim().parse::<u64>() {
            Ok(n) if n <= max => Ok(n),
            _ => Err(bad(format!("`{s}` is not a {what}"))),
        }
    };
    let pair = |s: &str| -> Result<(u16, u16), String> {
        let (c, m) = s
            .split_once('-')
            .ok_or_else(|| bad(format!("`{s}` is not COMPUTE-MEMORY")))?;
        Ok((
            number(c, "compute node", u16::MAX as u64)? as u16,
            number(m, "memory node", u16::MAX as u64)? as u16,
        ))
    };
    let with_duration = |s: &str, what: &str| -> Result<(String, u64), String> {
        let (a, d) = s
            .split_once('/')
            .ok_or_else(|| bad(format!("`{s}` is not {what}/DURATION")))?;
        Ok((a.to_string(), parse_duration_ns(d).map_err(bad)?))
    };
    let one = |kind: FaultKind| Ok(vec![Fault { at_ns, kind }]);
    match kind.trim() {
        "memory-crash" => one(FaultKind::CrashMemoryNode {
            node: number(need("NODE")?, "memory node", u16::MAX as u64)? as u16,
        }),
        "compute-crash" => one(FaultKind::CrashComputeNode {
            node: number(need("NODE")?, "compute node", u16::MAX as u64)? as u16,
        }),
        "link-cut" => {
            let t = need("COMPUTE-MEMORY")?;
            let (link, heal) = match t.split_once('/') {
                Some((l, d)) => (l, Some(parse_duration_ns(d).map_err(bad)?)),
                None => (t, None),
            };
            let (compute, memory) = pair(link)?;
            let mut v = vec![Fault {
                at_ns,
                kind: FaultKind::CutLink { compute, memory },
            }];
            if let Some(d) = heal {
                v.push(Fault {
                    at_ns: at_ns.saturating_add(d),
                    kind: FaultKind::HealLink { compute, memory },
                });
            }
            Ok(v)
        }
        "link-heal" => {
            let (compute, memory) = pair(need("COMPUTE-MEMORY")?)?;
            one(FaultKind::HealLink { compute, memory })
        }
        "queue-full" => {
            let (link, duration_ns) =
                with_duration(need("COMPUTE-MEMORY/DURATION")?, "COMPUTE-MEMORY")?;
            let (compute, memory) = pair(&link)?;
            one(FaultKind::QueueFull {
                compute,
                memory,
                duration_ns,
            })
        }
        "latency-spike" => {
            let (extra, duration_ns) = with_duration(need("EXTRA/DURATION")?, "EXTRA")?;
            one(FaultKind::LatencySpike {
                extra_ns: parse_duration_ns(&extra).map_err(bad)?,
                duration_ns,
            })
        }
        "thread-stall" => {
            let (thread, duration_ns) = with_duration(need("THREAD/DURATION")?, "THREAD")?;
            one(FaultKind::StallThread {
                thread: number(&thread, "thread", u32::MAX as u64)? as u32,
                duration_ns,
            })
        }
        "machine-crash" => one(FaultKind::CrashMachine {
            machine: number(need("MACHINE")?, "machine", u16::MAX as u64)? as u16,
        }),
        "partition" => {
            let t = need("NODE+NODE+...")?;
            let (nodes, heal) = match t.split_once('/') {
                Some((l, d)) => (l, Some(parse_duration_ns(d).map_err(bad)?)),
                None => (t, None),
            };
            let mut side = 0u64;
            for n in nodes.split('+') {
                side |= 1 << number(n, "node", 63)?;
            }
            let mut v = vec![Fault {
                at_ns,
                kind: FaultKind::Partition { side },
            }];
            if let Some(d) = heal {
                v.push(Fault {
                    at_ns: at_ns.saturating_add(d),
                    kind: FaultKind::HealPartition { side },
                });
            }
            Ok(v)
        }
        other => Err(bad(format!("unknown fault kind `{other}`"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fault_kind_parses_from_its_command_line_form() {
        let one = |s: &str| parse_fault(s).unwrap();
        assert_eq!(
            one("memory-crash@2ms:3"),
            vec![Fault {
                at_ns: 2_000_000,
                kind: FaultKind::CrashMemoryNode { node: 3 }
            }]
        );
        assert_eq!(
            one("compute-crash@1.5us:0")[0].kind,
            FaultKind::CrashComputeNode { node: 0 }
        );
        assert_eq!(one("compute-crash@1.5us:0")[0].at_ns, 1_500);
        let cut = one("link-cut@100:1-2/50us");
        assert_eq!(cut.len(), 2);
        assert_eq!(
            cut[0].kind,
            FaultKind::CutLink {
                compute: 1,
                memory: 2
            }
        );
        assert_eq!(cut[1].at_ns, 50_100);
        assert_eq!(
            cut[1].kind,
            FaultKind::HealLink {
                compute: 1,
                memory: 2
            }
        );
        assert_eq!(one("link-cut@0s:1-2").len(), 1);
        assert_eq!(
            one("link-heal@1s:0-0")[0],
            Fault {
                at_ns: 1_000_000_000,
                kind: FaultKind::HealLink {
                    compute: 0,
                    memory: 0
                }
            }
        );
        assert_eq!(
            one("queue-full@1ms:2-3/40us")[0].kind,
            FaultKind::QueueFull {
                compute: 2,
                memory: 3,
                duration_ns: 40_000
            }
        );
        assert!(parse_fault("queue-full@1ms:2-3").is_err());
        assert_eq!(
            one("latency-spike@1ms:20us/500us")[0].kind,
            FaultKind::LatencySpike {
                extra_ns: 20_000,
                duration_ns: 500_000
            }
        );
        assert_eq!(
            one("thread-stall@3ms:17/1ms")[0].kind,
            FaultKind::StallThread {
                thread: 17,
                duration_ns: 1_000_000
            }
        );
    }

    #[test]
    fn malformed_faults_name_their_problem() {
        for (s, says) in [
            ("memory-crash", "no `@TIME`"),
            ("memory-crash@1ms", "needs `:NODE`"),
            ("memory-crash@soon:1", "not a duration"),
            ("memory-crash@1ms:x", "not a memory node"),
            ("link-cut@1ms:3", "not COMPUTE-MEMORY"),
            ("latency-spike@1ms:20us", "not EXTRA/DURATION"),
            ("thread-stall@1ms:a/1ms", "not a thread"),
            ("meltdown@1ms:1", "unknown fault kind `meltdown`"),
            ("memory-crash@-1ms:1", "out of range"),
        ] {
            let e = parse_fault(s).unwrap_err();
            assert!(e.contains(says), "{s}: {e}");
        }
    }

    #[test]
    fn a_random_plan_with_crashes_is_replayable_and_crashes_sometimes() {
        let a = Fault::random_plan_with_crashes(9, 12, 1_000_000, (4, 4, 16));
        assert_eq!(
            a,
            Fault::random_plan_with_crashes(9, 12, 1_000_000, (4, 4, 16))
        );
        assert!(a.windows(2).all(|w| w[0].at_ns <= w[1].at_ns));
        let crashes = |p: &[Fault]| {
            p.iter()
                .filter(|f| {
                    matches!(
                        f.kind,
                        FaultKind::CrashMemoryNode { .. } | FaultKind::CrashComputeNode { .. }
                    )
                })
                .count()
        };
        let plans: Vec<_> = (0..50)
            .map(|s| Fault::random_plan_with_crashes(s, 6, 1_000_000, (4, 4, 16)))
            .collect();
        assert!(plans.iter().any(|p| crashes(p) > 0));
        assert!(plans.iter().all(|p| crashes(p) <= 2));
        for p in &plans {
            for f in p {
                f.check(4, 4).unwrap();
            }
        }
        // One compute node is never crashed: someone must be left.
        for s in 0..50 {
            let p = Fault::random_plan_with_crashes(s, 8, 1_000, (2, 1, 4));
            assert!(p
                .iter()
                .all(|f| !matches!(f.kind, FaultKind::CrashComputeNode { .. })));
        }
    }
}
