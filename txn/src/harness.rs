//! Running a transaction cluster: every core of every machine runs two
//! tasks — server thread t and coordinator thread t — and the coordinator
//! runs a [`Client`], a workload's transactions. The same run goes on the
//! simulator ([`run_sim`]) or on OS threads over any backend's executors
//! ([`run_threads`]: emu, mlx5). Servers stop once every client finished
//! and flushed its truncations, so that a run ends with every backup
//! copy up to date.

use crate::coord::{CoordStats, Coordinator};
use crate::error::TxError;
use crate::layout::Geometry;
use crate::server::{Server, ServerStats};
use nicdrv::sim::{RunEnd, SimConfig, SimModel, World};
use nicdrv::{Ctx, Executor, ExecutorConfig, Nic, Space, VerbCounters};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// A workload's side of one coordinator thread.
pub trait Client<N: Nic>: Send + 'static {
    type Out: Send + 'static;
    fn run<'a>(
        self,
        ctx: &'a Ctx<N>,
        c: &'a mut Coordinator,
    ) -> impl Future<Output = Result<Self::Out, TxError>> + 'a;
}

/// What one coordinator thread's client did.
#[derive(Debug)]
pub struct ClientReport<O> {
    pub machine: u16,
    pub thread: u16,
    pub out: Result<O, TxError>,
    pub stats: CoordStats,
    /// The client task's verbs (its commits' WRITEs and READs among them).
    pub counters: VerbCounters,
    /// From the client's start to its last commit (before the flush).
    pub elapsed_ns: u64,
}

/// What one server thread did.
#[derive(Debug)]
pub struct ServerReport {
    pub machine: u16,
    pub thread: u16,
    pub stats: Result<ServerStats, TxError>,
    pub counters: VerbCounters,
}

/// A whole run.
#[derive(Debug)]
pub struct Report<O> {
    pub clients: Vec<ClientReport<O>>,
    pub servers: Vec<ServerReport>,
    /// Every machine's host memory at the end.
    pub memory: Vec<Vec<u8>>,
}

impl<O> Report<O> {
    /// Every task's verbs, summed.
    pub fn counters(&self) -> VerbCounters {
        let mut c = VerbCounters::default();
        for r in &self.clients {
            c += r.counters;
        }
        for s in &self.servers {
            c += s.counters;
        }
        c
    }

    pub fn coord_stats(&self) -> CoordStats {
        let mut c = CoordStats::default();
        for r in &self.clients {
            c += r.stats;
        }
        c
    }

    /// Servers' stats summed, or the first server's error.
    pub fn server_stats(&self) -> Result<ServerStats, TxError> {
        let mut s = ServerStats::default();
        for r in &self.servers {
            s += r.stats.clone()?;
        }
        Ok(s)
    }

    /// The first error any task met.
    pub fn first_error(&self) -> Option<&TxError> {
        let c = self.clients.iter().filter_map(|c| c.out.as_ref().err());
        let s = self.servers.iter().filter_map(|s| s.stats.as_ref().err());
        c.chain(s).next()
    }
}

/// Every machine's executor config: two task slots (server, client).
pub fn core_config() -> ExecutorConfig {
    ExecutorConfig {
        slots: 2,
        ..Default::default()
    }
}

type Task<N> = Box<dyn FnOnce(Ctx<N>) -> std::pin::Pin<Box<dyn Future<Output = ()>>> + Send>;

/// Each core's machine and its two tasks (server, client), and where
/// they report.
struct Planned<N: Nic, O> {
    cores: Vec<(u16, [Task<N>; 2])>,
    sink: Arc<Sink<O>>,
}

struct Sink<O> {
    clients: Mutex<Vec<ClientReport<O>>>,
    servers: Mutex<Vec<ServerReport>>,
    /// Clients still running: servers stop when it reaches 0.
    live: AtomicUsize,
}

/// Each core's (machine, [server task, client task]), for the machines
/// `machines`. With every machine here, servers also stop when every
/// client ended (one that failed sends no DONE); with some, only once
/// every coordinator of the cluster said DONE.
fn tasks<N: Nic, C: Client<N>>(
    geo: Geometry,
    machines: std::ops::Range<u16>,
    mut client: impl FnMut(u16, u16) -> C,
) -> Result<Planned<N, C::Out>, TxError> {
    let map0 = geo.region_map()?;
    let all = machines == (0..geo.machines);
    let local = machines.len() * geo.threads as usize;
    let sink = Arc::new(Sink {
        clients: Mutex::new(Vec::new()),
        servers: Mutex::new(Vec::new()),
        // Never 0 while remote clients may run.
        live: AtomicUsize::new(if all { local } else { usize::MAX }),
    });
    let mut cores = Vec::new();
    for m in machines {
        // One allocator and one region map a machine, shared by its
        // threads.
        let alloc = crate::alloc::SharedAllocator::default();
        let map: crate::regions::SharedMap = Arc::new(std::sync::RwLock::new(map0.clone()));
        for t in 0..geo.threads {
            let (map2, sink2, alloc2) = (map.clone(), sink.clone(), alloc.clone());
            let server: Task<N> = Box::new(move |ctx| {
                Box::pin(async move {
                    // Acquire: pairs with each client's Release decrement,
                    // so the records its close appended are seen by the
                    // last sweep.
                    let stop = || sink2.live.load(Ordering::Acquire) == 0;
                    let stats = match Server::open(&ctx, geo, map2, m, t, alloc2) {
                        Ok(s) => s.run(&ctx, &stop).await,
                        Err(e) => Err(e),
                    };
                    sink2
                        .servers
                        .lock()
                        .expect("no panics hold it")
                        .push(ServerReport {
                            machine: m,
                            thread: t,
                            stats,
                            counters: ctx.counters(),
                        });
                })
            });
            let (map2, sink2, c) = (map.clone(), sink.clone(), client(m, t));
            let client: Task<N> = Box::new(move |ctx| {
                Box::pin(async move {
                    let start = ctx.now_ns();
                    let (out, stats, elapsed_ns) = match Coordinator::open(&ctx, geo, map2, m, t, 1)
                    {
                        Ok(mut co) => {
                            let out = c.run(&ctx, &mut co).await;
                            let elapsed = ctx.now_ns() - start;
                            let out = match (out, co.close(&ctx).await) {
                                (Ok(o), Ok(())) => Ok(o),
                                (Err(e), _) | (_, Err(e)) => Err(e),
                            };
                            (out, co.stats(), elapsed)
                        }
                        Err(e) => (Err(e), CoordStats::default(), 0),
                    };
                    sink2
                        .clients
                        .lock()
                        .expect("no panics hold it")
                        .push(ClientReport {
                            machine: m,
                            thread: t,
                            out,
                            stats,
                            counters: ctx.counters(),
                            elapsed_ns,
                        });
                    // Release: the flush's records landed before servers
                    // that see the count drop look at their rings.
                    sink2.live.fetch_sub(1, Ordering::Release);
                })
            });
            cores.push((m, [server, client]));
        }
    }
    Ok(Planned { cores, sink })
}

fn report<O>(sink: Arc<Sink<O>>, memory: Vec<Vec<u8>>) -> Report<O> {
    let sink = Arc::try_unwrap(sink).ok().expect("every task is done");
    let mut clients = sink.clients.into_inner().expect("no panics hold it");
    let mut servers = sink.servers.into_inner().expect("no panics hold it");
    clients.sort_by_key(|c| (c.machine, c.thread));
    servers.sort_by_key(|s| (s.machine, s.thread));
    Report {
        clients,
        servers,
        memory,
    }
}

/// Virtual time after which a simulated run is called stuck.
pub const SIM_LIMIT_NS: u64 = 60_000_000_000;

/// The run on the simulator: `geo.machines` machines of `geo.threads`
/// cores, the model `model`, seed `seed`.
pub fn run_sim<C: Client<nicdrv::sim::SimNic>>(
    geo: Geometry,
    seed: u64,
    model: SimModel,
    client: impl FnMut(u16, u16) -> C,
) -> Result<(Report<C::Out>, World), TxError> {
    run_sim_with_faults(geo, seed, model, &[], client)
}

/// As [`run_sim`], with simulator faults (times from the start; core t
/// of machine m is thread m × threads + t).
pub fn run_sim_with_faults<C: Client<nicdrv::sim::SimNic>>(
    geo: Geometry,
    seed: u64,
    model: SimModel,
    faults: &[nicdrv::sim::Fault],
    client: impl FnMut(u16, u16) -> C,
) -> Result<(Report<C::Out>, World), TxError> {
    let host = geo
        .host_bytes()
        .ok_or_else(|| TxError::Usage("layout overflows".into()))?;
    let m = geo.machines as usize;
    let sim = |e: nicdrv::sim::SimError| TxError::Usage(format!("simulator: {e}"));
    let mut w = World::new(SimConfig {
        seed,
        memory_nodes: m,
        compute_nodes: m,
        machines: m,
        host_bytes: host,
        model,
        ..Default::default()
    })
    .map_err(sim)?;
    let Planned { cores, sink } = tasks(geo, 0..geo.machines, client)?;
    for (machine, [server, client]) in cores {
        let th = w.add_thread(machine, core_config()).map_err(sim)?;
        w.spawn(th, server).map_err(sim)?;
        w.spawn(th, client).map_err(sim)?;
    }
    w.add_faults(faults).map_err(sim)?;
    match w.run_until(SIM_LIMIT_NS) {
        RunEnd::Done => {}
        end => {
            return Err(TxError::Protocol(format!(
                "seed {seed}: the run did not finish ({end:?} at {} ns)",
                w.now_ns()
            )))
        }
    }
    let memory = (0..geo.machines)
        .map(|n| {
            let mut b = vec![0u8; host as usize];
            w.read_memory(n, Space::Host, 0, &mut b);
            b
        })
        .collect();
    Ok((report(sink, memory), w))
}

/// The run on one OS thread per core, each with the executor
/// `executor(machine)` makes (its config from [`core_config`]);
/// `memory(machine)` reads a machine's host memory at the end.
pub fn run_threads<N: Nic, C: Client<N>>(
    geo: Geometry,
    executor: impl Fn(u16) -> Result<Executor<N>, String> + Sync,
    memory: impl Fn(u16) -> Vec<u8>,
    client: impl FnMut(u16, u16) -> C,
) -> Result<Report<C::Out>, TxError> {
    let planned = tasks(geo, 0..geo.machines, client)?;
    let sink = on_threads(planned, &executor)?;
    let memory = (0..geo.machines).map(memory).collect();
    Ok(report(sink, memory))
}

/// One machine of a cluster whose other machines run elsewhere (other
/// processes): its `geo.threads` cores on OS threads, each with the
/// executor `executor(machine)` makes. Its servers serve until every
/// coordinator of the cluster said DONE. The report holds this machine's
/// tasks only, and no memory.
pub fn run_machine<N: Nic, C: Client<N>>(
    geo: Geometry,
    machine: u16,
    executor: impl Fn(u16) -> Result<Executor<N>, String> + Sync,
    client: impl FnMut(u16, u16) -> C,
) -> Result<Report<C::Out>, TxError> {
    if machine >= geo.machines {
        return Err(TxError::Usage(format!(
            "machine {machine} of a cluster of {}",
            geo.machines
        )));
    }
    let planned = tasks(geo, machine..machine + 1, client)?;
    let sink = on_threads(planned, &executor)?;
    Ok(report(sink, Vec::new()))
}

fn on_threads<N: Nic, O: Send>(
    planned: Planned<N, O>,
    executor: &(impl Fn(u16) -> Result<Executor<N>, String> + Sync),
) -> Result<Arc<Sink<O>>, TxError> {
    let Planned { cores, sink } = planned;
    let failed = std::thread::scope(|s| {
        let hs: Vec<_> = cores
            .into_iter()
            .map(|(m, [server, client])| {
                let sink = &sink;
                s.spawn(move || -> Result<(), String> {
                    let mut ex = executor(m).inspect_err(|_| {
                        // Its client never runs: the servers must not wait
                        // for it (Release, as a client's own decrement).
                        sink.live.fetch_sub(1, Ordering::Release);
                    })?;
                    ex.spawn(server).map_err(|e| e.to_string())?;
                    ex.spawn(client).map_err(|e| e.to_string())?;
                    ex.run();
                    Ok(())
                })
            })
            .collect();
        let mut failed = None;
        for h in hs {
            match h.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => failed = Some(e),
                Err(_) => failed = Some("a core panicked".to_string()),
            }
        }
        failed
    });
    if let Some(e) = failed {
        return Err(TxError::Usage(format!("starting a core: {e}")));
    }
    Ok(sink)
}
