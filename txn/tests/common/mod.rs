//! Two machines on each backend, for the ring's tests: every case runs on
//! the simulator and on emu (threads over real shared memory).

#![allow(dead_code)]

pub mod appender;

use nicdrv::sim::{RunEnd, SimConfig, SimNic, World};
use nicdrv::{Ctx, Executor, ExecutorConfig, Nic};
use std::future::Future;
use std::pin::Pin;

pub const HOST: u64 = 1 << 20;

/// A task for one machine.
pub type Task<N> = Box<dyn FnOnce(Ctx<N>) -> Pin<Box<dyn Future<Output = ()>>> + Send>;

/// Wraps an async closure as a [`Task`].
pub fn task<N: Nic, F, Fut>(f: F) -> Task<N>
where
    F: FnOnce(Ctx<N>) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + 'static,
{
    Box::new(move |ctx| Box::pin(f(ctx)))
}

/// Runs tasks, each on its own core of machine 0 or 1, to the end.
pub trait Machines {
    type N: Nic;
    fn run(&self, tasks: Vec<(u16, Task<Self::N>)>);
}

pub struct Sim {
    pub seed: u64,
}

impl Machines for Sim {
    type N = SimNic;
    fn run(&self, tasks: Vec<(u16, Task<SimNic>)>) {
        let mut w = World::new(SimConfig {
            seed: self.seed,
            memory_nodes: 2,
            compute_nodes: 2,
            machines: 2,
            host_bytes: HOST,
            ..Default::default()
        })
        .unwrap();
        for (m, t) in tasks {
            let th = w.add_thread(m, one_slot()).unwrap();
            w.spawn(th, t).unwrap();
        }
        assert_eq!(
            w.run(),
            RunEnd::Done,
            "seed {}: tasks did not finish",
            self.seed
        );
    }
}

pub struct Emu {
    cluster: cluster::EmuCluster,
}

impl Emu {
    pub fn new() -> Emu {
        let cluster = cluster::EmuCluster::boot(&cluster::emu::EmuClusterConfig {
            memory_nodes: 2,
            host_bytes: HOST,
            dm_bytes: 4096,
            emu: Default::default(),
        })
        .unwrap();
        Emu { cluster }
    }
}

/// One OS thread per task, each with the executor `executor` makes for
/// its machine, to the end of every task.
fn on_threads<N: Nic>(tasks: Vec<(u16, Task<N>)>, executor: impl Fn(u16) -> Executor<N> + Sync) {
    std::thread::scope(|s| {
        let hs: Vec<_> = tasks
            .into_iter()
            .map(|(m, t)| {
                let executor = &executor;
                s.spawn(move || {
                    let mut ex = executor(m);
                    ex.spawn(t).unwrap();
                    ex.run();
                })
            })
            .collect();
        for h in hs {
            h.join().expect("a machine's core panicked");
        }
    });
}

fn one_slot() -> ExecutorConfig {
    ExecutorConfig {
        slots: 1,
        ..Default::default()
    }
}

impl Machines for Emu {
    type N = nicdrv::emu::EmuNic;
    fn run(&self, tasks: Vec<(u16, Task<Self::N>)>) {
        on_threads(tasks, |m| {
            self.cluster
                .machine_executor(m as usize, one_slot())
                .unwrap()
        });
    }
}

/// A transaction cluster of `g.machines` machines on emu: one memory node
/// each, one OS thread per core; the report with every machine's memory.
pub fn run_emu<C: txn::harness::Client<nicdrv::emu::EmuNic>>(
    g: txn::Geometry,
    client: impl FnMut(u16, u16) -> C,
) -> txn::harness::Report<C::Out> {
    run_emu_with(g, &Default::default(), client)
}

/// As [`run_emu`], with run options (leases).
pub fn run_emu_with<C: txn::harness::Client<nicdrv::emu::EmuNic>>(
    g: txn::Geometry,
    opts: &txn::harness::RunOptions,
    client: impl FnMut(u16, u16) -> C,
) -> txn::harness::Report<C::Out> {
    let cluster =
        cluster::EmuCluster::machines(g.machines as usize, g.host_bytes().unwrap()).unwrap();
    txn::harness::run_threads(
        g,
        opts,
        cluster.machine_executors(),
        |m| cluster.host_copy(m as usize),
        client,
    )
    .unwrap()
}

/// Two memory nodes on one RDMA device in loopback, each a machine; `None`
/// (the test skips, saying so) where this host has no RDMA device.
#[cfg(feature = "mlx5")]
pub struct Mlx5 {
    nic: nicdrv::mlx5::Mlx5Nic,
    nodes: Vec<std::sync::Arc<nicdrv::mlx5::Mlx5MemoryNode>>,
}

#[cfg(feature = "mlx5")]
impl Mlx5 {
    pub fn new() -> Option<Mlx5> {
        Mlx5::with(2, HOST as usize)
    }

    /// `machines` memory nodes of `host_bytes` each on the device.
    pub fn with(machines: u16, host_bytes: usize) -> Option<Mlx5> {
        use nicdrv::mlx5::{DeviceConfig, Mlx5Error, Mlx5MemoryNode, Mlx5Nic};
        let cfg = DeviceConfig::from_env().expect("the LOCH_MLX5_* variables");
        let nic = match Mlx5Nic::open(&cfg) {
            Ok(nic) => nic,
            Err(Mlx5Error::NoDevice) => {
                eprintln!("skipped: no RDMA device");
                return None;
            }
            Err(e) => panic!("an RDMA device exists but cannot be used: {e}"),
        };
        let nodes = (0..machines)
            .map(|id| std::sync::Arc::new(Mlx5MemoryNode::new(&nic, id, host_bytes, 4096).unwrap()))
            .collect();
        Some(Mlx5 { nic, nodes })
    }

    fn executor(&self, machine: u16) -> Executor<nicdrv::mlx5::Mlx5Nic> {
        self.executor_with(machine, one_slot())
    }

    /// An executor of `cfg` on machine `machine`, a queue pair to every
    /// node.
    pub fn executor_with(
        &self,
        machine: u16,
        cfg: ExecutorConfig,
    ) -> Executor<nicdrv::mlx5::Mlx5Nic> {
        let nic = self.nic.on_machine(&self.nodes[machine as usize]);
        let cq = nic
            .create_cq(cfg.qp_depth() * self.nodes.len() as u32)
            .unwrap();
        let qps = self
            .nodes
            .iter()
            .map(|n| {
                let prepared = nic.create_qp(&cq, cfg.qp_depth()).unwrap();
                let ep = n.accept(&prepared.endpoint()).unwrap();
                prepared.connect(&ep).unwrap()
            })
            .collect();
        let mr = nic
            .register(
                nicdrv::HeapMem::zeroed(cfg.scratch_bytes()).unwrap(),
                nicdrv::Access::LOCAL_WRITE,
            )
            .unwrap();
        Executor::new(nic, cq, qps, mr, cfg).unwrap()
    }
}

#[cfg(feature = "mlx5")]
impl Machines for Mlx5 {
    type N = nicdrv::mlx5::Mlx5Nic;
    fn run(&self, tasks: Vec<(u16, Task<Self::N>)>) {
        on_threads(tasks, |m| self.executor(m));
    }
}
