//! Loch cluster bootstrap: the cluster file, preflight checks,
//! and the authenticated control channel that exchanges queue-pair endpoints
//! and memory regions and runs barriers.
//!
//! - [`config`]: the TOML cluster file and its validation.
//! - [`preflight`]: does this machine fit its node (huge pages, memlock,
//!   cores, NIC)?
//! - [`wire`]: control messages and their bounded frames.
//! - [`auth`]: HMAC-SHA256 challenge–response over the cluster secret.
//! - [`channel`]: authenticated TCP connections and the cluster rendezvous.
//! - [`etcd`]: FaRM's configuration store on a real etcd (v3 JSON gateway),
//!   and a local etcd server for tests and the demo.
//!
//! Fuzz targets live in `bootstrap/fuzz` (cargo-fuzz layout, its own
//! workspace); run them with a nightly toolchain and cargo-fuzz:
//!
//! ```text
//! cd bootstrap/fuzz
//! cargo +nightly fuzz run wire_decode -- -max_total_time=60
//! cargo +nightly fuzz run config_parse -- -max_total_time=60
//! ```
//!
//! On stable, `tests/wire.rs` runs a seeded randomized decoder test instead.

pub mod auth;
pub mod channel;
pub mod config;
pub mod etcd;
pub mod preflight;
pub mod wire;

pub use auth::ClusterSecret;
pub use channel::{ChannelError, ChannelOptions, ControlChannel, Directory, Rendezvous};
pub use config::{ClusterConfig, ConfigError};
pub use wire::{Message, WireError};
