//! The `sim` backend: a deterministic discrete-event simulation of a whole
//! cluster in one thread.
//!
//! A [`World`] holds memory nodes (host and device memory), compute nodes
//! with threads, a virtual nanosecond clock, an event queue ordered by
//! (time, sequence) and one seeded RNG that makes every random choice. Each
//! compute thread runs an ordinary [`Executor`] over a [`SimNic`], so the
//! very futures that run on the emu backend run here in virtual time.
//!
//! What is modelled ([`SimModel`] has each figure and its source): link
//! latency; per-NIC bandwidth and inbound message rate; a PCIe read at the
//! memory node for host-memory READs; a NIC atomic unit per memory node that
//! serializes atomics per slot, host-memory atomics costing more than
//! device-memory ones; CPU time per doorbell, per polled completion and per
//! task step on each compute thread (a thread's tasks share its CPU); and
//! READs and WRITEs applied 64-byte line by line at random instants over the
//! transfer, so concurrent READs return torn mixes. Requests on one queue
//! pair touch memory in posting order and their answers arrive in order.
//!
//! Faults ([`Fault`]): memory-node and compute-node crashes, link cuts and
//! heals, latency spikes, thread stalls. Requests that get no answer
//! complete `RetryExceeded` after the transport timeout.
//!
//! Determinism: the same [`SimConfig`] (seed included) and the same tasks
//! give the same run, event for event; [`World::trace_hash`] hashes every
//! event's time and identity. [`for_each_seed`] sweeps seeds and prints the
//! one-line replay command of a failing seed.

mod fault;
mod model;
mod nic;
mod state;

pub use fault::{parse_duration_ns, parse_fault, Fault, FaultKind, FAULT_SYNTAX, MAX_TIME_NS};
pub use model::SimModel;
pub use nic::{SimCq, SimNic, SimQp, SimReg, SIM_CAPS};

use crate::addr::{NodeId, Space};
use crate::exec::{Ctx, ExecError, Executor, ExecutorConfig};
use crate::nic::{HeapMem, Nic, QpState, RemoteRegion};
use crate::verbs::Access;
use state::{CqSim, Ev, MemNode, QpSim, SimCluster, ThreadState, NO_THREAD};
use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::rc::Rc;

/// The shape of a simulated cluster.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub seed: u64,
    pub memory_nodes: usize,
    /// Host memory per memory node.
    pub host_bytes: u64,
    /// Device memory per memory node (real NICs: 64–256 KiB).
    pub dm_bytes: u64,
    pub compute_nodes: usize,
    /// Machines: the first `machines` node numbers are each a memory node
    /// and a compute node in one failure domain (compute node i and memory
    /// node i), whose threads reach their own memory through the local
    /// view; the memory nodes above are memory-only, the compute nodes
    /// above compute-only. 0 (the default): none.
    pub machines: usize,
    pub model: SimModel,
    pub faults: Vec<Fault>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            seed: 1,
            memory_nodes: 2,
            host_bytes: 16 << 20,
            dm_bytes: 256 << 10,
            compute_nodes: 1,
            machines: 0,
            model: SimModel::default(),
            faults: Vec::new(),
        }
    }
}

/// Why a world could not be built or used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SimError {
    /// The configuration cannot describe a cluster (the text says why).
    Config(String),
    Executor(ExecError),
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimError::Config(s) => write!(f, "invalid simulation: {s}"),
            SimError::Executor(e) => write!(f, "simulated thread: {e}"),
        }
    }
}

impl std::error::Error for SimError {}

/// How a run ended.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum RunEnd {
    /// Every task finished.
    Done,
    /// Nothing is left to happen, yet tasks remain (they wait forever).
    Stalled,
    /// The time limit was reached.
    Limit,
}

impl SimConfig {
    pub fn check(&self) -> Result<(), SimError> {
        let bad = |s: String| Err(SimError::Config(s));
        if self.memory_nodes == 0 || self.memory_nodes > NodeId::MAX as usize {
            return bad(format!(
                "memory_nodes must be 1..=65535, got {}",
                self.memory_nodes
            ));
        }
        if self.compute_nodes == 0 || self.compute_nodes > u16::MAX as usize {
            return bad(format!(
                "compute_nodes must be 1..=65535, got {}",
                self.compute_nodes
            ));
        }
        if self.host_bytes == 0 || !self.host_bytes.is_multiple_of(8) || self.host_bytes > (1 << 40)
        {
            return bad(format!(
                "host_bytes must be a positive multiple of 8 up to 1 TiB, got {}",
                self.host_bytes
            ));
        }
        if !self.dm_bytes.is_multiple_of(8) || self.dm_bytes > (1 << 30) {
            return bad(format!(
                "dm_bytes must be a multiple of 8 up to 1 GiB, got {}",
                self.dm_bytes
            ));
        }
        if self.machines > self.memory_nodes.min(self.compute_nodes) {
            return bad(format!(
                "machines ({}) must not exceed the memory nodes ({}) or the compute nodes ({})",
                self.machines, self.memory_nodes, self.compute_nodes
            ));
        }
        self.model.check().map_err(SimError::Config)?;
        for f in &self.faults {
            f.check_machines(self.memory_nodes, self.compute_nodes, self.machines)
                .map_err(SimError::Config)?;
        }
        Ok(())
    }
}

/// `bytes` of zeroed memory, as `vec![0; bytes]` gives it (zeroed pages
/// the kernel maps as they are touched), but a size the host cannot give
/// is an error rather than an abort: a simulated memory node's size comes
/// from the user's flags.
fn zeroed(bytes: usize) -> Result<Vec<u8>, SimError> {
    let too_big = || {
        SimError::Config(format!(
            "this host cannot give a simulated memory node {} MiB",
            bytes >> 20
        ))
    };
    if bytes == 0 {
        return Ok(Vec::new());
    }
    let layout = std::alloc::Layout::array::<u8>(bytes).map_err(|_| too_big())?;
    // SAFETY: the layout's size is not zero (checked above).
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    if p.is_null() {
        return Err(too_big());
    }
    // SAFETY: `p` was allocated by the global allocator with the layout
    // of `[u8; bytes]`, which is what a Vec<u8> of capacity `bytes`
    // deallocates with; its `bytes` bytes are initialized (zeroed); the
    // Vec owns it from here.
    Ok(unsafe { Vec::from_raw_parts(p, bytes, bytes) })
}

/// A simulated cluster.
pub struct World {
    shared: Rc<SimCluster>,
    execs: Vec<Option<Executor<SimNic>>>,
    live: usize,
    wall: std::time::Instant,
}

impl World {
    pub fn new(cfg: SimConfig) -> Result<World, SimError> {
        cfg.check()?;
        let mut mems = Vec::with_capacity(cfg.memory_nodes);
        for _ in 0..cfg.memory_nodes {
            mems.push(MemNode {
                host: zeroed(cfg.host_bytes as usize)?,
                dm: zeroed(cfg.dm_bytes as usize)?,
                regions: Vec::new(),
                crashed: false,
                nic_free: 0,
                tx_free: 0,
                atomic_free: 0,
                slot_free: vec![0; 2 * cfg.model.atomic_slots as usize],
                atomics_in_flight: Default::default(),
            });
        }
        let shared = Rc::new(SimCluster::new(
            cfg.model.clone(),
            cfg.seed,
            mems,
            cfg.compute_nodes,
            cfg.machines,
            cfg.faults.clone(),
        ));
        {
            // Each memory node registers all its memory at boot.
            let keys: Vec<_> = (0..cfg.memory_nodes)
                .map(|_| (shared.new_key(), shared.new_key()))
                .collect();
            let mut mems = shared.mem.borrow_mut();
            for (m, (hk, dk)) in mems.iter_mut().zip(keys) {
                m.regions.push(RemoteRegion {
                    space: Space::Host,
                    offset: 0,
                    len: cfg.host_bytes,
                    rkey: hk,
                    access: Access::REMOTE_ALL,
                });
                if cfg.dm_bytes > 0 {
                    m.regions.push(RemoteRegion {
                        space: Space::Device,
                        offset: 0,
                        len: cfg.dm_bytes,
                        rkey: dk,
                        access: Access::REMOTE_ALL,
                    });
                }
            }
        }
        for (i, f) in cfg.faults.iter().enumerate() {
            shared.schedule(f.at_ns, Ev::Fault(i as u32));
        }
        Ok(World {
            shared,
            execs: Vec::new(),
            live: 0,
            wall: std::time::Instant::now(),
        })
    }

    pub fn memory_nodes(&self) -> usize {
        self.shared.memory_nodes
    }

    pub fn compute_nodes(&self) -> usize {
        self.shared.cn.borrow().len()
    }

    /// Machines (node numbers below this are memory and compute node both).
    pub fn machines(&self) -> usize {
        self.shared.machines
    }

    pub fn model(&self) -> &SimModel {
        &self.shared.model
    }

    /// Virtual time now.
    pub fn now_ns(&self) -> u64 {
        self.shared.now.get()
    }

    /// Hash of every event so far (time and identity).
    pub fn trace_hash(&self) -> u64 {
        self.shared.stats.get().trace
    }

    /// Events processed so far.
    pub fn events(&self) -> u64 {
        self.shared.stats.get().events
    }

    /// Work requests posted so far.
    pub fn verbs(&self) -> u64 {
        self.shared.stats.get().verbs
    }

    /// Wall-clock seconds since the world was made.
    pub fn wall_secs(&self) -> f64 {
        self.wall.elapsed().as_secs_f64()
    }

    fn new_cq(&self, thread: u32) -> u32 {
        let mut cqs = self.shared.cqs.borrow_mut();
        cqs.push(CqSim {
            entries: VecDeque::new(),
            thread,
        });
        (cqs.len() - 1) as u32
    }

    fn new_qp(&self, thread: u32, cq: u32, cn: u16, mn: NodeId, depth: u32) -> SimQp {
        let mut qps = self.shared.qps.borrow_mut();
        qps.push(QpSim {
            cq,
            cn,
            mn,
            life: QpState::Ready,
            depth,
            outstanding: 0,
            pending_retire: 0,
            inflight: VecDeque::new(),
            resp_error: false,
            resp_last_end: 0,
            last_deliver: 0,
            last_arrive: 0,
            next_psn: 0,
            resp_psn: 0,
        });
        let regions = self.shared.mem.borrow()[mn as usize].regions.clone();
        SimQp {
            shared: self.shared.clone(),
            idx: (qps.len() - 1) as u32,
            thread,
            peer: mn,
            regions,
        }
    }

    /// Adds a compute thread on `compute_node` with its own executor, queue
    /// pairs to every memory node and registered scratch. Returns its id.
    pub fn add_thread(&mut self, compute_node: u16, cfg: ExecutorConfig) -> Result<u32, SimError> {
        if compute_node as usize >= self.compute_nodes() {
            return Err(SimError::Config(format!("no compute node {compute_node}")));
        }
        cfg.check().map_err(SimError::Executor)?;
        let t = self.execs.len() as u32;
        let cq = self.new_cq(t);
        self.shared.threads.borrow_mut().push(ThreadState {
            node: compute_node,
            clock: self.now_ns(),
            cpu_free: self.now_ns(),
            scheduled: false,
            halted: false,
            cq,
            timer_at: u64::MAX,
        });
        let nic = SimNic {
            shared: self.shared.clone(),
            thread: t,
        };
        let qps = (0..self.memory_nodes())
            .map(|m| self.new_qp(t, cq, compute_node, m as NodeId, cfg.qp_depth()))
            .collect();
        let mem = HeapMem::zeroed(cfg.scratch_bytes())
            .ok_or_else(|| SimError::Config("cannot allocate scratch".into()))?;
        let mr = nic
            .register(mem, Access::LOCAL_WRITE)
            .map_err(|e| SimError::Config(e.to_string()))?;
        let ex = Executor::new(
            nic,
            SimCq {
                shared: self.shared.clone(),
                idx: cq,
            },
            qps,
            mr,
            cfg,
        )
        .map_err(SimError::Executor)?;
        self.execs.push(Some(ex));
        Ok(t)
    }

    /// Threads made so far.
    pub fn threads(&self) -> usize {
        self.execs.len()
    }

    /// Starts a task on `thread`.
    pub fn spawn<F, Fut>(&mut self, thread: u32, f: F) -> Result<usize, SimError>
    where
        F: FnOnce(Ctx<SimNic>) -> Fut,
        Fut: Future<Output = ()> + 'static,
    {
        let ex = self
            .execs
            .get_mut(thread as usize)
            .and_then(|e| e.as_mut())
            .ok_or_else(|| SimError::Config(format!("no thread {thread}")))?;
        let slot = ex.spawn(f).map_err(SimError::Executor)?;
        self.live += 1;
        self.shared.wake(thread);
        Ok(slot)
    }

    /// Tasks not yet finished, over all threads.
    pub fn live_tasks(&self) -> usize {
        self.live
    }

    /// A thread's executor (for its counters).
    pub fn executor(&self, thread: u32) -> Option<&Executor<SimNic>> {
        self.execs.get(thread as usize).and_then(|e| e.as_ref())
    }

    /// Processes one event at or before `limit_ns`; false if there is none.
    pub fn step_until(&mut self, limit_ns: u64) -> bool {
        let Some(e) = self.shared.pop(limit_ns) else {
            return false;
        };
        match e.ev {
            Ev::Turn(t) => self.turn(t),
            Ev::Arrive(r, g) => self.shared.on_arrive(r, g),
            Ev::Access(r, g, l) => self.shared.on_access(r, g, l),
            Ev::Deliver(r, g) => self.shared.on_deliver(r, g),
            Ev::Timeout(r, g) => self.shared.on_timeout(r, g),
            Ev::Fault(i) => self.shared.on_fault(i),
            Ev::Timer(t) => self.shared.on_timer(t),
        }
        true
    }

    /// Processes one event; false if nothing is left to happen.
    pub fn step(&mut self) -> bool {
        self.step_until(u64::MAX)
    }

    fn turn(&mut self, t: u32) {
        let now = self.now_ns();
        {
            let mut th = self.shared.threads.borrow_mut();
            let ts = &mut th[t as usize];
            ts.scheduled = false;
            if ts.halted || self.shared.cn.borrow()[ts.node as usize].crashed {
                return;
            }
            if ts.cpu_free > now {
                // Stalled or still busy: come back when the CPU is free.
                ts.scheduled = true;
                let at = ts.cpu_free;
                drop(th);
                self.shared.schedule(at, Ev::Turn(t));
                return;
            }
            ts.clock = now;
        }
        let Some(ex) = self.execs[t as usize].as_mut() else {
            return;
        };
        let before = ex.live_tasks();
        ex.turn();
        let again = ex.has_ready();
        let after = ex.live_tasks();
        self.live -= before - after;
        {
            let mut th = self.shared.threads.borrow_mut();
            let ts = &mut th[t as usize];
            ts.cpu_free = ts.clock;
        }
        // Another turn only if a task is runnable or completions remain;
        // otherwise the thread sleeps until a completion wakes it.
        let cq = self.shared.thread_cq(t);
        if again || !self.shared.cqs.borrow()[cq as usize].entries.is_empty() {
            self.shared.wake(t);
        }
    }

    /// Runs until every task has finished, nothing is left to happen, or
    /// virtual time passes `limit_ns`. On `Limit` the clock stays at the last
    /// event run (so a run's end time is never rounded up to a limit): a
    /// driver that runs in slices moves its own limit, not `now + slice`.
    pub fn run_until(&mut self, limit_ns: u64) -> RunEnd {
        while self.live > 0 {
            if !self.step_until(limit_ns) {
                return if self.shared.events.borrow().is_empty() {
                    RunEnd::Stalled
                } else {
                    RunEnd::Limit
                };
            }
        }
        RunEnd::Done
    }

    /// Runs until every task has finished or nothing is left to happen.
    pub fn run(&mut self) -> RunEnd {
        self.run_until(u64::MAX)
    }

    /// Runs every event up to `t_ns` (tasks or not).
    pub fn advance_to(&mut self, t_ns: u64) {
        while self.step_until(t_ns) {}
        if self.shared.now.get() < t_ns {
            self.shared.now.set(t_ns);
        }
    }

    /// Crashes machine `m` now: its memory node and its compute node at
    /// once.
    pub fn crash_machine(&mut self, m: u16) -> Result<(), SimError> {
        if m as usize >= self.machines() {
            return Err(SimError::Config(format!("no machine {m}")));
        }
        self.shared.crash_machine(m);
        Ok(())
    }

    /// Sets a memory node's memory before a run (a test's starting image,
    /// such as another run's final memory). False, and nothing written,
    /// for a node or range that does not exist.
    pub fn write_memory(&mut self, node: NodeId, space: Space, off: u64, data: &[u8]) -> bool {
        let mut mems = self.shared.mem.borrow_mut();
        let Some(m) = mems.get_mut(node as usize) else {
            return false;
        };
        let mem = m.mem_mut(space);
        let Some(end) = (off as usize)
            .checked_add(data.len())
            .filter(|&e| e <= mem.len())
        else {
            return false;
        };
        mem[off as usize..end].copy_from_slice(data);
        true
    }

    /// The memory node's own CPU reading its memory (for checks).
    pub fn read_memory(&self, node: NodeId, space: Space, off: u64, buf: &mut [u8]) -> bool {
        let mems = self.shared.mem.borrow();
        let Some(m) = mems.get(node as usize) else {
            return false;
        };
        let mem = m.mem(space);
        let end = off as usize + buf.len();
        if end > mem.len() {
            return false;
        }
        buf.copy_from_slice(&mem[off as usize..end]);
        true
    }

    pub fn read_u64(&self, node: NodeId, space: Space, off: u64) -> Option<u64> {
        let mut b = [0u8; 8];
        self.read_memory(node, space, off, &mut b)
            .then(|| u64::from_le_bytes(b))
    }

    /// Adds faults to the plan while the world runs; their `at_ns` are
    /// absolute virtual times, none before now. Checked as
    /// [`SimConfig::faults`] are, and a thread stall against the threads
    /// made so far.
    pub fn add_faults(&mut self, faults: &[Fault]) -> Result<(), SimError> {
        let now = self.now_ns();
        for f in faults {
            f.check_machines(self.memory_nodes(), self.compute_nodes(), self.machines())
                .and_then(|()| f.check_threads(self.threads()))
                .map_err(SimError::Config)?;
            if f.at_ns < now {
                return Err(SimError::Config(format!(
                    "fault {f} is in the past (now {now} ns)"
                )));
            }
        }
        for f in faults {
            let i = {
                let mut all = self.shared.faults.borrow_mut();
                all.push(*f);
                all.len() - 1
            };
            self.shared.schedule(f.at_ns, Ev::Fault(i as u32));
        }
        Ok(())
    }

    /// Every fault of the plan: those given at the start, those added
    /// since, and those a task injected ([`SimNic::inject`]).
    pub fn faults(&self) -> Vec<Fault> {
        self.shared.faults.borrow().clone()
    }

    /// Stops a thread for good: it runs no more turns, as if its compute
    /// node had crashed, but the node and its other threads go on. For
    /// drivers that give up on tasks stuck for ever (spinning on a lock a
    /// crashed node held) before running something else in the same world.
    pub fn halt_thread(&mut self, thread: u32) {
        if let Some(t) = self.shared.threads.borrow_mut().get_mut(thread as usize) {
            t.halted = true;
        }
    }

    /// Crashes a memory node now.
    pub fn crash_memory_node(&mut self, node: NodeId) -> Result<(), SimError> {
        if node as usize >= self.memory_nodes() {
            return Err(SimError::Config(format!("no memory node {node}")));
        }
        self.shared.crash_memory(node);
        Ok(())
    }

    /// A queue pair of `depth` from `compute_node` to `memory_node` on its own
    /// completion queue, outside any executor, and a device handle to
    /// register local memory with: for tests that speak verbs directly
    /// (poll the queue with [`World::step`] in between).
    pub fn raw_qp(
        &mut self,
        compute_node: u16,
        memory_node: NodeId,
        depth: u32,
    ) -> Result<(SimNic, SimCq, SimQp), SimError> {
        if compute_node as usize >= self.compute_nodes()
            || memory_node as usize >= self.memory_nodes()
        {
            return Err(SimError::Config("raw_qp: no such node".into()));
        }
        let cq = self.new_cq(NO_THREAD);
        let qp = self.new_qp(NO_THREAD, cq, compute_node, memory_node, depth);
        Ok((
            SimNic {
                shared: self.shared.clone(),
                thread: NO_THREAD,
            },
            SimCq {
                shared: self.shared.clone(),
                idx: cq,
            },
            qp,
        ))
    }
}

impl Drop for World {
    fn drop(&mut self) {
        // Nothing more will run: requests in flight never touch local
        // memory again, so executors may go without draining.
        self.shared.events.borrow_mut().clear();
        self.execs.clear();
    }
}

/// The seeds a simulated test runs: `LOCH_SIM_SEED=N` replays one seed,
/// `LOCH_SIM_SEEDS=N` sweeps `0..N`, otherwise `0..default`.
pub fn seeds(default: u64) -> Vec<u64> {
    if let Some(s) = std::env::var("LOCH_SIM_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return vec![s];
    }
    let n = std::env::var("LOCH_SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    (0..n).collect()
}

/// Runs `f` for every seed of [`seeds`]; when one fails, prints the seed
/// and the one-line command that replays it, then fails.
pub fn for_each_seed(test: &str, default: u64, f: impl Fn(u64)) {
    for seed in seeds(default) {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(seed)));
        if let Err(e) = r {
            eprintln!(
                "simulated test `{test}` failed with seed {seed}; replay with:\n  LOCH_SIM_SEED={seed} cargo test --release --workspace {test} -- --nocapture"
            );
            std::panic::resume_unwind(e);
        }
    }
}
