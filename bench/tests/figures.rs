//! The paper's figures committed under `bench/paper/results/` stay what the
//! code produces. The simulator is deterministic, so a few of its figures,
//! cheap enough for every test run (about ten seconds in release), are run
//! again here and compared with the committed JSON field by field, all but
//! the wall time. A change that moves one fails here until its figures are
//! measured again with the script that produced them (named in each case),
//! so that `results/` never shows what the code no longer does (two hash
//! figures once went stale that way for a day).

mod common;

use std::path::Path;

use common::json_doc;
use serde_json::Value;

/// `v` without its wall-clock fields, which differ from run to run.
fn without_wall_time(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| k.as_str() != "wall_sec")
                .map(|(k, v)| (k.clone(), without_wall_time(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(without_wall_time).collect()),
        v => v.clone(),
    }
}

/// The paths (`.a.b[3]`) at which `a` and `b` differ, at most `max`.
fn differences(a: &Value, b: &Value, at: String, max: usize, out: &mut Vec<String>) {
    if out.len() >= max {
        return;
    }
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                match (x.get(k), y.get(k)) {
                    (Some(p), Some(q)) => differences(p, q, format!("{at}.{k}"), max, out),
                    (p, _) => out.push(format!(
                        "{at}.{k}: only in the {}",
                        if p.is_some() { "committed file" } else { "run" }
                    )),
                }
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                differences(p, q, format!("{at}[{i}]"), max, out);
            }
        }
        _ if a != b => out.push(format!("{at}: committed {a}, now {b}")),
        _ => {}
    }
}

fn committed(file: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("paper/results")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"))
}

/// The one element of the committed array `file` whose `key` is `name`.
fn committed_entry(file: &str, key: &str, name: &str) -> Value {
    let all = committed(file);
    let mut found = all
        .as_array()
        .unwrap_or_else(|| panic!("{file}: not an array"))
        .iter()
        .filter(|e| e[key] == name);
    let one = found.next().unwrap_or_else(|| panic!("{file}: no {name}"));
    assert!(found.next().is_none(), "{file}: {name} twice");
    one.clone()
}

#[test]
fn the_committed_simulator_figures_are_what_the_code_produces() {
    let cases: [(&str, &str, Value, Vec<&str>); 4] = [
        (
            "nessie_load.json",
            "bench/paper/nessie_load.sh",
            committed("nessie_load.json"),
            vec!["hash-load", "--capacity", "65536", "--json"],
        ),
        (
            "nessie_load_grow.json",
            "bench/paper/nessie_load.sh",
            committed("nessie_load_grow.json"),
            vec![
                "hash-load",
                "--capacity",
                "16384",
                "--max-capacity",
                "131072",
                "--json",
            ],
        ),
        // One system of the three the script runs together: each system's
        // run is a world of its own, so it comes out the same alone.
        (
            "rt-write.json (sherman-2rt)",
            "bench/paper/round_trips.sh",
            Value::Array(vec![committed_entry(
                "rt-write.json",
                "system",
                "sherman-2rt",
            )]),
            vec![
                "run",
                "--systems",
                "sherman-2rt",
                "--workload",
                "write-intensive",
                "--records",
                "1000000",
                "--ops",
                "3000",
                "--json",
            ],
        ),
        (
            "locks.json (dm+local+queue+handover)",
            "bench/paper/locks.sh",
            Value::Array(vec![committed_entry(
                "locks.json",
                "variant",
                "dm+local+queue+handover",
            )]),
            vec![
                "locks",
                "--locks",
                "1000",
                "--zipf",
                "0.99",
                "--variants",
                "dm+local+queue+handover",
                "--json",
            ],
        ),
    ];
    let mut stale = Vec::new();
    for (name, script, want, args) in cases {
        let got = json_doc(&args);
        let mut diff = Vec::new();
        differences(
            &without_wall_time(&want),
            &without_wall_time(&got),
            String::new(),
            5,
            &mut diff,
        );
        if !diff.is_empty() {
            stale.push(format!(
                "{name} (`loch-bench {}`; measure it again with {script}):\n  {}",
                args.join(" "),
                diff.join("\n  ")
            ));
        }
    }
    assert!(
        stale.is_empty(),
        "committed figures the code no longer produces:\n{}",
        stale.join("\n")
    );
}

/// The comparison itself: a changed field, a field only on one side and a
/// wall time that differs are told apart.
#[test]
fn the_comparison_names_what_differs_and_ignores_the_wall_time() {
    let a: Value = serde_json::json!({"x": 1, "wall_sec": 2.0, "v": [1, {"y": 2}]});
    let b: Value = serde_json::json!({"x": 1, "wall_sec": 9.0, "v": [1, {"y": 3}], "z": 0});
    let mut diff = Vec::new();
    differences(
        &without_wall_time(&a),
        &without_wall_time(&b),
        String::new(),
        5,
        &mut diff,
    );
    assert_eq!(
        diff,
        [".v[1].y: committed 2, now 3", ".z: only in the run"],
        "{diff:?}"
    );
    let mut none = Vec::new();
    differences(
        &without_wall_time(&a),
        &without_wall_time(&a),
        String::new(),
        5,
        &mut none,
    );
    assert!(none.is_empty());
}
