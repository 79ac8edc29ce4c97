//! The backend contract: what every NIC backend (emu, sim, mlx5) provides to
//! the executor and to tests. It is ibverbs in Rust clothes: a device
//! context ([`Nic`]), completion queues, reliable-connected queue pairs that
//! execute their work requests in posting order, and memory registration.

use crate::addr::{NodeId, Space};
use crate::local::LocalError;
use crate::verbs::{Access, Caps, Completion, LKey, PostError, RKey, WorkRequest};
use std::fmt;

/// A device context: the handle every per-core resource is made from.
/// Cloning is cheap and shares the device.
pub trait Nic: Clone + 'static {
    type Qp: QueuePair;
    type Cq: CompletionQueue;
    /// What local registration hands back; dropping it deregisters.
    type Reg: Registration;

    fn caps(&self) -> Caps;

    /// The clock executors read once per turn: wall-clock nanoseconds on
    /// real backends, virtual nanoseconds in the simulator.
    fn now_ns(&self) -> u64;

    /// Registers local memory (`ibv_reg_mr`). The region keeps the memory
    /// alive and deregisters before releasing it.
    fn register<M: RegisterableMemory>(
        &self,
        mem: M,
        access: Access,
    ) -> Result<Mr<M, Self::Reg>, RegError>;

    /// Told by the executor after each turn how many completions it routed
    /// and how many task polls it made, so a simulated NIC can charge the
    /// thread's CPU for them. Real backends spend real CPU and ignore it.
    fn charge_turn(&self, _completions: usize, _task_polls: usize) {}

    /// Charges `ns` of local computation (searching a node, hashing) to the
    /// calling thread. Real backends ignore it; the simulator advances the
    /// thread's virtual CPU clock.
    fn charge_cpu(&self, _ns: u64) {}

    /// Whether invariants that debug builds assert are asserted in release
    /// builds too: the simulator's, so its seed sweeps can trip them.
    const ASSERTS_INVARIANTS: bool = false;

    /// Whether every signaled request's completion is in its completion
    /// queue by the time `post_send` returns: the emulator without injected
    /// delay, which does a request's work while posting it. The executor
    /// then polls the queue right after posting and goes on with the task
    /// (a bounded number of times a turn), where it would otherwise return
    /// to its loop and find the completion at the next turn. No real NIC
    /// or simulated one does: a poll straight after a post would find
    /// nothing.
    fn completes_at_post(&self) -> bool {
        false
    }

    /// Whether dropping an executor must first wait for its requests in
    /// flight. The simulator cancels them itself when its world ends.
    fn drain_on_drop(&self) -> bool {
        true
    }

    // ---- machines: the local view (crate::local) ----

    /// Bytes of host memory of the machine this device's thread runs on;
    /// `None` where its node owns no memory.
    fn local_bytes(&self) -> Option<u64> {
        None
    }

    /// Loads the aligned word at `off` of the machine's memory.
    fn local_load(&self, _off: u64) -> Result<u64, LocalError> {
        Err(LocalError::NotAMachine)
    }

    /// Stores the aligned word at `off`.
    fn local_store(&self, _off: u64, _v: u64) -> Result<(), LocalError> {
        Err(LocalError::NotAMachine)
    }

    /// CPU compare-and-swap of the aligned word at `off`; returns the old
    /// word. Atomic with respect to other local CASes, not to NIC atomics.
    fn local_cas(&self, _off: u64, _compare: u64, _swap: u64) -> Result<u64, LocalError> {
        Err(LocalError::NotAMachine)
    }

    /// Copies `buf.len()` bytes at `off` into `buf` (may be torn by a
    /// racing remote WRITE; aligned words never are).
    fn local_read(&self, _off: u64, _buf: &mut [u8]) -> Result<(), LocalError> {
        Err(LocalError::NotAMachine)
    }

    /// Copies `data` to `off`.
    fn local_write(&self, _off: u64, _data: &[u8]) -> Result<(), LocalError> {
        Err(LocalError::NotAMachine)
    }

    // ---- the executor's timers and write waits ----

    /// Slot `slot` of this device's executor waits until a write lands in
    /// `off..off+len` of the machine's memory. A backend that sees writes
    /// land (the simulator) remembers it and wakes the thread when one
    /// does; others ignore it and the waiter re-checks once per turn.
    fn watch_writes(&self, _slot: usize, _off: u64, _len: u64) {}

    /// Slot `slot` waits no more.
    fn unwatch_writes(&self, _slot: usize) {}

    /// Whether a write may have landed in slot `slot`'s watched range since
    /// [`Nic::watch_writes`]. Backends that cannot tell say yes, every turn.
    fn write_seen(&self, _slot: usize) -> bool {
        true
    }

    /// After a turn: the earliest deadline of the executor's timers. A
    /// backend whose threads sleep between events (the simulator) runs the
    /// thread again at `at_ns`; real backends poll and ignore it.
    fn timer_due(&self, _at_ns: u64) {}
}

/// State of a queue pair as the contract sees it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum QpState {
    /// Ready to send (RTS).
    Ready,
    /// A request failed; the rest were flushed; posts are refused until
    /// [`QueuePair::recover`] succeeds.
    Error,
}

/// A region of the peer's memory this queue pair may name, with its rkey.
/// Learnt when the queue pair was connected (bootstrap exchanges them).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RemoteRegion {
    pub space: Space,
    pub offset: u64,
    pub len: u64,
    pub rkey: RKey,
    pub access: Access,
}

impl RemoteRegion {
    pub fn contains(&self, space: Space, offset: u64, len: u64) -> bool {
        space == self.space && range_within(self.offset, self.len, offset, len)
    }
}

/// Whether `[at, at + n)` lies inside `[base, base + len)`; a range or a
/// region whose end would pass 2^64 holds nothing (a plain sum wraps, and
/// an address near `u64::MAX` would pass). Remote regions and local
/// registrations are checked by it alike.
pub(crate) fn range_within(base: u64, len: u64, at: u64, n: u64) -> bool {
    at >= base
        && at
            .checked_add(n)
            .zip(base.checked_add(len))
            .is_some_and(|(end, region_end)| end <= region_end)
}

/// The responder's checks of a request against the regions it exposes, as
/// a NIC makes them: a region under the request's rkey must hold the whole
/// range and grant the right the verb needs (else `RemoteAccess`), and an
/// atomic must be 8-byte aligned (else `RemoteInvalidRequest`).
pub fn responder_check(
    regions: &[RemoteRegion],
    op: &crate::verbs::WrOp,
) -> crate::verbs::WcStatus {
    use crate::verbs::{Opcode, WcStatus};
    let remote = op.remote();
    let (space, off, len) = (remote.space(), remote.offset(), op.len() as u64);
    let opcode = op.opcode();
    let need = match opcode {
        Opcode::Read => Access::REMOTE_READ,
        Opcode::Write => Access::REMOTE_WRITE,
        _ => Access::REMOTE_ATOMIC,
    };
    let rkey = op.rkey();
    if !regions
        .iter()
        .any(|r| r.rkey == rkey && r.contains(space, off, len) && r.access.contains(need))
    {
        WcStatus::RemoteAccess
    } else if opcode.is_atomic() && !off.is_multiple_of(8) {
        WcStatus::RemoteInvalidRequest
    } else {
        WcStatus::Success
    }
}

/// A reliable-connected queue pair to one memory node.
pub trait QueuePair {
    /// Local queue pair number; completions carry it.
    fn qp_num(&self) -> u32;
    /// The memory node this queue pair is connected to.
    fn peer(&self) -> NodeId;
    /// The completion queue this queue pair completes on.
    fn cq_id(&self) -> CqId;
    fn state(&self) -> QpState;
    /// Work requests posted and not yet retired by a polled completion.
    fn outstanding(&self) -> u32;
    /// Send queue depth (`max_send_wr`).
    fn depth(&self) -> u32;
    /// The peer's regions known to this queue pair.
    fn remote_regions(&self) -> &[RemoteRegion];

    /// Posts a batch with one doorbell (`ibv_post_send` on a linked list).
    /// Requests execute in order; only signaled ones complete on success; the
    /// first failure completes with its error and flushes the rest, and the
    /// queue pair enters [`QpState::Error`]. A refused batch executes nothing.
    /// A batch a device takes only in part (mlx5, should the driver refuse
    /// what our checks passed) is not refused: it is reported posted, the
    /// queue pair enters error, and its last request completes as
    /// [`WcStatus::Flushed`](crate::verbs::WcStatus::Flushed) once every
    /// request before it retired.
    ///
    /// # Safety
    /// The local memory of every request that is not an inline WRITE must be
    /// inside a region registered on this device and must stay valid, and
    /// must not be read or written by the CPU if the NIC writes it (READ
    /// targets, atomic results), until a completion of that request or of a
    /// later request on this queue pair has been polled. An inline WRITE's
    /// local memory need not be registered, but must be valid for reads of
    /// its length for the duration of this call (its bytes are copied
    /// before it returns).
    unsafe fn post_send(&mut self, wrs: &[WorkRequest]) -> Result<(), PostError>;

    /// Brings a queue pair in error back to ready (RESET → INIT → RTR → RTS
    /// with the same peer). Allowed once every posted request is retired.
    fn recover(&mut self) -> Result<(), RecoverError>;
}

/// Which completion queue: equal for a queue and the queue pairs that
/// complete on it, and for no other queue of the process.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct CqId(pub usize, pub u32);

/// A completion queue shared by the queue pairs of one core.
pub trait CompletionQueue {
    /// This queue, as [`QueuePair::cq_id`] names it.
    fn id(&self) -> CqId;
    /// Moves up to `out.len()` completions into `out`; returns how many.
    /// Bounded work, never blocks (`ibv_poll_cq`).
    fn poll(&mut self, out: &mut [Completion]) -> usize;
}

/// Why a queue pair could not be recovered.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum RecoverError {
    /// Requests are still outstanding; poll their completions first.
    Busy { outstanding: u32 },
    /// The peer node is dead: the queue pair stays in error.
    PeerDead(NodeId),
}

impl fmt::Display for RecoverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecoverError::Busy { outstanding } => {
                write!(f, "queue pair still has {outstanding} outstanding requests")
            }
            RecoverError::PeerDead(n) => write!(f, "memory node {n} is dead"),
        }
    }
}

impl std::error::Error for RecoverError {}

/// Why registration failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegError {
    /// The memory is empty or its address is null.
    Empty,
    /// The device's table of regions is full.
    TooManyRegions,
    /// The region is larger than the device allows.
    TooLarge { len: u64 },
    /// The device refused (mlx5: errno text).
    Device(String),
}

impl fmt::Display for RegError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegError::Empty => write!(f, "cannot register empty memory"),
            RegError::TooManyRegions => write!(f, "the device's region table is full"),
            RegError::TooLarge { len } => write!(f, "region of {len} bytes is too large"),
            RegError::Device(s) => write!(f, "device refused registration: {s}"),
        }
    }
}

impl std::error::Error for RegError {}

/// Memory that can be registered: a stable pointer and length for as long as
/// the value lives.
///
/// # Safety
/// `as_ptr()..as_ptr()+len()` must be valid for reads and writes, not move,
/// and not be accessed through references while a NIC may write it, for as
/// long as the value is alive.
pub unsafe trait RegisterableMemory {
    fn as_ptr(&self) -> *mut u8;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A backend's registration record; dropping it deregisters.
pub trait Registration {
    fn lkey(&self) -> LKey;
    fn rkey(&self) -> RKey;
}

/// A registered memory region that owns its memory.
pub struct Mr<M, R> {
    // Field order matters: `reg` drops (deregisters) before `mem` is freed.
    reg: R,
    mem: M,
}

impl<M: RegisterableMemory, R: Registration> Mr<M, R> {
    pub fn new(reg: R, mem: M) -> Self {
        Mr { reg, mem }
    }
    pub fn lkey(&self) -> LKey {
        self.reg.lkey()
    }
    pub fn rkey(&self) -> RKey {
        self.reg.rkey()
    }
    pub fn as_ptr(&self) -> *mut u8 {
        self.mem.as_ptr()
    }
    pub fn len(&self) -> usize {
        self.mem.len()
    }
    pub fn is_empty(&self) -> bool {
        self.mem.is_empty()
    }
    pub fn memory(&self) -> &M {
        &self.mem
    }
}

/// Page-aligned, zeroed heap memory owned through a raw pointer, so that a
/// NIC may write it without aliasing any Rust reference.
pub struct HeapMem {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
}

impl HeapMem {
    /// Allocates `len` zeroed bytes aligned to 4 KiB; `None` if `len` is 0 or
    /// the allocation fails.
    pub fn zeroed(len: usize) -> Option<HeapMem> {
        if len == 0 {
            return None;
        }
        let layout = std::alloc::Layout::from_size_align(len, 4096).ok()?;
        // SAFETY: the layout has non-zero size (checked above).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        std::ptr::NonNull::new(ptr).map(|ptr| HeapMem { ptr, layout })
    }
}

impl Drop for HeapMem {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this very layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

// SAFETY: HeapMem owns its allocation outright; moving it to another thread
// moves that ownership.
unsafe impl Send for HeapMem {}

// SAFETY: the pointer comes from a live allocation of `layout.size()` bytes
// that only this value frees, and no reference into it is ever handed out.
unsafe impl RegisterableMemory for HeapMem {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.layout.size()
    }
}
