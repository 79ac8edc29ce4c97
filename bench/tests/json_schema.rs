//! `docs/benchmark-json.md` against what `loch-bench --json` prints: for
//! each command it has a section for, every field a small run prints is
//! named there, and every field named there is printed by one of the
//! runs. A field added, renamed or dropped without the document fails
//! here. Likewise `docs/history-format.md` against a `--history` file:
//! its header's fields and its operations' fields.

mod common;

use common::json_doc;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

const DOC: &str = include_str!("../../docs/benchmark-json.md");
const HISTORY_DOC: &str = include_str!("../../docs/history-format.md");

/// The fields each section (`loch-bench NAME`) names in its tables' first
/// column: a top-level field by its name (`latency_ns.{p50,p99}` and
/// `buckets[]` name `latency_ns` and `buckets`), and a configuration
/// field as `config.NAME`.
fn documented() -> BTreeMap<String, BTreeSet<String>> {
    sections(DOC, |heading| {
        let rest = heading.strip_prefix("`loch-bench ")?;
        Some(rest.split('`').next().unwrap_or_default().to_string())
    })
}

/// The fields named in the first column of the tables under each `## `
/// heading of `doc` that `name` names (the rest are skipped).
fn sections(
    doc: &str,
    name: impl Fn(&str) -> Option<String>,
) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut section = None;
    for line in doc.lines() {
        if let Some(heading) = line.strip_prefix("## ") {
            section = name(heading);
            if let Some(n) = &section {
                out.entry(n.clone()).or_default();
            }
            continue;
        }
        let (Some(s), Some(row)) = (&section, line.strip_prefix("| `")) else {
            continue;
        };
        let cell = format!("`{}", row.split('|').next().unwrap_or_default());
        for name in cell.split('`').skip(1).step_by(2) {
            let mut segs = name.split(['.', '[']);
            let first = segs.next().unwrap_or_default();
            let field = match (first, segs.next()) {
                ("config", Some(c)) => format!("config.{}", c.split(['{', ' ']).next().unwrap()),
                _ => first.to_string(),
            };
            out.get_mut(s).unwrap().insert(field);
        }
    }
    out
}

/// A command line's words.
fn words(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_string).collect()
}

/// The fields of a `--json` document (an array of objects, or one
/// object), named as [`documented`] names them.
fn printed(doc: &Value) -> BTreeSet<String> {
    let objects = match doc {
        Value::Array(a) => a.iter().collect(),
        one => vec![one],
    };
    let mut out = BTreeSet::new();
    for o in objects {
        for (k, v) in o.as_object().expect("an object") {
            match (k.as_str(), v) {
                ("config", Value::Object(c)) => out.extend(c.keys().map(|c| format!("config.{c}"))),
                _ => {
                    out.insert(k.clone());
                }
            }
        }
    }
    out
}

#[test]
fn every_field_written_is_documented_and_every_documented_field_written() {
    let sections = documented();
    let dir = std::env::temp_dir().join(format!("loch-json-schema-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let history = dir.join("history.jsonl");
    let history = history.to_str().unwrap();
    // Small runs, each command line as words; the history run's file is
    // added after (a temporary directory's path may hold spaces).
    let sim_run = "run --records 2000 --ops 20 --warmup 5 --threads 2 --memory-nodes 2";
    let mut history_run = words(&format!(
        "{sim_run} --compute-nodes 1 --systems sherman --workload ycsb-e --json"
    ));
    history_run.extend(["--history".to_string(), history.to_string()]);
    let runs: Vec<(&str, Vec<Vec<String>>)> = vec![
        (
            "run",
            vec![
                words(&format!(
                    "{sim_run} --compute-nodes 2 --systems sherman,cuckoo --json"
                )),
                // Scans and inserts: every field of a history's operations.
                history_run,
                // The BTreeMap reference is emu's alone.
                words(
                    "run --backend emu --records 2000 -D 0.05 --threads 1 --systems sherman --json",
                ),
            ],
        ),
        (
            "verbs",
            vec![
                words("verbs --backend sim --ops 100 --json"),
                words("verbs -D 0.05 --no-pin --json"),
            ],
        ),
        ("ring", vec![words("ring --backend sim -n 100 --json")]),
        ("locks", vec![words("locks --backend sim --ops 50 --json")]),
        ("hash-load", vec![words("hash-load --capacity 1024 --json")]),
        (
            "hash-grow",
            vec![words(
                "hash-grow --capacity 2048 --compute-nodes 1 --threads 2 --json",
            )],
        ),
        ("txn", vec![words("txn --backend sim --txs 50 --json")]),
        (
            "txn --fault",
            vec![words("txn --fault machine-crash@30ms:3 --seeds 1 --json")],
        ),
    ];
    assert_eq!(
        sections.keys().collect::<Vec<_>>(),
        runs.iter()
            .map(|r| r.0)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect::<Vec<_>>(),
        "a section of the document without a run here, or a run without a section"
    );
    let mut wrong = Vec::new();
    for (section, args) in &runs {
        let mut seen = BTreeSet::new();
        for a in args {
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            seen.extend(printed(&json_doc(&a)));
        }
        let named = &sections[*section];
        let undocumented: Vec<_> = seen.difference(named).collect();
        let unprinted: Vec<_> = named.difference(&seen).collect();
        if !undocumented.is_empty() || !unprinted.is_empty() {
            wrong.push(format!(
                "loch-bench {section}: printed but not in docs/benchmark-json.md: \
                 {undocumented:?}; there but not printed: {unprinted:?}"
            ));
        }
    }
    wrong.extend(history_fields_documented(history));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// What differs between `docs/history-format.md` and the history file at
/// `path`: the header's fields, and the fields of its operations (with
/// `type`, which the document names in the heading).
fn history_fields_documented(path: &str) -> Vec<String> {
    let doc = sections(HISTORY_DOC, |heading| match heading {
        h if h.contains("The header") => Some("header".into()),
        h if h.contains("Operations") => Some("op".into()),
        _ => None,
    });
    let text = std::fs::read_to_string(path).expect("the history file");
    let mut seen: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text.lines() {
        let v: Value = serde_json::from_str(line).expect("a JSON line");
        let o = v.as_object().expect("an object");
        let kind = o["type"].as_str().expect("a type").to_string();
        seen.entry(kind).or_default().extend(o.keys().cloned());
    }
    let mut wrong = Vec::new();
    for kind in ["header", "op"] {
        let mut named = doc[kind].clone();
        named.insert("type".into());
        let got = &seen[kind];
        let undocumented: Vec<_> = got.difference(&named).collect();
        let unprinted: Vec<_> = named.difference(got).collect();
        if !undocumented.is_empty() || !unprinted.is_empty() {
            wrong.push(format!(
                "history {kind} lines: written but not in docs/history-format.md: \
                 {undocumented:?}; there but not written: {unprinted:?}"
            ));
        }
    }
    wrong
}
