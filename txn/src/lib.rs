//! Loch transactions (FaRM, SOSP 2015): objects in replicated regions,
//! read lock-free with one-sided READs and committed by FaRM's optimistic
//! protocol through message and log rings in the machines' memory.

pub mod alloc;
pub mod config;
pub mod coord;
pub mod error;
pub mod harness;
pub mod history;
pub mod layout;
pub mod lease;
pub mod need;
pub mod object;
pub mod reconfig;
pub mod records;
pub mod recovery;
pub mod regions;
pub mod ring;
pub mod server;
pub mod workload;

pub use coord::{CoordStats, Coordinator, Outcome, Tx};
pub use error::{Abort, TxError};
pub use layout::Geometry;
pub use records::ObjAddr;
pub use server::{Server, ServerStats};
