//! `loch demo` as a user runs it: it boots, works, checks itself and exits 0;
//! bad flags exit 2.

use std::process::Command;

#[test]
fn demo_runs_and_passes_its_checks() {
    let out = Command::new(env!("CARGO_BIN_EXE_loch"))
        .args(["demo", "--seconds", "0.5", "--no-pin"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "operations/s",
        "round trips/op",
        "bytes read/op",
        "latency p50",
        "latency p99",
    ] {
        assert!(stdout.contains(line), "summary lacks {line}: {stdout}");
    }
    assert_eq!(stdout.matches(": ok").count(), 8, "{stdout}");
    assert!(stdout.contains("hash table (Nessie"), "{stdout}");
    assert!(stdout.contains("B+tree"), "{stdout}");
}

#[test]
fn demo_on_sim_is_deterministic_and_passes_its_checks() {
    let run = || {
        let out = Command::new(env!("CARGO_BIN_EXE_loch"))
            .args([
                "demo",
                "--backend",
                "sim",
                "--seed",
                "9",
                "--seconds",
                "0.002",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let s = String::from_utf8(out.stdout).unwrap();
        assert_eq!(s.matches(": ok").count(), 8, "{s}");
        assert!(s.contains("SIMULATED"), "{s}");
        // Everything but the wall-clock speed is a function of the seed.
        s.lines()
            .map(|l| {
                if l.starts_with("loch demo summary") {
                    l.split(';').next().unwrap().to_string() + &l[l.find("trace").unwrap()..]
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(run(), run());
}

#[test]
fn demo_refuses_bad_flags() {
    for args in [
        &["demo", "--cores", "zero"][..],
        &["demo", "--warp"],
        &["teleport"],
        &["demo", "--seconds", "0"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_loch"))
            .args(args)
            .output()
            .unwrap();
        assert_ne!(out.status.code(), Some(0), "{args:?}");
        assert!(!out.stderr.is_empty(), "{args:?}");
    }
}
