//! The workload `loch node` runs on its compute cores: tasks mixing READ,
//! WRITE and FAA over every memory node, each checking itself, and each
//! surviving the death of a memory node — operations needing it fail with
//! a clear error, the others go on.
//!
//! Memory layout on every memory node's host memory (no allocator, so a
//! dead node cannot block anyone's allocation), disjoint from what the
//! index workloads ([`crate::node_index`]) use — the superblock's words and
//! the chunks below [`Layout::areas_off`]:
//! - [`FAA_OFFSET`]: the node's shared FAA counter, bumped by every compute
//!   node; the launcher checks it against the FAAs the compute nodes
//!   report. The superblock keeps this word for it; no index uses it, and
//!   offset 0 (the null address's word on node 0) stays untouched.
//! - `areas_off + g · AREA_BYTES`: task `g`'s private words (`g` counts
//!   tasks over compute nodes in id order, then cores, then tasks), one per
//!   64-byte line; only task `g` writes there, so a READ must return what
//!   it last wrote. The areas sit at the top of the smallest memory node;
//!   the index allocators hand out chunks only below them.

use crate::stats::OpTally;
use crate::verb_mix::{self, Mix, Target};
use nicdrv::rng::Rng;
use nicdrv::{Ctx, GlobalAddr, Nic, NodeId, VerbError};
use std::cell::{Cell, RefCell};
use std::rc::Rc;

/// Words each task owns on each memory node, 64 bytes apart.
pub const TASK_WORDS: u64 = 256;
pub const AREA_BYTES: u64 = TASK_WORDS * 64;
/// The shared FAA counter's offset on every memory node.
pub const FAA_OFFSET: u64 = mempool::VERB_COUNTER_OFF;

/// Host bytes a memory node needs for `tasks` tasks in all: the superblock
/// and the areas.
pub fn host_bytes_needed(tasks: u64) -> u64 {
    mempool::SUPERBLOCK_BYTES + tasks * AREA_BYTES
}

/// Where the verb areas and the index chunks live on every memory node.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Offset of task 0's area; 4 KiB aligned, the same on every node.
    pub areas_off: u64,
    /// Host bytes below the areas, which the index allocators may use
    /// (the superblock included).
    pub index_bytes: u64,
}

impl Layout {
    /// The layout of memory nodes whose smallest has `min_memory_bytes`,
    /// for `tasks` verb tasks in all; `None` if the areas do not fit above
    /// the superblock.
    pub fn new(min_memory_bytes: u64, tasks: u64) -> Option<Layout> {
        let areas = tasks.checked_mul(AREA_BYTES)?;
        let off = min_memory_bytes.checked_sub(areas)? & !4095;
        (off >= mempool::SUPERBLOCK_BYTES).then_some(Layout {
            areas_off: off,
            index_bytes: off,
        })
    }
}

/// What one memory node saw from one core.
#[derive(Clone, Debug, Default)]
pub struct NodeTally {
    pub node: NodeId,
    /// Operations on this node that succeeded.
    pub ops: u64,
    pub faa: u64,
    pub failures: u64,
    /// Wall-clock (Unix) ns of the first failure, 0 if none.
    pub first_failure_unix_ns: u64,
    pub first_error: Option<String>,
    /// Whether the node was found dead (its owner process gone).
    pub dead: bool,
}

impl NodeTally {
    /// Adds another core's tally of the same node: counts add up, the
    /// earliest failure is kept.
    pub fn absorb(&mut self, t: NodeTally) {
        self.ops += t.ops;
        self.faa += t.faa;
        self.failures += t.failures;
        if t.first_failure_unix_ns != 0
            && (self.first_failure_unix_ns == 0
                || t.first_failure_unix_ns < self.first_failure_unix_ns)
        {
            self.first_failure_unix_ns = t.first_failure_unix_ns;
            self.first_error = t.first_error;
        }
        self.dead |= t.dead;
    }
}

/// What the tasks of one core share (one thread, so `Cell`s).
pub struct CoreState {
    pub tally: OpTally,
    pub nodes: RefCell<Vec<NodeTally>>,
    /// Nodes this core gave up on, by index into `nodes`.
    dead: Vec<Cell<bool>>,
    /// Whether memory node `i` (by index) still has a live owner.
    alive: Box<dyn Fn(usize) -> bool>,
    log_prefix: String,
}

impl CoreState {
    pub fn new(
        nodes: &[NodeId],
        alive: Box<dyn Fn(usize) -> bool>,
        log_prefix: String,
    ) -> Rc<CoreState> {
        Rc::new(CoreState {
            tally: OpTally::default(),
            nodes: RefCell::new(
                nodes
                    .iter()
                    .map(|&node| NodeTally {
                        node,
                        ..Default::default()
                    })
                    .collect(),
            ),
            dead: nodes.iter().map(|_| Cell::new(false)).collect(),
            alive,
            log_prefix,
        })
    }

    fn failed(&self, idx: usize, e: &VerbError) {
        let mut nodes = self.nodes.borrow_mut();
        let t = &mut nodes[idx];
        t.failures += 1;
        if t.first_error.is_none() {
            t.first_failure_unix_ns = nicdrv::clock::unix_ns();
            // A verb racing the death may see the queue pair's error state
            // rather than the timeout itself; the owner's state says why.
            t.dead = e.is_node_dead() || !(self.alive)(idx);
            let msg = if t.dead {
                format!("memory node {} is dead (its process is gone): {e}", t.node)
            } else {
                format!("memory node {} failed: {e}", t.node)
            };
            crate::node::say(format_args!(
                "{}: {msg}; its operations fail, those on the other memory nodes continue",
                self.log_prefix
            ));
            t.first_error = Some(msg);
        }
        // Any failure on a node ends this core's use of it: the emu queue
        // pair only fails when the node is gone or misconfigured.
        self.dead[idx].set(true);
    }

    /// A node this core still uses, starting from `idx`.
    fn live_from(&self, idx: usize) -> Option<usize> {
        let n = self.dead.len();
        (0..n).map(|k| (idx + k) % n).find(|&i| !self.dead[i].get())
    }
}

/// Writes `len` zero bytes at `at`, one WRITE per `piece` bytes (each must
/// fit the task's scratch); the first failed WRITE is the error.
pub async fn write_zeros<N: Nic>(
    ctx: &Ctx<N>,
    at: GlobalAddr,
    len: u64,
    piece: u64,
) -> Result<(), VerbError> {
    let zeros = vec![0u8; piece.min(len) as usize];
    let mut off = 0;
    while off < len {
        let n = piece.min(len - off);
        ctx.write(at.add(off), &zeros[..n as usize]).await?;
        off += n;
    }
    Ok(())
}

/// One task: the self-checking verb mix [`Mix::NODE`] over `nodes` until
/// `stop()` or `deadline_ns` (the NIC clock).
pub async fn task<N: Nic>(
    ctx: Ctx<N>,
    nodes: Vec<NodeId>,
    area_offset: u64,
    mut rng: Rng,
    deadline_ns: u64,
    stop: fn() -> bool,
    st: Rc<CoreState>,
) {
    let mut shadow = vec![vec![0u64; TASK_WORDS as usize]; nodes.len()];
    // Memory nodes outlive compute runs: a slot's words may hold an
    // earlier run's values, so the task zeroes them before it checks any
    // (in pieces within a slot's 4 KiB of scratch).
    for (idx, &node) in nodes.iter().enumerate() {
        let area = GlobalAddr::host(node, area_offset);
        if let Err(e) = write_zeros(&ctx, area, AREA_BYTES, 2048).await {
            st.failed(idx, &e);
        }
    }
    while ctx.now_ns() < deadline_ns && !stop() {
        let Some(idx) = st.live_from(rng.below(nodes.len() as u64) as usize) else {
            return; // every memory node is gone
        };
        let node = nodes[idx];
        let w = rng.below(TASK_WORDS) as usize;
        let target = Target {
            word: GlobalAddr::host(node, area_offset + w as u64 * 64),
            counter: GlobalAddr::host(node, FAA_OFFSET),
            // Mix::NODE draws no CAS; a CAS increment here would count
            // on the counter the launcher checks against the FAAs.
            cas_word: GlobalAddr::host(node, FAA_OFFSET),
        };
        let verb = Mix::NODE.pick(&mut rng);
        let t0 = ctx.now_ns();
        let r = verb_mix::step(&ctx, verb, &mut rng, target, &mut shadow[idx][w]).await;
        match r {
            Ok(found) => {
                if found.mismatch {
                    st.tally.mismatch();
                }
                st.tally.done(ctx.now_ns() - t0);
                let mut ns = st.nodes.borrow_mut();
                ns[idx].ops += 1;
                if verb.bumps_counter() {
                    ns[idx].faa += 1;
                }
            }
            Err(e) => st.failed(idx, &e),
        }
    }
}
