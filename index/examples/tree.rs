//! An application linked with Loch, using the Sherman B+tree: it boots an
//! embedded emu cluster (two memory nodes in this process), runs one task
//! on this thread's executor, and calls put, get, scan and delete from its
//! own code. `cargo run --release -p index --example tree`
use cluster::{EmuCluster, EmuClusterConfig};
use index::tree::{Tree, TreeConfig};
use nicdrv::ExecutorConfig;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let memory = EmuClusterConfig::default(); // 2 nodes × 256 MiB host, 256 KiB device
    let cluster = EmuCluster::boot(&memory)?;
    let tree = Tree::new(TreeConfig::sherman(memory.host_bytes), memory.dm_bytes)?;
    let mut executor = cluster.executor(ExecutorConfig::default())?;
    executor.spawn(move |ctx| async move {
        // Client ids mark the locks a task holds: unique and non-zero.
        let mut t = tree.client(1).expect("a client");
        t.create(&ctx).await.expect("create the tree");
        for (k, price) in [(10, 1_000), (20, 2_000), (30, 3_000), (40, 4_000)] {
            t.put(&ctx, k, price).await.expect("put");
        }
        assert_eq!(t.get(&ctx, 20).await.expect("get"), Some(2_000));
        let range = t.scan(&ctx, 15, 35, 10).await.expect("scan");
        assert_eq!(range, [(20, 2_000), (30, 3_000)]);
        assert!(t.delete(&ctx, 30).await.expect("delete"));
        assert_eq!(t.get(&ctx, 30).await.expect("get"), None);
        println!(
            "tree: 4 puts, a get, a scan of {} entries, a delete; {} round trips",
            range.len(),
            ctx.counters().round_trips
        );
    })?;
    executor.run(); // until every task has finished
    Ok(())
}
