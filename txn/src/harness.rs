//! Running a transaction cluster: every core of every machine runs two
//! tasks — server thread t and coordinator thread t — and the coordinator
//! runs a [`Client`], a workload's transactions. The same run goes on the
//! simulator ([`run_sim`]) or on OS threads over any backend's executors
//! ([`run_threads`]: emu, mlx5). Servers stop once every client finished
//! and flushed its truncations, so that a run ends with every backup
//! copy up to date.

use crate::config::{Configuration, Stored};
use crate::coord::{CoordStats, Coordinator};
use crate::error::TxError;
use crate::layout::Geometry;
use crate::lease::{LeaseConfig, LeaseStats, Membership, Suspicion};
use crate::recovery::Machine;
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

/// What one machine's failure handling did ([`RunOptions::recovery`]).
#[derive(Debug)]
pub struct MachineReport {
    pub machine: u16,
    /// Its reconfiguration task's events (an error: its task ended with
    /// it; none for a crashed machine, whose task never ends).
    pub events: Option<Result<Vec<crate::reconfig::Event>, TxError>>,
    /// Its background work: allocator recovery and copies to new backups.
    pub work: Vec<crate::recovery::Work>,
    /// Every configuration change it applied.
    pub changes: Vec<crate::recovery::Change>,
    /// The configuration it ended in, and whether it learnt it was removed.
    pub config: u64,
    pub removed: bool,
    /// Its region map at the end.
    pub map: crate::regions::RegionMap,
    /// Objects still held by lock recovery at the end (none once every
    /// recovering transaction is decided).
    pub rlocked: usize,
    /// When it had drained and recovered its locks, per configuration.
    pub recovered_at: Vec<(u64, u64)>,
}

/// What one lease task did.
#[derive(Debug)]
pub struct LeaseReport {
    pub machine: u16,
    pub peer: u16,
    pub stats: Result<LeaseStats, TxError>,
}

/// A whole run.
#[derive(Debug)]
pub struct Report<O> {
    pub clients: Vec<ClientReport<O>>,
    pub servers: Vec<ServerReport>,
    /// Every lease task's report (none without leases).
    pub leases: Vec<LeaseReport>,
    /// Every machine's suspicions, in the order raised per machine.
    pub suspicions: Vec<Suspicion>,
    /// Every machine's failure handling (none without a store).
    pub machines: Vec<MachineReport>,
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

    /// The stats of the servers that ended without an error, summed (a
    /// crashed or cut-off machine's servers end in one).
    pub fn live_server_stats(&self) -> ServerStats {
        let mut s = ServerStats::default();
        for r in self.servers.iter().filter_map(|r| r.stats.as_ref().ok()) {
            s += *r;
        }
        s
    }

    /// The first error any task met.
    pub fn first_error(&self) -> Option<&TxError> {
        self.first_error_on(|_| true)
    }

    /// The first error a task of a machine `on` says met: a machine
    /// removed while alive (a link down, a partition) ends its tasks with
    /// errors that are no failure of the cluster's.
    pub fn first_error_on(&self, on: impl Fn(u16) -> bool) -> Option<&TxError> {
        let c = self.clients.iter().filter(|c| on(c.machine));
        let s = self.servers.iter().filter(|s| on(s.machine));
        let l = self.leases.iter().filter(|l| on(l.machine));
        let c = c.filter_map(|c| c.out.as_ref().err());
        let s = s.filter_map(|s| s.stats.as_ref().err());
        let l = l.filter_map(|l| l.stats.as_ref().err());
        c.chain(s).chain(l).next()
    }

    /// Lease tasks' stats summed, or the first one's error.
    pub fn lease_stats(&self) -> Result<LeaseStats, TxError> {
        let mut s = LeaseStats::default();
        for l in &self.leases {
            s += l.stats.clone()?;
        }
        Ok(s)
    }
}

/// How a run goes beyond its workload.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// Simulator faults (times from the start; core t of machine m is
    /// thread m × threads + t, and machine m's lease core, with leases,
    /// thread machines × threads + m). Ignored off the simulator.
    pub faults: Vec<nicdrv::sim::Fault>,
    /// Failure detection by leases, on a core of its own on every machine
    /// (configuration 1, CM machine 0).
    pub leases: Option<LeaseConfig>,
    /// With leases, the configuration store: every machine also runs its
    /// reconfiguration task and its background work (allocator recovery,
    /// re-replication) on a core of its own (after the lease cores), and
    /// its servers and coordinators follow the configuration
    /// ([`crate::recovery`]). The store gets configuration 1 unless it
    /// holds one.
    pub recovery: Option<Arc<dyn crate::config::ConfigStore>>,
    /// With recovery, the store as machine m's reconfiguration task
    /// reaches it, where this names one (a store some machines cannot
    /// reach, say); the others use `recovery`'s.
    pub store_of: Vec<(u16, Arc<dyn crate::config::ConfigStore>)>,
    /// Servers stop at this time of their executor clock whatever else
    /// (a run across processes whose clients may have failed, sending no
    /// DONE).
    pub serve_until_ns: Option<u64>,
    /// How fast recovery's background work goes.
    pub copy_pace: crate::recovery::CopyPace,
    pub alloc_pace: crate::alloc::Pace,
}

/// The simulator threads [`run_sim_with`] makes for `machines` machines
/// of `threads` cores (a geometry's), with or without `leases` and
/// `recovery` (which needs leases), which a thread stall may name: the
/// cores (core t of machine m is thread m × threads + t), then a lease
/// core a machine with leases, then a recovery core a machine with
/// recovery. With neither it is where the lease cores start, with leases
/// alone where the recovery cores do.
pub fn sim_threads(machines: u16, threads: u16, leases: bool, recovery: bool) -> usize {
    let lease = usize::from(leases);
    let recovery = usize::from(leases && recovery);
    machines as usize * (threads as usize + lease + recovery)
}

/// The simulator threads [`run_leases_sim`] makes for `machines`
/// machines, with or without `rogue` writes and a `store`, which a thread
/// stall may name: machine m's lease core is thread m, then the rogue
/// writer's core where there are rogue writes, then a reconfiguration
/// core a machine with a store.
pub fn lease_sim_threads(machines: u16, rogue: bool, store: bool) -> usize {
    let machines = machines as usize;
    machines + usize::from(rogue) + if store { machines } else { 0 }
}

impl std::fmt::Debug for dyn crate::config::ConfigStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConfigStore")
    }
}

/// Executor config of a lease core with `tasks` lease tasks.
pub fn lease_core_config(tasks: usize) -> ExecutorConfig {
    ExecutorConfig {
        slots: tasks.max(1),
        ..Default::default()
    }
}

/// Every machine's executor config: two task slots (server, client).
pub fn core_config() -> ExecutorConfig {
    ExecutorConfig {
        slots: 2,
        ..Default::default()
    }
}

/// A machine's count of servers still serving, decremented when dropped.
struct Serving(Arc<AtomicUsize>);

impl Drop for Serving {
    fn drop(&mut self) {
        // Release: whatever the server did is before a lease task's stop
        // (Acquire) sees the count drop.
        self.0.fetch_sub(1, Ordering::Release);
    }
}

type Task<N> = Box<dyn FnOnce(Ctx<N>) -> std::pin::Pin<Box<dyn Future<Output = ()>>> + Send>;

/// Each core's machine and its two tasks (server, client), each lease
/// core's machine and tasks, and where they report.
struct Planned<N: Nic, O> {
    cores: Vec<(u16, [Task<N>; 2])>,
    lease_cores: Vec<(u16, Vec<Task<N>>)>,
    sink: Arc<Sink<O>>,
}

struct Sink<O> {
    clients: Mutex<Vec<ClientReport<O>>>,
    servers: Mutex<Vec<ServerReport>>,
    leases: Mutex<Vec<LeaseReport>>,
    memberships: Vec<Arc<Membership>>,
    /// With recovery: every machine, its reconfiguration events and its
    /// background work.
    machines: Vec<Arc<Machine>>,
    events: Mutex<Vec<MachineEvents>>,
    work: Mutex<Vec<(u16, Vec<crate::recovery::Work>)>>,
    /// Clients still running: servers stop when it reaches 0.
    live: AtomicUsize,
    /// Per machine, clients still doing their work (not lingering).
    working: Vec<AtomicUsize>,
}

/// Each core's (machine, [server task, client task]), for the machines
/// `machines`. With every machine here, servers also stop when every
/// client ended (one that failed sends no DONE); with some, only once
/// every coordinator of the cluster said DONE.
fn tasks<N: Nic, C: Client<N>>(
    geo: Geometry,
    machines: std::ops::Range<u16>,
    opts: &RunOptions,
    mut client: impl FnMut(u16, u16) -> C,
) -> Result<Planned<N, C::Out>, TxError> {
    let map0 = geo.region_map()?;
    let leases = opts.leases;
    if let Some(l) = leases {
        l.check()?;
    }
    let current = match (&opts.recovery, leases) {
        (None, _) => first_stored(geo),
        (Some(_), None) => {
            return Err(TxError::Usage(
                "recovery needs leases (failure detection)".into(),
            ))
        }
        (Some(_), Some(_)) if geo.spare_regions_per_machine == 0 => return Err(TxError::Usage(
            "recovery needs spare replica slots for new backups (spare_regions_per_machine ≥ 1)"
                .into(),
        )),
        (Some(store), Some(_)) => {
            crate::config::establish(store.as_ref(), &first_stored(geo).config)
                .map_err(|e| TxError::Usage(e.to_string()))?
        }
    };
    let all = machines == (0..geo.machines);
    let local = machines.len() * geo.threads as usize;
    let memberships: Vec<Arc<Membership>> = machines
        .clone()
        .map(|m| Membership::new(m, current.clone()))
        .collect();
    // One allocator and one region map a machine, shared by its threads.
    let allocs: Vec<crate::alloc::SharedAllocator> =
        machines.clone().map(|_| Default::default()).collect();
    let maps: Vec<crate::regions::SharedMap> = machines
        .clone()
        .map(|_| Arc::new(std::sync::RwLock::new(map0.clone())))
        .collect();
    let recovering: Vec<Arc<Machine>> = match opts.recovery {
        Some(_) => memberships
            .iter()
            .zip(&maps)
            .zip(&allocs)
            .map(|((ms, map), alloc)| {
                Machine::paced(
                    geo,
                    ms.clone(),
                    map.clone(),
                    alloc.clone(),
                    opts.alloc_pace,
                    opts.copy_pace,
                )
            })
            .collect(),
        None => Vec::new(),
    };
    let sink = Arc::new(Sink {
        clients: Mutex::new(Vec::new()),
        servers: Mutex::new(Vec::new()),
        leases: Mutex::new(Vec::new()),
        memberships,
        machines: recovering,
        events: Mutex::new(Vec::new()),
        work: Mutex::new(Vec::new()),
        // Never 0 while remote clients may run.
        live: AtomicUsize::new(if all { local } else { usize::MAX }),
        working: (0..geo.machines)
            .map(|m| {
                AtomicUsize::new(if machines.contains(&m) {
                    geo.threads as usize
                } else {
                    0
                })
            })
            .collect(),
    });
    let first = machines.start;
    let mut cores = Vec::new();
    let mut lease_cores = Vec::new();
    let mut recovery_cores = Vec::new();
    for m in machines {
        let i = (m - first) as usize;
        let (alloc, map) = (allocs[i].clone(), maps[i].clone());
        let machine = sink.machines.get(i).cloned();
        // The machine's servers still serving: its lease tasks end (with a
        // LEAVE) once they all stopped.
        let serving = Arc::new(AtomicUsize::new(geo.threads as usize));
        if let Some(timing) = leases {
            let membership = &sink.memberships[(m - first) as usize];
            let mut ts: Vec<Task<N>> = Vec::new();
            for lease in crate::lease::leases_of(geo, m, timing, membership) {
                let (sink2, serving2) = (sink.clone(), serving.clone());
                ts.push(Box::new(move |ctx| {
                    Box::pin(async move {
                        // Acquire: pairs with each server's Release
                        // decrement (nothing is read after it, but the
                        // ordering costs nothing here).
                        let stop = || serving2.load(Ordering::Acquire) == 0;
                        run_lease(&ctx, lease, &stop, &sink2.leases).await;
                    })
                }));
            }
            lease_cores.push((m, ts));
        }
        if let (Some(store), Some(timing), Some(mach)) = (&opts.recovery, leases, &machine) {
            let r = crate::reconfig::Reconfig {
                geo,
                timing,
                store: opts
                    .store_of
                    .iter()
                    .find(|s| s.0 == m)
                    .map_or_else(|| store.clone(), |s| s.1.clone()),
                membership: mach.membership.clone(),
                machine: Some(mach.clone()),
            };
            let (sink2, serving2) = (sink.clone(), serving.clone());
            let reconfig: Task<N> = Box::new(move |ctx| {
                Box::pin(async move {
                    // Acquire: as the lease tasks' stop.
                    let stop = || serving2.load(Ordering::Acquire) == 0;
                    let out = r.run(&ctx, &stop).await;
                    sink2
                        .events
                        .lock()
                        .expect("no panics hold it")
                        .push((m, out));
                })
            });
            let (sink2, serving2, mach2) = (sink.clone(), serving.clone(), mach.clone());
            let maintain: Task<N> = Box::new(move |ctx| {
                Box::pin(async move {
                    let stop = || serving2.load(Ordering::Acquire) == 0;
                    let work = mach2.maintain(&ctx, &stop).await;
                    sink2
                        .work
                        .lock()
                        .expect("no panics hold it")
                        .push((m, work));
                })
            });
            recovery_cores.push((m, vec![reconfig, maintain]));
        }
        for t in 0..geo.threads {
            let (map2, sink2, alloc2) = (map.clone(), sink.clone(), alloc.clone());
            let machine2 = machine.clone();
            let serve_until = opts.serve_until_ns;
            // Counts the server out when its task ends, or when it is
            // dropped unrun (its core did not start).
            let serving2 = Serving(serving.clone());
            let server: Task<N> = Box::new(move |ctx| {
                Box::pin(async move {
                    let _serving = serving2;
                    // Acquire: pairs with each client's Release decrement,
                    // so the records its close appended are seen by the
                    // last sweep.
                    let stop = || {
                        sink2.live.load(Ordering::Acquire) == 0
                            || serve_until.is_some_and(|t| ctx.now_ns() >= t)
                    };
                    let stats = match Server::open(&ctx, geo, map2, m, t, alloc2) {
                        Ok(s) => {
                            let s = match machine2 {
                                Some(mach) => s.follow(mach),
                                None => s,
                            };
                            s.run(&ctx, &stop).await
                        }
                        Err(e) => {
                            // A server that never ran drains nothing: its
                            // machine's other threads must not wait for it
                            // at the next configuration change.
                            if let Some(mach) = &machine2 {
                                mach.server_gone(t);
                            }
                            Err(e)
                        }
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
            let (machine2, config) = (machine.clone(), current.config.id as u32);
            let client: Task<N> = Box::new(move |ctx| {
                Box::pin(async move {
                    let start = ctx.now_ns();
                    let opened =
                        Coordinator::open(&ctx, geo, map2, m, t, config).map(|co| match machine2 {
                            Some(mach) => co.follow(mach),
                            None => co,
                        });
                    let (out, stats, elapsed_ns) = match opened {
                        Ok(mut co) => {
                            let out = c.run(&ctx, &mut co).await;
                            let elapsed = ctx.now_ns() - start;
                            // Release: pairs with linger's Acquire.
                            sink2.working[m as usize].fetch_sub(1, Ordering::Release);
                            let out = match (out, linger(&ctx, &mut co, &sink2.working).await) {
                                (Ok(o), Ok(())) => Ok(o),
                                (Err(e), _) | (_, Err(e)) => Err(e),
                            };
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
    // Recovery cores come after every lease core (fault specs name lease
    // cores by number).
    lease_cores.extend(recovery_cores);
    Ok(Planned {
        cores,
        lease_cores,
        sink,
    })
}

/// A coordinator whose client is done stays on while a client of a
/// machine of its configuration still works (with every machine here:
/// across processes only its own are known), taking each configuration
/// change and its recovery round: it is the heir of its thread number's
/// coordinators on the machines before it, and a heir that left would
/// leave their transactions undecided, locked for good. Bounded by
/// [`LINGER_MAX_NS`].
async fn linger<N: Nic>(
    ctx: &Ctx<N>,
    co: &mut Coordinator,
    working: &[AtomicUsize],
) -> Result<(), TxError> {
    let Some(mach) = co.machine() else {
        return Ok(());
    };
    let deadline = ctx.now_ns() + LINGER_MAX_NS;
    loop {
        co.follow_changes(ctx).await?;
        let cur = mach.membership.current();
        // Acquire: pairs with the clients' Release decrements.
        let busy = cur.config.machines.iter().any(|&(m, _)| {
            working
                .get(m as usize)
                .is_some_and(|w| w.load(Ordering::Acquire) > 0)
        });
        if !busy || mach.membership.is_removed() || ctx.now_ns() >= deadline {
            return Ok(());
        }
        ctx.sleep(LINGER_POLL_NS)?.await;
    }
}

/// How often a lingering coordinator looks, and for how long at most.
const LINGER_POLL_NS: u64 = 100_000;
const LINGER_MAX_NS: u64 = 10_000_000_000;

fn report<O>(sink: Arc<Sink<O>>, memory: Vec<Vec<u8>>) -> Report<O> {
    // A crashed machine's tasks never end and still hold the sink: take
    // what the others reported.
    fn take<T>(v: &Mutex<Vec<T>>) -> Vec<T> {
        std::mem::take(&mut *v.lock().expect("no panics hold it"))
    }
    let mut clients = take(&sink.clients);
    let mut servers = take(&sink.servers);
    let mut leases = take(&sink.leases);
    clients.sort_by_key(|c| (c.machine, c.thread));
    servers.sort_by_key(|s| (s.machine, s.thread));
    leases.sort_by_key(|l| (l.machine, l.peer));
    let suspicions = sink
        .memberships
        .iter()
        .flat_map(|m| m.suspicions())
        .collect();
    let mut events = take(&sink.events);
    let mut work = take(&sink.work);
    let machines = sink
        .machines
        .iter()
        .map(|m| {
            let me = m.me();
            MachineReport {
                machine: me,
                events: take_of(&mut events, me),
                work: take_of(&mut work, me).unwrap_or_default(),
                changes: m.changes(),
                config: m.membership.epoch(),
                removed: m.membership.is_removed(),
                map: m.map.read().expect("no panics hold the map").clone(),
                rlocked: m.rlocked(),
                recovered_at: m.recovered_at(),
            }
        })
        .collect();
    Report {
        clients,
        servers,
        leases,
        suspicions,
        machines,
        memory,
    }
}

/// Machine `me`'s entry of `v`, taken out.
fn take_of<T>(v: &mut Vec<(u16, T)>, me: u16) -> Option<T> {
    let i = v.iter().position(|x| x.0 == me)?;
    Some(v.swap_remove(i).1)
}

/// A lease task run to its end, its report in `sink`.
async fn run_lease<N: Nic>(
    ctx: &Ctx<N>,
    lease: crate::lease::Lease,
    stop: &dyn Fn() -> bool,
    sink: &Mutex<Vec<LeaseReport>>,
) {
    let stats = lease.run(ctx, stop).await;
    sink.lock().expect("no panics hold it").push(LeaseReport {
        machine: lease.me,
        peer: lease.peer,
        stats,
    });
}

fn sim(e: nicdrv::sim::SimError) -> TxError {
    TxError::Usage(format!("simulator: {e}"))
}

/// A simulated cluster of `geo.machines` machines of `host` bytes each.
fn sim_world(geo: Geometry, seed: u64, model: SimModel, host: u64) -> Result<World, TxError> {
    let m = geo.machines as usize;
    World::new(SimConfig {
        seed,
        memory_nodes: m,
        compute_nodes: m,
        machines: m,
        host_bytes: host,
        model,
        ..Default::default()
    })
    .map_err(sim)
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
    let opts = RunOptions {
        faults: faults.to_vec(),
        ..Default::default()
    };
    run_sim_with(geo, seed, model, &opts, client)
}

/// As [`run_sim`], with [`RunOptions`].
pub fn run_sim_with<C: Client<nicdrv::sim::SimNic>>(
    geo: Geometry,
    seed: u64,
    model: SimModel,
    opts: &RunOptions,
    client: impl FnMut(u16, u16) -> C,
) -> Result<(Report<C::Out>, World), TxError> {
    let host = geo
        .host_bytes()
        .ok_or_else(|| TxError::Usage("layout overflows".into()))?;
    let mut w = sim_world(geo, seed, model, host)?;
    let Planned {
        cores,
        lease_cores,
        sink,
    } = tasks(geo, 0..geo.machines, opts, client)?;
    for (machine, [server, client]) in cores {
        let th = w.add_thread(machine, core_config()).map_err(sim)?;
        w.spawn(th, server).map_err(sim)?;
        w.spawn(th, client).map_err(sim)?;
    }
    for (machine, ts) in lease_cores {
        let th = w
            .add_thread(machine, lease_core_config(ts.len()))
            .map_err(sim)?;
        for t in ts {
            w.spawn(th, t).map_err(sim)?;
        }
    }
    debug_assert_eq!(
        w.threads(),
        sim_threads(
            geo.machines,
            geo.threads,
            opts.leases.is_some(),
            opts.recovery.is_some()
        ),
        "sim_threads says the layout"
    );
    w.add_faults(&opts.faults).map_err(sim)?;
    let crashed = |w: &World| {
        w.faults()
            .iter()
            .any(|f| matches!(f.kind, nicdrv::sim::FaultKind::CrashMachine { .. }))
    };
    match w.run_until(SIM_LIMIT_NS) {
        RunEnd::Done => {}
        // A crashed machine's tasks never end (the plan's crashes and
        // those a test's trap injected); every other one did.
        RunEnd::Stalled if crashed(&w) && opts.recovery.is_some() => {}
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

/// A machine's executor of a config (from [`core_config`] or
/// [`lease_core_config`]).
pub trait ExecutorFactory<N: Nic>:
    Fn(u16, ExecutorConfig) -> Result<Executor<N>, String> + Sync
{
}
impl<N: Nic, F: Fn(u16, ExecutorConfig) -> Result<Executor<N>, String> + Sync> ExecutorFactory<N>
    for F
{
}

/// The run on one OS thread per core (and per lease core), each with the
/// executor `executor(machine, config)` makes; `memory(machine)` reads a
/// machine's host memory at the end. `opts.faults` are the simulator's
/// and ignored.
pub fn run_threads<N: Nic, C: Client<N>>(
    geo: Geometry,
    opts: &RunOptions,
    executor: impl ExecutorFactory<N>,
    memory: impl Fn(u16) -> Vec<u8>,
    client: impl FnMut(u16, u16) -> C,
) -> Result<Report<C::Out>, TxError> {
    let planned = tasks(geo, 0..geo.machines, opts, client)?;
    let sink = on_threads(planned, &executor)?;
    let memory = (0..geo.machines).map(memory).collect();
    Ok(report(sink, memory))
}

/// One machine of a cluster whose other machines run elsewhere (other
/// processes): its `geo.threads` cores (and its lease core) on OS
/// threads, each with the executor `executor(machine, config)` makes. Its
/// servers serve until every coordinator of the cluster said DONE. The
/// report holds this machine's tasks only, and no memory.
pub fn run_machine<N: Nic, C: Client<N>>(
    geo: Geometry,
    machine: u16,
    opts: &RunOptions,
    executor: impl ExecutorFactory<N>,
    client: impl FnMut(u16, u16) -> C,
) -> Result<Report<C::Out>, TxError> {
    if machine >= geo.machines {
        return Err(TxError::Usage(format!(
            "machine {machine} of a cluster of {}",
            geo.machines
        )));
    }
    let planned = tasks(geo, machine..machine + 1, opts, client)?;
    let sink = on_threads(planned, &executor)?;
    Ok(report(sink, Vec::new()))
}

fn on_threads<N: Nic, O: Send>(
    planned: Planned<N, O>,
    executor: &impl ExecutorFactory<N>,
) -> Result<Arc<Sink<O>>, TxError> {
    let Planned {
        cores,
        lease_cores,
        sink,
    } = planned;
    let failed = std::thread::scope(|s| {
        let mut hs: Vec<_> = cores
            .into_iter()
            .map(|(m, [server, client])| {
                let sink = &sink;
                s.spawn(move || -> Result<(), String> {
                    let mut ex = executor(m, core_config()).inspect_err(|_| {
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
        hs.extend(lease_cores.into_iter().map(|(m, ts)| {
            s.spawn(move || -> Result<(), String> {
                let mut ex = executor(m, lease_core_config(ts.len()))?;
                for t in ts {
                    ex.spawn(t).map_err(|e| e.to_string())?;
                }
                ex.run();
                Ok(())
            })
        }));
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

/// What a run of lease tasks alone saw ([`run_leases_sim`]).
#[derive(Debug)]
pub struct LeaseRun {
    /// Lease tasks that ended (those of crashed machines never do).
    pub leases: Vec<LeaseReport>,
    pub suspicions: Vec<Suspicion>,
    /// Each machine's reconfiguration events (with a store; none for a
    /// crashed machine's task, which never ends).
    pub reconfig: Vec<MachineEvents>,
    /// Each machine's configuration number at the end, and whether it
    /// learnt it was removed.
    pub configs: Vec<(u16, u64, bool)>,
}

/// Configuration 1 of a cluster of `geo`: every machine, each in a
/// failure domain of its own, machine 0 the CM (revision 0 until a store
/// says otherwise).
pub fn first_stored(geo: Geometry) -> Stored {
    Stored {
        revision: 0,
        config: Configuration {
            id: 1,
            machines: (0..geo.machines).map(|m| (m, m as u32)).collect(),
            cm: 0,
        },
    }
}

/// One machine's reconfiguration events, or its task's error.
pub type MachineEvents = (u16, Result<Vec<crate::reconfig::Event>, TxError>);

/// A run of lease tasks alone.
#[derive(Clone)]
pub struct LeaseSim {
    pub timing: LeaseConfig,
    pub faults: Vec<nicdrv::sim::Fault>,
    pub rogue: Vec<RogueWrite>,
    /// Every task leaves at this time.
    pub until_ns: u64,
    /// With a store, a reconfiguration task on a core of its own on every
    /// machine; the store gets configuration 1 (every machine in a domain
    /// of its own, CM machine 0) unless it holds one.
    pub store: Option<Arc<dyn crate::config::ConfigStore>>,
}

impl LeaseSim {
    /// Leases of `lease_ns` until `until_ns`, nothing else.
    pub fn of(lease_ns: u64, until_ns: u64) -> LeaseSim {
        LeaseSim {
            timing: LeaseConfig::of(lease_ns),
            faults: Vec::new(),
            rogue: Vec::new(),
            until_ns,
            store: None,
        }
    }
}

/// A word a rogue writer puts into a machine's memory by RDMA WRITE at a
/// time: bad input for the lease tasks to refuse.
#[derive(Copy, Clone, Debug)]
pub struct RogueWrite {
    pub at_ns: u64,
    pub machine: u16,
    pub off: u64,
    pub word: u64,
}

/// The lease tasks of every machine on the simulator, nothing else, from
/// time 0 until `until_ns` (then every task leaves), with faults and
/// rogue writes (from a thread of the last machine), and with a store the
/// reconfiguration tasks: how long detection and a new configuration
/// take, apart from any workload, and what bad lease words do.
pub fn run_leases_sim(
    geo: Geometry,
    seed: u64,
    model: SimModel,
    run: &LeaseSim,
) -> Result<LeaseRun, TxError> {
    let current = match &run.store {
        Some(store) => crate::config::establish(store.as_ref(), &first_stored(geo).config)
            .map_err(|e| TxError::Usage(e.to_string()))?,
        None => first_stored(geo),
    };
    run_leases_sim_from(geo, seed, model, run, current)
}

/// As [`run_leases_sim`], every machine starting in `current` whatever
/// the store holds (tests of a store that fails).
pub fn run_leases_sim_from(
    geo: Geometry,
    seed: u64,
    model: SimModel,
    run: &LeaseSim,
    current: Stored,
) -> Result<LeaseRun, TxError> {
    let LeaseSim {
        timing,
        ref faults,
        ref rogue,
        until_ns,
        ref store,
    } = *run;
    timing.check()?;
    geo.check()?;
    let host = geo
        .host_bytes()
        .ok_or_else(|| TxError::Usage("layout overflows".into()))?;
    let transport_timeout_ns = model.transport_timeout_ns;
    let mut w = sim_world(geo, seed, model, host)?;
    let reports: Arc<Mutex<Vec<LeaseReport>>> = Arc::default();
    let memberships: Vec<Arc<Membership>> = (0..geo.machines)
        .map(|me| Membership::new(me, current.clone()))
        .collect();
    for me in 0..geo.machines {
        let ls = crate::lease::leases_of(geo, me, timing, &memberships[me as usize]);
        let th = w.add_thread(me, lease_core_config(ls.len())).map_err(sim)?;
        for lease in ls {
            let reports = reports.clone();
            w.spawn(th, move |ctx| async move {
                let stop = || ctx.now_ns() >= until_ns;
                run_lease(&ctx, lease, &stop, &reports).await;
            })
            .map_err(sim)?;
        }
    }
    if !rogue.is_empty() {
        let th = w
            .add_thread(geo.machines - 1, lease_core_config(1))
            .map_err(sim)?;
        let rogue = rogue.clone();
        w.spawn(th, move |ctx| async move {
            for r in rogue {
                if let Ok(s) = ctx.sleep_until(r.at_ns.max(ctx.now_ns())) {
                    s.await;
                }
                let at = nicdrv::GlobalAddr::new(r.machine, Space::Host, r.off);
                let mut b = ctx.batch();
                b.write_u64(at, r.word);
                // A rogue's failure is nobody's business.
                let _ = b.submit().await;
            }
        })
        .map_err(sim)?;
    }
    let events: Arc<Mutex<Vec<MachineEvents>>> = Arc::default();
    if let Some(store) = store {
        for me in 0..geo.machines {
            let r = crate::reconfig::Reconfig {
                geo,
                timing,
                store: store.clone(),
                membership: memberships[me as usize].clone(),
                machine: None,
            };
            let th = w.add_thread(me, lease_core_config(1)).map_err(sim)?;
            let events = events.clone();
            w.spawn(th, move |ctx| async move {
                let stop = || ctx.now_ns() >= until_ns;
                let out = r.run(&ctx, &stop).await;
                events.lock().expect("no panics hold it").push((me, out));
            })
            .map_err(sim)?;
        }
    }
    debug_assert_eq!(
        w.threads(),
        lease_sim_threads(geo.machines, !rogue.is_empty(), store.is_some()),
        "sim_threads says the layout"
    );
    w.add_faults(faults).map_err(sim)?;
    // Crashed machines' tasks never end: run past the stop by a lease and
    // the transport timeout, then take what ended.
    let end = until_ns + timing.lease_ns + 2 * transport_timeout_ns;
    if let RunEnd::Limit = w.run_until(end) {
        return Err(TxError::Protocol(format!(
            "seed {seed}: lease tasks still running at {} ns",
            w.now_ns()
        )));
    }
    let mut leases = std::mem::take(&mut *reports.lock().expect("no panics hold it"));
    leases.sort_by_key(|l| (l.machine, l.peer));
    let mut reconfig = std::mem::take(&mut *events.lock().expect("no panics hold it"));
    reconfig.sort_by_key(|e| e.0);
    Ok(LeaseRun {
        leases,
        suspicions: memberships.iter().flat_map(|m| m.suspicions()).collect(),
        configs: memberships
            .iter()
            .map(|m| (m.me, m.epoch(), m.is_removed()))
            .collect(),
        reconfig,
    })
}

type MachineEventsOf = Result<Vec<crate::reconfig::Event>, TxError>;

/// What one machine's failure handling did in [`run_machine_leases`].
#[derive(Debug)]
pub struct MachineLeases {
    pub leases: Vec<LeaseReport>,
    pub events: Result<Vec<crate::reconfig::Event>, TxError>,
    /// The configuration it ended in, and whether it learnt it was removed.
    pub config: Stored,
    pub removed: bool,
    pub suspicions: Vec<Suspicion>,
    /// The executor clock when the run began (events' times are on it).
    pub start_ns: u64,
}

/// One machine of a cluster whose other machines run elsewhere: its lease
/// core and its reconfiguration core on OS threads, for `run_ns` of the
/// executor clock, in configuration `current` of `store`. Failure
/// detection and reconfiguration alone, with no workload ([`run_machine`]
/// runs one, with the whole failure handling).
pub fn run_machine_leases<N: Nic>(
    geo: Geometry,
    machine: u16,
    timing: LeaseConfig,
    store: Arc<dyn crate::config::ConfigStore>,
    current: Stored,
    executor: impl ExecutorFactory<N>,
    run_ns: u64,
) -> Result<MachineLeases, TxError> {
    timing.check()?;
    geo.check()?;
    if !current.config.contains(machine) {
        return Err(TxError::Usage(format!(
            "machine {machine} is not in configuration {}",
            current.config.id
        )));
    }
    let membership = Membership::new(machine, current);
    let start_ns = nicdrv::clock::now_ns();
    let until = start_ns + run_ns;
    let leases: Arc<Mutex<Vec<LeaseReport>>> = Arc::default();
    let events: Arc<Mutex<Option<MachineEventsOf>>> = Arc::default();
    let executor = &executor;
    let failed = std::thread::scope(|s| {
        let ls = crate::lease::leases_of(geo, machine, timing, &membership);
        let n = ls.len();
        let leases = leases.clone();
        let lease_core = s.spawn(move || -> Result<(), String> {
            let mut ex = executor(machine, lease_core_config(n))?;
            for lease in ls {
                let leases = leases.clone();
                ex.spawn(move |ctx| async move {
                    let stop = || ctx.now_ns() >= until;
                    run_lease(&ctx, lease, &stop, &leases).await;
                })
                .map_err(|e| e.to_string())?;
            }
            ex.run();
            Ok(())
        });
        let r = crate::reconfig::Reconfig {
            geo,
            timing,
            store,
            membership: membership.clone(),
            machine: None,
        };
        let events = events.clone();
        let reconfig_core = s.spawn(move || -> Result<(), String> {
            let mut ex = executor(machine, lease_core_config(1))?;
            ex.spawn(move |ctx| async move {
                let stop = || ctx.now_ns() >= until;
                let out = r.run(&ctx, &stop).await;
                *events.lock().expect("no panics hold it") = Some(out);
            })
            .map_err(|e| e.to_string())?;
            ex.run();
            Ok(())
        });
        [lease_core.join(), reconfig_core.join()]
            .into_iter()
            .find_map(|j| match j {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e),
                Err(_) => Some("a core panicked".to_string()),
            })
    });
    if let Some(e) = failed {
        return Err(TxError::Usage(format!("starting a core: {e}")));
    }
    let mut leases = std::mem::take(&mut *leases.lock().expect("no panics hold it"));
    leases.sort_by_key(|l| l.peer);
    let events = events.lock().expect("no panics hold it").take();
    Ok(MachineLeases {
        leases,
        events: events.unwrap_or_else(|| {
            Err(TxError::Protocol(
                "the reconfiguration task did not end".into(),
            ))
        }),
        config: membership.current(),
        removed: membership.is_removed(),
        suspicions: membership.suspicions(),
        start_ns,
    })
}
