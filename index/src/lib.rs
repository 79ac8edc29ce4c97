//! # index — Loch's indexes on disaggregated memory
//!
//! Owns the data structures that compute nodes run over one-sided verbs:
//! [`tree`], the Sherman B+tree with HOCL locks, command combination, line
//! versions and the index cache, plus its FG+ baseline; [`cuckoo`], the
//! Nessie lock-free cuckoo hash table, driven by one-sided READ, WRITE and
//! CAS only; [`any`], one client over both; and [`keys`], the keys every
//! workload gives its records. Their concurrency tests
//! check recorded histories with the `history` crate.

pub mod any;
pub mod cuckoo;
pub mod keys;
pub mod tree;

/// Awaits one index operation and checks that it gave its task's scratch
/// back: whatever buffers it allocated are gone when it returns, so a task
/// can run operations forever in a fixed window. Debug builds and the
/// simulator assert it ([`nicdrv::Ctx::scratch_balanced`]).
///
/// A macro, so that the operation's future is made where it is awaited:
/// an `async fn` taking it by value moved the whole future into its own
/// state and again into the await, two copies per operation (on emu, 152
/// instructions of `memcpy` in a 3,936-instruction tree lookup).
macro_rules! scratch_scoped {
    ($ctx:expr, $op:expr) => {{
        let scope_ctx = $ctx;
        let before = scope_ctx.scratch_used();
        let r = $op.await;
        scope_ctx.scratch_balanced(before);
        r
    }};
}
pub(crate) use scratch_scoped;
