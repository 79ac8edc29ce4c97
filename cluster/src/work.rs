//! What runs on a cluster's cores, the same on every backend: a
//! [`Workload`] spawns each core's tasks through [`Spawn`] and sums what the
//! tasks of one [`Workload::Group`] counted.

use nicdrv::sim::{SimNic, World};
use nicdrv::{Ctx, Executor, Nic, VerbCounters};
use std::future::Future;

/// Where tasks start: one core's executor (emu, mlx5) or one simulated
/// thread.
pub trait Spawn<N: Nic> {
    /// Starts a task; an error when the core has no free slot.
    fn spawn_task<F, Fut>(&mut self, f: F) -> Result<(), String>
    where
        F: FnOnce(Ctx<N>) -> Fut,
        Fut: Future<Output = ()> + 'static;
}

impl<N: Nic> Spawn<N> for Executor<N> {
    fn spawn_task<F, Fut>(&mut self, f: F) -> Result<(), String>
    where
        F: FnOnce(Ctx<N>) -> Fut,
        Fut: Future<Output = ()> + 'static,
    {
        self.spawn(f).map(drop).map_err(|e| e.to_string())
    }
}

/// One thread of a simulated world, as a place to start tasks.
pub struct SimThread<'a> {
    pub world: &'a mut World,
    pub thread: u32,
}

impl Spawn<SimNic> for SimThread<'_> {
    fn spawn_task<F, Fut>(&mut self, f: F) -> Result<(), String>
    where
        F: FnOnce(Ctx<SimNic>) -> Fut,
        Fut: Future<Output = ()> + 'static,
    {
        self.world
            .spawn(self.thread, f)
            .map(drop)
            .map_err(|e| e.to_string())
    }
}

/// Which core a workload is asked to fill, and where it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    /// The core's index in the run, 0-based.
    pub core: usize,
    /// The compute node the core belongs to (always 0 on a single-host
    /// emu cluster, which is one compute node).
    pub compute_node: usize,
}

/// The tasks of a run, described once for every backend.
///
/// Tasks that share an OS thread share a [`Group`](Workload::Group): on emu
/// each core is a thread of its own, so each core has its own group and
/// the run returns one [`Out`](Workload::Out) per core; a simulated world
/// runs every core on one thread, so all its cores share one group and the
/// run returns one `Out`.
pub trait Workload: Sync {
    /// What the tasks of one group count and share (`Rc`s and `Cell`s: one
    /// thread).
    type Group;
    /// What a group reports at the end.
    type Out: Send;

    /// Group `index` of `groups` in the run (emu: one per core, core
    /// `index`; sim: 0 of 1), made on the thread that runs it.
    fn group(&self, index: usize, groups: usize) -> Self::Group;

    /// Starts the tasks of the core at `place`.
    fn spawn<N: Nic, S: Spawn<N>>(
        &self,
        place: Place,
        group: &Self::Group,
        on: &mut S,
    ) -> Result<(), String>;

    /// What the group's tasks counted, once they are done; `counters` are
    /// the verb counters of the group's cores, summed.
    fn finish(&self, group: Self::Group, counters: VerbCounters) -> Self::Out;
}
