//! Control-channel handshake time on loopback: dial, mutual HMAC proof,
//! ready channel. Run: `cargo run --release -p bootstrap --example handshake_time`

use std::net::TcpListener;
use std::time::{Duration, Instant};

use bootstrap::channel::{ChannelOptions, ControlChannel};
use bootstrap::ClusterSecret;

fn main() {
    const N: usize = 2000;
    let l = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let addr = l.local_addr().expect("local addr");
    let server = std::thread::spawn(move || {
        let o = ChannelOptions::new(0, ClusterSecret::new(vec![1; 32]));
        for _ in 0..N {
            ControlChannel::accept(&l, &o, &|_| true).expect("accept");
        }
    });
    let o = ChannelOptions::new(1, ClusterSecret::new(vec![1; 32]));
    let mut us: Vec<Duration> = (0..N)
        .map(|_| {
            let t0 = Instant::now();
            ControlChannel::connect(addr, Some(0), &o).expect("connect");
            t0.elapsed()
        })
        .collect();
    server.join().expect("server");
    us.sort();
    println!(
        "{N} handshakes over 127.0.0.1: p50 {:?}, p99 {:?}, max {:?}",
        us[N / 2],
        us[N * 99 / 100],
        us[N - 1]
    );
}
