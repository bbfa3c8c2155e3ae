//! Tag-matching latency and bandwidth between two processes, in the manner of
//! `ucx_perftest -t tag_lat` / `-t tag_bw`, for `scripts/bench-tcp`.
//!
//! ```text
//! tag_perf --server [HOST:PORT]                     (default 127.0.0.1:13337)
//! tag_perf --client HOST:PORT -t lat|bw -s BYTES -n ITERS [-w WINDOW]
//! ```
//!
//! `lat`: ping-pong, the client prints the half round trip. `bw`: a sliding window, as
//! `ucx_perftest`'s stream test runs it: the client keeps up to `WINDOW` sends outstanding
//! (waiting for the oldest before it starts another), the server keeps `WINDOW` receives
//! posted (reposting each as it completes), and one acknowledgement after the last message
//! ends the run; the client prints MB/s (2^20 bytes, as `ucx_perftest` counts).
//! The last line is machine-readable: `RESULT lat_us=…` or `RESULT bw_mbs=…`.
//! The transport is `RDMX_TRANSPORT` (auto by default).

use std::collections::VecDeque;
use std::time::Instant;

use rdmx::{Context, TAG_MASK_ALL};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, Clone, Copy)]
struct Test {
    bw: bool,
    size: usize,
    iters: usize,
    window: usize,
}

const SETUP: u64 = 1;
const DATA: u64 = 2;
const ACK: u64 = 3;

fn main() {
    env_logger::init();
    if let Err(e) = run() {
        eprintln!("tag_perf: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let get = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let ctx = Context::new()?;
    let worker = ctx.worker()?;
    if args.first().map(String::as_str) == Some("--server") {
        let addr = args.get(1).cloned().unwrap_or("127.0.0.1:13337".into());
        let listener = worker.listen(&addr)?;
        eprintln!("tag_perf: listening on {addr} ({})", ctx.transport());
        let ep = listener.accept()?;
        let (test, _): (Test, _) = worker.recv_obj(SETUP, TAG_MASK_ALL)?;
        let mut buf = vec![0u8; test.size];
        if test.bw {
            let mut posted: VecDeque<_> = (0..test.window.min(test.iters))
                .map(|_| worker.tag_recv(DATA, TAG_MASK_ALL, vec![0; test.size]))
                .collect();
            let mut started = posted.len();
            while let Some(r) = posted.pop_front() {
                let buf = r.wait()?.buf;
                if started < test.iters {
                    posted.push_back(worker.tag_recv(DATA, TAG_MASK_ALL, buf));
                    started += 1;
                }
            }
            ep.send(ACK, &[])?;
        } else {
            for _ in 0..test.iters {
                buf = worker.tag_recv(DATA, TAG_MASK_ALL, buf).wait()?.buf;
                buf = ep.tag_send(DATA, buf).wait()?.buf;
            }
        }
        ep.flush(std::time::Duration::from_secs(10))?;
        return Ok(());
    }
    let addr = get("--client").ok_or("usage: tag_perf --server [ADDR] | --client HOST:PORT ...")?;
    let test = Test {
        bw: get("-t").as_deref() == Some("bw"),
        size: get("-s").map_or(Ok(8), |s| s.parse())?,
        iters: get("-n").map_or(Ok(10_000), |s| s.parse())?,
        window: get("-w").map_or(Ok(32), |s| s.parse())?,
    };
    if test.iters == 0 || test.window == 0 {
        return Err("-n and -w must be positive".into());
    }
    let ep = worker.connect(&addr)?;
    ep.send_obj(SETUP, &test)?;
    let mut buf = vec![1u8; test.size];
    let start = Instant::now();
    if test.bw {
        let mut spare: Vec<Vec<u8>> = (0..test.window).map(|_| vec![1; test.size]).collect();
        let mut sends = VecDeque::with_capacity(test.window);
        for _ in 0..test.iters {
            let buf = match spare.pop() {
                Some(buf) => buf,
                None => {
                    let oldest: rdmx::Request = sends.pop_front().ok_or("empty window")?;
                    oldest.wait()?.buf
                }
            };
            sends.push_back(ep.tag_send(DATA, buf));
        }
        for s in sends {
            s.wait()?;
        }
        worker.tag_recv(ACK, TAG_MASK_ALL, Vec::new()).wait()?;
        let bytes = (test.iters * test.size) as f64;
        // MB = 2^20 bytes, as ucx_perftest counts.
        let mbs = bytes / start.elapsed().as_secs_f64() / (1 << 20) as f64;
        println!("tag_bw {} B x {}: {mbs:.1} MB/s", test.size, test.iters);
        println!("RESULT bw_mbs={mbs:.3}");
    } else {
        for _ in 0..test.iters {
            buf = ep.tag_send(DATA, buf).wait()?.buf;
            buf = worker.tag_recv(DATA, TAG_MASK_ALL, buf).wait()?.buf;
        }
        let us = start.elapsed().as_secs_f64() * 1e6 / test.iters as f64 / 2.0;
        println!(
            "tag_lat {} B x {}: {us:.2} us (half round trip)",
            test.size, test.iters
        );
        println!("RESULT lat_us={us:.3}");
    }
    ep.close()?;
    Ok(())
}
