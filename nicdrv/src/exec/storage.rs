//! A slot's batch storage: the requests of the batch being built, their
//! target nodes and buffers, laid out once at start. Keeping them here
//! rather than in the batch value keeps task futures small, so moving them
//! (which Rust does whenever a future is created or awaited) costs a few
//! words instead of kilobytes.
//!
//! Access goes through `UnsafeCell`s. That is sound because a slot belongs
//! to one executor thread, every access is a short borrow inside one of the
//! methods below that never calls back into task code, and no reference
//! into the storage escapes these methods.

use super::arena::Buf;
use super::ctx::{LAST_BIT, MAX_BATCH};
use super::error::VerbError;
use super::Slot;
use crate::addr::NodeId;
use crate::counters::VerbCounters;
use crate::verbs::{Opcode, WorkRequest, PLACEHOLDER_WR};
use std::cell::UnsafeCell;

pub(crate) struct BatchStorage {
    wrs: UnsafeCell<[WorkRequest; MAX_BATCH]>,
    nodes: UnsafeCell<[NodeId; MAX_BATCH]>,
    grouped: UnsafeCell<[WorkRequest; MAX_BATCH]>,
    bufs: UnsafeCell<[Option<Buf>; MAX_BATCH]>,
    /// Entries of `bufs` that may hold a buffer (a high-water mark since the
    /// last clear), so clearing touches only those.
    used: std::cell::Cell<u8>,
}

impl BatchStorage {
    pub(crate) fn new() -> BatchStorage {
        BatchStorage {
            wrs: UnsafeCell::new([PLACEHOLDER_WR; MAX_BATCH]),
            nodes: UnsafeCell::new([0; MAX_BATCH]),
            grouped: UnsafeCell::new([PLACEHOLDER_WR; MAX_BATCH]),
            bufs: UnsafeCell::new([const { None }; MAX_BATCH]),
            used: std::cell::Cell::new(0),
        }
    }
}

const SEQ_MASK: u64 = 0xffff << 32;

impl Slot {
    /// Starts a batch (a `Batch`, or a lone READ): a new generation, so
    /// the previous batch's results and futures are no longer its, and
    /// what that batch left in the storage freed. Returns the generation
    /// (never 0: 0 marks a refused batch, so the count skips it).
    pub(crate) fn start_batch(&self) -> u32 {
        let gen = self.gen.get().wrapping_add(1).max(1);
        self.gen.set(gen);
        self.clear_storage();
        gen
    }

    /// Starts the post of a batch: the slot is busy until its result, with
    /// a fresh sequence number (returned) and no failures or nodes yet.
    pub(crate) fn begin_post(&self) -> u16 {
        debug_assert!(self.pending.get() == 0);
        self.busy.set(true);
        let seq = self.seq.get().wrapping_add(1);
        self.seq.set(seq);
        self.failure.set(None);
        self.posted_nodes.set(0);
        self.failed_nodes.set(0);
        self.wide.set(false);
        seq
    }

    /// Accounts for a group `g` just posted to `node`: the node, the
    /// arena's count in flight, the counters.
    #[inline(always)]
    pub(crate) fn posted(&self, node: NodeId, g: &[WorkRequest]) {
        if node < 64 {
            self.posted_nodes.set(self.posted_nodes.get() | 1 << node);
        } else {
            self.wide.set(true);
        }
        self.arena.posted_group();
        self.bump(|c: &mut VerbCounters| {
            c.doorbells += 1;
            for w in g {
                c.count(w.op.opcode(), w.op.len());
            }
        });
    }

    /// Drops the buffers a previous batch left (untaken results, or those of
    /// a batch that was never submitted). Every batch starts and ends with
    /// one, mostly over storage its results were already taken from: that
    /// case is one test here, the loop out of line.
    #[inline(always)]
    pub(crate) fn clear_storage(&self) {
        if self.storage.used.get() != 0 {
            self.clear_stored_bufs();
        }
    }

    #[inline(never)]
    fn clear_stored_bufs(&self) {
        // SAFETY: see the module comment; dropping a Buf only touches its
        // arena's counters, never this storage.
        let bufs = unsafe { &mut *self.storage.bufs.get() };
        // Newest first: a batch's buffers were allocated in request order, so
        // each one dropped is then the top of the window and rewinds it.
        for b in bufs[..self.storage.used.get() as usize].iter_mut().rev() {
            drop(b.take());
        }
        self.storage.used.set(0);
    }

    #[inline(always)]
    pub(crate) fn store(&self, ix: usize, node: NodeId, wr: WorkRequest, buf: Option<Buf>) {
        // SAFETY: see the module comment.
        unsafe {
            (*self.storage.wrs.get())[ix] = wr;
            (*self.storage.nodes.get())[ix] = node;
            (*self.storage.bufs.get())[ix] = buf;
        }
        let used = &self.storage.used;
        used.set(used.get().max(ix as u8 + 1));
    }

    pub(crate) fn with_wr(&self, ix: usize, f: impl FnOnce(&mut WorkRequest)) {
        // SAFETY: see the module comment; `f` is ours (a field update).
        f(unsafe { &mut (*self.storage.wrs.get())[ix] })
    }

    pub(crate) fn opcode_of(&self, ix: usize) -> Opcode {
        // SAFETY: see the module comment.
        unsafe { (*self.storage.wrs.get())[ix].op.opcode() }
    }

    /// Takes request `ix`'s buffer, and lowers the high-water mark past
    /// the empty entries at its top, so a batch whose results were all
    /// taken leaves nothing to clear.
    #[inline]
    pub(crate) fn take_buf(&self, ix: usize) -> Option<Buf> {
        // SAFETY: see the module comment.
        let bufs = unsafe { &mut *self.storage.bufs.get() };
        let b = bufs[ix].take();
        let mut used = self.storage.used.get() as usize;
        while used > 0 && bufs[used - 1].is_none() {
            used -= 1;
        }
        self.storage.used.set(used as u8);
        b
    }

    pub(crate) fn peek_word(&self, ix: usize) -> Option<u64> {
        // SAFETY: see the module comment; the value is copied out.
        unsafe { (*self.storage.bufs.get())[ix].as_ref().map(|b| b.u64_at(0)) }
    }

    /// Posts the first `len` stored requests, one doorbell per memory node
    /// (in order of first appearance), each group's last request signaled
    /// and marked last. Stops at the first refused post. Returns the groups
    /// posted and the refusal, if any.
    pub(crate) fn post_groups(
        &self,
        len: usize,
        seq: u16,
        mut post: impl FnMut(NodeId, &[WorkRequest]) -> Result<(), VerbError>,
    ) -> (u32, Option<VerbError>) {
        // SAFETY: see the module comment; `post` reaches the queue pairs,
        // never this storage.
        let (wrs, nodes, grouped) = unsafe {
            (
                &mut *self.storage.wrs.get(),
                &*self.storage.nodes.get(),
                &mut *self.storage.grouped.get(),
            )
        };
        for w in wrs[..len].iter_mut() {
            w.wr_id = (w.wr_id & !SEQ_MASK & !LAST_BIT) | ((seq as u64) << 32);
            w.signaled = false;
        }
        let mut groups = 0u32;
        let mut send = |node: NodeId, g: &mut [WorkRequest]| {
            let last = g.len() - 1;
            g[last].signaled = true;
            g[last].wr_id |= LAST_BIT;
            post(node, g)?;
            self.posted(node, g);
            Ok::<(), VerbError>(())
        };
        let first = nodes[0];
        if nodes[..len].iter().all(|&n| n == first) {
            return match send(first, &mut wrs[..len]) {
                Ok(()) => (1, None),
                Err(e) => (0, Some(e)),
            };
        }
        let mut done = [false; MAX_BATCH];
        for i in 0..len {
            if done[i] {
                continue;
            }
            let node = nodes[i];
            let mut n = 0;
            for j in i..len {
                if nodes[j] == node {
                    done[j] = true;
                    grouped[n] = wrs[j];
                    n += 1;
                }
            }
            if let Err(e) = send(node, &mut grouped[..n]) {
                return (groups, Some(e));
            }
            groups += 1;
        }
        debug_assert!(groups > 1);
        (groups, None)
    }
}
