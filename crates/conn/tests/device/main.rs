//! Device tests: real rdmacm/verbs on Soft-RoCE. The host has no RDMA, so every test here is
//! `#[ignore]`d there; `scripts/test` runs them with `--ignored` inside the guest that
//! `scripts/softroce` boots (rxe0 on 192.0.2.1, rxe1 on 192.0.2.2).

use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use rdmx_conn::*;

mod channel;
mod connections;
mod events;
mod teardown;
mod two_sided;

const LONG: Duration = Duration::from_secs(30);

fn env_addr(name: &str) -> IpAddr {
    let value = std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run the device tests through scripts/test (it boots the Soft-RoCE guest)")
    });
    value
        .parse()
        .unwrap_or_else(|_| panic!("{name}={value:?} is not an IP address"))
}

fn addr_a() -> IpAddr {
    env_addr("SOFTROCE_ADDR_A")
}

fn addr_b() -> IpAddr {
    env_addr("SOFTROCE_ADDR_B")
}

/// One side's shared verbs objects and event channel: what a worker owns.
struct Verbs {
    pd: ProtectionDomain,
    cq: CompletionQueue,
    srq: Option<SharedReceiveQueue>,
    events: EventChannel,
}

impl Verbs {
    fn new(ip: IpAddr, srq_depth: Option<u32>, events: bool) -> Verbs {
        let device = Device::for_local_addr(ip).expect("device owning the address");
        let pd = ProtectionDomain::new(&device).expect("pd");
        let cq = CompletionQueue::new(&device, 1024, events).expect("cq");
        let srq = srq_depth.map(|depth| SharedReceiveQueue::new(&pd, &cq, depth).expect("srq"));
        let events = EventChannel::new().expect("event channel");
        Verbs {
            pd,
            cq,
            srq,
            events,
        }
    }

    fn config(&self) -> QpConfig {
        QpConfig::new(&self.pd, &self.cq, self.srq.as_ref(), &self.events)
    }

    /// Registers `count` receive buffers of `len` bytes (one region) and posts them on the SRQ.
    fn fill_srq(&self, count: usize, len: usize) {
        let srq = self.srq.as_ref().expect("an SRQ");
        for (i, buf) in self
            .pd
            .register_chunks(len, count, Access::LOCAL_WRITE)
            .unwrap()
            .into_iter()
            .enumerate()
        {
            srq.post_recv(buf, i as u64).map_err(|(e, _)| e).unwrap();
        }
    }
}

fn listen(ip: IpAddr) -> (Listener, SocketAddr) {
    let listener = Listener::bind(
        &AddrInfo::from_socket_addr(SocketAddr::new(ip, 0), Side::Passive).unwrap(),
        16,
    )
    .unwrap();
    let addr = listener.local_addr().expect("bound address");
    assert_ne!(addr.port(), 0, "the system picked a port");
    (listener, addr)
}

fn dst(addr: SocketAddr) -> AddrInfo {
    AddrInfo::from_socket_addr(addr, Side::Active).unwrap()
}

/// Polls `cq` until `n` completions arrived (panics after 30 s: the guest is slow, not stuck).
fn collect(cq: &CompletionQueue, n: usize) -> Vec<Completion> {
    let deadline = Instant::now() + LONG;
    let mut out = Vec::new();
    while out.len() < n {
        let want = n - out.len();
        cq.poll(&mut out, want).unwrap();
        assert!(
            Instant::now() < deadline,
            "only {} of {n} completions arrived: {out:?}",
            out.len()
        );
        thread::yield_now();
    }
    out
}

/// RDMA READs each `(offset, piece)` from `remote` at that offset, all in flight at once, and
/// returns the pieces, filled, in the order given (asserting every READ succeeded).
fn read_pieces(
    conn: &Connection,
    cq: &CompletionQueue,
    remote: RemoteBuf,
    pieces: Vec<(usize, RegisteredBuf)>,
) -> Vec<RegisteredBuf> {
    let n = pieces.len();
    for (i, (at, piece)) in pieces.into_iter().enumerate() {
        let len = piece.len();
        let part = RemoteBuf {
            addr: remote.addr + at as u64,
            len: len as u32,
            rkey: remote.rkey,
        };
        conn.post_read(piece, len, part, i as u64)
            .map_err(|(e, _)| e)
            .unwrap();
    }
    let mut reads = collect(cq, n);
    assert!(
        reads
            .iter()
            .all(|c| c.status.is_success() && c.kind == WorkKind::Read),
        "{reads:?}"
    );
    reads.sort_by_key(|c| c.cookie);
    reads.into_iter().map(|c| c.buffer.unwrap()).collect()
}

/// Accepts one request on another thread, returning the connection through a channel.
fn accept_one(
    listener: Listener,
    config: QpConfig,
    reply: &'static [u8],
) -> thread::JoinHandle<(Listener, Connection, Vec<u8>)> {
    thread::spawn(move || {
        let request = listener
            .get_request(Some(LONG))
            .unwrap()
            .expect("a connection request");
        let data = request.private_data().to_vec();
        let conn = request.accept(&config, reply, LONG).unwrap();
        (listener, conn, data)
    })
}

/// A server with a filled SRQ and a client with its own receive queue, connected.
struct Pair {
    server: Verbs,
    client: Verbs,
    listener: Listener,
    server_conn: Connection,
    client_conn: Connection,
}

fn connected_pair(
    ip: IpAddr,
    srq_buffers: usize,
    server_events: bool,
    client_events: bool,
) -> Pair {
    let server = Verbs::new(ip, Some(srq_buffers as u32), server_events);
    server.fill_srq(srq_buffers, 64);
    let client = Verbs::new(ip, None, client_events);
    let (listener, addr) = listen(ip);
    let accepted = accept_one(listener, server.config(), b"");
    let client_conn = connect(&dst(addr), &client.config(), b"", LONG).unwrap();
    let (listener, server_conn, _) = accepted.join().unwrap();
    Pair {
        server,
        client,
        listener,
        server_conn,
        client_conn,
    }
}
