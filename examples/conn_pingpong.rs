//! The floor under rdmx's RDMA latency: an 8-byte ping-pong straight on rdmx-conn (inline
//! SENDs, busy-polled CQ, receives reposted as they complete), with the worker, the engine and
//! the tag matching left out. Against `ib_send_lat` it measures what the safe verbs layer
//! costs; against `pingpong --result -s 8` what everything above it costs.
//!
//! ```text
//! conn_pingpong --server 192.0.2.1:7480 [--srq]         # one client, then exits
//! conn_pingpong --client 192.0.2.1:7480 [--srq] [N]     # N round trips (default 3000)
//! ```
//! `--srq` posts the receives on a shared receive queue, as rdmx's workers do; without it
//! the QP has its own receive queue, as `ib_send_lat` has.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use rdmx::conn::{
    connect, Access, AddrInfo, Completion, CompletionQueue, Connection, Device, EventChannel,
    ProtectionDomain, QpConfig, SharedReceiveQueue, Side, WorkKind,
};

const TIMEOUT: Duration = Duration::from_secs(20);
const RECVS: usize = 64;
const SIZE: usize = 8;
/// The first byte of the client's last message: the server stops echoing.
const BYE: u8 = 0xff;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let srq = args.iter().any(|a| a == "--srq");
    let rest: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|a| *a != "--srq")
        .collect();
    let result = match rest[..] {
        ["--server", addr] => server(addr, srq),
        ["--client", addr] => client(addr, srq, 3000),
        ["--client", addr, n] => match n.parse() {
            Ok(n) => client(addr, srq, n),
            Err(_) => Err(format!("{n:?} is not a number of round trips").into()),
        },
        _ => Err(
            "usage: conn_pingpong --server HOST:PORT [--srq] | --client HOST:PORT [--srq] [N]"
                .into(),
        ),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("conn_pingpong: {err}");
            ExitCode::FAILURE
        }
    }
}

/// One side's verbs objects, receives posted.
struct Side1 {
    pd: ProtectionDomain,
    cq: CompletionQueue,
    srq: Option<SharedReceiveQueue>,
    events: EventChannel,
}

impl Side1 {
    fn new(device: &Device, srq: bool) -> Result<Side1> {
        let pd = ProtectionDomain::new(device)?;
        let cq = CompletionQueue::new(device, 256, false)?;
        let srq = if srq {
            let srq = SharedReceiveQueue::new(&pd, &cq, RECVS as u32)?;
            for (i, buf) in pd
                .register_chunks(64, RECVS, Access::LOCAL_WRITE)?
                .into_iter()
                .enumerate()
            {
                srq.post_recv(buf, i as u64).map_err(|(e, _)| e)?;
            }
            Some(srq)
        } else {
            None
        };
        let events = EventChannel::new()?;
        Ok(Side1 {
            pd,
            cq,
            srq,
            events,
        })
    }

    fn config(&self) -> QpConfig {
        let mut config = QpConfig::new(&self.pd, &self.cq, self.srq.as_ref(), &self.events);
        config.recv_depth = RECVS as u32;
        config
    }

    /// Receives on the QP's own queue (when there is no SRQ).
    fn post_own_recvs(&self, conn: &Connection) -> Result<()> {
        if self.srq.is_none() {
            for (i, buf) in self
                .pd
                .register_chunks(64, RECVS, Access::LOCAL_WRITE)?
                .into_iter()
                .enumerate()
            {
                conn.post_recv(buf, i as u64).map_err(|(e, _)| e)?;
            }
        }
        Ok(())
    }

    /// Busy-polls until a receive completes (send completions are taken on the way),
    /// reposts its buffer and returns the message's first byte.
    fn recv(&self, conn: &Connection, out: &mut Vec<Completion>) -> Result<u8> {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            out.clear();
            self.cq.poll(out, 4)?;
            let mut got = None;
            for c in out.drain(..) {
                if !c.status.is_success() {
                    return Err(format!("{:?} failed: {:?}", c.kind, c.status).into());
                }
                if c.kind == WorkKind::Recv {
                    let buf = c.buffer.expect("a receive buffer");
                    got = Some(buf[0]);
                    match &self.srq {
                        Some(srq) => srq.post_recv(buf, c.cookie).map_err(|(e, _)| e)?,
                        None => conn.post_recv(buf, c.cookie).map_err(|(e, _)| e)?,
                    }
                }
            }
            if let Some(first) = got {
                return Ok(first);
            }
            if Instant::now() > deadline {
                return Err("no message within 20 s".into());
            }
        }
    }
}

impl Side1 {
    /// Waits for a send to complete (the goodbye left before the connection goes).
    fn recv_send_done(&self, out: &mut Vec<Completion>) -> Result<()> {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            out.clear();
            self.cq.poll(out, 4)?;
            if out
                .iter()
                .any(|c| c.kind == WorkKind::Send && c.cookie == 2)
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err("the goodbye was not sent within 20 s".into());
            }
        }
    }
}

fn server(addr: &str, srq: bool) -> Result<()> {
    let listener = rdmx::conn::Listener::bind(&AddrInfo::resolve(addr, Side::Passive)?, 8)?;
    let device = listener
        .device()?
        .ok_or("the listen address is not on an RDMA device")?;
    let side = Side1::new(&device, srq)?;
    eprintln!("conn_pingpong: listening on {addr}");
    let request = listener
        .get_request(Some(TIMEOUT))?
        .ok_or("no client within 20 s")?;
    let conn = request.accept(&side.config(), b"", TIMEOUT)?;
    side.post_own_recvs(&conn)?;
    let mut out = Vec::new();
    let ping = [0u8; SIZE];
    // Echo until the client says goodbye.
    while side.recv(&conn, &mut out)? != BYE {
        conn.post_send_inline(&ping, 1)?;
    }
    Ok(())
}

fn client(addr: &str, srq: bool, n: usize) -> Result<()> {
    let dst = AddrInfo::resolve(addr, Side::Active)?;
    let device = Device::for_route(&dst)?;
    let side = Side1::new(&device, srq)?;
    let deadline = Instant::now() + TIMEOUT;
    let conn = loop {
        match connect(&dst, &side.config(), b"", TIMEOUT) {
            Ok(conn) => break conn,
            Err(e) if Instant::now() < deadline => {
                log::debug!("connect: {e}; retrying");
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(e.into()),
        }
    };
    side.post_own_recvs(&conn)?;
    let mut out = Vec::new();
    let ping = [0u8; SIZE];
    let warmup = n / 10;
    let mut started = Instant::now();
    for i in 0..warmup + n {
        if i == warmup {
            started = Instant::now();
        }
        conn.post_send_inline(&ping, 1)?;
        side.recv(&conn, &mut out)?;
    }
    let one_way = started.elapsed().as_secs_f64() * 1e6 / (2 * n) as f64;
    conn.post_send_inline(&[BYE; SIZE], 2)?;
    side.recv_send_done(&mut out)?;
    println!("RESULT lat_us={one_way:.3}");
    Ok(())
}
