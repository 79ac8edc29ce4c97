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

use nicdrv::{Ctx, Nic};
use std::future::Future;

/// Runs one index operation and checks that it gave its task's scratch back:
/// whatever buffers it allocated are gone when it returns, so a task can run
/// operations forever in a fixed window. Debug builds and the simulator
/// assert it ([`Ctx::scratch_balanced`]).
pub(crate) async fn scratch_scoped<N: Nic, T>(ctx: &Ctx<N>, op: impl Future<Output = T>) -> T {
    let before = ctx.scratch_used();
    let r = op.await;
    ctx.scratch_balanced(before);
    r
}
