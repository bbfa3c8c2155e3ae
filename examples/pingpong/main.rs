//! The ping-pong demo: one-way latency and bandwidth of rdmx's tagged messages over a size
//! sweep, in the manner of `ucx_perftest -t tag_lat` / `tag_bw` and `ib_send_lat`.
//!
//! ```text
//! pingpong                              both sides in one process, loopback, auto transport
//! pingpong --server [ADDR]              serve one client (default 0.0.0.0:13337)
//! pingpong --client HOST[:PORT] [-s 1:16M] [-n N] [-w N] [--bw [--window N]] [--json]
//! ```
//!
//! Latency mode times each round trip (receive pre-posted, then send) and reports half of it;
//! bandwidth mode keeps a window of sends outstanding and the server acknowledges each window.
//! Every size's last echo is checked byte for byte. `--help` lists every option.

mod args;
mod report;

use std::collections::VecDeque;
use std::io::IsTerminal;
#[cfg(feature = "rdma")]
use std::net::IpAddr;
use std::thread;
use std::time::{Duration, Instant};

use args::{ArgError, Args, Plan, Role};
use rdmx::{Context, Ep, Request, Transport, Worker, TAG_MASK_ALL};
use report::{Header, Progress, Row};

const SETUP: u64 = 1;
const DATA: u64 = 2;
const ACK: u64 = 3;

type Result<T> = std::result::Result<T, String>;

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let args = match args::parse(&argv) {
        Ok(a) => a,
        Err(ArgError::Help) => {
            println!("{}", args::USAGE);
            return;
        }
        Err(ArgError::Bad(m)) => {
            eprintln!("pingpong: {m}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(args) {
        eprintln!("pingpong: {e}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<()> {
    let ctx = Context::new().map_err(|e| e.to_string())?;
    match &args.role {
        Role::Server(addr) => {
            let worker = ctx.worker().map_err(|e| e.to_string())?;
            let listener = worker
                .listen(addr)
                .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
            let bound = listener
                .local_addr()
                .map_or_else(|| addr.clone(), |a| a.to_string());
            let over: Vec<String> = listener
                .transports()
                .iter()
                .map(|t| t.to_string())
                .collect();
            eprintln!("pingpong: listening on {bound} ({})", over.join(", "));
            let ep = listener.accept().map_err(|e| format!("accept: {e}"))?;
            serve(&worker, &ep)
        }
        Role::Client(addr) => {
            let worker = ctx.worker().map_err(|e| e.to_string())?;
            let ep = worker
                .connect(addr)
                .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
            client(&ctx, &worker, &ep, &args)
        }
        Role::Loopback => {
            let host = loopback_host(&ctx)?;
            let server_worker = ctx.worker().map_err(|e| e.to_string())?;
            let listener = server_worker
                .listen(&format!("{host}:0"))
                .map_err(|e| format!("cannot listen on {host}: {e}"))?;
            let addr = listener
                .local_addr()
                .ok_or("the listener has no local address")?
                .to_string();
            let server = thread::spawn(move || -> Result<()> {
                let ep = listener.accept().map_err(|e| format!("accept: {e}"))?;
                serve(&server_worker, &ep)
            });
            let worker = ctx.worker().map_err(|e| e.to_string())?;
            let ep = worker
                .connect(&addr)
                .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
            client(&ctx, &worker, &ep, &args)?;
            drop(ep);
            server
                .join()
                .map_err(|_| "the server thread panicked".to_string())?
                .map_err(|e| format!("server side: {e}"))
        }
    }
}

/// An address both sides of a one-process run can use: loopback for TCP; for RDMA an address
/// of the (first, or `RDMX_DEVICE`) device with an active port, since rdmacm does not route
/// over `lo`.
fn loopback_host(ctx: &Context) -> Result<String> {
    if ctx.transport() == Transport::Tcp {
        return Ok("127.0.0.1".into());
    }
    #[cfg(not(feature = "rdma"))]
    return Ok("127.0.0.1".into());
    #[cfg(feature = "rdma")]
    rdma_loopback_host(ctx)
}

#[cfg(feature = "rdma")]
fn rdma_loopback_host(ctx: &Context) -> Result<String> {
    let devices = ctx.devices().map_err(|e| e.to_string())?;
    let wanted = ctx.config().device().map(str::to_string);
    for d in devices {
        if wanted.as_deref().is_some_and(|w| w != d.name()) {
            continue;
        }
        let active: Vec<u8> = d
            .ports()
            .unwrap_or_default()
            .into_iter()
            .filter(|p| p.state == "ACTIVE")
            .map(|p| p.port)
            .collect();
        let addrs = d.ip_addrs().unwrap_or_default();
        let pick = addrs
            .iter()
            .filter(|(port, _)| active.contains(port))
            .map(|(_, a)| *a)
            .min_by_key(|a| !a.is_ipv4());
        if let Some(a) = pick {
            return Ok(match a {
                IpAddr::V4(v4) => v4.to_string(),
                IpAddr::V6(v6) => format!("[{v6}]"),
            });
        }
    }
    Err("no RDMA device has an active port with an IP address; \
         run with RDMX_TRANSPORT=tcp, or give --server/--client addresses"
        .into())
}

fn alloc(size: usize) -> Result<Vec<u8>> {
    let mut v = Vec::new();
    v.try_reserve_exact(size)
        .map_err(|_| format!("cannot allocate {size} bytes"))?;
    v.resize(size, 0);
    Ok(v)
}

fn pattern(size: usize, seed: usize) -> Result<Vec<u8>> {
    let mut v = alloc(size)?;
    for (i, b) in v.iter_mut().enumerate() {
        *b = (i.wrapping_mul(31) ^ seed) as u8;
    }
    Ok(v)
}

fn wait(r: Request, what: &str) -> Result<rdmx::Done> {
    r.wait().map_err(|e| format!("{what}: {e}"))
}

/// The server side of one session: receives the plan, then echoes (latency) or acknowledges
/// windows (bandwidth) for every size.
fn serve(worker: &Worker, ep: &Ep) -> Result<()> {
    let (plan, _): (Plan, _) = worker
        .recv_obj(SETUP, TAG_MASK_ALL)
        .map_err(|e| format!("reading the client's plan: {e}"))?;
    plan.validate()
        .map_err(|e| format!("the client's plan is invalid: {e}"))?;
    for &size in &plan.sizes {
        match plan.window {
            None => serve_latency(worker, ep, &plan, size)?,
            Some(w) => serve_bandwidth(worker, ep, &plan, size, w)?,
        }
    }
    ep.flush(Duration::from_secs(30))
        .map_err(|e| format!("flush: {e}"))
}

fn check_len(got: &rdmx::Done, size: usize) -> Result<()> {
    if got.length != size {
        return Err(format!(
            "expected a {size}-byte message, the peer sent {}",
            got.length
        ));
    }
    Ok(())
}

fn serve_latency(worker: &Worker, ep: &Ep, plan: &Plan, size: usize) -> Result<()> {
    let total = plan.warmup_for(size) + plan.iters_for(size);
    let mut spare = alloc(size)?;
    let mut pending = Some(worker.tag_recv(DATA, TAG_MASK_ALL, alloc(size)?));
    for i in 0..total {
        let Some(r) = pending.take() else { break };
        let got = wait(r, "receive")?;
        check_len(&got, size)?;
        if i + 1 < total {
            // The next ping finds its receive posted (the expected path), as in ucx_perftest.
            pending = Some(worker.tag_recv(DATA, TAG_MASK_ALL, spare));
        }
        spare = wait(ep.tag_send(DATA, got.buf), "send")?.buf;
    }
    Ok(())
}

/// Receives `count` messages of `size` bytes with `w` receives kept posted (each reposted as
/// it completes, as `ucx_perftest`'s stream test does), then acknowledges them all.
fn serve_window(
    worker: &Worker,
    ep: &Ep,
    bufs: &mut Vec<Vec<u8>>,
    size: usize,
    count: usize,
) -> Result<()> {
    let mut posted: VecDeque<Request> = bufs
        .drain(..)
        .take(count)
        .map(|b| worker.tag_recv(DATA, TAG_MASK_ALL, b))
        .collect();
    let mut started = posted.len();
    while let Some(r) = posted.pop_front() {
        let got = wait(r, "receive")?;
        check_len(&got, size)?;
        if started < count {
            posted.push_back(worker.tag_recv(DATA, TAG_MASK_ALL, got.buf));
            started += 1;
        } else {
            bufs.push(got.buf);
        }
    }
    wait(ep.tag_send(ACK, Vec::new()), "acknowledgement")?;
    Ok(())
}

fn serve_bandwidth(worker: &Worker, ep: &Ep, plan: &Plan, size: usize, w: usize) -> Result<()> {
    let (warm, timed) = plan.windows_for(size);
    let mut bufs = Vec::with_capacity(w);
    for _ in 0..w {
        bufs.push(alloc(size)?);
    }
    if warm > 0 {
        serve_window(worker, ep, &mut bufs, size, warm * w)?;
    }
    serve_window(worker, ep, &mut bufs, size, timed * w)
}

/// The client side: sends the plan, runs every size, prints the table or the JSON.
fn client(ctx: &Context, worker: &Worker, ep: &Ep, args: &Args) -> Result<()> {
    let plan = &args.plan;
    let eager_limit = ep.eager_limit().ok_or("the connection closed")?;
    let threshold = ctx
        .config()
        .entries()
        .into_iter()
        .find(|e| e.var == rdmx::EAGER_THRESHOLD_VAR)
        .map(|e| e.source.to_string())
        .unwrap_or_default();
    let header = Header {
        transport: ep.transport().to_string(),
        device: worker.stats().device,
        peer: ep.peer_addr().map(|a| a.to_string()),
        eager_threshold: ctx.config().eager_threshold_for(ep.transport()),
        threshold_source: threshold,
        eager_limit,
        window: plan.window,
        sizes: plan.sizes.len(),
    };
    ep.send_obj(SETUP, plan)
        .map_err(|e| format!("sending the plan: {e}"))?;
    let show_progress = args
        .progress
        .unwrap_or_else(|| std::io::stderr().is_terminal());
    let mut out = report::Output::new(args.json, header);
    out.header().map_err(|e| e.to_string())?;
    let mut progress = Progress::new(show_progress, plan.sizes.len());
    for (index, &size) in plan.sizes.iter().enumerate() {
        let protocol = if size as u64 <= eager_limit {
            "eager"
        } else {
            "rndv"
        };
        progress.start(index, size);
        let row = match plan.window {
            None => latency(worker, ep, plan, size, &mut progress)?,
            Some(w) => bandwidth(worker, ep, plan, size, w, &mut progress)?,
        };
        progress.clear();
        out.row(Row { protocol, ..row })
            .map_err(|e| e.to_string())?;
    }
    out.finish().map_err(|e| e.to_string())?;
    ep.close().map_err(|e| format!("close: {e}"))
}

fn latency(
    worker: &Worker,
    ep: &Ep,
    plan: &Plan,
    size: usize,
    progress: &mut Progress,
) -> Result<Row> {
    let (warmup, iters) = (plan.warmup_for(size), plan.iters_for(size));
    let total = warmup + iters;
    let mut sbuf = pattern(size, total)?;
    let mut rbuf = alloc(size)?;
    let mut one_way = Vec::with_capacity(iters);
    // One clock read per round trip (as ib_send_lat): each ends where the next begins.
    let mut t0 = Instant::now();
    for i in 0..total {
        let r = worker.tag_recv(DATA, TAG_MASK_ALL, rbuf);
        let s = ep.tag_send(DATA, sbuf);
        sbuf = wait(s, "send")?.buf;
        let got = wait(r, "receive")?;
        let t1 = Instant::now();
        let rtt = t1 - t0;
        t0 = t1;
        check_len(&got, size)?;
        rbuf = got.buf;
        if i >= warmup {
            one_way.push(rtt.as_secs_f64() * 1e6 / 2.0);
        }
        progress.tick(i + 1, total);
    }
    if rbuf != sbuf {
        let at = rbuf.iter().zip(&sbuf).position(|(a, b)| a != b);
        return Err(format!(
            "the {size}-byte echo differs from what was sent (first at byte {at:?})"
        ));
    }
    Ok(Row::from_samples(
        size,
        iters,
        warmup,
        &mut one_way,
        |mean_us| (size as f64 / (mean_us * 1e-6), 1.0 / (mean_us * 1e-6)),
    ))
}

/// Sends `count` messages from `bufs` with at most `bufs.len()` outstanding (a sliding
/// window: the oldest send is waited for before the next starts, as `ucx_perftest`'s stream
/// test does), then waits for the server's acknowledgement of all of them. Each wait for the
/// oldest send records the time since the previous one in `per_msg` (µs).
fn send_window(
    worker: &Worker,
    ep: &Ep,
    bufs: &mut Vec<Vec<u8>>,
    count: usize,
    mut per_msg: Option<&mut Vec<f64>>,
) -> Result<()> {
    let ack = worker.tag_recv(ACK, TAG_MASK_ALL, Vec::new());
    let mut sends = VecDeque::with_capacity(bufs.len());
    let mut last = Instant::now();
    for _ in 0..count {
        let buf = match bufs.pop() {
            Some(buf) => buf,
            None => {
                let oldest = sends.pop_front().ok_or("an empty send window")?;
                let buf = wait(oldest, "send")?.buf;
                let now = Instant::now();
                if let Some(samples) = per_msg.as_deref_mut() {
                    samples.push((now - last).as_secs_f64() * 1e6);
                }
                last = now;
                buf
            }
        };
        sends.push_back(ep.tag_send(DATA, buf));
    }
    for s in sends {
        bufs.push(wait(s, "send")?.buf);
    }
    wait(ack, "acknowledgement")?;
    Ok(())
}

fn bandwidth(
    worker: &Worker,
    ep: &Ep,
    plan: &Plan,
    size: usize,
    w: usize,
    progress: &mut Progress,
) -> Result<Row> {
    let (warm, timed) = plan.windows_for(size);
    let mut bufs = Vec::with_capacity(w);
    for k in 0..w {
        bufs.push(pattern(size, k)?);
    }
    if warm > 0 {
        send_window(worker, ep, &mut bufs, warm * w, None)?;
    }
    progress.tick(warm, warm + timed);
    let msgs = timed * w;
    let mut per_msg = Vec::with_capacity(msgs);
    let t0 = Instant::now();
    send_window(worker, ep, &mut bufs, msgs, Some(&mut per_msg))?;
    let elapsed = t0.elapsed().as_secs_f64();
    progress.tick(warm + timed, warm + timed);
    if per_msg.is_empty() {
        // A single window: no send waited for another; its mean is all there is.
        per_msg.push(elapsed * 1e6 / msgs as f64);
    }
    let m = msgs as f64;
    Ok(Row::from_samples(
        size,
        msgs,
        warm * w,
        &mut per_msg,
        |_| (m * size as f64 / elapsed, m / elapsed),
    ))
}
