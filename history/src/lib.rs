//! # history — what a run did, and whether it was allowed
//!
//! Owns the recording of operation histories and their checkers, apart
//! from the systems they judge so that every system's tests (and the
//! benchmark's `--check-history`) use one checker, and so that checkers of
//! other models can sit beside it:
//! - [`map`]: a `u64 → u64` map's histories, checked for per-key
//!   linearizability, with the scan rules of an ordered index (the Sherman
//!   B+tree and the Nessie hash table are both judged by it).
//!
//! It depends on nothing else of Loch's.

pub mod map;
