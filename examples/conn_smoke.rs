//! rdmacm smoke test: one SEND and one RDMA READ between a server and a client process.
//!
//! ```text
//! conn_smoke --server 192.0.2.1:7471     # waits for one client
//! conn_smoke --client 192.0.2.1:7471     # connects, SENDs, READs 1 MiB, checks it
//! ```
//! `scripts/demo` runs both in the Soft-RoCE guest.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use rdmx::conn::{
    connect, Access, AddrInfo, Completion, CompletionQueue, Device, EventChannel, Listener,
    ProtectionDomain, QpConfig, RemoteBuf, SharedReceiveQueue, Side,
};

const EXPOSED_LEN: usize = 1 << 20;
const TIMEOUT: Duration = Duration::from_secs(20);

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["--server", addr] => server(addr),
        ["--client", addr] => client(addr),
        _ => Err("usage: conn_smoke --server HOST:PORT | --client HOST:PORT".into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("conn_smoke: {err}");
            ExitCode::FAILURE
        }
    }
}

fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(31) ^ (i >> 12)) as u8
}

fn wait_one(cq: &CompletionQueue) -> Result<Completion> {
    let mut out = Vec::new();
    if cq.wait(&mut out, 1, Some(TIMEOUT))? == 0 {
        return Err("no completion within 20 s".into());
    }
    let c = out.pop().expect("one completion");
    if !c.status.is_success() {
        return Err(format!("{:?} failed: {:?}", c.kind, c.status).into());
    }
    Ok(c)
}

fn server(addr: &str) -> Result<()> {
    let listener = Listener::bind(&AddrInfo::resolve(addr, Side::Passive)?, 8)?;
    let device = listener
        .device()?
        .ok_or("the listen address is not on an RDMA device")?;
    println!("server: listening on {} ({})", addr, device.name());
    let pd = ProtectionDomain::new(&device)?;
    let cq = CompletionQueue::new(&device, 64, true)?;
    let srq = SharedReceiveQueue::new(&pd, &cq, 16)?;
    for buf in pd.register_chunks(4096, 16, Access::LOCAL_WRITE)? {
        srq.post_recv(buf, 0).map_err(|(e, _)| e)?;
    }
    let request = listener
        .get_request(Some(TIMEOUT))?
        .ok_or("no client within 20 s")?;
    println!(
        "server: request from {:?} saying {:?}",
        request.peer_addr(),
        text(request.private_data())
    );
    let conn = request.accept(
        &QpConfig::new(&pd, &cq, Some(&srq), &EventChannel::new()?),
        b"welcome to rdmx",
        TIMEOUT,
    )?;

    let hello = wait_one(&cq)?;
    let buf = hello.buffer.as_ref().expect("an SRQ buffer");
    println!(
        "server: SEND landed in the SRQ ({} bytes from qp {}): {:?}",
        hello.byte_len,
        hello.qp_num,
        text(&buf[..hello.byte_len as usize])
    );

    let exposed = pd.register_from(
        &(0..EXPOSED_LEN).map(pattern).collect::<Vec<_>>(),
        Access::REMOTE_READ,
    )?;
    let remote = exposed.remote().expect("registered with REMOTE_READ");
    let mut ad = Vec::with_capacity(16);
    ad.extend_from_slice(&remote.addr.to_le_bytes());
    ad.extend_from_slice(&remote.len.to_le_bytes());
    ad.extend_from_slice(&remote.rkey.to_le_bytes());
    conn.post_send_inline(&ad, 1)?;
    println!(
        "server: exposed {EXPOSED_LEN} bytes for RDMA READ (rkey {:#x})",
        remote.rkey
    );
    wait_one(&cq)?; // our SEND

    let done = wait_one(&cq)?;
    let buf = done.buffer.as_ref().expect("an SRQ buffer");
    println!(
        "server: client reports {:?}",
        text(&buf[..done.byte_len as usize])
    );
    drop(exposed);
    Ok(())
}

fn client(addr: &str) -> Result<()> {
    let dst = AddrInfo::resolve(addr, Side::Active)?;
    let device = Device::for_route(&dst)?;
    let pd = ProtectionDomain::new(&device)?;
    let cq = CompletionQueue::new(&device, 64, true)?;
    let config = QpConfig::new(&pd, &cq, None, &EventChannel::new()?);
    let start = Instant::now();
    let conn = loop {
        match connect(&dst, &config, b"conn_smoke client", TIMEOUT) {
            Ok(conn) => break conn,
            // The server process may not be listening yet.
            Err(err) if err.is_refused() && start.elapsed() < TIMEOUT => {
                std::thread::sleep(Duration::from_millis(200))
            }
            Err(err) => return Err(err.into()),
        }
    };
    println!(
        "client: connected to {addr} ({}), server said {:?}",
        device.name(),
        text(conn.peer_private_data())
    );

    conn.post_recv(pd.register(64, Access::LOCAL_WRITE)?, 0)
        .map_err(|(e, _)| e)?;
    let hello = pd.register_from(b"hello over RDMA SEND", Access::SEND)?;
    let len = hello.len();
    conn.post_send(hello, len, 1).map_err(|(e, _)| e)?;
    wait_one(&cq)?;

    let ad = wait_one(&cq)?;
    let ad = &ad.buffer.as_ref().expect("the receive buffer")[..16];
    let remote = RemoteBuf {
        addr: u64::from_le_bytes(ad[..8].try_into()?),
        len: u32::from_le_bytes(ad[8..12].try_into()?),
        rkey: u32::from_le_bytes(ad[12..16].try_into()?),
    };
    let target = pd.register(remote.len as usize, Access::LOCAL_WRITE)?;
    conn.post_read(target, remote.len as usize, remote, 2)
        .map_err(|(e, _)| e)?;
    let read = wait_one(&cq)?;
    let data = read.buffer.expect("the READ target");
    let wrong = data
        .iter()
        .enumerate()
        .filter(|&(i, &b)| b != pattern(i))
        .count();
    println!(
        "client: RDMA READ of {} bytes at {:#x}: {} wrong bytes",
        data.len(),
        remote.addr,
        wrong
    );
    let report = format!("read {} bytes, {} wrong", data.len(), wrong);
    conn.post_send_inline(report.as_bytes(), 3)?;
    wait_one(&cq)?;
    if wrong != 0 {
        return Err(format!("{wrong} bytes differ from what the server exposed").into());
    }
    println!("client: OK");
    Ok(())
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .trim_end_matches('\0')
        .to_string()
}
