//! Per-task registered scratch memory and the buffers carved from it.
//!
//! Each task slot owns a fixed window of the core's registered scratch
//! region, made at start. [`Buf`]s are bump-allocated from it. The NIC may
//! write a buffer only while it sits in a posted batch, and a slot posts one
//! batch at a time, so the rules that keep the NIC from writing memory that
//! has been handed out again are simple:
//! - a dropped buffer's bytes are reused only when the slot has nothing in
//!   flight (an in-flight batch whose future was dropped still owns them);
//! - the window rewinds to empty when no buffer is live and nothing is in
//!   flight; a buffer dropped on top of the stack rewinds it at once.
//!
//! The memory itself is kept alive by every buffer (a reference count on
//! the registration), so a buffer can never dangle, not even one that
//! outlives its executor.

use crate::verbs::LKey;
use std::any::Any;
use std::cell::Cell;
use std::fmt;
use std::rc::Rc;

/// Buffers are aligned to this, so 8-byte words in them are aligned.
pub const BUF_ALIGN: usize = 8;

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

    fn maybe_rewind(&self) {
        if self.live.get() == 0 && self.inflight.get() == 0 {
            self.top.set(0);
        }
    }

    pub(crate) fn free_bytes(&self) -> usize {
        self.cap - self.top.get()
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
fn alloc_raw(arena: &Rc<SlotArena>, len: usize) -> Option<Buf> {
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

    pub(crate) fn sge(&self) -> crate::verbs::Sge {
        crate::verbs::Sge {
            addr: self.ptr,
            len: self.len,
            lkey: self.arena.lkey,
        }
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
        // into this range: with nothing in flight, none can.
        if a.inflight.get() == 0 && a.top.get() == self.end as usize {
            a.top.set(self.start as usize);
        }
        a.maybe_rewind();
    }
}
