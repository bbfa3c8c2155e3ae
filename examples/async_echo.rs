//! An async RPC-style echo service on one worker: a tokio server answers requests from
//! many concurrent client tasks (1000 by default), each task making calls one after
//! another over endpoints it shares with the others. Nothing blocks a task: the client
//! connects with `Worker::connect_nb`, the server accepts with `rdmx::tokio::accept`,
//! requests and replies are awaited as futures, and each worker is driven by
//! `rdmx::tokio::drive`.
//!
//! ```text
//! cargo run --release --example async_echo                       # server and clients here
//! cargo run --release --example async_echo -- --serve 0.0.0.0:7000
//! cargo run --release --example async_echo -- --connect HOST:7000 --tasks 1000 --calls 100
//! ```
//!
//! A call is a request whose tag carries the caller's task and call number (the top bit
//! marks requests): the server's handler tasks each take any request (a wildcard receive
//! on that bit), and answer on the endpoint it came from with the same tag, marked as a
//! reply. The client checks that each reply carries its own request's bytes back.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use clap::Parser;
use rdmx::{ConnId, Context, Ep, Transport, Worker};

/// The tag bit of requests; replies have it clear.
const REQUEST: u64 = 1 << 63;
/// The tag that tells a server, in a request, to stop (the `--connect` side's last call).
const STOP: u64 = REQUEST | (1 << 62);

#[derive(Parser, Debug, Clone)]
#[command(about = "An async RPC-style echo service over rdmx")]
struct Args {
    /// Serve at this address (host:port) until a client says stop.
    #[arg(long, conflicts_with = "connect")]
    serve: Option<String>,
    /// Call a server at this address (host:port).
    #[arg(long)]
    connect: Option<String>,
    /// Where the server of a run with neither --serve nor --connect listens.
    #[arg(long, default_value = "127.0.0.1:0")]
    addr: String,
    /// Concurrent client tasks.
    #[arg(long, default_value_t = 1000)]
    tasks: u64,
    /// Calls each task makes, one after another.
    #[arg(long, default_value_t = 20)]
    calls: u64,
    /// Endpoints the client's tasks share.
    #[arg(long, default_value_t = 4)]
    endpoints: usize,
    /// The server's handler tasks.
    #[arg(long, default_value_t = 64)]
    handlers: usize,
    /// Bytes of each request (and its reply).
    #[arg(long, default_value_t = 64)]
    size: usize,
    /// Transport: tcp, shm or rdma (default: the context's, RDMX_TRANSPORT).
    #[arg(long)]
    transport: Option<Transport>,
}

/// What the clients did.
#[derive(Debug)]
struct Report {
    calls: u64,
    elapsed: Duration,
    slowest: Duration,
}

fn context(args: &Args) -> rdmx::Result<Context> {
    let b = Context::builder();
    match args.transport {
        Some(t) => b.transport(t).build(),
        None => b.build(),
    }
}

/// The server: accepts connections and answers requests until one says stop.
async fn serve(worker: Worker, addr: &str, handlers: usize, size: usize) -> rdmx::Result<()> {
    let _driver = rdmx::tokio::drive(&worker)?;
    let listener = worker.listen(addr)?;
    println!(
        "serving at {}",
        listener.local_addr().map_or(addr.into(), |a| a.to_string())
    );
    serve_on(worker, listener, handlers, size).await
}

async fn serve_on(
    worker: Worker,
    listener: rdmx::Listener,
    handlers: usize,
    size: usize,
) -> rdmx::Result<()> {
    let eps: Arc<RwLock<HashMap<ConnId, Ep>>> = Arc::default();
    // (A client may send as soon as its connect completes, before the accepting task has
    // put the endpoint in the map: a handler waits for it, told by this.)
    let accepted = Arc::new(tokio::sync::Notify::new());
    let accepting = {
        let (eps, accepted) = (eps.clone(), accepted.clone());
        tokio::spawn(async move {
            loop {
                match rdmx::tokio::accept(&listener).await {
                    Ok(ep) => {
                        log::info!("accepted {:?} over {}", ep.peer_addr(), ep.transport());
                        eps.write().unwrap().insert(ep.id(), ep);
                        accepted.notify_waiters();
                    }
                    Err(e) => {
                        log::error!("accept: {e}");
                        return;
                    }
                }
            }
        })
    };
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    for _ in 0..handlers {
        let (worker, eps, stop_tx) = (worker.clone(), eps.clone(), stop_tx.clone());
        let accepted = accepted.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let req = worker.tag_recv(REQUEST, REQUEST, vec![0; size]).await?;
                if req.tag == STOP {
                    let _ = stop_tx.send(true);
                    return Ok::<_, rdmx::Error>(());
                }
                let Some(id) = req.conn else {
                    continue;
                };
                let Some(ep) = endpoint(&eps, &accepted, id).await else {
                    log::warn!("a request from an endpoint never accepted, or gone");
                    continue;
                };
                let mut reply = req.buf;
                reply.truncate(req.length);
                ep.tag_send(req.tag & !REQUEST, reply).await?;
            }
        }));
    }
    let _ = stop_rx.wait_for(|&s| s).await;
    for t in tasks {
        t.abort();
    }
    accepting.abort();
    println!("server: stopped");
    Ok(())
}

/// The server's endpoint `id`, waiting up to a second for the accepting task to add it.
async fn endpoint(
    eps: &RwLock<HashMap<ConnId, Ep>>,
    accepted: &tokio::sync::Notify,
    id: ConnId,
) -> Option<Ep> {
    let added = async {
        loop {
            // (Made before the look: an endpoint added after it wakes this.)
            let next = accepted.notified();
            if let Some(ep) = eps.read().unwrap().get(&id).cloned() {
                return ep;
            }
            next.await;
        }
    };
    tokio::time::timeout(Duration::from_secs(1), added)
        .await
        .ok()
}

/// The clients: `tasks` tasks making `calls` calls each over `endpoints` shared endpoints.
async fn call(worker: Worker, addr: &str, args: &Args, stop: bool) -> rdmx::Result<Report> {
    let _driver = rdmx::tokio::drive(&worker)?;
    let connecting: Vec<_> = (0..args.endpoints.max(1))
        .map(|_| worker.connect_nb(addr))
        .collect();
    let mut eps = Vec::new();
    for c in connecting {
        eps.push(c.await?);
    }
    println!(
        "client: {} endpoints to {addr} over {}",
        eps.len(),
        eps[0].transport()
    );
    let eps = Arc::new(eps);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..args.tasks {
        let (worker, eps, calls, size) = (worker.clone(), eps.clone(), args.calls, args.size);
        tasks.push(tokio::spawn(async move {
            let mut slowest = Duration::ZERO;
            for c in 0..calls {
                let tag = (t << 24) | c;
                let body: Vec<u8> = (0..size).map(|i| (tag as usize + i) as u8).collect();
                let ep = &eps[(t + c) as usize % eps.len()];
                let began = Instant::now();
                let reply = worker.tag_recv(tag, rdmx::TAG_MASK_ALL, vec![0; size]);
                ep.tag_send(REQUEST | tag, body.clone()).await?;
                let got = reply.await?;
                slowest = slowest.max(began.elapsed());
                if got.buf[..got.length] != body[..] {
                    return Err(rdmx::Error::Invalid(format!(
                        "call {c} of task {t}: the reply is not the request's bytes"
                    )));
                }
            }
            Ok(slowest)
        }));
    }
    let mut slowest = Duration::ZERO;
    for t in tasks {
        let s = t
            .await
            .map_err(|e| rdmx::Error::Invalid(format!("a client task: {e}")))??;
        slowest = slowest.max(s);
    }
    let elapsed = start.elapsed();
    if stop {
        eps[0].tag_send(STOP, Vec::new()).await?;
    }
    for ep in eps.iter() {
        ep.close_nb().await?;
    }
    Ok(Report {
        calls: args.tasks * args.calls,
        elapsed,
        slowest,
    })
}

/// Runs what `args` asks for on the current tokio runtime.
async fn run(args: Args) -> rdmx::Result<Option<Report>> {
    let ctx = context(&args)?;
    if let Some(addr) = &args.serve {
        serve(ctx.worker()?, addr, args.handlers, args.size).await?;
        return Ok(None);
    }
    if let Some(addr) = &args.connect {
        return call(ctx.worker()?, addr, &args, true).await.map(Some);
    }
    // Both here: a server worker and a client worker.
    let server = ctx.worker()?;
    let _driver = rdmx::tokio::drive(&server)?;
    let listener = server.listen(&args.addr)?;
    let addr = listener
        .local_addr()
        .ok_or_else(|| rdmx::Error::Invalid("the listener has no address".into()))?
        .to_string();
    let serving = tokio::spawn(serve_on(server, listener, args.handlers, args.size));
    let report = call(ctx.worker()?, &addr, &args, true).await?;
    serving
        .await
        .map_err(|e| rdmx::Error::Invalid(format!("the server task: {e}")))??;
    Ok(Some(report))
}

fn print(r: &Report) {
    println!(
        "{} calls in {:.3} s: {:.0} calls/s; the slowest call took {:.1} us",
        r.calls,
        r.elapsed.as_secs_f64(),
        r.calls as f64 / r.elapsed.as_secs_f64(),
        r.slowest.as_secs_f64() * 1e6,
    );
}

fn main() {
    env_logger::init();
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match rt.block_on(run(args)) {
        Ok(Some(r)) => print(&r),
        Ok(None) => {}
        Err(e) => {
            eprintln!("async_echo: {e}");
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 1000 client tasks, each making its calls over 4 shared endpoints, answered by 64
    /// handler tasks of one server worker: every reply is its own request's bytes.
    fn thousand_tasks(transport: Transport) {
        let _ = env_logger::builder().is_test(true).try_init();
        let args = Args::parse_from([
            "async_echo",
            "--tasks",
            "1000",
            "--calls",
            "5",
            "--transport",
            &transport.to_string(),
        ]);
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
            .unwrap();
        let report = rt
            .block_on(async {
                tokio::time::timeout(Duration::from_secs(120), run(args))
                    .await
                    .expect("the run hung")
            })
            .expect("the run")
            .expect("a report");
        print(&report);
        assert_eq!(report.calls, 5000);
    }

    #[test]
    fn a_thousand_client_tasks_over_tcp() {
        thousand_tasks(Transport::Tcp);
    }

    #[test]
    fn a_thousand_client_tasks_over_shm() {
        thousand_tasks(Transport::Shm);
    }
}
