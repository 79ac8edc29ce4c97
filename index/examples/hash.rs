//! An application linked with Loch, using the Nessie hash table: it boots
//! an embedded emu cluster (two memory nodes in this process), runs one
//! task on this thread's executor, and calls put, get and delete from its
//! own code. `cargo run --release -p index --example hash`
use cluster::{EmuCluster, EmuClusterConfig};
use index::cuckoo::{Cuckoo, CuckooConfig};
use nicdrv::ExecutorConfig;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let memory = EmuClusterConfig::default(); // 2 nodes × 256 MiB host memory
    let cluster = EmuCluster::boot(&memory)?;
    // Room for 10 000 entries, 8-byte keys, values up to 32 bytes.
    let table = Cuckoo::new(CuckooConfig::new(10_000, 8, 32, memory.host_bytes))?;
    let mut executor = cluster.executor(ExecutorConfig::default())?;
    executor.spawn(move |ctx| async move {
        let mut h = table.client().expect("a client");
        h.create(&ctx).await.expect("create the table");
        h.put(&ctx, b"AAPL.bid", b"189.25").await.expect("put");
        h.put(&ctx, b"AAPL.ask", b"189.27").await.expect("put");
        h.put(&ctx, b"AAPL.bid", b"189.26").await.expect("update");
        let bid = h.get(&ctx, b"AAPL.bid").await.expect("get");
        assert_eq!(bid.as_deref(), Some(&b"189.26"[..]));
        assert!(h.delete(&ctx, b"AAPL.ask").await.expect("delete"));
        assert_eq!(h.get(&ctx, b"AAPL.ask").await.expect("get"), None);
        println!(
            "hash: 3 puts, 2 gets, a delete; {} round trips",
            ctx.counters().round_trips
        );
    })?;
    executor.run(); // until every task has finished
    Ok(())
}
