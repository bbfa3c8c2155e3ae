//! One-way latency of the bare rings: two threads ping-pong an 8-byte record through a
//! channel's two rings, busy-polling. What rdmx's shared-memory transport adds on top of
//! the rings is the rest of its 8 B latency.
//!
//! `cargo run --release -p rdmx-shm --example ring_pingpong [ROUND_TRIPS] [BYTES]`

use std::time::Instant;

use rdmx_shm::channel::{self, Side};

fn main() -> rdmx_shm::Result<()> {
    let mut args = std::env::args().skip(1);
    let n: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let size: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(8);
    let cap = 256 << 10;
    let seg = channel::create("ring-pingpong", cap)?;
    let (mut tx_a, mut rx_a) = channel::ends(&seg, cap, Side::Creator)?;
    let (mut tx_b, mut rx_b) = channel::ends(&seg, cap, Side::Opener)?;
    let echo = std::thread::spawn(move || {
        let mut buf = Vec::new();
        for _ in 0..n {
            while !rx_b.pop(&mut buf).expect("pop") {
                std::hint::spin_loop();
            }
            while !tx_b.push(&[&buf]).expect("push") {}
        }
    });
    let msg = vec![7u8; size];
    let mut buf = Vec::new();
    let t = Instant::now();
    for _ in 0..n {
        while !tx_a.push(&[&msg]).expect("push") {}
        while !rx_a.pop(&mut buf).expect("pop") {
            std::hint::spin_loop();
        }
    }
    let one_way = t.elapsed().as_secs_f64() * 1e6 / (2 * n) as f64;
    echo.join().expect("echo thread");
    println!("{size} B one-way over the bare rings: {one_way:.3} us");
    Ok(())
}
