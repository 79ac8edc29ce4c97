//! # index — Loch's indexes on disaggregated memory
//!
//! Owns the data structures that compute nodes run over one-sided verbs:
//! [`tree`], the Sherman B+tree with HOCL locks, command combination, line
//! versions and the index cache, plus its FG+ baseline. The Nessie cuckoo
//! hash joins later.

pub mod tree;
