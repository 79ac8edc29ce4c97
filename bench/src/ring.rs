//! `loch-bench ring`: one sender core and one receiver core on two
//! machines, records through one ring (txn::ring): records per second and
//! one-way latency (the sender stamps each record with its clock; the
//! receiver subtracts it on arrival). On emu both cores share the host's
//! monotonic clock; on sim the clock is virtual and the table adds what
//! the model predicts for one record (a WRITE one way, then the poll).

use crate::args::{size_value, ArgError, Backend};
use cluster::stats::latency_histogram;
use hdrhistogram::Histogram;
use nicdrv::sim::{RunEnd, SimConfig, SimModel, World};
use nicdrv::{Ctx, Executor, ExecutorConfig, Nic};
use serde_json::json;
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use txn::ring::{record_bytes, Receiver, RingError, RingLayout, Sender};

/// `loch-bench ring`: records through one ring between two machines.
#[derive(clap::Args, Debug)]
#[command(after_help = RING_AFTER_HELP)]
pub struct RingArgs {
    /// emu: two machines on this host, two pinned cores, wall clock; sim:
    /// two simulated machines, virtual time; mlx5: as emu, through this
    /// host's RDMA device in loopback (a --features mlx5 build)
    #[arg(long, value_enum, ignore_case = true, default_value_t = Backend::Emu)]
    backend: Backend,
    #[command(flatten)]
    device: crate::args::DeviceArgs,
    /// Payload bytes per record (at least 16: the sender's timestamp and
    /// the record's number)
    #[arg(short = 's', long, value_parser = size_value, default_value = "64")]
    size: usize,
    /// Records to send (default emu and mlx5 2000000, sim 100000)
    #[arg(short = 'n', long, visible_alias = "iters", value_name = "N")]
    records: Option<u64>,
    /// Records per doorbell (1 ..= 15), each its own WRITE
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Ring capacity (a multiple of 16, at least 32; a record's payload is
    /// at most half of it less 16 bytes; at most what a machine here holds
    /// for it, 4032 KiB)
    #[arg(long, value_parser = size_value, default_value = "64k")]
    capacity: usize,
    /// The simulation's seed (sim) [default: 1]
    #[arg(long)]
    seed: Option<u64>,
    /// Do not pin the threads to cores (emu and mlx5)
    #[arg(long)]
    no_pin: bool,
    /// One JSON document on stdout
    #[arg(long)]
    json: bool,
}

const RING_AFTER_HELP: &str = "\
Columns: backend, payload bytes per record, records, records/s (Mrec/s), one-way latency
p50/p90/p99/p999/max in microseconds (sender's clock at append to receiver's clock at
acceptance), sender waits (appends that found the ring full), torn looks (receiver looks that
found a record in part and read it again).
Exit codes: 0 done; 1 the benchmark failed (a record lost or altered, a verb failed); 2 bad
input (one line naming it; nothing run); 130 stopped by SIGINT or SIGTERM (the records sent
until then are reported).";

const HOST: u64 = 4 << 20;

/// How long either end waits for the other before the run fails (10 s,
/// virtual on sim).
const PATIENCE_NS: u64 = 10_000_000_000;

fn layout(capacity: u64) -> RingLayout {
    RingLayout {
        receiver: 1,
        ring_off: 64 << 10,
        capacity,
        receiver_head_off: 0,
        sender: 0,
        sender_head_off: 0,
        sender_tail_off: 8,
    }
}

/// The number an end record carries in place of its sequence number: the
/// sender stopped early (SIGINT/SIGTERM) and sends no more.
const END: u64 = u64::MAX;

/// What one run measured.
struct Measured {
    /// Records received (fewer than asked if the run was stopped).
    records: u64,
    latency: Histogram<u64>,
    elapsed_ns: u64,
    sender_waits: u64,
    torn_looks: u64,
}

/// The sender: `n` records of `size` bytes, `batch` per doorbell, each
/// stamped with the clock and numbered; returns how often the ring had no
/// room for a doorbell's records at once. Stopped by a signal, it sends
/// one record numbered [`END`] instead of the rest.
async fn send<N: Nic>(
    ctx: &Ctx<N>,
    l: RingLayout,
    n: u64,
    size: usize,
    batch: usize,
) -> Result<u64, RingError> {
    let mut s = Sender::open(ctx, l)?;
    let mut bufs = vec![vec![0u8; size]; batch];
    let mut waits = 0;
    let mut i = 0;
    while i < n {
        if cmdline::signals::stop_requested() {
            bufs[0][8..16].copy_from_slice(&END.to_le_bytes());
            s.append_many(ctx, &[&bufs[0]], Some(ctx.now_ns() + PATIENCE_NS))
                .await?;
            break;
        }
        let k = batch.min((n - i) as usize);
        let need: u64 = bufs[..k].iter().map(|b| record_bytes(b.len() as u64)).sum();
        waits += u64::from(s.free(ctx)? < need);
        let now = ctx.nic().now_ns();
        for (j, p) in bufs[..k].iter_mut().enumerate() {
            p[..8].copy_from_slice(&now.to_le_bytes());
            p[8..16].copy_from_slice(&(i + j as u64).to_le_bytes());
        }
        let refs: Vec<&[u8]> = bufs[..k].iter().map(Vec::as_slice).collect();
        // A receiver that stopped taking records ends the run, not hangs it.
        s.append_many(ctx, &refs, Some(ctx.now_ns() + PATIENCE_NS))
            .await?;
        i += k as u64;
    }
    Ok(waits)
}

/// The receiver: `n` records (fewer if an [`END`] record comes first),
/// checked in order, latencies recorded; returns (records, latencies,
/// first arrival, last arrival, torn looks).
async fn receive<N: Nic>(
    ctx: &Ctx<N>,
    l: RingLayout,
    n: u64,
    size: usize,
) -> Result<Received, String> {
    let mut r = Receiver::open(ctx, l).map_err(|e| e.to_string())?;
    let mut h = latency_histogram();
    let (mut first, mut last) = (0, 0);
    let mut p = Vec::with_capacity(size);
    for i in 0..n {
        r.recv_into(ctx, &mut p, Some(ctx.now_ns() + PATIENCE_NS))
            .await
            .map_err(|e| format!("record {i}: {e}"))?;
        let now = ctx.nic().now_ns();
        if p.len() != size {
            return Err(format!("record {i}: {} bytes, not {size}", p.len()));
        }
        if p[8..16] == END.to_le_bytes() {
            return Ok((i, h, first, last, r.torn_looks()));
        }
        if p[8..16] != i.to_le_bytes() {
            return Err(format!("record {i} arrived out of order or altered"));
        }
        let sent = u64::from_le_bytes(p[..8].try_into().expect("8 bytes"));
        let _ = h.record(now.saturating_sub(sent).max(1));
        if i == 0 {
            first = sent;
        }
        last = now;
    }
    Ok((n, h, first, last, r.torn_looks()))
}

/// What the receiver returns: (records, latencies, first arrival, last
/// arrival, torn looks).
type Received = (u64, Histogram<u64>, u64, u64, u64);

fn run_sim(
    seed: u64,
    l: RingLayout,
    n: u64,
    size: usize,
    batch: usize,
) -> Result<Measured, String> {
    let mut w = World::new(SimConfig {
        seed,
        memory_nodes: 2,
        compute_nodes: 2,
        machines: 2,
        host_bytes: HOST,
        ..Default::default()
    })
    .map_err(|e| e.to_string())?;
    let cfg = ExecutorConfig {
        slots: 1,
        ..Default::default()
    };
    let waits = Rc::new(RefCell::new(Err("the sender did not finish".to_string())));
    let got = Rc::new(RefCell::new(Err("the receiver did not finish".to_string())));
    let (wa, g) = (waits.clone(), got.clone());
    let ts = w.add_thread(0, cfg).map_err(|e| e.to_string())?;
    w.spawn(ts, move |ctx| async move {
        *wa.borrow_mut() = send(&ctx, l, n, size, batch)
            .await
            .map_err(|e| e.to_string());
    })
    .map_err(|e| e.to_string())?;
    let tr = w.add_thread(1, cfg).map_err(|e| e.to_string())?;
    w.spawn(tr, move |ctx| async move {
        *g.borrow_mut() = receive(&ctx, l, n, size).await;
    })
    .map_err(|e| e.to_string())?;
    if w.run() != RunEnd::Done {
        return Err("the simulated sender and receiver did not finish".into());
    }
    let sender_waits = waits.replace(Ok(0))?;
    let (records, latency, first, last, torn_looks) = got.replace(Err(String::new()))?;
    Ok(Measured {
        records,
        latency,
        elapsed_ns: last - first,
        sender_waits,
        torn_looks,
    })
}

/// The two machines on this host (emu), or on its RDMA device in
/// loopback (mlx5), each core on a thread of its own.
fn run_on_threads(
    a: &RingArgs,
    l: RingLayout,
    n: u64,
    size: usize,
    batch: usize,
) -> Result<Measured, String> {
    let cfg = ExecutorConfig {
        slots: 1,
        ..Default::default()
    };
    let pin = !a.no_pin;
    #[cfg(feature = "mlx5")]
    if a.backend == Backend::Mlx5 {
        let cluster = cluster::mlx5::Mlx5Cluster::boot(&a.device.config(), 2, HOST, 4096, 2)?;
        return run_pair(l, n, size, batch, pin, |m| cluster.executor(Some(m), cfg));
    }
    let cluster = cluster::EmuCluster::boot(&cluster::emu::EmuClusterConfig {
        memory_nodes: 2,
        host_bytes: HOST,
        dm_bytes: 4096,
        emu: Default::default(),
    })
    .map_err(|e| e.to_string())?;
    run_pair(l, n, size, batch, pin, |m| {
        cluster.machine_executor(m, cfg).map_err(|e| e.to_string())
    })
}

/// The sender on machine 0's thread and the receiver on machine 1's,
/// each with the executor `executor(machine)` makes there.
fn run_pair<N: Nic>(
    l: RingLayout,
    n: u64,
    size: usize,
    batch: usize,
    pin: bool,
    executor: impl Fn(usize) -> Result<Executor<N>, String> + Sync,
) -> Result<Measured, String> {
    let waits = Arc::new(Mutex::new(Err("the sender did not finish".to_string())));
    let got = Arc::new(Mutex::new(Err("the receiver did not finish".to_string())));
    std::thread::scope(|s| {
        for m in 0..2 {
            let (executor, waits, got) = (&executor, waits.clone(), got.clone());
            s.spawn(move || {
                if pin {
                    nicdrv::exec::pin_current_thread(m);
                }
                let mut ex = match executor(m) {
                    Ok(ex) => ex,
                    Err(e) => {
                        let e = format!("machine {m}: {e}");
                        if m == 0 {
                            *waits.lock().expect("not poisoned") = Err(e);
                        } else {
                            *got.lock().expect("not poisoned") = Err(e);
                        }
                        return;
                    }
                };
                let spawned = if m == 0 {
                    ex.spawn(move |ctx| async move {
                        let r = send(&ctx, l, n, size, batch)
                            .await
                            .map_err(|e| e.to_string());
                        *waits.lock().expect("not poisoned") = r;
                    })
                } else {
                    ex.spawn(move |ctx| async move {
                        let r = receive(&ctx, l, n, size).await;
                        *got.lock().expect("not poisoned") = r;
                    })
                };
                if spawned.is_ok() {
                    ex.run();
                }
            });
        }
    });
    let sender_waits = std::mem::replace(&mut *waits.lock().expect("not poisoned"), Ok(0))?;
    let (records, latency, first, last, torn_looks) =
        std::mem::replace(&mut *got.lock().expect("not poisoned"), Err(String::new()))?;
    Ok(Measured {
        records,
        latency,
        elapsed_ns: last.saturating_sub(first),
        sender_waits,
        torn_looks,
    })
}

pub fn run(a: RingArgs) -> Result<crate::run::Outcome, ArgError> {
    a.device.check(a.backend)?;
    let sim = a.backend == Backend::Sim;
    let l = layout(a.capacity as u64);
    l.check()
        .map_err(|e| ArgError(format!("--capacity: {e}")))?;
    if l.ring_off + l.capacity > HOST {
        return Err(ArgError(format!(
            "--capacity {} is more than the {} KiB a machine here holds for it",
            a.capacity,
            (HOST - l.ring_off) >> 10
        )));
    }
    if a.size < 16 || a.size as u64 > l.max_payload() {
        return Err(ArgError(format!(
            "--size {} must be 16 ..= {} bytes for a ring of {} (a record's payload is at most half the ring less 16 bytes)",
            a.size,
            l.max_payload(),
            a.capacity
        )));
    }
    let n = a.records.unwrap_or(if sim { 100_000 } else { 2_000_000 });
    if !(1..=txn::ring::MAX_RECORDS_PER_DOORBELL).contains(&a.batch) {
        return Err(ArgError(format!(
            "--batch {} must be 1 ..= {}",
            a.batch,
            txn::ring::MAX_RECORDS_PER_DOORBELL
        )));
    }
    if n == 0 {
        return Err(ArgError("--records must be positive".into()));
    }
    // Each doorbell's records must fit the ring whole, where its end falls
    // among them included: the sender's positions, doorbell by doorbell.
    // They repeat within one position per 16 bytes of ring (the next
    // depends only on the last, modulo the capacity), and a shorter last
    // doorbell takes no more than a whole one would there.
    let (mut tail, mut sent) = (0u64, 0u64);
    let mut left = l.capacity / txn::ring::ALIGN + 1;
    while sent < n && left > 0 {
        left -= 1;
        let k = (a.batch as u64).min(n - sent);
        let lens = std::iter::repeat_n(a.size as u64, k as usize);
        let need = l
            .bytes_at(tail, lens)
            .map_err(|e| ArgError(e.to_string()))?;
        if need > l.capacity {
            return Err(ArgError(format!(
                "--batch {} records of --size {} take up to {need} bytes of the ring where its \
                 end falls among them, more than --capacity {} holds",
                a.batch, a.size, a.capacity
            )));
        }
        tail += need;
        sent += k;
    }
    // A flag of the other backends is not silently dropped.
    if sim && a.no_pin {
        return Err(ArgError(
            "--no-pin applies to emu and mlx5 (sim pins nothing)".into(),
        ));
    }
    if !sim && a.seed.is_some() {
        return Err(ArgError(
            "--seed applies to sim (emu and mlx5 draw nothing)".into(),
        ));
    }
    if !sim && !a.no_pin {
        cmdline::warn_if_oversubscribed("loch-bench ring", "cores", 2);
    }
    let m = match if sim {
        run_sim(a.seed.unwrap_or(1), l, n, a.size, a.batch)
    } else {
        run_on_threads(&a, l, n, a.size, a.batch)
    } {
        Ok(m) => m,
        Err(why) => return Ok(crate::run::Outcome::Failed(why)),
    };
    let rate = m.records as f64 * 1e9 / m.elapsed_ns.max(1) as f64;
    let q = |p: f64| m.latency.value_at_quantile(p) as f64 / 1e3;
    let backend = a.backend.name();
    let model = SimModel::default();
    // One record, as the model has it: the doorbell, one way on the link,
    // the transfer, then the receiver's turn (a step and its local reads).
    let record = record_bytes(a.size as u64);
    let transfer_ns = model.xfer_ns(record + model.header_bytes);
    // The receiver loads the header's two words, then reads the record's lines.
    let local_ns = model.cpu_local_line_ns * (2 + record.div_ceil(64));
    let predicted_ns = model.cpu_post_ns
        + model.link_latency_ns_one_way
        + transfer_ns
        + model.cpu_step_ns
        + local_ns;
    if a.json {
        let doc = json!([{
            "schema_version": 1,
            "bench": "ring",
            "backend": backend,
            "payload_bytes": a.size,
            "records_per_doorbell": a.batch,
            "capacity_bytes": a.capacity,
            "records": m.records,
            "records_per_sec": rate,
            "latency_us": {
                "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "p999": q(0.999),
                "max": m.latency.max() as f64 / 1e3,
            },
            "sender_waits": m.sender_waits,
            "torn_looks": m.torn_looks,
            "model_one_way_us": if sim { json!(predicted_ns as f64 / 1e3) } else { json!(null) },
        }]);
        cmdline::outln!("{doc}");
    } else {
        cmdline::outln!(
            "{:<7} {:>6} {:>10} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9}",
            "backend",
            "bytes",
            "records",
            "Mrec/s",
            "p50 us",
            "p90 us",
            "p99 us",
            "p999 us",
            "max us",
            "waits",
            "torn"
        );
        cmdline::outln!(
            "{:<7} {:>6} {:>10} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>9.1} {:>9} {:>9}",
            backend,
            a.size,
            m.records,
            rate / 1e6,
            q(0.5),
            q(0.9),
            q(0.99),
            q(0.999),
            m.latency.max() as f64 / 1e3,
            m.sender_waits,
            m.torn_looks
        );
        if sim {
            cmdline::outln!(
                "model: one record one way = doorbell {} + link {} + transfer {} + receiver step {} + local reads {} = {:.2} us",
                model.cpu_post_ns,
                model.link_latency_ns_one_way,
                transfer_ns,
                model.cpu_step_ns,
                local_ns,
                predicted_ns as f64 / 1e3
            );
        }
    }
    Ok(crate::run::Outcome::finished())
}
