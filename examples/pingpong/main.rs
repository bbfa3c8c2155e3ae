//! The ping-pong demo and rdmx's benchmark client, in the manner of `ucx_perftest -t tag_lat`
//! / `tag_bw` and `ib_send_lat`: one-way latency or bandwidth of tagged messages over a size
//! sweep.
//!
//! ```text
//! pingpong                              both sides in one process, loopback, auto transport
//! pingpong --server [ADDR]              serve one client (default 0.0.0.0:13337)
//! pingpong --client HOST[:PORT] [-s 1:16M] [-n N] [-w N] [--bw [--window N]]
//!                               [--json | --result] [--async]
//! ```
//!
//! `--async` (latency and bandwidth; on either side, each its own): the side awaits its requests as
//! futures in one task of a tokio runtime, its worker driven by `rdmx::tokio::drive`,
//! instead of waiting for them (`Request::wait`) — the path of an async service.
//!
//! Latency mode times each round trip (receive pre-posted, then send) and reports half of it
//! (`--run-clock`: times the run as a whole, for machines where reading the clock is a system
//! call, and in bandwidth mode, for a sender that does nothing per message but send).
//! Bandwidth mode keeps a sliding window of sends outstanding (the oldest is waited for
//! before the next starts), all from one shared buffer (`--own-buffers`: one per send), the server keeps as many receives posted (each reposted as it
//! completes; `--recv-window N`: N of them) and acknowledges once after the warm-up and once after the measured messages,
//! as `ucx_perftest`'s stream test runs. Every latency size's last echo is checked byte for
//! byte. The server prints `pingpong: listening on HOST:PORT (TRANSPORTS)` on stderr once it
//! listens. Sizes, defaults, statistics and the JSON schema are `rdmx-bench`'s, shared with
//! its socket baseline and its report. `--help` lists every option.

use std::collections::VecDeque;
use std::io::{IsTerminal, Write};
#[cfg(feature = "rdma")]
use std::net::IpAddr;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use clap::Parser;
use rdmx::{Context, Ep, Request, Transport, Worker, TAG_MASK_ALL};
use rdmx_bench::clock::Clock;
use rdmx_bench::plan::{Plan, SweepArgs};
use rdmx_bench::schema::{
    self, histogram, record, record_n, Histogram, PingpongDoc, PingpongRow, MB,
};
use rdmx_bench::sizes::format_size;

mod tasks;
use tasks::Tasks;
#[cfg(feature = "tokio")]
use tasks::{latency_async, send_window_async, serve_latency_async, serve_window_async};

const SETUP: u64 = 1;
const DATA: u64 = 2;
const ACK: u64 = 3;
/// The default port of `--server` and `--client HOST`.
const DEFAULT_PORT: u16 = 13337;

type Result<T> = std::result::Result<T, String>;

/// rdmx's ping-pong: one-way latency or bandwidth over a size sweep. Environment:
/// RDMX_TRANSPORT (auto|shm|rdma|tcp), RDMX_EAGER_THRESHOLD and the other RDMX_* settings (see
/// rdmx-info). Latency is one-way: half the round trip. MB = 2^20 bytes.
#[derive(Parser)]
#[command(name = "pingpong")]
struct Args {
    /// Serve one client at ADDR, then exit [default: 0.0.0.0:13337]
    #[arg(long, value_name = "ADDR", num_args = 0..=1, conflicts_with = "client",
          default_missing_value = "0.0.0.0", value_parser = with_port)]
    server: Option<String>,
    /// Run the sweep against the server at HOST[:PORT] (default port 13337)
    #[arg(long, value_name = "HOST[:PORT]", value_parser = with_port)]
    client: Option<String>,
    #[command(flatten)]
    sweep: SweepArgs,
    /// Machine-readable lines instead of the table, one per size: `RESULT size=S lat_us=MEAN
    /// p50_us=P msgs_per_s=R` (latency) or `RESULT size=S bw_mbs=B msgs_per_s=R`
    #[arg(long, conflicts_with = "json")]
    result: bool,
    /// Progress lines on stderr even when it is not a terminal
    #[arg(long, overrides_with = "no_progress")]
    progress: bool,
    /// No progress lines
    #[arg(long)]
    no_progress: bool,
    /// Read the clock once per run, not once per round trip (latency) or per send waited for
    /// (bandwidth); every percentile is then the mean. Where the clock is a system call (a VM
    /// whose clocksource is hpet, such as the Soft-RoCE guests) a read per round trip adds
    /// its cost to every one, and to a count of system calls; `ib_send_lat` reads the TSC,
    /// which costs no call. In bandwidth mode the reading and the histogram took about 90 of
    /// the sender's 650 instructions per 8 B message over shared memory (callgrind), as much
    /// as a third of the receiver's lead on it, which decides whether the receiver finds a
    /// backlog (the rate is then its speed) or waits on the sender's cache lines.
    #[arg(long)]
    run_clock: bool,
    /// Bandwidth: receives the server keeps posted, 1 to the window [default: the window].
    /// Rendezvous messages beyond them wait at the server as headers (their data stays with
    /// the client until a receive matches), so the server's buffers hold N messages instead
    /// of a window's worth: `ucx_perftest` posts all its receives into one buffer, which a
    /// safe API cannot do, and stays in cache where 16 MiB of distinct buffers do not
    #[arg(long, value_name = "N", requires = "bw")]
    recv_window: Option<u32>,
    /// Bandwidth: each send of the window from a buffer of its own (moved into the send and
    /// back), instead of one buffer shared by the window's sends (`Ep::tag_send_shared`), as
    /// `ucx_perftest`, `ib_read_bw` and `osu_bw` send
    #[arg(long, requires = "bw")]
    own_buffers: bool,
    /// Await each request as a future in one task of a tokio runtime (current thread), the
    /// worker driven by `rdmx::tokio::drive` in its wait mode, instead of waiting for it
    /// (`Request::wait`); latency and bandwidth. Each side chooses for itself
    #[arg(long = "async")]
    async_tasks: bool,
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let args: Args = rdmx_bench::cli::parse_or_exit("pingpong");
    let plan = plan_of(&args).unwrap_or_else(|e| {
        eprintln!("pingpong: {e}");
        std::process::exit(2)
    });
    if let Err(e) = run(&args, &plan) {
        eprintln!("pingpong: {e}");
        std::process::exit(1);
    }
}

/// The sweep the options describe, checked.
fn plan_of(args: &Args) -> Result<Plan> {
    let mut plan = args.sweep.plan()?;
    plan.recv_window = args.recv_window;
    plan.validate()?;
    Ok(plan)
}

/// `HOST` or `HOST:PORT` (IPv6 as `[::1]:PORT`) → `HOST:PORT`, checking the port.
fn with_port(addr: &str) -> Result<String> {
    let addr = addr.trim();
    let (host, port) = match addr.strip_prefix('[') {
        Some(rest) => {
            let (h, tail) = rest
                .split_once(']')
                .ok_or(format!("`{addr}`: missing `]`"))?;
            (format!("[{h}]"), tail.strip_prefix(':'))
        }
        None if addr.matches(':').count() > 1 => (format!("[{addr}]"), None),
        None => match addr.split_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (addr.to_string(), None),
        },
    };
    if host.is_empty() {
        return Err("empty address".into());
    }
    let port = port.map_or(Ok(DEFAULT_PORT), |p| {
        p.parse::<u16>()
            .map_err(|_| format!("`{addr}`: `{p}` is not a port number"))
    })?;
    Ok(format!("{host}:{port}"))
}

fn run(args: &Args, plan: &Plan) -> Result<()> {
    let ctx = Context::new().map_err(|e| e.to_string())?;
    let worker = ctx.worker().map_err(|e| e.to_string())?;
    // (Driven from before its first connection: see `rdmx::tokio`.)
    let tasks = Tasks::new(args.async_tasks, &worker)?;
    if let Some(addr) = &args.server {
        let listener = worker
            .listen(addr)
            .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        let bound = listener
            .local_addr()
            .map_or(addr.clone(), |a| a.to_string());
        let over: Vec<String> = listener
            .transports()
            .iter()
            .map(|t| t.to_string())
            .collect();
        eprintln!("pingpong: listening on {bound} ({})", over.join(", "));
        let ep = listener.accept().map_err(|e| format!("accept: {e}"))?;
        return serve(&worker, &ep, tasks.as_ref());
    }
    let connect = |addr: &str| {
        worker
            .connect(addr)
            .map_err(|e| format!("cannot connect to {addr}: {e}"))
    };
    if let Some(addr) = &args.client {
        return client(&ctx, &worker, &connect(addr)?, args, plan, tasks.as_ref());
    }
    // Loopback: the server side on a thread of its own.
    let host = loopback_host(&ctx)?;
    let server_worker = ctx.worker().map_err(|e| e.to_string())?;
    let listener = server_worker
        .listen(&format!("{host}:0"))
        .map_err(|e| format!("cannot listen on {host}: {e}"))?;
    let addr = listener
        .local_addr()
        .ok_or("the listener has no local address")?
        .to_string();
    let server_async = args.async_tasks;
    let server = thread::spawn(move || -> Result<()> {
        let tasks = Tasks::new(server_async, &server_worker)?;
        let ep = listener.accept().map_err(|e| format!("accept: {e}"))?;
        serve(&server_worker, &ep, tasks.as_ref())
    });
    let ep = connect(&addr)?;
    client(&ctx, &worker, &ep, args, plan, tasks.as_ref())?;
    drop(ep);
    server
        .join()
        .map_err(|_| "the server thread panicked".to_string())?
        .map_err(|e| format!("server side: {e}"))
}

/// An address both sides of a one-process run can use: loopback for TCP and shared memory; for RDMA an address
/// of the (first, or `RDMX_DEVICE`) device with an active port, since rdmacm does not route
/// over `lo`.
fn loopback_host(ctx: &Context) -> Result<String> {
    if matches!(ctx.transport(), Transport::Tcp | Transport::Shm) {
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
        let ports = d.ports().unwrap_or_default();
        let active = |port: &u8| ports.iter().any(|p| p.port == *port && p.state == "ACTIVE");
        let addrs = d.ip_addrs().unwrap_or_default();
        let pick = addrs
            .iter()
            .filter(|(port, _)| active(port))
            .map(|(_, a)| *a)
            .min_by_key(|a| !a.is_ipv4());
        match pick {
            Some(IpAddr::V4(v4)) => return Ok(v4.to_string()),
            Some(IpAddr::V6(v6)) => return Ok(format!("[{v6}]")),
            None => {}
        }
    }
    Err("no RDMA device has an active port with an IP address; \
         run with RDMX_TRANSPORT=tcp, or give --server/--client addresses"
        .into())
}

fn alloc(size: u64) -> Result<Vec<u8>> {
    let mut v = Vec::new();
    v.try_reserve_exact(size as usize)
        .map_err(|_| format!("cannot allocate {size} bytes"))?;
    v.resize(size as usize, 0);
    Ok(v)
}

fn pattern(size: u64, seed: u64) -> Result<Vec<u8>> {
    let mut v = alloc(size)?;
    for (i, b) in v.iter_mut().enumerate() {
        *b = (i.wrapping_mul(31) ^ seed as usize) as u8;
    }
    Ok(v)
}

// (Inlined into the loops that wait for each message, as `Request::wait` is: as a call, the
// request and its result went through memory, and the error's formatting took registers.)
#[inline(always)]
fn wait(r: Request, what: &str) -> Result<rdmx::Done> {
    r.wait().map_err(|e| failed(what, e))
}

#[cold]
#[inline(never)]
fn failed(what: &str, e: rdmx::Error) -> String {
    format!("{what}: {e}")
}

fn check_len(got: &rdmx::Done, size: u64) -> Result<()> {
    if got.length as u64 != size {
        return Err(format!(
            "expected a {size}-byte message, the peer sent {}",
            got.length
        ));
    }
    Ok(())
}

/// The server side of one session: receives the plan, then echoes (latency) or receives
/// windows (bandwidth) for every size.
fn serve(worker: &Worker, ep: &Ep, tasks: Option<&Tasks>) -> Result<()> {
    let (plan, _): (Plan, _) = worker
        .recv_obj(SETUP, TAG_MASK_ALL)
        .map_err(|e| format!("reading the client's plan: {e}"))?;
    plan.validate()
        .map_err(|e| format!("the client's plan is invalid: {e}"))?;
    for &size in &plan.sizes {
        let (warm, timed) = plan.counts_for(size);
        match plan.window {
            None => serve_latency(worker, ep, size, warm + timed, tasks)?,
            Some(w) => {
                let posted = plan.recv_window.unwrap_or(w);
                let mut bufs = (0..posted)
                    .map(|_| alloc(size))
                    .collect::<Result<Vec<_>>>()?;
                for count in [warm, timed].into_iter().filter(|&c| c > 0) {
                    #[cfg(feature = "tokio")]
                    if let Some(t) = tasks {
                        t.rt.block_on(serve_window_async(worker, ep, &mut bufs, size, count))?;
                        continue;
                    }
                    serve_window(worker, ep, &mut bufs, size, count)?;
                }
            }
        }
    }
    ep.flush(Duration::from_secs(30))
        .map_err(|e| format!("flush: {e}"))
}

/// Echoes `total` pings. Each receive is posted once the previous echo is sent, as
/// ucx_perftest's tag_lat responder does (receive, then send): posting it takes no time
/// between a ping's arrival and its echo, and the next ping, a round trip away, still finds
/// it posted (the expected path).
fn serve_latency(
    worker: &Worker,
    ep: &Ep,
    size: u64,
    total: u64,
    tasks: Option<&Tasks>,
) -> Result<()> {
    #[cfg(feature = "tokio")]
    if let Some(t) = tasks {
        return t.rt.block_on(serve_latency_async(worker, ep, size, total));
    }
    #[cfg(not(feature = "tokio"))]
    let _ = tasks;
    let mut buf = alloc(size)?;
    for _ in 0..total {
        let got = wait(worker.tag_recv(DATA, TAG_MASK_ALL, buf), "receive")?;
        check_len(&got, size)?;
        buf = wait(ep.tag_send(DATA, got.buf), "send")?.buf;
    }
    Ok(())
}

/// Receives `count` messages with `bufs.len()` receives kept posted (each reposted as it
/// completes), then acknowledges them all.
fn serve_window(
    worker: &Worker,
    ep: &Ep,
    bufs: &mut Vec<Vec<u8>>,
    size: u64,
    count: u64,
) -> Result<()> {
    let mut posted: VecDeque<Request> = bufs
        .drain(..)
        .take(count as usize)
        .map(|b| worker.tag_recv(DATA, TAG_MASK_ALL, b))
        .collect();
    let mut started = posted.len() as u64;
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

/// The client side: sends the plan, runs every size, prints the table, the RESULT lines or
/// the JSON.
fn client(
    ctx: &Context,
    worker: &Worker,
    ep: &Ep,
    args: &Args,
    plan: &Plan,
    tasks: Option<&Tasks>,
) -> Result<()> {
    let eager_limit = ep.eager_limit().ok_or("the connection closed")?;
    let mut doc = PingpongDoc {
        tool: "rdmx-pingpong".into(),
        transport: ep.transport().to_string(),
        device: worker.stats().device,
        peer: ep.peer_addr().map(|a| a.to_string()),
        eager_threshold: Some(ctx.config().eager_threshold_for(ep.transport())),
        eager_limit: Some(eager_limit),
        mode: if plan.window.is_some() {
            schema::MODE_BANDWIDTH
        } else {
            schema::MODE_LATENCY
        }
        .into(),
        window: plan.window.map(u64::from),
        results: Vec::new(),
    };
    ep.send_obj(SETUP, plan)
        .map_err(|e| format!("sending the plan: {e}"))?;
    let table = !args.sweep.json && !args.result;
    // (Read once per message or round trip, as ucx_perftest and perftest read theirs.)
    let clock = Clock::new();
    if table {
        let source = ctx
            .config()
            .entries()
            .into_iter()
            .find(|e| e.var == rdmx::EAGER_THRESHOLD_VAR)
            .map(|e| e.source.to_string())
            .unwrap_or_default();
        let device = doc.device.as_deref().map(|d| format!(", device {d}"));
        let peer = doc.peer.as_deref().map(|p| format!(", server {p}"));
        let time = if plan.window.is_some() {
            "per message"
        } else {
            "one-way"
        };
        println!(
            "{}",
            schema::table_title("rdmx pingpong", doc.window, plan.sizes.len())
        );
        // (The data path: over shared memory, also how rendezvous data moves — by CMA, or
        // copied through the ring where the kernel refuses CMA.)
        println!(
            "# transport {}{}{}",
            ep.data_path(),
            device.unwrap_or_default(),
            peer.unwrap_or_default()
        );
        println!(
            "# RDMX_EAGER_THRESHOLD {} B ({source}); eager up to {eager_limit} B on this endpoint, rendezvous above",
            doc.eager_threshold.unwrap_or_default()
        );
        println!(
            "# times in µs {time}, clock {}; MB = 2^20 bytes\n{}",
            clock.source(),
            schema::table_columns()
        );
    }
    if table && tasks.is_some() {
        println!("# requests awaited as futures (--async), the worker driven by rdmx::tokio");
    }
    let run = Run {
        worker,
        ep,
        clock: &clock,
        tasks,
    };
    let progress = !args.no_progress && (args.progress || std::io::stderr().is_terminal());
    for (index, &size) in plan.sizes.iter().enumerate() {
        let protocol = if size <= eager_limit { "eager" } else { "rndv" };
        if progress {
            eprintln!(
                "pingpong: size {}/{} ({})",
                index + 1,
                plan.sizes.len(),
                format_size(size)
            );
        }
        let counts = plan.counts_for(size);
        let row = match plan.window {
            None => latency(&run, size, protocol, counts, args.run_clock)?,
            Some(w) => bandwidth(
                &run,
                size,
                protocol,
                counts,
                (w, args.own_buffers),
                args.run_clock,
            )?,
        };
        if table {
            println!("{}", schema::table_row(&row));
        } else if args.result {
            println!("{}", result_line(&row, plan.window.is_some()));
        }
        let _ = std::io::stdout().flush();
        doc.results.push(row);
    }
    if args.sweep.json {
        print!("{}", doc.to_json());
    }
    ep.close().map_err(|e| format!("close: {e}"))
}

/// The machine-readable line of `--result` (the scripts read `lat_us`, `bw_mbs` and
/// `msgs_per_s` from it).
fn result_line(r: &PingpongRow, bandwidth: bool) -> String {
    if bandwidth {
        format!(
            "RESULT size={} bw_mbs={:.3} msgs_per_s={:.0}",
            r.size,
            r.bytes_per_s / MB,
            r.msgs_per_s
        )
    } else {
        format!(
            "RESULT size={} lat_us={:.3} p50_us={:.3} msgs_per_s={:.0}",
            r.size, r.mean_us, r.p50_us, r.msgs_per_s
        )
    }
}

/// What the client's measurements run on: its worker, the endpoint to the server, and the
/// clock they read.
struct Run<'a> {
    worker: &'a Worker,
    ep: &'a Ep,
    clock: &'a Clock,
    tasks: Option<&'a Tasks>,
}

fn latency(
    run: &Run,
    size: u64,
    protocol: &str,
    (warm, timed): (u64, u64),
    run_clock: bool,
) -> Result<PingpongRow> {
    #[cfg(feature = "tokio")]
    if let Some(t) = run.tasks {
        return t
            .rt
            .block_on(latency_async(run, size, protocol, (warm, timed), run_clock));
    }
    #[cfg(not(feature = "tokio"))]
    let _ = run.tasks;
    let &Run {
        worker, ep, clock, ..
    } = run;
    let total = warm + timed;
    let mut sbuf = pattern(size, total)?;
    let mut rbuf = alloc(size)?;
    let mut rtt = histogram();
    // One clock read per round trip (as ib_send_lat): each ends where the next begins. With
    // `run_clock`, one when the timed round trips begin and one when they end.
    let mut t0 = clock.now();
    for i in 0..total {
        if run_clock && i == warm {
            t0 = clock.now();
        }
        // Send, then post the receive for the echo, as ucx_perftest's tag_lat initiator does:
        // the echo is a round trip away, so it still finds the receive posted.
        sbuf = wait(ep.tag_send(DATA, sbuf), "send")?.buf;
        let got = wait(worker.tag_recv(DATA, TAG_MASK_ALL, rbuf), "receive")?;
        if !run_clock {
            let t1 = clock.now();
            if i >= warm {
                record(&mut rtt, clock.between(t0, t1));
            }
            t0 = t1;
        }
        check_len(&got, size)?;
        rbuf = got.buf;
    }
    latency_row(
        size,
        protocol,
        (warm, timed),
        run_clock,
        (sbuf, rbuf),
        rtt,
        clock,
        t0,
    )
}

/// The row of a latency run whose timed part began at `t0` (with `run_clock`), checking
/// that the last echo `rbuf` is what was sent, `sbuf`.
#[allow(clippy::too_many_arguments)]
fn latency_row(
    size: u64,
    protocol: &str,
    (warm, timed): (u64, u64),
    run_clock: bool,
    (sbuf, rbuf): (Vec<u8>, Vec<u8>),
    mut rtt: Histogram<u64>,
    clock: &Clock,
    t0: rdmx_bench::clock::Stamp,
) -> Result<PingpongRow> {
    if run_clock && timed > 0 {
        let ns = clock.since(t0).as_nanos() / u128::from(timed);
        let each = Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX));
        record_n(&mut rtt, each, timed);
    }
    if rbuf != sbuf {
        let at = rbuf.iter().zip(&sbuf).position(|(a, b)| a != b);
        return Err(format!(
            "the {size}-byte echo differs from what was sent (first at byte {at:?})"
        ));
    }
    Ok(PingpongRow::latency(size, protocol, (warm, timed), &rtt))
}

/// What a bandwidth run sends from.
enum Source {
    /// One buffer, shared by every send of the window (`Ep::tag_send_shared`).
    Shared(Arc<Vec<u8>>),
    /// A buffer per send of the window, moved into the send and back (`Ep::tag_send`).
    Own(Vec<Vec<u8>>),
}

/// Sends `count` messages from `src` with at most `window` outstanding (a sliding window: the
/// oldest send is waited for before the next starts), then waits for the server's
/// acknowledgement. With `gaps`, each wait for the oldest send records the time since the
/// previous one in it.
fn send_window(
    &Run {
        worker, ep, clock, ..
    }: &Run,
    src: &mut Source,
    window: usize,
    count: u64,
    mut gaps: Option<&mut Histogram<u64>>,
) -> Result<()> {
    let ack = worker.tag_recv(ACK, TAG_MASK_ALL, Vec::new());
    let mut sends = VecDeque::with_capacity(window);
    let mut last = clock.now();
    for _ in 0..count {
        if sends.len() == window {
            let oldest: Request = sends.pop_front().ok_or("an empty send window")?;
            let buf = wait(oldest, "send")?.buf;
            if let Source::Own(bufs) = src {
                bufs.push(buf);
            }
            if let Some(gaps) = gaps.as_deref_mut() {
                let now = clock.now();
                record(gaps, clock.between(last, now));
                last = now;
            }
        }
        sends.push_back(match src {
            Source::Shared(data) => ep.tag_send_shared(DATA, data),
            Source::Own(bufs) => ep.tag_send(DATA, bufs.pop().ok_or("no send buffer left")?),
        });
    }
    for s in sends {
        let buf = wait(s, "send")?.buf;
        if let Source::Own(bufs) = src {
            bufs.push(buf);
        }
    }
    wait(ack, "acknowledgement")?;
    Ok(())
}

/// [`send_window`], or with `--async` [`send_window_async`] on the side's runtime.
fn send_window_in(
    run: &Run,
    src: &mut Source,
    window: usize,
    count: u64,
    gaps: Option<&mut Histogram<u64>>,
) -> Result<()> {
    #[cfg(feature = "tokio")]
    if let Some(t) = run.tasks {
        return t
            .rt
            .block_on(send_window_async(run, src, window, count, gaps));
    }
    send_window(run, src, window, count, gaps)
}

fn bandwidth(
    run: &Run,
    size: u64,
    protocol: &str,
    (warm, timed): (u64, u64),
    (w, own_buffers): (u32, bool),
    run_clock: bool,
) -> Result<PingpongRow> {
    let mut src = if own_buffers {
        Source::Own(
            (0..u64::from(w))
                .map(|k| pattern(size, k))
                .collect::<Result<Vec<_>>>()?,
        )
    } else {
        Source::Shared(Arc::new(pattern(size, 0)?))
    };
    let window = w as usize;
    if warm > 0 {
        send_window_in(run, &mut src, window, warm, None)?;
    }
    let mut gaps = histogram();
    let t0 = run.clock.now();
    let per_send = (!run_clock).then_some(&mut gaps);
    send_window_in(run, &mut src, window, timed, per_send)?;
    let elapsed = run.clock.since(t0);
    if gaps.is_empty() {
        // Timed as a whole, or a single window (no send waited for another): its mean is
        // all there is.
        record(&mut gaps, elapsed / timed.max(1) as u32);
    }
    Ok(PingpongRow::bandwidth(
        size,
        protocol,
        (warm, timed),
        &gaps,
        elapsed,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_get_the_default_port() {
        assert_eq!(with_port("example"), Ok("example:13337".into()));
        assert_eq!(with_port("10.0.0.1:99"), Ok("10.0.0.1:99".into()));
        assert_eq!(with_port("[::1]:5"), Ok("[::1]:5".into()));
        assert_eq!(with_port("::1"), Ok("[::1]:13337".into()));
        assert!(with_port("h:70000")
            .unwrap_err()
            .contains("not a port number"));
        assert!(with_port("").is_err());
    }

    #[test]
    fn the_command_line() {
        let a = Args::try_parse_from(["pingpong", "--server", "-n", "3"]).unwrap();
        assert_eq!(a.server.as_deref(), Some("0.0.0.0:13337"));
        let a = Args::try_parse_from(["pingpong", "--bw", "-s", "1M", "-n", "64"]).unwrap();
        let plan = a.sweep.plan().unwrap();
        assert_eq!((plan.window, plan.iters_for(1 << 20)), (Some(16), 64));
        assert!(Args::try_parse_from(["pingpong", "--window", "4"]).is_err());
        let a = Args::try_parse_from(["pingpong", "--bw", "--recv-window", "2"]).unwrap();
        assert_eq!(plan_of(&a).unwrap().recv_window, Some(2));
        let a = Args::try_parse_from(["pingpong", "--bw", "--window", "4", "--recv-window", "5"])
            .unwrap();
        assert!(plan_of(&a).unwrap_err().contains("receive window 5"));
        assert!(Args::try_parse_from(["pingpong", "--recv-window", "2"]).is_err());
        assert!(Args::try_parse_from(["pingpong", "--server", "--client", "x"]).is_err());
        assert!(Args::try_parse_from(["pingpong", "--json", "--result"]).is_err());
    }
}
