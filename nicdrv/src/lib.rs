//! # nicdrv — the NIC contract of Loch
//!
//! Owns everything between Loch's data structures and the wire: global
//! addresses ([`addr`]), the verbs vocabulary ([`verbs`]), the backend
//! contract ([`nic`]) that every backend keeps, the backends themselves
//! ([`emu`], [`sim`], and `mlx5` behind the cargo feature of that name), per-task counters
//! ([`counters`]), the per-core run-to-completion executor ([`exec`]) and
//! the one warning every huge-page fallback shares ([`pages`]).
//!
//! Promises to upper layers: work requests on one queue pair
//! execute in posting order; only signaled requests complete on success; a
//! failure completes with its status and flushes the rest of the queue
//! pair; READs and WRITEs longer than 8 bytes are not atomic (a concurrent
//! READ may see a torn mix of lines), but each aligned 64-byte line lands
//! whole and aligned 8-byte words never tear; atomics are
//! atomic with respect to other NIC atomics; nothing orders two queue pairs.

pub mod addr;
pub mod clock;
pub mod conformance;
pub mod counters;
pub mod emu;
pub mod exec;
pub mod gids;
pub mod local;
#[cfg(feature = "mlx5")]
pub mod mlx5;
pub mod nic;
pub mod pages;
pub mod rng;
pub mod sim;
pub mod verbs;

pub use addr::{GlobalAddr, NodeId, Space};
pub use counters::VerbCounters;
pub use exec::{Batch, Buf, Ctx, Done, ExecError, Executor, ExecutorConfig, OpId, VerbError};
pub use local::{LocalError, TimerError, WaitError, Woken};
pub use nic::{
    CompletionQueue, CqId, HeapMem, Mr, Nic, QpState, QueuePair, RegisterableMemory, RemoteRegion,
};
pub use verbs::{
    Access, Caps, Completion, LKey, Opcode, PostError, RKey, Sge, WcStatus, WorkRequest, WrOp,
};
