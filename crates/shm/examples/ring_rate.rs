//! Message rate of the bare rings: one thread pushes records of an 8 B rdmx frame's size
//! (its 40-byte header and 8 bytes of payload) through a ring as fast as it can, another
//! takes them, busy-polling, as the worker does (`Consumer::take_words`). What rdmx's shared-memory transport adds per message on top of
//! the rings is the rest of its 8 B message rate: against this ceiling, the rdmx and UCX
//! rates of `scripts/bench` show how much of a message's cost is the rings'.
//!
//! `cargo run --release -p rdmx-shm --example ring_rate [RECORDS] [BYTES]`

use std::time::Instant;

use rdmx_shm::channel::{self, Side};

fn main() -> rdmx_shm::Result<()> {
    let mut args = std::env::args().skip(1);
    let n: u64 = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(5_000_000);
    let size: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(48);
    let cap = 256 << 10;
    let seg = channel::create("ring-rate", cap)?;
    let (mut tx, _) = channel::ends(&seg, cap, Side::Creator)?;
    let (_, mut rx) = channel::ends(&seg, cap, Side::Opener)?;
    let sink = std::thread::spawn(move || {
        // (As the worker takes records: into one word buffer, copied out of the ring.)
        let mut buf = rdmx_shm::RecordBuf::default();
        for _ in 0..n {
            while rx.take_words(&mut buf).expect("take").is_none() {
                std::hint::spin_loop();
            }
            rx.free();
        }
    });
    let msg = vec![7u8; size];
    let t = Instant::now();
    for _ in 0..n {
        while !tx.push(&[&msg]).expect("push") {
            std::hint::spin_loop();
        }
    }
    sink.join().expect("sink thread");
    let rate = n as f64 / t.elapsed().as_secs_f64();
    println!(
        "{size} B records through a bare ring: {:.2} M/s",
        rate / 1e6
    );
    Ok(())
}
