//! The harness on both backends: one workload, written once, booted from
//! one description and run on emu threads and in a simulated world; the
//! memory holds exactly what the groups say their tasks did.

use cluster::sim::{self as simrun, Flow, Placement};
use cluster::{Backend, Cluster, ClusterSpec, Place, Spawn, Workload};
use nicdrv::sim::{RunEnd, SimModel};
use nicdrv::{ExecutorConfig, GlobalAddr, Nic, Space, VerbCounters};
use std::cell::{Cell, RefCell};
use std::rc::Rc;

/// Where the counter lives: past the superblock of memory node 1.
const COUNTER: GlobalAddr = GlobalAddr::host(1, 8192);

/// Each task adds 1 to the counter `per_task` times; a group records the
/// places its cores were given.
struct Adds {
    tasks: usize,
    per_task: u64,
}

struct Group {
    faa: Cell<u64>,
    places: RefCell<Vec<Place>>,
    index: (usize, usize),
}

impl Workload for Adds {
    type Group = Rc<Group>;
    type Out = (u64, Vec<Place>, (usize, usize), VerbCounters);

    fn group(&self, index: usize, groups: usize) -> Rc<Group> {
        Rc::new(Group {
            faa: Cell::new(0),
            places: RefCell::new(Vec::new()),
            index: (index, groups),
        })
    }

    fn spawn<N: Nic, S: Spawn<N>>(
        &self,
        place: Place,
        g: &Rc<Group>,
        on: &mut S,
    ) -> Result<(), String> {
        g.places.borrow_mut().push(place);
        for _ in 0..self.tasks {
            let (g, n) = (g.clone(), self.per_task);
            on.spawn_task(move |ctx| async move {
                for _ in 0..n {
                    ctx.faa(COUNTER, 1).await.expect("no faults here");
                    g.faa.set(g.faa.get() + 1);
                }
            })?;
        }
        Ok(())
    }

    fn finish(&self, g: Rc<Group>, counters: VerbCounters) -> Self::Out {
        (g.faa.get(), g.places.borrow().clone(), g.index, counters)
    }
}

fn spec(backend: Backend) -> ClusterSpec {
    ClusterSpec {
        memory_nodes: 2,
        host_bytes: 4 << 20,
        dm_bytes: 64 << 10,
        latency_ns: 0,
        machines: 0,
        backend,
    }
}

fn cfg(slots: usize) -> ExecutorConfig {
    ExecutorConfig {
        slots,
        ..Default::default()
    }
}

#[test]
fn one_workload_runs_on_emu_cores_with_a_group_each() {
    runs_on_cores_with_a_group_each(Backend::Emu { pin: false });
}

/// The same on this host's RDMA device in loopback; where it has none,
/// booting fails at once with one clear error.
#[cfg(feature = "mlx5")]
#[test]
fn one_workload_runs_on_mlx5_cores_with_a_group_each() {
    let device = nicdrv::mlx5::DeviceConfig::from_env().expect("the LOCH_MLX5_* variables");
    let mlx5 = Backend::Mlx5 { device, pin: false };
    if std::path::Path::new("/sys/class/infiniband").exists() {
        runs_on_cores_with_a_group_each(mlx5);
        return;
    }
    let t = std::time::Instant::now();
    let e = Cluster::boot(&spec(mlx5.clone())).err().expect("no device");
    assert!(e.starts_with("no RDMA device"), "{e}");
    assert!(t.elapsed() < std::time::Duration::from_secs(10));
    // A latency cannot be injected into a real NIC: refused before the
    // device is opened.
    let e = Cluster::boot(&ClusterSpec {
        latency_ns: 1000,
        ..spec(mlx5)
    })
    .err()
    .expect("refused");
    assert!(e.contains("cannot be injected on a real NIC"), "{e}");
}

fn runs_on_cores_with_a_group_each(backend: Backend) {
    let mut c = Cluster::boot(&spec(backend)).unwrap();
    assert!(c.on_threads());
    let work = Adds {
        tasks: 3,
        per_task: 500,
    };
    let outs = c.run(&work, 3, cfg(3)).unwrap();
    assert_eq!(outs.len(), 3, "one result per core");
    for (core, (faa, places, index, counters)) in outs.iter().enumerate() {
        assert_eq!(*faa, 1500);
        assert_eq!(counters.faa, 1500, "the core's own verb counters");
        assert_eq!(*index, (core, 3));
        assert_eq!(
            places,
            &[Place {
                core,
                compute_node: 0
            }]
        );
    }
    assert_eq!(c.read_u64(1, Space::Host, 8192), Some(4500));
    assert_eq!(c.read_u64(1, Space::Host, 4 << 20), None, "past the end");
    assert_eq!(c.read_u64(7, Space::Host, 0), None, "no such node");
    // Not a word (emu's load asserted its alignment: a panic).
    assert_eq!(c.read_u64(1, Space::Host, 8196), None, "unaligned");
    // An executor configuration past the executor's bounds is an error
    // before its queue sizes are computed (they overflowed: a panic in a
    // debug build, a wrapped size in a release one).
    let e = c.run(&work, 1, cfg(1 << 28)).map(|_| ()).unwrap_err();
    assert!(e.to_string().contains("slots must be 1..=65535"), "{e}");
}

#[test]
fn one_workload_runs_in_a_world_with_one_group_placed_round_robin() {
    let sim = Backend::Sim {
        seed: 5,
        compute_nodes: 2,
        model: SimModel::default(),
        faults: Vec::new(),
    };
    let mut c = Cluster::boot(&spec(sim)).unwrap();
    assert!(!c.on_threads());
    let work = Adds {
        tasks: 2,
        per_task: 100,
    };
    let outs = c.run(&work, 3, cfg(2)).unwrap();
    assert_eq!(outs.len(), 1, "one group for the world");
    let (faa, places, index, counters) = &outs[0];
    assert_eq!((*faa, counters.faa, *index), (600, 600, (0, 1)));
    let nodes: Vec<usize> = places.iter().map(|p| p.compute_node).collect();
    assert_eq!(nodes, [0, 1, 0]);
    assert_eq!(c.read_u64(1, Space::Host, 8192), Some(600));
}

#[test]
fn slices_stop_when_told_and_the_limit_moves_on() {
    let Cluster::Sim(mut w) = Cluster::boot(&spec(Backend::Sim {
        seed: 9,
        compute_nodes: 1,
        model: SimModel::default(),
        faults: Vec::new(),
    }))
    .unwrap() else {
        unreachable!("a sim spec boots a world")
    };
    let work = Adds {
        tasks: 1,
        per_task: 1_000_000,
    };
    let spawned = simrun::spawn(&mut w, &work, 2, cfg(1), Placement::Blocks(2)).unwrap();
    assert_eq!(spawned.threads, 0..2);
    let mut slices = 0;
    let end = simrun::run_slices(&mut w, 10_000, |_, until| {
        slices += 1;
        assert_eq!(until, 10_000 * slices, "the limit moves by a slice");
        if slices == 5 {
            Flow::Stop
        } else {
            Flow::Go
        }
    });
    assert_eq!((end, slices), (RunEnd::Limit, 5));
    let done = spawned.group.faa.get();
    assert!(done > 0 && done < 2_000_000, "{done} adds in 50 virtual µs");
    spawned.halt(&mut w);
    // Halted threads run no more: what was in flight lands, then the world
    // stalls with their tasks unfinished.
    assert_eq!(w.run(), RunEnd::Stalled);
    assert_eq!(w.live_tasks(), 2);
    let (faa, ..) = spawned.finish(&w, &work);
    // A task halted with its FAA in flight did not count it, though it
    // may have landed: at most one per task.
    let memory = w.read_u64(1, Space::Host, 8192).unwrap();
    assert!(
        (faa..=faa + 2).contains(&memory),
        "memory {memory}, counted {faa}"
    );
}

/// Each core leaves a mark in its machine's memory through the local view
/// and reads it back with a remote READ; a core on no machine is told so.
struct Marks;

impl Workload for Marks {
    type Group = Rc<RefCell<Vec<(usize, usize, Result<u64, nicdrv::LocalError>)>>>;
    type Out = Vec<(usize, usize, Result<u64, nicdrv::LocalError>)>;

    fn group(&self, _: usize, _: usize) -> Self::Group {
        Rc::new(RefCell::new(Vec::new()))
    }

    fn spawn<N: Nic, S: Spawn<N>>(
        &self,
        place: Place,
        g: &Self::Group,
        on: &mut S,
    ) -> Result<(), String> {
        let g = g.clone();
        on.spawn_task(move |ctx| async move {
            let off = 64 * 1024 + 8 * place.core as u64;
            let mark = 1000 + place.core as u64;
            let r = match ctx.local().store(off, mark) {
                Ok(()) => {
                    let node = place.compute_node as u16;
                    let back = ctx.read(GlobalAddr::host(node, off), 8).await.unwrap();
                    Ok(back.u64_at(0))
                }
                Err(e) => Err(e),
            };
            g.borrow_mut().push((place.core, place.compute_node, r));
        })
    }

    fn finish(&self, g: Self::Group, _: VerbCounters) -> Self::Out {
        g.borrow().clone()
    }
}

/// Machines through the one harness: on emu core c runs on machine c mod 2,
/// on sim compute nodes 0 and 1 are machines and node 2 is compute-only;
/// every mark is in its machine's memory afterwards.
#[test]
fn cores_on_machines_reach_their_own_memory_on_both_backends() {
    #[allow(unused_mut)]
    let mut backends = vec![
        Backend::Emu { pin: false },
        Backend::Sim {
            seed: 3,
            compute_nodes: 3,
            model: SimModel::default(),
            faults: Vec::new(),
        },
    ];
    // And through the RDMA device in loopback, where this host has one.
    #[cfg(feature = "mlx5")]
    if std::path::Path::new("/sys/class/infiniband").exists() {
        let device = nicdrv::mlx5::DeviceConfig::from_env().expect("the LOCH_MLX5_* variables");
        backends.push(Backend::Mlx5 { device, pin: false });
    }
    for backend in backends {
        let sim = matches!(backend, Backend::Sim { .. });
        let mut c = Cluster::boot(&ClusterSpec {
            machines: 2,
            ..spec(backend)
        })
        .unwrap();
        let outs: Vec<_> = c.run(&Marks, 4, cfg(1)).unwrap().concat();
        assert_eq!(outs.len(), 4);
        for (core, node, r) in outs {
            let mark = 1000 + core as u64;
            if sim && node == 2 {
                assert_eq!(r, Err(nicdrv::LocalError::NotAMachine), "core {core}");
                continue;
            }
            assert_eq!(node, core % if sim { 3 } else { 2 }, "core {core}'s place");
            assert_eq!(r, Ok(mark), "core {core} read its mark back");
            let off = 64 * 1024 + 8 * core as u64;
            assert_eq!(c.read_u64(node as u16, Space::Host, off), Some(mark));
        }
    }
    assert!(Cluster::boot(&ClusterSpec {
        machines: 3,
        ..spec(Backend::Emu { pin: false })
    })
    .is_err());
}
