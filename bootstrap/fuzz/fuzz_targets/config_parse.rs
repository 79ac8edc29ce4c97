//! Any text as a cluster file: a config or a `ConfigError`, never a panic.
//! `parse` touches no file, so this runs without a secret on disk.
#![no_main]

use std::path::Path;

use bootstrap::config::ClusterConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Err(e) = ClusterConfig::parse(Path::new("fuzz.toml"), text) {
            // The message must render (no panicking Display either).
            let _ = e.to_string();
        }
    }
});
