//! A workload on a simulated world: its cores become threads of the
//! world's compute nodes, all on this one OS thread, so they share one
//! [`Workload::Group`]. The world runs either to the end or in slices of
//! virtual time, with a look at the run after each slice.

use crate::work::{Place, SimThread, Workload};
use nicdrv::sim::{RunEnd, World};
use nicdrv::{ExecutorConfig, VerbCounters};
use std::ops::Range;

/// Which compute node the simulated thread of each core joins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Core `c` on compute node `c mod compute_nodes`.
    RoundRobin,
    /// `n` cores per compute node, in order: core `c` on node `c / n`.
    Blocks(usize),
    /// Every core on this compute node.
    Node(usize),
}

impl Placement {
    fn node_of(self, core: usize, compute_nodes: usize) -> usize {
        match self {
            Placement::RoundRobin => core % compute_nodes.max(1),
            Placement::Blocks(n) => core / n.max(1),
            Placement::Node(n) => n,
        }
    }
}

/// A workload's cores, spawned on a world and not yet finished.
pub struct Spawned<G> {
    /// What the cores' tasks share.
    pub group: G,
    /// The world's threads the cores run on, one per core, in core order.
    pub threads: Range<u32>,
    /// The virtual time the tasks were spawned at.
    pub start_ns: u64,
}

impl<G> Spawned<G> {
    /// The verb counters of the cores' threads, summed.
    pub fn counters(&self, w: &World) -> VerbCounters {
        let mut c = VerbCounters::default();
        for t in self.threads.clone() {
            c += w.executor(t).map(|e| e.counters()).unwrap_or_default();
        }
        c
    }

    /// Stops the cores' threads for good: tasks stuck for ever (on a
    /// crashed node, behind a lock it held) must not spin on through the
    /// runs after this one.
    pub fn halt(&self, w: &mut World) {
        for t in self.threads.clone() {
            w.halt_thread(t);
        }
    }

    /// What the group counted, with the threads' verb counters.
    pub fn finish<W: Workload<Group = G>>(self, w: &World, work: &W) -> W::Out {
        let counters = self.counters(w);
        work.finish(self.group, counters)
    }
}

/// Adds one thread per core of `cores` (placed by `place`) with executor
/// `cfg`, and has `work` spawn each core's tasks on it, core by core.
pub fn spawn<W: Workload>(
    w: &mut World,
    work: &W,
    cores: usize,
    cfg: ExecutorConfig,
    place: Placement,
) -> Result<Spawned<W::Group>, String> {
    let group = work.group(0, 1);
    let start_ns = w.now_ns();
    let threads = spawn_with(w, cores, cfg, place, |p, on| work.spawn(p, &group, on))?;
    Ok(Spawned {
        group,
        threads,
        start_ns,
    })
}

/// Adds one thread per core of `cores` (placed by `place`) with executor
/// `cfg`, and calls `tasks(place, thread)` to start each core's tasks
/// there, core by core; the threads added.
pub fn spawn_with(
    w: &mut World,
    cores: usize,
    cfg: ExecutorConfig,
    place: Placement,
    mut tasks: impl FnMut(Place, &mut SimThread<'_>) -> Result<(), String>,
) -> Result<Range<u32>, String> {
    let first = w.threads() as u32;
    let compute_nodes = w.compute_nodes();
    for core in 0..cores {
        let compute_node = place.node_of(core, compute_nodes);
        let node =
            u16::try_from(compute_node).map_err(|_| format!("no compute node {compute_node}"))?;
        let thread = w.add_thread(node, cfg).map_err(|e| e.to_string())?;
        let place = Place { core, compute_node };
        tasks(place, &mut SimThread { world: w, thread })?;
    }
    Ok(first..w.threads() as u32)
}

/// Spawns `work` on `cores` cores, runs the world until every task has
/// ended, and finishes: what the group reported, or why the run ended
/// early. A world whose run ended early keeps the unfinished tasks (a
/// later run in it ends early too, whatever its own tasks do): make a new
/// world for the next.
pub fn run<W: Workload>(
    w: &mut World,
    work: &W,
    cores: usize,
    cfg: ExecutorConfig,
    place: Placement,
) -> Result<W::Out, String> {
    let out = run_or_stop(w, work, cores, cfg, place, &|| false)?;
    Ok(out.expect("a run never stopped ends only when its tasks have"))
}

/// Events [`run_or_stop`] runs between two looks at its stop request:
/// milliseconds of wall time at the simulator's speed, a few looks a
/// second at the least.
const EVENTS_PER_LOOK: u32 = 100_000;

/// As [`run`], looking at `stop` every 100,000 events (`EVENTS_PER_LOOK`):
/// `Ok(None)` when it said stop before every task ended (the unfinished
/// tasks stay in the world, as after any early end). For a stop that
/// must not wait for the tasks to notice it: in a large world a task
/// may take minutes of wall time to end the operation it is in (the
/// simulation runs its own order of events either way).
pub fn run_or_stop<W: Workload>(
    w: &mut World,
    work: &W,
    cores: usize,
    cfg: ExecutorConfig,
    place: Placement,
    stop: &dyn Fn() -> bool,
) -> Result<Option<W::Out>, String> {
    let spawned = spawn(w, work, cores, cfg, place)?;
    while w.live_tasks() > 0 {
        for _ in 0..EVENTS_PER_LOOK {
            if w.live_tasks() == 0 {
                break;
            }
            if !w.step() {
                // Nothing left to happen, yet tasks remain: they wait
                // forever (`RunEnd::Stalled`).
                return Err("the simulation ended Stalled with tasks unfinished".into());
            }
        }
        if w.live_tasks() > 0 && stop() {
            return Ok(None);
        }
    }
    Ok(Some(spawned.finish(w, work)))
}

/// After a slice: run on, or stop here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Go,
    Stop,
}

/// Runs `w` in slices of `slice_ns` virtual ns, calling `each(w, until)`
/// after every slice that reached its limit; returns how the run ended:
/// [`RunEnd::Limit`] when `each` said stop, else what ended it.
///
/// The limit moves on by a slice each time even when the clock does not
/// (`World::run_until` leaves the clock at the last event, and the next
/// one may lie further off than a slice).
pub fn run_slices(
    w: &mut World,
    slice_ns: u64,
    mut each: impl FnMut(&World, u64) -> Flow,
) -> RunEnd {
    let mut until = w.now_ns();
    loop {
        until = until.saturating_add(slice_ns);
        let end = w.run_until(until);
        if end != RunEnd::Limit {
            return end;
        }
        if each(w, until) == Flow::Stop {
            return RunEnd::Limit;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placements_put_cores_where_they_say() {
        let nodes = |p: Placement| (0..6).map(|c| p.node_of(c, 3)).collect::<Vec<_>>();
        assert_eq!(nodes(Placement::RoundRobin), [0, 1, 2, 0, 1, 2]);
        assert_eq!(nodes(Placement::Blocks(2)), [0, 0, 1, 1, 2, 2]);
        assert_eq!(nodes(Placement::Node(1)), [1; 6]);
    }
}
