//! Timers, waiting for a write, and the local view, as tasks see them.
//!
//! Each slot holds one deadline and one watched range, in cells made with
//! the executor (no allocation, a bounded structure): a turn wakes the
//! slots whose deadline has come or whose range a backend says was written
//! ([`crate::Nic::write_seen`]), and tells the backend its earliest
//! deadline ([`crate::Nic::timer_due`]) so a simulated thread sleeps until
//! then instead of spinning. The deadline is the earliest of the task's
//! live waits: it is cleared before each poll of the task and every live
//! wait arms it again as it is polled, so a wait that has ended never
//! leaves its deadline behind. A task waits for one range at a time: a
//! second write wait while one is live is refused ([`WaitError::Busy`]).
//! The waits wake the task through its slot, not `cx.waker()`: they are
//! for tasks of this executor, polled by it (as its batches are).

use super::ctx::Ctx;
use super::Slot;
use crate::local::{check_deadline, check_range, LocalError, TimerError, WaitError, Woken};
use crate::nic::Nic;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// No deadline.
pub(crate) const NO_TIMER: u64 = u64::MAX;

impl Slot {
    /// Arms the slot's deadline at `at` (the earlier of two live ones).
    fn arm(&self, at: u64) {
        self.timer.set(self.timer.get().min(at));
    }
}

impl<N: Nic> Ctx<N> {
    /// Sleeps until the executor's clock reaches `at_ns` (wall clock on
    /// real backends, virtual in the simulator, where a sleeping task costs
    /// no events). A deadline before this turn's time or more than
    /// [`crate::local::TIMER_HORIZON_NS`] ahead is refused.
    pub fn sleep_until(&self, at_ns: u64) -> Result<Sleep<'_, N>, TimerError> {
        check_deadline(at_ns, self.now_ns())?;
        Ok(Sleep {
            ctx: self,
            at: at_ns,
            armed: false,
        })
    }

    /// Sleeps for `ns` from this turn's time.
    pub fn sleep(&self, ns: u64) -> Result<Sleep<'_, N>, TimerError> {
        let now = self.now_ns();
        self.sleep_until(now.saturating_add(ns))
    }

    /// Waits until a write lands in `off..off+len` of this machine's memory
    /// (a remote WRITE or atomic, or another local store), or until
    /// `deadline_ns`. Look at the memory first and wait only when it is not
    /// yet what you want: writes before the wait began do not end it. In
    /// the simulator the wake-up is an event of the write itself, so an
    /// idle waiter costs nothing; on emu and mlx5 the waiter looks once per
    /// executor turn, as a polling loop would.
    pub fn wait_for_write(
        &self,
        off: u64,
        len: u64,
        deadline_ns: Option<u64>,
    ) -> Result<WaitWrite<'_, N>, WaitError> {
        let size = self.nic().local_bytes().ok_or(LocalError::NotAMachine)?;
        check_range(off, len, size, false)?;
        if self.slot_state().watching.get() {
            return Err(WaitError::Busy);
        }
        if let Some(d) = deadline_ns {
            check_deadline(d, self.now_ns())?;
        }
        Ok(WaitWrite {
            ctx: self,
            off,
            len,
            deadline: deadline_ns.unwrap_or(NO_TIMER),
            started: false,
            ended: None,
        })
    }

    /// This machine's own memory as its CPU sees it ([`crate::local`]).
    pub fn local(&self) -> Local<'_, N> {
        Local { nic: self.nic() }
    }
}

/// The future of [`Ctx::sleep_until`].
pub struct Sleep<'a, N: Nic> {
    ctx: &'a Ctx<N>,
    at: u64,
    armed: bool,
}

impl<N: Nic> Future for Sleep<'_, N> {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        let now = self.ctx.now_ns();
        if now >= self.at {
            self.disarm();
            return Poll::Ready(());
        }
        if !self.armed {
            self.armed = true;
            self.ctx.begin_wait();
        }
        self.ctx.slot_state().arm(self.at);
        Poll::Pending
    }
}

impl<N: Nic> Sleep<'_, N> {
    fn disarm(&mut self) {
        if std::mem::take(&mut self.armed) {
            self.ctx.end_wait();
        }
    }
}

impl<N: Nic> Drop for Sleep<'_, N> {
    fn drop(&mut self) {
        self.disarm();
    }
}

/// The future of [`Ctx::wait_for_write`].
pub struct WaitWrite<'a, N: Nic> {
    ctx: &'a Ctx<N>,
    off: u64,
    len: u64,
    deadline: u64,
    started: bool,
    /// How it ended (a poll after the end gives the same answer).
    ended: Option<Woken>,
}

impl<N: Nic> Future for WaitWrite<'_, N> {
    type Output = Woken;
    fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Woken> {
        if let Some(w) = self.ended {
            return Poll::Ready(w);
        }
        let (ctx, now) = (self.ctx, self.ctx.now_ns());
        let s = ctx.slot_state();
        // The deadline first: a wait past it ends so, whatever was written
        // (a backend that cannot tell says "written" every turn).
        let woke = if now >= self.deadline {
            Some(Woken::Deadline)
        } else if !self.started {
            if s.watching.get() {
                // Another wait of this task watches already (made before
                // that one first ran): end at once, the caller looks again.
                Some(Woken::Written)
            } else {
                self.started = true;
                ctx.begin_wait();
                s.watching.set(true);
                ctx.nic().watch_writes(ctx.slot(), self.off, self.len);
                None
            }
        } else if ctx.nic().write_seen(ctx.slot()) {
            Some(Woken::Written)
        } else {
            None
        };
        if let Some(w) = woke {
            self.finish();
            self.ended = Some(w);
            return Poll::Ready(w);
        }
        if self.deadline != NO_TIMER {
            s.arm(self.deadline);
        }
        Poll::Pending
    }
}

impl<N: Nic> WaitWrite<'_, N> {
    fn finish(&mut self) {
        if std::mem::take(&mut self.started) {
            self.ctx.slot_state().watching.set(false);
            self.ctx.nic().unwatch_writes(self.ctx.slot());
            self.ctx.end_wait();
        }
    }
}

impl<N: Nic> Drop for WaitWrite<'_, N> {
    fn drop(&mut self) {
        self.finish();
    }
}

impl<N: Nic> Ctx<N> {
    /// A wait of this task began.
    fn begin_wait(&self) {
        let s = self.slot_state();
        s.waits.set(s.waits.get() + 1);
        let c = &self.core_ref().waits;
        c.set(c.get() + 1);
    }

    /// A wait of this task ended (the next poll's live waits re-arm the
    /// deadline; the last one clears it now).
    fn end_wait(&self) {
        let s = self.slot_state();
        let w = s.waits.get();
        debug_assert!(w > 0, "a wait ended that never began");
        s.waits.set(w.saturating_sub(1));
        if w <= 1 {
            s.timer.set(NO_TIMER);
        }
        let c = &self.core_ref().waits;
        c.set(c.get().saturating_sub(1));
    }
}

impl Slot {
    /// Whether this turn should poll the slot for its waits: its deadline
    /// has come, or its watched range may have been written.
    pub(crate) fn wait_due<N: Nic>(&self, nic: &N, slot: usize, now: u64) -> bool {
        self.waits.get() > 0
            && (self.timer.get() <= now || (self.watching.get() && nic.write_seen(slot)))
    }
}

/// [`Ctx::local`]: the machine's memory through its device.
pub struct Local<'a, N: Nic> {
    nic: &'a N,
}

impl<N: Nic> Local<'_, N> {
    /// Bytes of the machine's memory (`None`: not a machine).
    pub fn bytes(&self) -> Option<u64> {
        self.nic.local_bytes()
    }
    pub fn load(&self, off: u64) -> Result<u64, LocalError> {
        self.nic.local_load(off)
    }
    pub fn store(&self, off: u64, v: u64) -> Result<(), LocalError> {
        self.nic.local_store(off, v)
    }
    pub fn cas(&self, off: u64, compare: u64, swap: u64) -> Result<u64, LocalError> {
        self.nic.local_cas(off, compare, swap)
    }
    pub fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), LocalError> {
        self.nic.local_read(off, buf)
    }
    pub fn write(&self, off: u64, data: &[u8]) -> Result<(), LocalError> {
        self.nic.local_write(off, data)
    }
}
