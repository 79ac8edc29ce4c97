//! Running a [`RunSpec`] on a cluster: the load phases and the measured
//! clients as cluster workloads, on the sim backend (virtual time, faults)
//! or the emu backend (wall clock, pinned cores).

use super::*;

pub(crate) fn exec_cfg(spec: &RunSpec) -> ExecutorConfig {
    // 64 KiB, or what a tree operation on larger nodes may need.
    let op = spec.layout().op_scratch_bytes();
    ExecutorConfig {
        slots: spec.coroutines,
        scratch_bytes_per_slot: op.max(64 << 10),
        poll_batch: 32,
    }
}

pub fn measure(spec: &RunSpec) -> Result<Report, Failed> {
    measure_across(spec, Arc::new(Across::new(spec)))
}

/// [`measure`], its clients sharing `across` (which a test may look into).
pub(crate) fn measure_across(spec: &RunSpec, across: Arc<Across>) -> Result<Report, Failed> {
    match spec.backend {
        Backend::Sim => measure_sim(spec, across),
        Backend::Emu | Backend::Mlx5 => measure_threads(spec, across),
    }
}

pub(crate) fn finish(
    sh: &ClientTally,
    clients: u64,
    elapsed_ns: u64,
    wall_sec: f64,
    sim_events: u64,
) -> Result<Report, Failed> {
    if let Some(e) = sh.failure.borrow_mut().take() {
        return Err(Failed {
            why: format!("an operation failed: {e}"),
            history: sh.take_history(),
        });
    }
    let kinds = std::mem::take(&mut *sh.kinds.borrow_mut());
    let ops = kinds.iter().map(|k| k.count).sum();
    let mut all_latency = latency_histogram();
    for k in &kinds {
        all_latency
            .add(&k.latency)
            .map_err(|e| format!("merging latency histograms: {e:?}"))?;
    }
    Ok(Report {
        kinds,
        all_latency,
        elapsed_ns,
        tree: *sh.tree.borrow(),
        ops,
        wall_sec,
        sim_events,
        history: sh.take_history(),
        unfinished_clients: clients.saturating_sub(sh.finished.get()),
    })
}

/// The loaders of one load phase: `parts` of them, `per_core` to a core.
pub(crate) struct LoadWork {
    pub(crate) index: IndexHandle,
    pub(crate) records: u64,
    pub(crate) parts: usize,
    pub(crate) per_core: usize,
    pub(crate) loaded: Arc<AtomicU64>,
}

impl Workload for LoadWork {
    /// The first loader's error.
    type Group = Rc<RefCell<Option<String>>>;
    type Out = Option<String>;

    fn group(&self, _: usize, _: usize) -> Self::Group {
        Rc::new(RefCell::new(None))
    }

    fn spawn<N: Nic, S: Spawn<N>>(
        &self,
        place: Place,
        err: &Self::Group,
        on: &mut S,
    ) -> Result<(), String> {
        let first = place.core * self.per_core;
        for part in first..(first + self.per_core).min(self.parts) {
            let (h, e, n, parts) = (self.index.clone(), err.clone(), self.records, self.parts);
            let l = self.loaded.clone();
            on.spawn_task(move |ctx| load_part(ctx, h, n, part, parts, e, l))?;
        }
        Ok(())
    }

    fn finish(&self, err: Self::Group, _: VerbCounters) -> Option<String> {
        err.borrow_mut().take()
    }
}

/// The load phases of an index: the tree is created and bulk-loaded by one
/// client; the hash table is created by one, then filled by
/// `CUCKOO_LOADERS` in parallel.
pub(crate) fn load_phases(spec: &RunSpec) -> Vec<usize> {
    if spec.cuckoo {
        vec![1, CUCKOO_LOADERS]
    } else {
        vec![1]
    }
}

/// The measured clients: `coroutines` per core, numbered from 1 across
/// the run; core `c` runs on compute node `c / threads` with that node's
/// index handle.
pub(crate) struct ClientWork<'a> {
    pub(crate) spec: &'a RunSpec,
    /// One handle per compute node.
    pub(crate) indexes: &'a [IndexHandle],
    pub(crate) dist: KeyDist,
    /// What every group's clients share.
    pub(crate) across: Arc<Across>,
}

impl<'a> ClientWork<'a> {
    pub(crate) fn new(
        spec: &'a RunSpec,
        indexes: &'a [IndexHandle],
        across: Arc<Across>,
    ) -> ClientWork<'a> {
        ClientWork {
            spec,
            indexes,
            dist: KeyDist::new(spec.records, spec.zipf),
            across,
        }
    }
}

impl Workload for ClientWork<'_> {
    type Group = (Rc<ClientTally>, Rc<RunSpec>, Rc<KeyDist>);
    type Out = Result<Report, Failed>;

    fn group(&self, index: usize, groups: usize) -> Self::Group {
        let sh = ClientTally::new(self.spec, self.across.clone(), groups as u64, index as u64);
        (sh, Rc::new(self.spec.clone()), Rc::new(self.dist.clone()))
    }

    fn spawn<N: Nic, S: Spawn<N>>(
        &self,
        place: Place,
        (sh, spec, dist): &Self::Group,
        on: &mut S,
    ) -> Result<(), String> {
        let index = &self.indexes[place.compute_node];
        // A core of the other half runs the other mix.
        let spec = match &spec.half_mix {
            Some(half) if place.core % 2 == 1 => Rc::new(RunSpec {
                mix: half.clone(),
                half_mix: None,
                ..(**spec).clone()
            }),
            _ => spec.clone(),
        };
        for co in 0..spec.coroutines {
            let id = 1 + (place.core * spec.coroutines + co) as u64;
            let c = index.client(id).map_err(|e| e.to_string())?;
            let (s, d, h) = (spec.clone(), dist.clone(), sh.clone());
            on.spawn_task(move |ctx| client_task(ctx, c, s, d, id, h))?;
        }
        Ok(())
    }

    /// An emu core's report (sim reports from the whole world instead).
    fn finish(&self, (sh, ..): Self::Group, _: VerbCounters) -> Self::Out {
        // The executor's clock on emu is nicdrv::clock, as is this.
        let end = nicdrv::clock::now_ns();
        finish(&sh, self.spec.coroutines as u64, end, 0.0, 0)
    }
}

fn measure_sim(spec: &RunSpec, across: Arc<Across>) -> Result<Report, Failed> {
    let mut w = World::new(SimConfig {
        seed: spec.seed,
        memory_nodes: spec.memory_nodes,
        compute_nodes: spec.compute_nodes,
        host_bytes: spec.host_bytes,
        dm_bytes: DM_BYTES,
        model: spec.model.clone(),
        ..Default::default()
    })
    .map_err(|e| e.to_string())?;
    let trees = handles(spec, DM_BYTES)?;
    load_sim(&mut w, spec, &trees)?;
    // Fault times count from here, the start of the workload.
    let start = w.now_ns();
    let clients = ClientWork::new(spec, &trees, across);
    let cores = spec.threads * trees.len();
    let spawned = simrun::spawn(
        &mut w,
        &clients,
        cores,
        exec_cfg(spec),
        Placement::Blocks(spec.threads),
    )?;
    let sh = &spawned.group.0;
    // Client threads are numbered after the loaders' in the world.
    let first_client_thread = spawned.threads.start;
    let faults = client_faults(spec, start, first_client_thread);
    w.add_faults(&faults).map_err(|e| e.to_string())?;
    let wall = std::time::Instant::now();
    let mut last_print = 0.0;
    // Under faults some clients may never finish (stuck behind a lock a
    // crashed node held, or on a crashed node): the run ends once no
    // operation has ended for FAULT_QUIET_NS of virtual time.
    let mut quiet_since = (w.now_ns(), sh.last_done_ns.get());
    let last_fault_ns = faults.iter().map(|f| f.at_ns).max().unwrap_or(0);
    // A stop request ends the world at the slice's end, its operations in
    // flight pending: the clients look at it only between operations, and
    // with thousands spinning on hot locks (FG+ at --coroutines 64) an
    // operation took minutes of wall time to end.
    let mut stopped = false;
    // Slices of virtual time, so a long run can report progress.
    let end = simrun::run_slices(&mut w, 1_000_000, |w, until| {
        if cmdline::signals::stop_requested() {
            stopped = true;
            return Flow::Stop;
        }
        if !faults.is_empty() {
            let last = sh.last_done_ns.get();
            if last != quiet_since.1 || last_fault_ns > until {
                quiet_since = (until, last);
            } else if until - quiet_since.0 >= FAULT_QUIET_NS {
                return Flow::Stop;
            }
        }
        let t = wall.elapsed().as_secs_f64();
        if t - last_print >= 2.0 {
            last_print = t;
            let done: u64 = sh.kinds.borrow().iter().map(|k| k.count).sum();
            let target = match spec.length {
                // `done` counts measured operations only: warm-ups are not
                // in the target either.
                Length::Ops(n) => format!("~{} measured ops", n * spec.clients()),
                Length::Nanos(d) => format!("{:.1} measured virtual ms", d as f64 / 1e6),
            };
            cmdline::errln!(
                "loch-bench run: {} at {:.1} virtual ms, {} measured ops (of {}), {:.0} s wall",
                spec.system,
                w.now_ns() as f64 / 1e6,
                done,
                target,
                t
            );
        }
        Flow::Go
    });
    let wall_sec = wall.elapsed().as_secs_f64();
    let stuck_ends = faults.is_empty() && !stopped;
    if end != RunEnd::Done && sh.failure.borrow().is_none() && stuck_ends {
        return Err(Failed {
            why: format!("the simulation ended {end:?} with clients unfinished"),
            // The stuck clients' operations stay pending in it.
            history: sh.take_history(),
        });
    }
    // Under faults the measured interval ends with the last operation that
    // ended, not with the quiet time the run waited out (a stopped run's
    // ends at the stop).
    let now = if faults.is_empty() {
        w.now_ns()
    } else {
        sh.last_done_ns.get()
    };
    let elapsed = now.saturating_sub(clients.across.from.load(Ordering::Relaxed).min(now));
    let events = w.events();
    finish(sh, spec.clients(), elapsed, wall_sec, events)
}

/// Creates and loads the index on compute node 0 of `w`, up to 8 loaders
/// to a simulated thread.
fn load_sim(w: &mut World, spec: &RunSpec, trees: &[IndexHandle]) -> Result<(), String> {
    let mut progress = Progress::new(format!("records loaded ({})", spec.system), spec.records);
    for parts in load_phases(spec) {
        // Up to 8 loaders to a simulated thread, all on compute node 0.
        let per_core = if parts == 1 { 1 } else { 8 };
        let load = LoadWork {
            index: trees[0].clone(),
            records: spec.records,
            parts,
            per_core,
            loaded: progress.counter(),
        };
        let cfg = ExecutorConfig {
            slots: per_core,
            ..exec_cfg(spec)
        };
        let cores = parts.div_ceil(per_core);
        let spawned = simrun::spawn(w, &load, cores, cfg, Placement::Node(0))?;
        let end = simrun::run_slices(w, 1_000_000, |_, _| {
            progress.tick();
            Flow::Go
        });
        if end != RunEnd::Done {
            return Err("loading did not finish".into());
        }
        if let Some(e) = spawned.finish(w, &load) {
            return Err(format!("loading failed: {e}"));
        }
    }
    progress.finish();
    Ok(())
}

/// The run's faults on the world's clock and threads: times from the start
/// of the workload (`start`), stalled threads counted from the first
/// client thread.
fn client_faults(spec: &RunSpec, start: u64, first_client_thread: u32) -> Vec<Fault> {
    spec.faults
        .iter()
        .map(|f| Fault {
            at_ns: start.saturating_add(f.at_ns),
            kind: match f.kind {
                FaultKind::StallThread {
                    thread,
                    duration_ns,
                } => FaultKind::StallThread {
                    thread: first_client_thread + thread,
                    duration_ns,
                },
                k => k,
            },
        })
        .collect()
}

/// How long a run with faults waits, in virtual time, with no operation
/// ending and no fault still to come, before it stops the clients left.
pub(crate) const FAULT_QUIET_NS: u64 = 20_000_000;

/// A run on threads of this host (emu, mlx5), wall clock.
fn measure_threads(spec: &RunSpec, across: Arc<Across>) -> Result<Report, Failed> {
    // The loader's core is not pinned, the clients' are.
    let backend = spec.backend.cluster(false, spec.seed, 1, &spec.device)?;
    let mut cluster = Cluster::boot(&ClusterSpec {
        memory_nodes: spec.memory_nodes,
        host_bytes: spec.host_bytes,
        dm_bytes: DM_BYTES,
        latency_ns: 0,
        machines: 0,
        backend,
    })?;
    // One compute node: this process; its cores share one index handle.
    let trees = handles(spec, cluster.dm_bytes(DM_BYTES))?;
    let mut progress = Progress::new(format!("records loaded ({})", spec.system), spec.records);
    for parts in load_phases(spec) {
        // Every loader on one core.
        let load = LoadWork {
            index: trees[0].clone(),
            records: spec.records,
            parts,
            per_core: parts,
            loaded: progress.counter(),
        };
        let cfg = ExecutorConfig {
            slots: parts,
            ..exec_cfg(spec)
        };
        let loading = AtomicBool::new(true);
        let loaded = std::thread::scope(|scope| {
            // Draws the bar while the cores load; no thread when nothing is
            // drawn, so the loaders have the machine to themselves.
            if progress.shown() {
                scope.spawn(|| {
                    // Relaxed: a stop flag for the display thread only.
                    while loading.load(Ordering::Relaxed) {
                        progress.tick();
                        std::thread::sleep(std::time::Duration::from_millis(20));
                    }
                });
            }
            let r = cluster.run_pinned(&load, 1, cfg, false);
            loading.store(false, Ordering::Relaxed);
            r
        });
        let loaded = loaded.map_err(|e| e.to_string())?;
        if let Some(Some(e)) = loaded.into_iter().next() {
            return Err(format!("loading failed: {e}").into());
        }
    }
    progress.finish();
    let wall = std::time::Instant::now();
    // Shared by the cores: the measured interval starts at the first
    // measured operation of any core, and --seconds counts from there.
    let clients = ClientWork::new(spec, &trees, across);
    let reports = cluster
        .run_pinned(&clients, spec.threads, exec_cfg(spec), true)
        .map_err(|e| e.to_string())?;
    let wall_sec = wall.elapsed().as_secs_f64();
    let (mut merged, mut failed): (Option<Report>, Option<Failed>) = (None, None);
    for r in reports {
        match r {
            Ok(r) => {
                merged = Some(match merged {
                    None => r,
                    Some(mut m) => {
                        m.absorb(r);
                        m
                    }
                })
            }
            // The first core's failure is the run's; every core's history
            // goes with it.
            Err(f) => match &mut failed {
                None => failed = Some(f),
                Some(first) => append_history(&mut first.history, f.history),
            },
        }
    }
    if let Some(mut f) = failed {
        append_history(&mut f.history, merged.and_then(|m| m.history));
        return Err(f);
    }
    let mut m = merged.ok_or("no cores ran")?;
    let start = clients.across.from.load(Ordering::Relaxed);
    m.elapsed_ns = m.elapsed_ns.saturating_sub(start.min(m.elapsed_ns));
    m.wall_sec = wall_sec;
    Ok(m)
}

/// Adds `more` to `to` (where both were recorded).
fn append_history(to: &mut Option<HistLog>, more: Option<HistLog>) {
    if let (Some(a), Some(b)) = (to.as_mut(), more) {
        a.append(b);
    }
}
