//! What a run prints and draws: the table on stdout and the `--plot` charts.

use super::*;

/// The charts of `--plot`: a latency CDF per thread count, and throughput
/// against client threads for a sweep.
pub(crate) fn write_plots(
    dir: &Path,
    done: &[SystemRun],
    thread_list: &[usize],
) -> Result<(), String> {
    std::fs::create_dir_all(dir)
        .map_err(|e| format!("--plot: cannot create `{}`: {e}", dir.display()))?;
    let first = &done[0].spec;
    let what = format!(
        "{}, {} on {} ({})",
        first.workload_label(),
        if first.zipf == 0.0 {
            "uniform".to_string()
        } else {
            format!("zipf {}", first.zipf)
        },
        first.backend.name(),
        first.backend.clock()
    );
    // parse_threads rejects repeats, so each point is one run per system.
    let points = thread_list;
    for &t in points {
        let runs: Vec<&SystemRun> = done.iter().filter(|d| d.spec.threads == t).collect();
        let series: Vec<(String, &Histogram<u64>)> = runs
            .iter()
            .map(|d| (d.spec.system.clone(), &d.report.all_latency))
            .collect();
        let title = format!(
            "Latency CDF: {what}, {} x {t} client threads",
            first.compute_nodes
        );
        let name = if points.len() == 1 {
            "latency-cdf".to_string()
        } else {
            format!("latency-cdf-t{t}")
        };
        write_chart(dir, &name, plot::latency_cdf(&title, &series))?;
    }
    if points.len() > 1 {
        let mut series: Vec<plot::Series> = Vec::new();
        for d in done {
            let p = (
                (d.spec.compute_nodes * d.spec.threads) as f64,
                d.report.ops_per_sec(),
            );
            match series.iter_mut().find(|s| s.name == d.spec.system) {
                Some(s) => s.points.push(p),
                None => series.push(plot::Series {
                    name: d.spec.system.clone(),
                    points: vec![p],
                }),
            }
        }
        for s in &mut series {
            s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        let title = format!("Throughput: {what}");
        write_chart(dir, "throughput", plot::throughput(&title, &series))?;
    }
    Ok(())
}

/// NAME.svg, and NAME.png unless no font could be had for it: then the
/// reason is said once per process and the SVG stands alone.
fn write_chart(dir: &Path, name: &str, drawn: plot::Drawn) -> Result<(), String> {
    outfile::write_atomic(&dir.join(format!("{name}.svg")), drawn.svg.as_bytes())?;
    match drawn.png {
        Ok(png) => outfile::write_atomic(&dir.join(format!("{name}.png")), &png),
        Err(e) => {
            // No PNG beside this SVG: not an older one either.
            let _ = std::fs::remove_file(dir.join(format!("{name}.png")));
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                cmdline::errln!("loch-bench run: warning: --plot: SVG only: {}", e.0)
            });
            Ok(())
        }
    }
}

/// What the table's columns mean, printed under it.
const TABLE_LEGEND: &[&str] = &[
    "Mops/s: measured operations per second, all clients (virtual time on sim)",
    "p50 us, p99 us: operation latency, microseconds",
    "wr<=2rt %, wr<=3rt %: writes that took at most 2 or 3 network round trips",
    "wr p99rt: round trips of the 99th-percentile write",
    "rd<=1rt %: reads (gets, lookups) answered in one round trip",
    "B/w nosp: bytes written back per write that split no node",
    "clean rd%: tree lookups that read a consistent leaf the first time",
    "retry/op: leaf re-reads per operation (torn or changed)",
    "cache%: index-cache hit ratio (hash table: gets answered from its location cache)",
    "n/a: the figure does not apply (a tree's on the hash table, or no such operations)",
];

pub(crate) fn print_table(spec: &RunSpec, rows: &[serde_json::Value]) {
    cmdline::outln!(
        "{} on {} ({}): {} memory nodes, {} compute nodes x {} threads x {} coroutines, {} records, zipf {}",
        spec.workload_label(),
        spec.backend.name(),
        spec.backend.clock(),
        spec.memory_nodes,
        spec.compute_nodes,
        spec.threads,
        spec.coroutines,
        spec.records,
        spec.zipf
    );
    cmdline::outln!(
        "{:<22} {:>10} {:>9} {:>9} {:>10} {:>10} {:>9} {:>10} {:>9} {:>9} {:>9} {:>8}",
        "system",
        "Mops/s",
        "p50 us",
        "p99 us",
        "wr<=2rt %",
        "wr<=3rt %",
        "wr p99rt",
        "rd<=1rt %",
        "B/w nosp",
        "clean rd%",
        "retry/op",
        "cache%"
    );
    // A figure that does not apply (null in the JSON) is n/a.
    let num = |v: &serde_json::Value, scale: f64, width: usize, prec: usize| match v.as_f64() {
        Some(x) => format!("{:>width$.prec$}", x * scale),
        None => format!("{:>width$}", "n/a"),
    };
    for j in rows {
        cmdline::outln!(
            "{:<22} {} {} {} {} {} {} {} {} {} {} {}",
            j["system"].as_str().unwrap_or("?"),
            num(&j["ops_per_sec"], 1e-6, 10, 3),
            num(&j["latency_ns"]["p50"], 1e-3, 9, 1),
            num(&j["latency_ns"]["p99"], 1e-3, 9, 1),
            num(&j["writes_within_2_round_trips"], 100.0, 10, 2),
            num(&j["writes_within_3_round_trips"], 100.0, 10, 2),
            num(&j["write_round_trips_p99"], 1.0, 9, 0),
            num(&j["reads_within_1_round_trip"], 100.0, 10, 2),
            num(&j["bytes_written_per_nonsplit_write"], 1.0, 9, 1),
            num(&j["clean_lookup_ratio"], 100.0, 9, 3),
            num(&j["retries_per_op"], 1.0, 9, 4),
            num(&j["cache_hit_ratio"], 100.0, 8, 2),
        );
    }
    for l in TABLE_LEGEND {
        cmdline::outln!("  {l}");
    }
    if !spec.faults.is_empty() {
        cmdline::outln!(
            "faults (from the start of the workload): {}",
            spec.fault_names().join("; ")
        );
        for j in rows {
            let f = &j["failed_ops"];
            let by: Vec<String> = KINDS
                .iter()
                .filter_map(|k| {
                    let n = f[k.name()].as_u64().unwrap_or(0);
                    (n > 0).then(|| format!("{} {n}", k.name()))
                })
                .collect();
            cmdline::outln!(
                "{}: {} failed operations{}, {} clients unfinished",
                j["system"].as_str().unwrap_or("?"),
                f["total"].as_u64().unwrap_or(0),
                if by.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", by.join(", "))
                },
                j["unfinished_clients"].as_u64().unwrap_or(0)
            );
        }
    }
}
