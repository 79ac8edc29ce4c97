//! Machines: a memory node and a compute node in one failure domain, whose
//! cores reach their own host memory through the *local view* (FaRM's
//! receivers poll the rings other machines write into their memory).
//!
//! The local view is word load, store and CAS of aligned 8-byte words, and
//! reads and writes of byte ranges, at offsets into the machine's host
//! memory. Its memory model is the design's: an aligned word never tears;
//! a range read racing a remote WRITE may return any mix of old and new
//! (it is not even line-atomic: the CPU is not the NIC); a local CAS is
//! atomic with respect to other local CASes, not with respect to NIC
//! atomics on the same word. A range *write* lands line by line, each
//! 64-byte line it covers whole to a concurrent remote READ, as a CPU's
//! store of a whole cache line is to the NIC's DMA of that line — what
//! FaRM's primaries rely on when they install an object under its
//! per-line versions. Every access is bounds-checked and a bad one is a
//! [`LocalError`], never a panic.
//!
//! Backends: emu — atomics on the shared mapping of the node the process
//! (or thread) owns, range writes through the same line seqlock as WRITE
//! verbs; sim — the simulated node's memory, charged to the thread's CPU,
//! a write applied at one instant; mlx5 — the registered region itself,
//! a plain copy (line-whole on x86 only as far as the processor writes
//! each line in one piece; a real deployment keeps to full-line stores).
//!
//! The same module holds the timer errors: timers and waiting for a write
//! are executor features ([`crate::Ctx::sleep`],
//! [`crate::Ctx::wait_for_write`]) that the backends help with through
//! [`crate::Nic`]'s hooks.

use crate::emu::shm::SharedMem;
use std::fmt;

/// Why a local access was refused.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum LocalError {
    /// This thread's node owns no memory: it is not on a machine.
    NotAMachine,
    /// `off..off+len` is not inside the machine's `size` bytes.
    OutOfRange { off: u64, len: u64, size: u64 },
    /// A word access at an offset that is not a multiple of 8.
    Misaligned { off: u64 },
    /// The machine's memory is gone (its node crashed).
    Gone,
}

impl fmt::Display for LocalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LocalError::NotAMachine => {
                write!(
                    f,
                    "local access on a node that owns no memory (not a machine)"
                )
            }
            LocalError::OutOfRange { off, len, size } => write!(
                f,
                "local access of {len} bytes at offset {off} is outside the machine's {size} bytes"
            ),
            LocalError::Misaligned { off } => {
                write!(f, "local word access at offset {off}, not a multiple of 8")
            }
            LocalError::Gone => write!(f, "the machine's memory is gone (its node crashed)"),
        }
    }
}

impl std::error::Error for LocalError {}

/// Checks `off..off+len` against `size` bytes, and word alignment when
/// `word`.
pub fn check_range(off: u64, len: u64, size: u64, word: bool) -> Result<(), LocalError> {
    if word && !off.is_multiple_of(8) {
        return Err(LocalError::Misaligned { off });
    }
    match off.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(LocalError::OutOfRange { off, len, size }),
    }
}

/// The local view over memory that is really shared (emu's mapping,
/// mlx5's registered region): every access an atomic one, checked first.
/// Not `Clone`, for the reason [`SharedMem`] is not; [`MachineMemory`],
/// which keeps the memory mapped, is.
#[derive(Debug)]
pub struct SharedLocal(View);

#[derive(Debug)]
enum View {
    /// Plain atomic copies.
    Plain(SharedMem),
    /// Emu's window with its line words, through which range writes go so
    /// that each line is whole to concurrent READ verbs.
    Lines(crate::emu::lines::LineMem),
}

impl SharedLocal {
    pub fn new(mem: SharedMem) -> SharedLocal {
        SharedLocal(View::Plain(mem))
    }

    /// The view over an emu window with its line seqlock.
    pub fn with_lines(lines: crate::emu::lines::LineMem) -> SharedLocal {
        SharedLocal(View::Lines(lines))
    }

    /// The memory itself (for an emu window, the one its words guard).
    fn mem(&self) -> &SharedMem {
        match &self.0 {
            View::Plain(m) => m,
            View::Lines(l) => l.data(),
        }
    }

    /// A second view onto the same memory.
    ///
    /// # Safety
    /// As for [`SharedMem::alias`]: not used once the memory is unmapped.
    unsafe fn alias(&self) -> SharedLocal {
        // SAFETY: the caller's contract is the aliases' one.
        unsafe {
            SharedLocal(match &self.0 {
                View::Plain(m) => View::Plain(m.alias()),
                View::Lines(l) => View::Lines(l.alias()),
            })
        }
    }

    pub fn len(&self) -> u64 {
        self.mem().len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.mem().is_empty()
    }

    fn check(&self, off: u64, len: u64, word: bool) -> Result<(), LocalError> {
        check_range(off, len, self.len(), word)
    }

    pub fn load(&self, off: u64) -> Result<u64, LocalError> {
        self.check(off, 8, true)?;
        Ok(self.mem().load_u64(off))
    }

    pub fn store(&self, off: u64, v: u64) -> Result<(), LocalError> {
        self.check(off, 8, true)?;
        self.mem().store_u64(off, v);
        Ok(())
    }

    pub fn cas(&self, off: u64, compare: u64, swap: u64) -> Result<u64, LocalError> {
        self.check(off, 8, true)?;
        Ok(self.mem().cas_u64(off, compare, swap))
    }

    pub fn read(&self, off: u64, buf: &mut [u8]) -> Result<(), LocalError> {
        self.check(off, buf.len() as u64, false)?;
        self.mem().read(off, buf);
        Ok(())
    }

    pub fn write(&self, off: u64, data: &[u8]) -> Result<(), LocalError> {
        self.check(off, data.len() as u64, false)?;
        match &self.0 {
            View::Lines(l) => l.write(off, data),
            View::Plain(m) => m.write(off, data),
        }
        Ok(())
    }
}

/// A machine's memory as a device clone holds it (emu, mlx5): the view,
/// and whatever keeps that memory mapped and registered for as long as
/// any clone lives.
pub struct MachineMemory {
    view: SharedLocal,
    _keep: std::sync::Arc<dyn std::any::Any + Send + Sync>,
}

impl Clone for MachineMemory {
    fn clone(&self) -> Self {
        MachineMemory {
            // SAFETY: the clone holds `_keep` too, which keeps the memory
            // valid while the view lives (`new`'s contract).
            view: unsafe { self.view.alias() },
            _keep: self._keep.clone(),
        }
    }
}

impl MachineMemory {
    /// # Safety
    /// `keep` must keep `view`'s memory valid for as long as it lives:
    /// every clone holds it and makes a second window onto that memory.
    pub unsafe fn new(
        view: SharedLocal,
        keep: std::sync::Arc<dyn std::any::Any + Send + Sync>,
    ) -> Self {
        MachineMemory { view, _keep: keep }
    }
}

/// The view of a device's machine memory, or `NotAMachine`.
pub fn view_of(m: &Option<MachineMemory>) -> Result<&SharedLocal, LocalError> {
    m.as_ref().map(|m| &m.view).ok_or(LocalError::NotAMachine)
}

/// The local-view methods of a [`crate::Nic`] whose machine memory is the
/// `Option<MachineMemory>` in its field `local` (emu, mlx5): one body for
/// both.
macro_rules! shared_local_view {
    () => {
        fn local_bytes(&self) -> Option<u64> {
            $crate::local::view_of(&self.local).ok().map(|v| v.len())
        }

        fn local_load(&self, off: u64) -> Result<u64, $crate::local::LocalError> {
            $crate::local::view_of(&self.local)?.load(off)
        }

        fn local_store(&self, off: u64, v: u64) -> Result<(), $crate::local::LocalError> {
            $crate::local::view_of(&self.local)?.store(off, v)
        }

        fn local_cas(
            &self,
            off: u64,
            compare: u64,
            swap: u64,
        ) -> Result<u64, $crate::local::LocalError> {
            $crate::local::view_of(&self.local)?.cas(off, compare, swap)
        }

        fn local_read(&self, off: u64, buf: &mut [u8]) -> Result<(), $crate::local::LocalError> {
            $crate::local::view_of(&self.local)?.read(off, buf)
        }

        fn local_write(&self, off: u64, data: &[u8]) -> Result<(), $crate::local::LocalError> {
            $crate::local::view_of(&self.local)?.write(off, data)
        }
    };
}
pub(crate) use shared_local_view;

/// Why a timer was refused.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum TimerError {
    /// The deadline is before the current executor turn's time.
    InPast { at_ns: u64, now_ns: u64 },
    /// The deadline is further ahead than [`TIMER_HORIZON_NS`].
    BeyondHorizon { at_ns: u64, now_ns: u64 },
}

/// How far ahead a timer may be set: one hour. Longer waits are a
/// configuration mistake (FaRM's longest timer is a lease of tens of
/// milliseconds), and the bound keeps every deadline sum far from overflow.
pub const TIMER_HORIZON_NS: u64 = 3_600 * 1_000_000_000;

impl fmt::Display for TimerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TimerError::InPast { at_ns, now_ns } => {
                write!(f, "timer at {at_ns} ns is in the past (now {now_ns} ns)")
            }
            TimerError::BeyondHorizon { at_ns, now_ns } => write!(
                f,
                "timer at {at_ns} ns is more than {} s ahead (now {now_ns} ns)",
                TIMER_HORIZON_NS / 1_000_000_000
            ),
        }
    }
}

impl std::error::Error for TimerError {}

/// Why a wait for a write could not start.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum WaitError {
    /// The range is not in the machine's memory (or there is none).
    Local(LocalError),
    /// The deadline is in the past or beyond the horizon.
    Timer(TimerError),
    /// The task waits for a write already (one range at a time).
    Busy,
}

impl fmt::Display for WaitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WaitError::Local(e) => write!(f, "waiting for a write: {e}"),
            WaitError::Timer(e) => write!(f, "waiting for a write: {e}"),
            WaitError::Busy => write!(
                f,
                "waiting for a write: this task waits for one already (one range at a time)"
            ),
        }
    }
}

impl std::error::Error for WaitError {}

impl From<LocalError> for WaitError {
    fn from(e: LocalError) -> Self {
        WaitError::Local(e)
    }
}

impl From<TimerError> for WaitError {
    fn from(e: TimerError) -> Self {
        WaitError::Timer(e)
    }
}

/// How a wait for a write ended.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Woken {
    /// A write may have landed in the range (the simulator knows one did;
    /// other backends say so once per turn): look again.
    Written,
    /// The deadline came first.
    Deadline,
}

/// Checks a deadline against the turn's time.
pub fn check_deadline(at_ns: u64, now_ns: u64) -> Result<(), TimerError> {
    if at_ns < now_ns {
        Err(TimerError::InPast { at_ns, now_ns })
    } else if at_ns - now_ns > TIMER_HORIZON_NS {
        Err(TimerError::BeyondHorizon { at_ns, now_ns })
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_local_accesses_are_errors() {
        let mut backing = vec![0u64; 8];
        // SAFETY: the vector outlives `l` and is only touched through it.
        let l = SharedLocal::new(unsafe { SharedMem::new(backing.as_mut_ptr() as *mut u8, 64) });
        assert_eq!(l.load(3), Err(LocalError::Misaligned { off: 3 }));
        assert_eq!(
            l.store(64, 1),
            Err(LocalError::OutOfRange {
                off: 64,
                len: 8,
                size: 64
            })
        );
        assert!(l.read(u64::MAX - 2, &mut [0; 4]).is_err());
        assert!(l.write(60, &[1; 5]).is_err());
        l.write(1, &[7; 9]).unwrap();
        let mut b = [0u8; 11];
        l.read(0, &mut b).unwrap();
        assert_eq!(b, [0, 7, 7, 7, 7, 7, 7, 7, 7, 7, 0]);
        assert_eq!(l.cas(16, 0, 5), Ok(0));
        assert_eq!(l.cas(16, 0, 6), Ok(5));
        assert_eq!(l.load(16), Ok(5));
        drop(backing);
    }

    #[test]
    fn deadlines_in_the_past_or_too_far_are_errors() {
        assert!(check_deadline(5, 5).is_ok());
        assert_eq!(
            check_deadline(4, 5),
            Err(TimerError::InPast {
                at_ns: 4,
                now_ns: 5
            })
        );
        assert!(check_deadline(5 + TIMER_HORIZON_NS, 5).is_ok());
        assert!(matches!(
            check_deadline(6 + TIMER_HORIZON_NS, 5),
            Err(TimerError::BeyondHorizon { .. })
        ));
    }
}
