//! Endpoint scale, for `scripts/bench-endpoints`: how long one process takes to connect
//! `N` endpoints to one server worker, and what receive memory the workers and the process
//! hold once they are up.
//!
//! ```text
//! endpoints [--eps N] [--clients C] [--addr IP]     (defaults 64, 4, 127.0.0.1)
//! ```
//!
//! One server worker listens on `IP`; `C` client workers, one thread each, connect `N`
//! endpoints to it between them (the server accepting), and every endpoint then sends one
//! 8-byte message that the server receives: the connect time runs from the first connect
//! to the last of those messages (and the server's answer to each). Then it reports the
//! server worker's receive memory ([`rdmx::WorkerStats::recv_buffer_bytes`]), the client
//! workers' together, the process's resident memory growth (`VmRSS` before the workers and
//! after: both sides of every endpoint, sockets and QPs included), and the
//! server's credit pool. The transport is `RDMX_TRANSPORT` (auto by default); every other
//! setting is rdmx's default. The last line is machine-readable:
//! `RESULT eps=… connect_ms=… server_recv_bytes=… client_recv_bytes=… rss_bytes=… …`.

use std::thread;
use std::time::Instant;

use rdmx::{Context, Ep, TAG_MASK_ALL};

/// The tag of the server's answer to each endpoint.
const REPLY: u64 = u64::MAX;

fn main() {
    env_logger::init();
    if let Err(e) = run() {
        eprintln!("endpoints: {e}");
        std::process::exit(1);
    }
}

/// The process's resident memory in bytes (`VmRSS` of /proc/self/status).
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kib| kib.parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

/// Raises the open-file limit to its hard limit: N TCP endpoints on both sides of one
/// process take 2N descriptors.
fn raise_fd_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut lim = getrlimit(Resource::Nofile);
    if lim.current < lim.maximum {
        lim.current = lim.maximum;
        if let Err(e) = setrlimit(Resource::Nofile, lim) {
            log::warn!("could not raise the open-file limit: {e}");
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let get = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let n: usize = get("--eps").map_or(Ok(64), |v| v.parse())?;
    let clients: usize = get("--clients").map_or(Ok(4), |v| v.parse())?;
    let ip = get("--addr").unwrap_or_else(|| "127.0.0.1".into());
    if n == 0 || clients == 0 {
        return Err("--eps and --clients must be at least 1".into());
    }
    raise_fd_limit();
    let rss_before = rss_bytes();
    let ctx = Context::new()?;
    let server = ctx.worker()?;
    let listener = server.listen(&format!("{ip}:0"))?;
    let addr = listener
        .local_addr()
        .ok_or("the listener has no local address")?
        .to_string();
    let workers = (0..clients)
        .map(|_| ctx.worker())
        .collect::<Result<Vec<_>, _>>()?;
    let started = Instant::now();
    let connecting: Vec<_> = workers
        .iter()
        .enumerate()
        .map(|(c, w)| {
            let (w, addr) = (w.clone(), addr.clone());
            let mine = (0..n).filter(|i| i % clients == c).count();
            thread::spawn(move || -> rdmx::Result<Vec<Ep>> {
                let eps = (0..mine)
                    .map(|_| w.connect(&addr))
                    .collect::<rdmx::Result<Vec<_>>>()?;
                for (j, ep) in eps.iter().enumerate() {
                    let i = (j * clients + c) as u64;
                    ep.tag_send(i, i.to_le_bytes().to_vec()).wait()?;
                }
                for _ in 0..mine {
                    w.recv_vec(REPLY, TAG_MASK_ALL)?;
                }
                Ok(eps)
            })
        })
        .collect();
    let accepted = (0..n)
        .map(|_| listener.accept())
        .collect::<rdmx::Result<Vec<_>>>()?;
    for i in 0..n as u64 {
        let (data, _) = server.recv_vec(i, TAG_MASK_ALL)?;
        if data != i.to_le_bytes() {
            return Err(format!("endpoint {i} sent {data:?}").into());
        }
    }
    for ep in &accepted {
        ep.tag_send(REPLY, vec![1; 8]).wait()?;
    }
    let mut eps = Vec::new();
    for t in connecting {
        eps.push(t.join().map_err(|_| "a client thread panicked")??);
    }
    let connect = started.elapsed();
    let rss_after = rss_bytes();
    let st = server.stats();
    let client_recv: u64 = workers.iter().map(|w| w.stats().recv_buffer_bytes).sum();
    let rss = rss_after.saturating_sub(rss_before);
    println!(
        "{n} endpoints over {} from {clients} client workers: connected in {:.1} ms; server \
         receive memory {} B, clients' {} B; RSS +{rss} B; credits {:?}",
        ctx.transport(),
        connect.as_secs_f64() * 1e3,
        st.recv_buffer_bytes,
        client_recv,
        st.credits
    );
    println!(
        "RESULT eps={n} connect_ms={:.1} server_recv_bytes={} client_recv_bytes={client_recv} \
         rss_bytes={rss} credits_granted={} credit_pool={}",
        connect.as_secs_f64() * 1e3,
        st.recv_buffer_bytes,
        st.credits.granted,
        st.credits.pool
    );
    drop((eps, accepted));
    Ok(())
}
