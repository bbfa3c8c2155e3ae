//! One-sided operations, the way an application uses them: a server worker maps a shared
//! counter and a table and sends their keys to its clients in tag messages; each client (a
//! worker on a thread of its own) increments the counter with fetch-and-add, writes its row
//! of the table with put, flushes, and once every client is done reads the whole table back
//! with get. The server never takes part in the operations: over RDMA its NIC performs
//! them, over TCP and shared memory its progress thread does.
//!
//! ```text
//! one_sided [--clients 4] [--adds 10000]      RDMX_TRANSPORT picks the transport
//! ```

use std::collections::VecDeque;
use std::thread;

use clap::Parser;
use rdmx::{Context, Ep, RemoteAccess, Request, Worker, TAG_MASK_ALL};

const COUNTER_KEY: u64 = 1;
const TABLE_KEY: u64 = 2;
const DONE: u64 = 3;
const GO: u64 = 4;
/// Bytes of one row of the table.
const ROW: usize = 64;

/// A shared counter and a table, on a server, reached by clients with one-sided operations.
#[derive(Parser)]
struct Args {
    /// Client workers, each on a thread of its own
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Fetch-and-adds each client makes (16 in flight)
    #[arg(long, default_value_t = 10_000)]
    adds: u64,
    /// Address the server listens on
    #[arg(long, default_value = "127.0.0.1")]
    addr: String,
}

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn main() -> Result<()> {
    env_logger::init();
    let args = Args::parse();
    let ctx = Context::new()?;
    let server = ctx.worker()?;
    server.start_progress_thread()?;
    let listener = server.listen(&format!("{}:0", args.addr))?;
    let addr = listener
        .local_addr()
        .ok_or("no listening address")?
        .to_string();
    let counter = server.mem_map(8, RemoteAccess::ATOMIC)?;
    let table = server.mem_map(args.clients * ROW, RemoteAccess::READ | RemoteAccess::WRITE)?;
    println!(
        "server: counter and a {}-byte table mapped; clients connect to {addr}",
        table.len()
    );

    let clients: Vec<_> = (0..args.clients)
        .map(|i| {
            let (ctx, addr, adds) = (ctx.clone(), addr.clone(), args.adds);
            thread::spawn(move || client(&ctx, &addr, i, adds))
        })
        .collect();
    let eps: Vec<Ep> = (0..args.clients)
        .map(|_| listener.accept())
        .collect::<rdmx::Result<_>>()?;
    for ep in &eps {
        ep.send(COUNTER_KEY, &counter.pack_rkey())?;
        ep.send(TABLE_KEY, &table.pack_rkey())?;
    }
    println!("server: keys sent over {}", eps[0].data_path());
    // Every client's operations completed at this worker's memory before its message.
    for _ in &eps {
        server.recv_vec(DONE, TAG_MASK_ALL)?;
    }
    let total = counter.load(0)?;
    println!("server: the counter is {total}");
    for ep in &eps {
        ep.send(GO, &[])?;
    }
    let mut ok = true;
    for c in clients {
        let (i, rows) = c.join().map_err(|_| "a client panicked")??;
        if i == 0 {
            println!("client 0 read the table:");
            for row in rows.chunks(ROW) {
                println!("  {}", String::from_utf8_lossy(row).trim_end_matches('\0'));
            }
        }
        ok &= rows == table.to_vec();
    }
    let want = args.clients as u64 * args.adds;
    if total != want || !ok {
        return Err(format!("the counter is {total}, not {want}, or a table read differs").into());
    }
    println!(
        "ok: {} clients x {} fetch-and-adds = {total}",
        args.clients, args.adds
    );
    Ok(())
}

/// Client `i`: its fetch-and-adds, its row, then the whole table.
fn client(ctx: &Context, addr: &str, i: usize, adds: u64) -> Result<(usize, Vec<u8>)> {
    let w: Worker = ctx.worker()?;
    let ep = w.connect(addr)?;
    let (bytes, _) = w.recv_vec(COUNTER_KEY, TAG_MASK_ALL)?;
    let counter = ep.unpack_rkey(&bytes)?;
    let (bytes, _) = w.recv_vec(TABLE_KEY, TAG_MASK_ALL)?;
    let table = ep.unpack_rkey(&bytes)?;
    let mut window: VecDeque<Request> = VecDeque::new();
    let (mut lowest, mut highest) = (u64::MAX, 0);
    for _ in 0..adds {
        if window.len() == 16 {
            let old = window.pop_front().unwrap().wait()?.value;
            (lowest, highest) = (lowest.min(old), highest.max(old));
        }
        window.push_back(ep.atomic_fetch_add(&counter, 0, 1)?);
    }
    for r in window {
        let old = r.wait()?.value;
        (lowest, highest) = (lowest.min(old), highest.max(old));
    }
    let mut row = format!("client {i}: {adds} adds, saw {lowest}..={highest}").into_bytes();
    row.resize(ROW, 0);
    ep.put(&table, (i * ROW) as u64, row)?.wait()?;
    // (The put completed at the server already; a flush covers what was not waited for.)
    ep.rma_flush().wait()?;
    ep.send(DONE, &[])?;
    w.recv_vec(GO, TAG_MASK_ALL)?;
    let len = table.len() as usize;
    let rows = ep.get(&table, 0, vec![0; len])?.wait()?.buf;
    ep.close()?;
    Ok((i, rows))
}
