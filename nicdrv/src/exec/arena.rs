//! Per-task registered scratch memory and the buffers carved from it.
//!
//! Each task slot owns a fixed window of the core's registered scratch
//! region, made at start. [`Buf`]s are bump-allocated from it. The NIC may
//! write a buffer only while it sits in a posted batch, and a slot posts one
//! batch at a time, so the rules that keep the NIC from writing memory that
//! has been handed out again are simple:
//! - a dropped buffer's bytes are reused only when the slot has nothing in
//!   flight (an in-flight batch whose future was dropped still owns them);
//! - a buffer dropped on top of the stack rewinds it at once; one dropped
//!   below the top leaves a hole, and holes that the top comes down to are
//!   taken back with it, so buffers may die in any order and the window still
//!   returns to where it was once they are all gone;
//! - the window rewinds to empty when no buffer is live and nothing is in
//!   flight.
//!
//! The holes are kept in a fixed table made at start ([`MAX_HOLES`]), so
//! nothing allocates per operation; a hole that finds the table full stays
//! reserved until the window empties (never unsound, only wasteful).
//!
//! The memory itself is kept alive by every buffer (a reference count on
//! the registration), so a buffer can never dangle, not even one that
//! outlives its executor.

use super::error::VerbError;
use crate::verbs::LKey;
use std::any::Any;
use std::cell::Cell;
use std::fmt;
use std::rc::Rc;

/// Buffers are aligned to this, so 8-byte words in them are aligned.
pub const BUF_ALIGN: usize = 8;

/// Buffers dropped below the top that a slot remembers at once.
pub const MAX_HOLES: usize = 32;

/// A dropped buffer's range, `start..end`, below the top of the window.
#[derive(Clone, Copy)]
struct Hole {
    start: u32,
    end: u32,
}

pub(crate) struct SlotArena {
    base: *mut u8,
    cap: usize,
    lkey: LKey,
    top: Cell<usize>,
    live: Cell<u32>,
    /// Queue-pair groups posted by this slot and not yet completed.
    inflight: Cell<u32>,
    /// High-water mark, for sizing advice.
    peak: Cell<usize>,
    /// Ranges of dropped buffers below `top`, unordered; `holes[..nholes]`.
    holes: Cell<[Hole; MAX_HOLES]>,
    nholes: Cell<usize>,
    _keep: Rc<dyn Any>,
}

impl SlotArena {
    /// # Safety
    /// `base..base+cap` must be registered under `lkey`, 8-byte aligned, and
    /// kept alive by `keep`; nothing else may hand it out.
    pub(crate) unsafe fn new(
        base: *mut u8,
        cap: usize,
        lkey: LKey,
        keep: Rc<dyn Any>,
    ) -> SlotArena {
        debug_assert_eq!(base as usize % BUF_ALIGN, 0);
        SlotArena {
            base,
            cap,
            lkey,
            top: Cell::new(0),
            live: Cell::new(0),
            inflight: Cell::new(0),
            peak: Cell::new(0),
            holes: Cell::new([Hole { start: 0, end: 0 }; MAX_HOLES]),
            nholes: Cell::new(0),
            _keep: keep,
        }
    }

    pub(crate) fn inflight(&self) -> u32 {
        self.inflight.get()
    }

    pub(crate) fn posted_group(&self) {
        self.inflight.set(self.inflight.get() + 1);
    }

    pub(crate) fn completed_group(&self) {
        let n = self.inflight.get();
        assert!(n > 0, "completion for a slot with nothing in flight");
        self.inflight.set(n - 1);
        self.maybe_rewind();
    }

    /// Takes back what it can: everything when no buffer is live, else the
    /// holes the top has come down to. Only with nothing in flight, since a
    /// posted request may still write into a dropped buffer's bytes.
    fn maybe_rewind(&self) {
        if self.inflight.get() != 0 {
            return;
        }
        if self.live.get() == 0 {
            self.top.set(0);
            self.nholes.set(0);
            return;
        }
        if self.nholes.get() == 0 {
            return;
        }
        let mut holes = self.holes.get();
        let mut n = self.nholes.get();
        let mut top = self.top.get() as u32;
        // Each pass removes the hole that ends at the top, if any; holes
        // never overlap, so at most one does.
        while let Some(i) = holes[..n].iter().position(|h| h.end == top) {
            top = holes[i].start;
            holes[i] = holes[n - 1];
            n -= 1;
        }
        self.top.set(top as usize);
        self.holes.set(holes);
        self.nholes.set(n);
    }

    /// Returns `start..end`, a dropped buffer's range, to the window.
    fn release(&self, start: u32, end: u32) {
        if self.inflight.get() == 0 && self.top.get() == end as usize {
            self.top.set(start as usize);
        } else {
            let n = self.nholes.get();
            if n < MAX_HOLES {
                let mut holes = self.holes.get();
                holes[n] = Hole { start, end };
                self.holes.set(holes);
                self.nholes.set(n + 1);
            }
        }
        self.maybe_rewind();
    }

    pub(crate) fn free_bytes(&self) -> usize {
        self.cap - self.top.get()
    }

    /// Bytes between the window's start and its top: live buffers and the
    /// holes below the topmost one.
    pub(crate) fn used(&self) -> usize {
        self.top.get()
    }

    pub(crate) fn peak(&self) -> usize {
        self.peak.get()
    }
}

/// Allocates `len` bytes (zeroed) from `arena`; `None` when the window is
/// exhausted.
pub(crate) fn alloc(arena: &Rc<SlotArena>, len: usize) -> Option<Buf> {
    let mut b = alloc_raw(arena, len)?;
    // Zeroing keeps data of earlier operations out of a fresh buffer.
    b.as_mut_slice().fill(0);
    Some(b)
}

/// Allocates without zeroing: the bytes are whatever an earlier buffer of
/// this slot left (always initialized: the scratch came zeroed).
pub(crate) fn alloc_raw(arena: &Rc<SlotArena>, len: usize) -> Option<Buf> {
    let start = arena.top.get();
    let end = start.checked_add(len.max(1).next_multiple_of(BUF_ALIGN))?;
    if end > arena.cap || len > u32::MAX as usize {
        return None;
    }
    arena.top.set(end);
    arena.peak.set(arena.peak.get().max(end));
    arena.live.set(arena.live.get() + 1);
    // SAFETY: start..start+len is inside the window and was handed to no
    // one else since the last rewind; the NIC writes it only once the Buf is
    // posted.
    let ptr = unsafe { arena.base.add(start) };
    Some(Buf {
        ptr,
        len: len as u32,
        start: start as u32,
        end: end as u32,
        arena: arena.clone(),
    })
}

/// Allocates a buffer holding a copy of `data` (not zeroed first).
pub(crate) fn alloc_copy(arena: &Rc<SlotArena>, data: &[u8]) -> Option<Buf> {
    let mut b = alloc_raw(arena, data.len())?;
    b.as_mut_slice().copy_from_slice(data);
    Some(b)
}

/// A task-owned buffer of registered memory. While a `Buf` is outside a
/// batch, only its owner touches it; moved into a batch it travels with the
/// request and comes back in the batch's [`Done`](super::Done).
pub struct Buf {
    ptr: *mut u8,
    len: u32,
    start: u32,
    end: u32,
    arena: Rc<SlotArena>,
}

impl Buf {
    pub fn len(&self) -> usize {
        self.len as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the Buf exclusively owns this range (see the module
        // rules); the NIC is not writing it because the Buf is not posted.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len as usize) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as for as_slice, and `&mut self` makes this unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len as usize) }
    }

    /// Reads the little-endian 8-byte word at byte offset `at`.
    pub fn u64_at(&self, at: usize) -> u64 {
        u64::from_le_bytes(self.as_slice()[at..at + 8].try_into().expect("8 bytes"))
    }

    /// The buffer as the local side of a verb posted by the slot that
    /// owns `arena`. Only a buffer of that arena: it alone keeps the
    /// bytes from reuse while a verb of its slot is in flight, so another
    /// slot's buffer, freed by its owner's arena (which knows nothing of
    /// this verb) after a dropped batch, could be handed out while the
    /// NIC still writes it.
    #[inline]
    pub(crate) fn sge_for(&self, arena: &Rc<SlotArena>) -> Result<crate::verbs::Sge, VerbError> {
        if !Rc::ptr_eq(&self.arena, arena) {
            return Err(VerbError::ForeignBuffer);
        }
        Ok(crate::verbs::Sge {
            addr: self.ptr,
            len: self.len,
            lkey: self.arena.lkey,
        })
    }

    /// Shortens the buffer (the bytes stay reserved until it drops).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len as u32);
    }
}

impl fmt::Debug for Buf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Buf({} bytes)", self.len)
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        let a = &self.arena;
        a.live.set(a.live.get() - 1);
        // Rewinding is only safe when no posted request can still write
        // into this range: `release` reuses it only with nothing in flight.
        a.release(self.start, self.end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An arena over a window of `cap` bytes of ordinary memory.
    fn arena(cap: usize) -> Rc<SlotArena> {
        let mem: Rc<Vec<u64>> = Rc::new(vec![0u64; cap / 8]);
        let base = mem.as_ptr() as *mut u8;
        // SAFETY: `mem` is `cap` bytes, 8-byte aligned, kept alive by the
        // arena through `keep`, and handed to nothing else. Nothing reads it
        // through `mem` while the arena writes it.
        Rc::new(unsafe { SlotArena::new(base, cap, LKey(1), mem) })
    }

    #[test]
    fn buffers_dropped_in_any_order_give_the_window_back() {
        let a = arena(4096);
        let keep = alloc(&a, 64).unwrap();
        let base = a.used();
        // Every order of dropping three buffers, with one older buffer live
        // throughout (so the empty-window rewind never helps).
        for order in [
            [0, 1, 2],
            [0, 2, 1],
            [1, 0, 2],
            [1, 2, 0],
            [2, 0, 1],
            [2, 1, 0],
        ] {
            let mut bufs: Vec<Option<Buf>> = [8, 1024, 24].iter().map(|&n| alloc(&a, n)).collect();
            assert!(a.used() > base);
            for i in order {
                bufs[i].take();
            }
            assert_eq!(a.used(), base, "order {order:?}");
        }
        drop(keep);
        assert_eq!(a.used(), 0);
    }

    #[test]
    fn a_window_reused_forever_never_grows() {
        // The pattern that exhausted tree tasks: a page read, copies of it
        // written, the page dropped before the copies.
        let a = arena(4096);
        let _held = alloc(&a, 8).unwrap();
        for _ in 0..10_000 {
            let page = alloc(&a, 1024).unwrap();
            let copy = alloc_copy(&a, &page.as_slice()[..64]).unwrap();
            drop(page);
            let next = alloc(&a, 1024).unwrap();
            drop(copy);
            drop(next);
        }
        assert_eq!(a.used(), 8);
    }

    #[test]
    fn bytes_dropped_while_in_flight_wait_for_the_completion() {
        let a = arena(4096);
        let _held = alloc(&a, 8).unwrap();
        let b = alloc(&a, 64).unwrap();
        a.posted_group();
        drop(b);
        // A request posted before the drop may still write those bytes.
        assert_eq!(a.used(), 72);
        let c = alloc(&a, 8).unwrap();
        assert!(c.start >= 72, "reused bytes still in flight");
        drop(c);
        assert_eq!(a.used(), 80);
        a.completed_group();
        assert_eq!(a.used(), 8);
    }

    #[test]
    fn a_full_hole_table_only_wastes_until_the_window_empties() {
        let a = arena(1 << 16);
        let bottom = alloc(&a, 8).unwrap();
        let mut bufs: Vec<Buf> = (0..MAX_HOLES + 4).map(|_| alloc(&a, 8).unwrap()).collect();
        let top = alloc(&a, 8).unwrap();
        // Dropping everything but the top leaves more holes than the table.
        bufs.clear();
        drop(top);
        assert!(a.used() > 8, "holes past the table stay reserved");
        drop(bottom);
        assert_eq!(a.used(), 0);
    }
}
