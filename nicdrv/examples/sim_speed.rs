//! How fast the simulator runs: 8 memory nodes, 8 compute nodes × 22
//! threads, one task per thread doing 8-byte READs (or the verb given as the
//! first argument) for 20 virtual milliseconds.

use nicdrv::sim::{SimConfig, World};
use nicdrv::{ExecutorConfig, GlobalAddr};

fn main() {
    let verb = std::env::args().nth(1).unwrap_or_else(|| "read".into());
    let mut w = World::new(SimConfig {
        memory_nodes: 8,
        compute_nodes: 8,
        host_bytes: 1 << 20,
        ..Default::default()
    })
    .unwrap();
    for t in 0..176u32 {
        let th = w
            .add_thread(
                (t % 8) as u16,
                ExecutorConfig {
                    slots: 1,
                    scratch_bytes_per_slot: 4096,
                    ..Default::default()
                },
            )
            .unwrap();
        let verb = verb.clone();
        w.spawn(th, move |ctx| async move {
            let a = GlobalAddr::host((t % 8) as u16, 4096 + 64 * (t as u64 / 8));
            let mut buf = Some(ctx.alloc(8).unwrap());
            while ctx.now_ns() < 20_000_000 {
                let mut b = ctx.batch();
                let op = match verb.as_str() {
                    "faa" => b.faa(a, 1),
                    _ => b.read(a, buf.take().unwrap()),
                };
                let mut d = b.submit().await.unwrap();
                if verb != "faa" {
                    buf = Some(d.take_buf(op));
                }
            }
        })
        .unwrap();
    }
    let t0 = std::time::Instant::now();
    w.run();
    let wall = t0.elapsed().as_secs_f64();
    println!(
        "{} verbs, {} events in {:.3} s wall: {:.2} M verbs/s, {:.2} M events/s; virtual {:.1} ms",
        w.verbs(),
        w.events(),
        wall,
        w.verbs() as f64 / wall / 1e6,
        w.events() as f64 / wall / 1e6,
        w.now_ns() as f64 / 1e6
    );
}
