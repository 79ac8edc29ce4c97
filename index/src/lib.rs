//! # index — Loch's indexes on disaggregated memory
//!
//! Owns the data structures that compute nodes run over one-sided verbs:
//! [`tree`], the Sherman B+tree with HOCL locks, command combination, line
//! versions and the index cache, plus its FG+ baseline; and [`history`],
//! the recorder and linearizability checker their concurrency tests (and
//! the benchmark's `--history`) use. [`cuckoo`] is the Nessie lock-free
//! cuckoo hash table, driven by one-sided READ, WRITE and CAS only.

pub mod any;
pub mod cuckoo;
pub mod history;
pub mod tree;
