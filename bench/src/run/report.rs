//! What a run measured ([`Report`], per kind of operation), and its JSON
//! document.

use super::*;

/// What the clients measured.
pub struct KindStats {
    pub count: u64,
    pub latency: Histogram<u64>,
    pub rtt: Vec<u64>,
    pub bytes_written: u64,
    pub bytes_read: u64,
    /// Writes that split nothing, and their bytes written.
    pub nosplit: u64,
    pub nosplit_bytes: u64,
    /// Operations that failed (only a run with faults goes on after one),
    /// warm-up included.
    pub failed: u64,
}

/// A run that failed: why, and the history its clients recorded until
/// then (where one was recorded), the operation that failed left pending.
pub struct Failed {
    pub why: String,
    pub history: Option<HistLog>,
}

impl From<String> for Failed {
    /// A failure before any client ran: no history.
    fn from(why: String) -> Failed {
        Failed { why, history: None }
    }
}

impl From<&str> for Failed {
    fn from(why: &str) -> Failed {
        Failed::from(why.to_string())
    }
}

/// A history and which of its events were measured (not warm-up).
#[derive(Default)]
pub struct HistLog {
    pub history: History,
    pub measured: Vec<bool>,
}

impl HistLog {
    pub(crate) fn invoke(&mut self, client: u32, op: Op, now_ns: u64, measured: bool) -> OpId {
        self.measured.push(measured);
        self.history.invoke(client, op, now_ns)
    }

    pub(crate) fn append(&mut self, other: HistLog) {
        // Moved, not cloned: a scan's result is not copied at the end of
        // a run, when the history is at its largest.
        self.history.append(other.history);
        self.measured.extend(other.measured);
    }

    /// The history file (see `docs/history-format.md`): `header`, then one
    /// `initial` line per bulk-loaded record, then every operation, warm-up
    /// included, in invocation order (emu merges per-core histories, so the
    /// file sorts them), each marked `measured` or not; written line by
    /// line into `out`.
    pub fn write_file(
        &self,
        out: &mut dyn std::io::Write,
        header: &serde_json::Value,
        initial: &[(u64, u64)],
    ) -> std::io::Result<()> {
        let mut events: Vec<_> = self.history.events().iter().zip(&self.measured).collect();
        events.sort_by_key(|(e, _)| e.invoke_ns);
        writeln!(out, "{header}")?;
        for (k, v) in initial {
            writeln!(out, "{{\"type\":\"initial\",\"key\":{k},\"value\":{v}}}")?;
        }
        // One line at a time through a buffer the lines reuse.
        let mut line = String::with_capacity(256);
        for (e, &m) in &events {
            line.clear();
            e.write_json(
                &mut line,
                if m {
                    "\"type\":\"op\",\"measured\":true,"
                } else {
                    "\"type\":\"op\",\"measured\":false,"
                },
            );
            line.push('\n');
            out.write_all(line.as_bytes())?;
        }
        Ok(())
    }
}

pub struct Report {
    pub kinds: Vec<KindStats>,
    pub all_latency: Histogram<u64>,
    pub elapsed_ns: u64,
    pub tree: TreeStats,
    pub ops: u64,
    pub wall_sec: f64,
    pub sim_events: u64,
    pub history: Option<HistLog>,
    /// Clients that did not run to their end: a run with faults stops once
    /// the clients that can have finished (those left were stuck or on a
    /// crashed compute node).
    pub unfinished_clients: u64,
}

impl Report {
    /// Adds another core's report to this one.
    pub(crate) fn absorb(&mut self, r: Report) {
        for (a, b) in self.kinds.iter_mut().zip(r.kinds) {
            a.count += b.count;
            a.latency.add(&b.latency).expect("same bounds");
            for (x, y) in a.rtt.iter_mut().zip(b.rtt) {
                *x += y;
            }
            a.bytes_written += b.bytes_written;
            a.bytes_read += b.bytes_read;
            a.nosplit += b.nosplit;
            a.nosplit_bytes += b.nosplit_bytes;
            a.failed += b.failed;
        }
        self.unfinished_clients += r.unfinished_clients;
        self.all_latency.add(&r.all_latency).expect("same bounds");
        self.tree += r.tree;
        self.ops += r.ops;
        // Each core returned its end time; the run ends with the last.
        self.elapsed_ns = self.elapsed_ns.max(r.elapsed_ns);
        if let (Some(a), Some(b)) = (self.history.as_mut(), r.history) {
            a.append(b);
        }
    }
}

pub(crate) fn rtt_quantile(h: &[u64], q: f64) -> u64 {
    let total: u64 = h.iter().sum();
    if total == 0 {
        return 0;
    }
    let target = ((total as f64) * q).ceil() as u64;
    let mut acc = 0;
    for (i, &c) in h.iter().enumerate() {
        acc += c;
        if acc >= target {
            return i as u64;
        }
    }
    (h.len() - 1) as u64
}

pub(crate) fn rtt_mean(h: &[u64]) -> f64 {
    let total: u64 = h.iter().sum();
    if total == 0 {
        return 0.0;
    }
    h.iter()
        .enumerate()
        .map(|(i, &c)| i as u64 * c)
        .sum::<u64>() as f64
        / total as f64
}

impl Report {
    pub fn ops_per_sec(&self) -> f64 {
        if self.elapsed_ns == 0 {
            0.0
        } else {
            self.ops as f64 * 1e9 / self.elapsed_ns as f64
        }
    }

    /// Round-trip histogram over all writes.
    pub fn write_rtt(&self) -> Vec<u64> {
        let mut h = vec![0; 65];
        for k in KINDS.iter().filter(|k| k.is_write()) {
            for (x, y) in h.iter_mut().zip(&self.kinds[k.ix()].rtt) {
                *x += y;
            }
        }
        h
    }
}

/// The version of the JSON `loch-bench` writes (docs/benchmark-json.md);
/// it changes when a field changes meaning or goes.
pub const SCHEMA_VERSION: u64 = 1;

/// A tree configuration as JSON values, one field each.
fn tree_config_json(t: &TreeConfig, layout: Layout) -> serde_json::Value {
    json!({
        "combine": t.combine,
        "lock_in_dm": t.lock_in_dm,
        "local_lock_table": t.local_lock_table,
        "local_wait_queue": t.local_wait_queue,
        "handover": t.handover,
        "max_handover": t.max_handover,
        "lock_with_read": t.lock_with_read,
        "handover_page": t.handover_page,
        "versions": match t.versions {
            index::tree::VersionScheme::Lines => "lines",
            index::tree::VersionScheme::FrontRear => "front-rear",
        },
        "whole_node_writes": t.whole_node_writes,
        "lock_table_words": t.lock_table_words,
        "cache_bytes": t.cache_bytes,
        "chunk_bytes": t.chunk.chunk_bytes,
        "key_bytes": layout.key_bytes(),
        "value_bytes": t.value_bytes,
        "node_bytes": layout.node_bytes(),
    })
}

pub fn report_json(spec: &RunSpec, r: &Report) -> serde_json::Value {
    let per = |v: u64| {
        if r.ops == 0 {
            0.0
        } else {
            v as f64 / r.ops as f64
        }
    };
    let mut rt = serde_json::Map::new();
    for k in KINDS {
        let s = &r.kinds[k.ix()];
        if s.count == 0 {
            continue;
        }
        let last = s.rtt.iter().rposition(|&c| c > 0).unwrap_or(0);
        rt.insert(
            k.name().into(),
            json!({
                "count": s.count,
                "mean": rtt_mean(&s.rtt),
                "p50": rtt_quantile(&s.rtt, 0.5),
                "p99": rtt_quantile(&s.rtt, 0.99),
                "hist": &s.rtt[..=last],
                "latency_ns": {"p50": s.latency.value_at_quantile(0.5), "p99": s.latency.value_at_quantile(0.99)},
            }),
        );
    }
    let w = r.write_rtt();
    let writes: u64 = w.iter().sum();
    let le2: u64 = w.iter().take(3).sum();
    let le3: u64 = w.iter().take(4).sum();
    let nosplit: u64 = KINDS.iter().map(|k| r.kinds[k.ix()].nosplit).sum();
    let nosplit_bytes: u64 = KINDS.iter().map(|k| r.kinds[k.ix()].nosplit_bytes).sum();
    let mut failed_ops = serde_json::Map::new();
    failed_ops.insert(
        "total".into(),
        json!(r.kinds.iter().map(|k| k.failed).sum::<u64>()),
    );
    for k in KINDS {
        failed_ops.insert(k.name().into(), json!(r.kinds[k.ix()].failed));
    }
    let bw: u64 = r.kinds.iter().map(|k| k.bytes_written).sum();
    let br: u64 = r.kinds.iter().map(|k| k.bytes_read).sum();
    // A figure that does not apply — a tree's on a hash table, a ratio of
    // nothing — is null, not zero.
    let tree = spec.system != "cuckoo";
    let tree_only = |v: serde_json::Value| if tree { v } else { json!(null) };
    let ratio = |num: u64, den: u64| {
        if den == 0 {
            json!(null)
        } else {
            json!(num as f64 / den as f64)
        }
    };
    let mut doc = json!({
        "schema_version": SCHEMA_VERSION,
        "system": spec.system,
        "index": if tree { "tree" } else { "hash" },
        "backend": spec.backend.name(),
        "simulated": spec.backend == Backend::Sim,
        "workload": spec.mix.name,
        "half_workload": spec.half_mix.as_ref().map(|h| h.name.clone()),
        "zipf": spec.zipf,
        "request_distribution": spec.mix.request.name(),
        "ops": r.ops,
        "elapsed_ns": r.elapsed_ns,
        "ops_per_sec": r.ops_per_sec(),
        "latency_ns": {
            "p50": r.all_latency.value_at_quantile(0.5),
            "p90": r.all_latency.value_at_quantile(0.9),
            "p99": r.all_latency.value_at_quantile(0.99),
            "p999": r.all_latency.value_at_quantile(0.999),
        },
        "round_trips": rt,
        "reads_within_1_round_trip": ratio(
            r.kinds[Kind::Read.ix()].rtt.get(1).copied().unwrap_or(0),
            r.kinds[Kind::Read.ix()].count,
        ),
        "writes_within_2_round_trips": ratio(le2, writes),
        "writes_within_3_round_trips": ratio(le3, writes),
        "write_round_trips_p99": if writes == 0 { json!(null) } else { json!(rtt_quantile(&w, 0.99)) },
        "bytes_written_per_op": per(bw),
        "bytes_read_per_op": per(br),
        "bytes_written_per_nonsplit_write": tree_only(ratio(nosplit_bytes, nosplit)),
        "retries_per_op": tree_only(json!(per(r.tree.read_retries))),
        "lock_retries_per_op": tree_only(json!(per(r.tree.lock_retries))),
        "handovers_per_op": tree_only(json!(per(r.tree.handovers))),
        "clean_lookup_ratio": tree_only(ratio(r.tree.clean_lookups, r.tree.lookups)),
        "cache_hit_ratio": ratio(r.tree.cache_hits, r.tree.cache_hits + r.tree.cache_misses),
        "splits": tree_only(json!(r.tree.splits)),
        "wall_sec": r.wall_sec,
        "sim_events": r.sim_events,
        "config": {
            "memory_nodes": spec.memory_nodes,
            "compute_nodes": spec.compute_nodes,
            "threads_per_compute_node": spec.threads,
            "coroutines_per_thread": spec.coroutines,
            "records": spec.records,
            "ops_per_client": match spec.length { Length::Ops(n) => json!(n), Length::Nanos(_) => json!(null) },
            "seconds": match spec.length { Length::Ops(_) => json!(null), Length::Nanos(d) => json!(d as f64 / 1e9) },
            "max_scan_length": spec.mix.max_scan,
            "ycsb_fieldcount": spec.mix.field_count,
            "ycsb_fieldlength": spec.mix.field_length,
            "warmup_per_client": spec.warmup,
            "sim_model_overrides": spec.model.overrides(),
            "seed": spec.seed,
            "cache_bytes": spec.cache_bytes,
            "hash_grace_ns": spec.hash_grace_ns,
            "tree": tree_config_json(&spec.tree, spec.layout()),
        },
    });
    doc["failed_ops"] = failed_ops.into();
    doc["unfinished_clients"] = json!(r.unfinished_clients);
    doc["faults"] = json!(spec.fault_names());
    doc
}
