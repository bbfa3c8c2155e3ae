//! rdmx's one-sided benchmark, in the manner of `ucx_perftest -t ucp_put_lat / ucp_put_bw /
//! ucp_get / ucp_fadd` and perftest's `ib_write_lat / ib_write_bw / ib_read_lat /
//! ib_atomic_lat`:
//!
//! ```text
//! rma_perf --server ADDR                      serve one client, then exit
//! rma_perf --client ADDR -t TEST -s SIZE [-n ITERS] [-w WARMUP] [--window N]
//! ```
//!
//! - `put_lat`: a ping-pong of puts, as `ib_write_lat` runs it: each side puts `SIZE` bytes
//!   into the other's region, the last 8 carrying the iteration's number, and waits until
//!   the peer's put of that number lands in its own region (polling its memory, progressing
//!   its worker). Latency: half the round trip.
//! - `put_bw`: `ITERS` puts of `SIZE` bytes with `--window` in flight, then a flush;
//!   bandwidth of the whole (MB = 2^20 bytes).
//! - `get_lat`, `fadd_lat`: one get of `SIZE` bytes, or one fetch-and-add, at a time;
//!   latency: the whole operation (a round trip), as `ib_read_lat` and `ib_atomic_lat`
//!   report it.
//!
//! The client prints one JSON line: `{"test", "size", "iters", "median_us", "mean_us",
//! "mb_per_s", "transport", "clock"}` (with `--run-clock` the latency tests time their
//! operations as a whole, and the median is the mean). The server prints `rma_perf: listening on ADDR` on stderr once
//! it listens. RDMX_TRANSPORT picks the transport.

use std::collections::VecDeque;
use std::time::Instant;

use clap::Parser;
use rdmx::{
    Context, Ep, MemHandle, RemoteAccess, RemoteKey, Request, Transport, Worker, TAG_MASK_ALL,
};
use rdmx_bench::clock::Clock;
use rdmx_bench::schema::{histogram, record};

const SETUP: u64 = 1;
const KEY: u64 = 2;
const DONE: u64 = 3;

/// One-sided latency and bandwidth (see the module's documentation).
#[derive(Parser)]
#[command(name = "rma_perf")]
struct Args {
    /// Serve one client at ADDR (HOST:PORT)
    #[arg(long, value_name = "ADDR", conflicts_with = "client")]
    server: Option<String>,
    /// Measure against the server at ADDR (HOST:PORT)
    #[arg(long, value_name = "ADDR")]
    client: Option<String>,
    /// put_lat, put_bw, get_lat or fadd_lat
    #[arg(short = 't', long, default_value = "put_lat")]
    test: String,
    /// Bytes per operation (put_lat: a multiple of 8; fadd_lat: 8)
    #[arg(short = 's', long, default_value_t = 8)]
    size: usize,
    /// Measured operations
    #[arg(short = 'n', long, default_value_t = 10_000)]
    iters: u64,
    /// Warm-up operations
    #[arg(short = 'w', long, default_value_t = 1_000)]
    warmup: u64,
    /// Puts in flight (put_bw)
    #[arg(long, default_value_t = 16)]
    window: usize,
    /// Latency tests: time the measured operations as a whole and report their mean, not
    /// each one (for machines where reading the clock is a system call, as in the guest)
    #[arg(long)]
    run_clock: bool,
}

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// What the client asks of the server.
#[derive(serde::Serialize, serde::Deserialize)]
struct Setup {
    test: String,
    size: usize,
    rounds: u64,
}

fn main() -> Result<()> {
    env_logger::init();
    let args = Args::parse();
    let ctx = Context::new()?;
    let w = ctx.worker()?;
    match (&args.server, &args.client) {
        (Some(addr), None) => serve(&w, addr),
        (None, Some(addr)) => measure(&w, addr, &args),
        _ => Err("give --server ADDR or --client ADDR".into()),
    }
}

/// The region both sides put into: `size` bytes, at least one word.
fn region(w: &Worker, size: usize) -> rdmx::Result<MemHandle> {
    w.mem_map(size.max(8), RemoteAccess::ALL)
}

/// Waits, progressing `w`, until the last word of `m` holds `value`.
fn await_word(w: &Worker, m: &MemHandle, value: u64) -> rdmx::Result<()> {
    let last = m.len() - 8;
    while m.load(last)? != value {
        w.progress();
    }
    Ok(())
}

/// `buf` with `value` in its last 8 bytes.
fn stamped(mut buf: Vec<u8>, value: u64) -> Vec<u8> {
    let n = buf.len();
    buf[n - 8..].copy_from_slice(&value.to_ne_bytes());
    buf
}

fn exchange_keys(w: &Worker, ep: &Ep, m: &MemHandle) -> Result<RemoteKey> {
    ep.send(KEY, &m.pack_rkey())?;
    let (bytes, _) = w.recv_vec(KEY, TAG_MASK_ALL)?;
    Ok(ep.unpack_rkey(&bytes)?)
}

fn serve(w: &Worker, addr: &str) -> Result<()> {
    let listener = w.listen(addr)?;
    eprintln!(
        "rma_perf: listening on {}",
        listener.local_addr().ok_or("not bound")?
    );
    let ep = listener.accept()?;
    let (setup, _): (Setup, _) = w.recv_obj(SETUP, TAG_MASK_ALL)?;
    let m = region(w, setup.size)?;
    let key = exchange_keys(w, &ep, &m)?;
    if setup.test == "put_lat" {
        // The pong: each put of the client's answered by one of the same number.
        let mut buf = vec![0u8; setup.size];
        for i in 1..=setup.rounds {
            await_word(w, &m, i)?;
            buf = ep.put(&key, 0, stamped(buf, i))?.wait()?.buf;
        }
    }
    // Progressing until the client is done: over messages this side performs its operations;
    // over RDMA the NIC does, and this side only looks for the message now and then (as
    // perftest's passive side waits), leaving the CPU to the client and the NIC.
    let passive = ep.transport() == Transport::Rdma;
    while w.probe(DONE, TAG_MASK_ALL).is_none() {
        w.progress();
        if passive {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    w.recv_vec(DONE, TAG_MASK_ALL)?;
    ep.close()?;
    Ok(())
}

fn measure(w: &Worker, addr: &str, args: &Args) -> Result<()> {
    let ep = w.connect(addr)?;
    let size = args.size;
    match args.test.as_str() {
        "put_lat" if size >= 8 && size % 8 == 0 => {}
        "fadd_lat" if size == 8 => {}
        "put_bw" | "get_lat" => {}
        t => return Err(format!("no test {t} of {size} bytes (see --help)").into()),
    }
    let rounds = args.warmup + args.iters;
    ep.send_obj(
        SETUP,
        &Setup {
            test: args.test.clone(),
            size,
            rounds,
        },
    )?;
    let m = region(w, size)?;
    let key = exchange_keys(w, &ep, &m)?;
    let clock = Clock::new();
    let mut h = histogram();
    let mut whole = None;
    // One latency operation `i` (of `rounds`, the first `warmup` not counted) timed by
    // `op`, which returns the time to record; with --run-clock the clock is read only when
    // the counted ones start and end.
    let mut run_start = None;
    let mut timed = |i: u64, op: &mut dyn FnMut() -> Result<std::time::Duration>| -> Result<()> {
        if args.run_clock && i == args.warmup + 1 {
            run_start = Some(Instant::now());
        }
        let d = op()?;
        if i > args.warmup && !args.run_clock {
            record(&mut h, d);
        }
        if args.run_clock && i == rounds {
            whole = run_start.map(|t| t.elapsed());
        }
        Ok(())
    };
    let stamp = || (!args.run_clock).then(|| clock.now());
    let since =
        |t: Option<rdmx_bench::clock::Stamp>| t.map_or_else(Default::default, |t| clock.since(t));
    match args.test.as_str() {
        "put_lat" => {
            let mut buf = Some(vec![0u8; size]);
            for i in 1..=rounds {
                timed(i, &mut || {
                    let t = stamp();
                    let put = ep.put(&key, 0, stamped(buf.take().unwrap_or_default(), i))?;
                    await_word(w, &m, i)?;
                    buf = Some(put.wait()?.buf);
                    Ok(since(t) / 2)
                })?;
            }
        }
        "get_lat" => {
            let mut buf = Some(vec![0u8; size]);
            for i in 1..=rounds {
                timed(i, &mut || {
                    let t = stamp();
                    buf = Some(ep.get(&key, 0, buf.take().unwrap_or_default())?.wait()?.buf);
                    Ok(since(t))
                })?;
            }
        }
        "fadd_lat" => {
            for i in 1..=rounds {
                timed(i, &mut || {
                    let t = stamp();
                    let old = ep.atomic_fetch_add(&key, 0, 1)?.wait()?.value;
                    if old != i - 1 {
                        return Err(format!("fetch-and-add {i} found {old}").into());
                    }
                    Ok(since(t))
                })?;
            }
        }
        _ => {
            // put_bw: the window's oldest put is waited for before the next starts.
            let mut window: VecDeque<Request> = VecDeque::new();
            let mut spare: Vec<Vec<u8>> = (0..args.window).map(|_| vec![7u8; size]).collect();
            let mut start = Instant::now();
            for i in 0..rounds {
                if i == args.warmup {
                    for r in window.drain(..) {
                        spare.push(r.wait()?.buf);
                    }
                    start = Instant::now();
                }
                if window.len() == args.window {
                    spare.push(window.pop_front().unwrap().wait()?.buf);
                }
                let buf = spare.pop().ok_or("no buffer")?;
                window.push_back(ep.put(&key, 0, buf)?);
            }
            ep.rma_flush().wait()?;
            for r in window {
                r.wait()?;
            }
            whole = Some(start.elapsed());
        }
    }
    ep.send(DONE, &[])?;
    let us = |ns: f64| ns / 1000.0;
    let (median_us, mean_us, mb_per_s) = match whole {
        Some(d) => {
            // (A put ping-pong's latency is half its round trip.)
            let halves = if args.test == "put_lat" { 2.0 } else { 1.0 };
            let per = d.as_nanos() as f64 / args.iters as f64 / halves;
            let mb = size as f64 / (per / 1e9) / (1 << 20) as f64;
            (us(per), us(per), mb)
        }
        None => {
            let median = us(h.value_at_quantile(0.5) as f64);
            (median, us(h.mean()), size as f64 / median / 1.048576)
        }
    };
    println!(
        "{}",
        serde_json::json!({
            "test": args.test,
            "size": size,
            "iters": args.iters,
            "median_us": median_us,
            "mean_us": mean_us,
            "mb_per_s": mb_per_s,
            "transport": ep.transport().to_string(),
            "clock": if args.run_clock || args.test == "put_bw" { "run" } else { "per operation" },
            "rcache_registrations": w.stats().rcache_registrations,
        })
    );
    ep.close()?;
    Ok(())
}
