//! Two machines on each backend, for the ring's tests: every case runs on
//! the simulator and on emu (threads over real shared memory).

#![allow(dead_code)]

use nicdrv::emu::{Backing, EmuConfig, EmuEndpoint, EmuNic, EmuNode, EmuNodeConfig};
use nicdrv::sim::{RunEnd, SimConfig, SimNic, World};
use nicdrv::{Access, Ctx, Executor, ExecutorConfig, HeapMem, Nic};
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
            let th = w
                .add_thread(
                    m,
                    ExecutorConfig {
                        slots: 1,
                        ..Default::default()
                    },
                )
                .unwrap();
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
    /// The machines' memory, owned here for the harness's life.
    _nodes: Vec<EmuNode>,
    endpoints: Vec<EmuEndpoint>,
    nic: EmuNic,
}

impl Emu {
    pub fn new() -> Emu {
        let nodes: Vec<EmuNode> = (0..2)
            .map(|id| {
                let n = EmuNode::create(&EmuNodeConfig {
                    id,
                    host_bytes: HOST,
                    dm_bytes: 4096,
                    backing: Backing::Memfd,
                })
                .unwrap();
                n.register_all().unwrap();
                n
            })
            .collect();
        let endpoints = nodes.iter().map(EmuNode::endpoint).collect();
        Emu {
            _nodes: nodes,
            endpoints,
            nic: EmuNic::new(EmuConfig::default()),
        }
    }

    fn executor(&self, machine: u16) -> Executor<EmuNic> {
        let cfg = ExecutorConfig {
            slots: 1,
            ..Default::default()
        };
        let nic = self.nic.on_machine(&self.endpoints[machine as usize]);
        let cq = nic.create_cq(cfg.qp_depth() * 2).unwrap();
        let qps = self
            .endpoints
            .iter()
            .map(|e| nic.create_qp(&cq, cfg.qp_depth()).unwrap().connect(e))
            .collect();
        let mr = nic
            .register(
                HeapMem::zeroed(cfg.scratch_bytes()).unwrap(),
                Access::LOCAL_WRITE,
            )
            .unwrap();
        Executor::new(nic, cq, qps, mr, cfg).unwrap()
    }
}

impl Machines for Emu {
    type N = EmuNic;
    fn run(&self, tasks: Vec<(u16, Task<EmuNic>)>) {
        std::thread::scope(|s| {
            let hs: Vec<_> = tasks
                .into_iter()
                .map(|(m, t)| {
                    s.spawn(move || {
                        let mut ex = self.executor(m);
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
        use nicdrv::mlx5::{DeviceConfig, Mlx5Error, Mlx5MemoryNode, Mlx5Nic};
        let cfg = DeviceConfig {
            name: std::env::var("LOCH_MLX5_DEVICE").ok(),
            ..DeviceConfig::default()
        };
        let nic = match Mlx5Nic::open(&cfg) {
            Ok(nic) => nic,
            Err(Mlx5Error::NoDevice) => {
                eprintln!("skipped: no RDMA device");
                return None;
            }
            Err(e) => panic!("an RDMA device exists but cannot be used: {e}"),
        };
        let nodes = (0..2)
            .map(|id| {
                std::sync::Arc::new(Mlx5MemoryNode::new(&nic, id, HOST as usize, 4096).unwrap())
            })
            .collect();
        Some(Mlx5 { nic, nodes })
    }

    fn executor(&self, machine: u16) -> Executor<nicdrv::mlx5::Mlx5Nic> {
        let cfg = ExecutorConfig {
            slots: 1,
            ..Default::default()
        };
        let nic = self.nic.on_machine(&self.nodes[machine as usize]);
        let cq = nic.create_cq(cfg.qp_depth() * 2).unwrap();
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
                HeapMem::zeroed(cfg.scratch_bytes()).unwrap(),
                Access::LOCAL_WRITE,
            )
            .unwrap();
        Executor::new(nic, cq, qps, mr, cfg).unwrap()
    }
}

#[cfg(feature = "mlx5")]
impl Machines for Mlx5 {
    type N = nicdrv::mlx5::Mlx5Nic;
    fn run(&self, tasks: Vec<(u16, Task<Self::N>)>) {
        std::thread::scope(|s| {
            let hs: Vec<_> = tasks
                .into_iter()
                .map(|(m, t)| {
                    s.spawn(move || {
                        let mut ex = self.executor(m);
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
}
