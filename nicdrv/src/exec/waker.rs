//! Wakers for task slots: a flag per slot, set by whoever wakes the task and
//! swapped clear by the executor before it polls the slot. The executor's
//! own wakes (completions, spawns, deadlines) set `Slot::woken_here`
//! instead, a plain cell that needs no locked swap to clear.
//!
//! The flags live in an `Arc` so that a `Waker` stored anywhere stays valid
//! after the executor is gone (std requires wakers to be `Send + Sync` and
//! freely cloneable). The executor keeps one waker per slot, made at start,
//! so polling never clones or allocates.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{RawWaker, RawWakerVTable, Waker};

pub(crate) struct SlotWake {
    pub(crate) woken: AtomicBool,
}

impl SlotWake {
    /// Marks the slot runnable. Release pairs with the executor's Acquire
    /// swap so the task sees whatever the waker did before waking it.
    pub(crate) fn wake(&self) {
        self.woken.store(true, Ordering::Release);
    }

    pub(crate) fn take(&self) -> bool {
        // A plain load first: most slots are not woken, and a swap is a
        // locked read-modify-write even when it changes nothing.
        self.woken.load(Ordering::Relaxed) && self.woken.swap(false, Ordering::Acquire)
    }
}

static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, wake, wake_by_ref, drop_waker);

unsafe fn clone(p: *const ()) -> RawWaker {
    // SAFETY: `p` came from Arc::into_raw in `waker_for`; the waker being
    // cloned holds one count, so the Arc is alive.
    unsafe { Arc::increment_strong_count(p as *const SlotWake) };
    RawWaker::new(p, &VTABLE)
}

unsafe fn wake(p: *const ()) {
    // SAFETY: the waking waker holds a count (it is consumed here): use it,
    // then release it.
    unsafe {
        wake_by_ref(p);
        drop_waker(p);
    }
}

unsafe fn wake_by_ref(p: *const ()) {
    // SAFETY: the calling waker holds a count, so the pointee is alive.
    unsafe { (*(p as *const SlotWake)).wake() };
}

unsafe fn drop_waker(p: *const ()) {
    // SAFETY: releases the count this waker held.
    drop(unsafe { Arc::from_raw(p as *const SlotWake) });
}

pub(crate) fn waker_for(w: &Arc<SlotWake>) -> Waker {
    let p = Arc::into_raw(w.clone()) as *const ();
    // SAFETY: the vtable functions treat `p` as an Arc<SlotWake> holding one
    // count, which into_raw just gave it.
    unsafe { Waker::from_raw(RawWaker::new(p, &VTABLE)) }
}
