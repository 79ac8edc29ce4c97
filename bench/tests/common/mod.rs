//! Helpers shared by the `loch-bench` tests: running the binary, and the
//! JSON document of a run that must succeed.
#![allow(dead_code)]

use std::process::{Command, Output};

/// `loch-bench` run with `args`, to its end.
pub fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_loch-bench"))
        .args(args)
        .output()
        .expect("run loch-bench")
}

/// The JSON document of a `--json` run that must succeed.
pub fn json_doc(args: &[&str]) -> serde_json::Value {
    let out = bench(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}
