//! The control-channel handshake time `loch node` pays per connection, on
//! 127.0.0.1: dial, Hello/Auth both ways (HMAC-SHA256 over fresh nonces).
//! Prints the figure; fails if a handshake takes longer than the bound
//! `loch node`'s rendezvous relies on.
//!
//! `cargo test --release -p appliance --test handshake -- --nocapture`

use bootstrap::{ChannelOptions, ClusterSecret, ControlChannel};
use std::net::TcpListener;
use std::time::{Duration, Instant};

#[test]
fn handshake_time_on_localhost() {
    const N: usize = 200;
    let secret = ClusterSecret::new(b"0123456789abcdef0123456789abcdef".to_vec());
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server_opts = ChannelOptions::new(0, secret.clone());
    let server = std::thread::spawn(move || {
        for _ in 0..N {
            ControlChannel::accept(&listener, &server_opts, &|id| id == 1).unwrap();
        }
    });
    let opts = ChannelOptions::new(1, secret);
    let mut ns: Vec<u64> = (0..N)
        .map(|_| {
            let t = Instant::now();
            let ch = ControlChannel::connect(addr, Some(0), &opts).unwrap();
            let d = t.elapsed().as_nanos() as u64;
            assert_eq!(ch.peer_id(), 0);
            d
        })
        .collect();
    server.join().unwrap();
    ns.sort_unstable();
    let (p50, p99) = (ns[N / 2], ns[N * 99 / 100]);
    println!(
        "control-channel handshake on 127.0.0.1: p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs ({N} handshakes)",
        p50 as f64 / 1e3,
        p99 as f64 / 1e3,
        ns[N - 1] as f64 / 1e3
    );
    assert!(
        Duration::from_nanos(p99) < opts.handshake_timeout / 10,
        "p99 {p99} ns"
    );
}
