//! An application with its own key and value sizes: a book of quotes in
//! the Sherman B+tree, keyed by 16-byte instrument symbols (ordered byte by
//! byte) with 32-byte records (bid, ask, bid size, ask size). The sizes are
//! fixed when the tree is made: the key by its type, the value by
//! `TreeConfig::value_bytes`. `cargo run --release -p index --example quotes`
use cluster::{EmuCluster, EmuClusterConfig};
use index::tree::{TreeConfig, TreeOf};
use nicdrv::ExecutorConfig;

/// A symbol, zero-padded to the key's 16 bytes.
fn symbol(s: &str) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..s.len()].copy_from_slice(s.as_bytes());
    k
}

/// A quote as the tree stores it: four little-endian words.
fn quote(bid: u64, ask: u64, bid_size: u64, ask_size: u64) -> [u8; 32] {
    let mut v = [0u8; 32];
    for (i, w) in [bid, ask, bid_size, ask_size].into_iter().enumerate() {
        v[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
    }
    v
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let memory = EmuClusterConfig::default(); // 2 nodes × 256 MiB host, 256 KiB device
    let cluster = EmuCluster::boot(&memory)?;
    let cfg = TreeConfig {
        value_bytes: 32,
        ..TreeConfig::sherman(memory.host_bytes)
    };
    let book = TreeOf::<[u8; 16]>::new(cfg, memory.dm_bytes)?;
    let mut executor = cluster.executor(ExecutorConfig::default())?;
    executor.spawn(move |ctx| async move {
        let mut t = book.client(1).expect("a client");
        t.create(&ctx).await.expect("create the book");
        // Prices in cents.
        for (s, bid, ask) in [
            ("AAPL.XNAS", 18910, 18912),
            ("AMZN.XNAS", 17850, 17853),
            ("ASML.XAMS", 91240, 91280),
            ("MSFT.XNAS", 41501, 41504),
        ] {
            let v = quote(bid, ask, 300, 200);
            t.put_value(&ctx, symbol(s), &v).await.expect("put");
        }
        // A new quote replaces the old one whole.
        let aapl = quote(18911, 18912, 500, 100);
        t.put_value(&ctx, symbol("AAPL.XNAS"), &aapl).await.expect("put");
        let mut got = [0u8; 32];
        let found = t.get_value(&ctx, symbol("AAPL.XNAS"), &mut got).await;
        assert!(found.expect("get"));
        assert_eq!(got, aapl);
        // Every symbol from "A" up to "B": a prefix is a key range.
        let a = t
            .scan_values(&ctx, symbol("A"), symbol("B"), 100)
            .await
            .expect("scan");
        let names: Vec<&str> = a
            .iter()
            .map(|(k, _)| std::str::from_utf8(k).unwrap().trim_end_matches('\0'))
            .collect();
        assert_eq!(names, ["AAPL.XNAS", "AMZN.XNAS", "ASML.XAMS"]);
        assert_eq!(a[0].1, aapl);
        println!(
            "quotes: 5 puts of 32-byte quotes under 16-byte symbols, a get, {} symbols from A to B; \
             {}-byte nodes; {} round trips",
            names.len(),
            t.tree().layout().node_bytes(),
            ctx.counters().round_trips
        );
    })?;
    executor.run(); // until every task has finished
    Ok(())
}
