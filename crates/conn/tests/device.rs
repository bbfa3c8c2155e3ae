//! Device tests: real rdmacm/verbs on Soft-RoCE. The host has no RDMA, so every test here is
//! `#[ignore]`d there; `scripts/test` runs them with `--ignored` inside the guest that
//! `scripts/softroce` boots (rxe0 on 192.0.2.1, rxe1 on 192.0.2.2).

use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use rdmx_conn::*;

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

/// One side's shared verbs objects: what a worker owns.
struct Verbs {
    pd: ProtectionDomain,
    cq: CompletionQueue,
    srq: Option<SharedReceiveQueue>,
}

impl Verbs {
    fn new(ip: IpAddr, srq_depth: Option<u32>, events: bool) -> Verbs {
        let device = Device::for_local_addr(ip).expect("device owning the address");
        let pd = ProtectionDomain::new(&device).expect("pd");
        let cq = CompletionQueue::new(&device, 1024, events).expect("cq");
        let srq = srq_depth.map(|depth| SharedReceiveQueue::new(&pd, &cq, depth).expect("srq"));
        Verbs { pd, cq, srq }
    }

    fn config(&self) -> QpConfig {
        QpConfig::new(&self.pd, &self.cq, self.srq.as_ref())
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
    addr: SocketAddr,
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
        addr,
        server_conn,
        client_conn,
    }
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn devices_and_ports_are_listed() {
    let names: Vec<String> = Device::list().unwrap().iter().map(|d| d.name()).collect();
    for var in ["SOFTROCE_DEV_A", "SOFTROCE_DEV_B"] {
        let want = std::env::var(var).unwrap();
        assert!(names.contains(&want), "{want} not in {names:?}");
        let device = Device::by_name(&want).unwrap();
        let ports = device.ports().unwrap();
        assert_eq!(ports.len(), 1);
        assert_eq!(ports[0].state, "ACTIVE");
        assert_eq!(ports[0].link_layer, "Ethernet");
        assert!(device.limits().unwrap().max_srq_wr > 0);
    }
    assert_eq!(
        Device::for_local_addr(addr_a()).unwrap().name(),
        std::env::var("SOFTROCE_DEV_A").unwrap()
    );
    assert_eq!(
        Device::for_local_addr(addr_b()).unwrap().name(),
        std::env::var("SOFTROCE_DEV_B").unwrap()
    );
    let route = AddrInfo::from_socket_addr(SocketAddr::new(addr_b(), 7471), Side::Active).unwrap();
    assert_eq!(
        Device::for_route(&route).unwrap().name(),
        std::env::var("SOFTROCE_DEV_B").unwrap()
    );
    assert!(Device::by_name("no-such-device")
        .unwrap_err()
        .message()
        .contains("no-such-device"));
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn connect_accept_and_reject_carry_private_data() {
    for ip in [addr_a(), addr_b()] {
        let server = Verbs::new(ip, Some(16), false);
        let client = Verbs::new(ip, Some(16), false);
        let (listener, addr) = listen(ip);
        let accepted = accept_one(listener, server.config(), b"accepted-by-server");
        let conn = connect(&dst(addr), &client.config(), b"hello-from-client", LONG).unwrap();
        let (listener, server_conn, request_data) = accepted.join().unwrap();
        assert!(
            request_data.starts_with(b"hello-from-client"),
            "{request_data:?}"
        );
        assert!(conn.peer_private_data().starts_with(b"accepted-by-server"));
        assert_eq!(conn.peer_addr().map(|a| a.port()), Some(addr.port()));
        assert_eq!(server_conn.peer_addr().map(|a| a.ip()), Some(ip));
        assert_ne!(conn.qp_num(), server_conn.qp_num());

        // A rejected request: the client gets ECONNREFUSED and the server's reason.
        let rejecter = thread::spawn(move || {
            let request = listener.get_request(Some(LONG)).unwrap().unwrap();
            assert!(request.private_data().starts_with(b"may I?"));
            request.reject(b"not today").unwrap();
            listener
        });
        let err = connect(&dst(addr), &client.config(), b"may I?", LONG).unwrap_err();
        assert!(err.is_refused(), "{err}");
        assert!(err.message().contains("rejected"), "{err}");
        assert!(
            err.reject_data().starts_with(b"not today"),
            "{:?}",
            err.reject_data()
        );
        rejecter.join().unwrap();

        // Private data past the connect limit is refused before anything is sent.
        let err = connect(
            &dst(addr),
            &client.config(),
            &[0u8; MAX_CONNECT_PRIVATE_DATA + 1],
            LONG,
        )
        .unwrap_err();
        assert_eq!(err.errno(), libc::EINVAL);
    }
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn connections_share_one_srq_and_one_cq() {
    const CLIENTS: usize = 3;
    let ip = addr_a();
    let server = Verbs::new(ip, Some(32), false);
    server.fill_srq(32, 256);
    let (listener, addr) = listen(ip);
    let config = server.config();
    let acceptor = thread::spawn(move || {
        (0..CLIENTS)
            .map(|_| {
                listener
                    .get_request(Some(LONG))
                    .unwrap()
                    .unwrap()
                    .accept(&config, b"", LONG)
                    .unwrap()
            })
            .collect::<Vec<_>>()
    });
    let clients: Vec<(Verbs, Connection)> = (0..CLIENTS)
        .map(|i| {
            let side = Verbs::new(ip, None, false);
            let conn = connect(
                &dst(addr),
                &side.config(),
                format!("client {i}").as_bytes(),
                LONG,
            )
            .unwrap();
            (side, conn)
        })
        .collect();
    let server_conns = acceptor.join().unwrap();
    assert_eq!(server.cq.pending(), 32, "32 receives posted on the SRQ");

    // Each client sends two messages: one from a registered buffer, one inline.
    for (i, (side, conn)) in clients.iter().enumerate() {
        let buf = side
            .pd
            .register_from(
                format!("buffer message from client {i}").as_bytes(),
                Access::SEND,
            )
            .unwrap();
        let len = buf.len();
        conn.post_send(buf, len, 100 + i as u64)
            .map_err(|(e, _)| e)
            .unwrap();
        conn.post_send_inline(
            format!("inline message from client {i}").as_bytes(),
            200 + i as u64,
        )
        .unwrap();
        let sent = collect(&side.cq, 2);
        assert!(
            sent.iter()
                .all(|c| c.status.is_success() && c.kind == WorkKind::Send),
            "{sent:?}"
        );
        let returned = sent.iter().find(|c| c.cookie == 100 + i as u64).unwrap();
        assert_eq!(
            returned.buffer.as_ref().map(|b| b.len()),
            Some(len),
            "the send buffer came back"
        );
    }

    // All six land in the one SRQ and complete on the one CQ, tagged with the sender's QP.
    let received = collect(&server.cq, 2 * CLIENTS);
    let server_qps: Vec<u32> = server_conns.iter().map(|c| c.qp_num()).collect();
    for c in &received {
        assert!(c.status.is_success(), "{c:?}");
        assert_eq!(c.kind, WorkKind::Recv);
        let buf = c.buffer.as_ref().expect("an SRQ buffer");
        let text = std::str::from_utf8(&buf[..c.byte_len as usize]).unwrap();
        let client: usize = text.rsplit(' ').next().unwrap().parse().unwrap();
        assert_eq!(
            c.qp_num, server_qps[client],
            "{text} arrived on the QP of client {client}"
        );
    }
    let mut per_qp: Vec<u32> = received.iter().map(|c| c.qp_num).collect();
    per_qp.sort();
    per_qp.dedup();
    assert_eq!(
        per_qp.len(),
        CLIENTS,
        "messages came through {CLIENTS} different QPs"
    );
    assert_eq!(server.cq.pending(), 32 - 2 * CLIENTS);

    // Receive buffers go back on the SRQ and are used again.
    for c in received {
        server
            .srq
            .as_ref()
            .unwrap()
            .post_recv(c.buffer.unwrap(), c.cookie)
            .map_err(|(e, _)| e)
            .unwrap();
    }
    assert_eq!(server.cq.pending(), 32);
    clients[0].1.post_send_inline(b"again", 7).unwrap();
    collect(&clients[0].0.cq, 1);
    let again = collect(&server.cq, 1);
    assert_eq!(&again[0].buffer.as_ref().unwrap()[..5], b"again");
    drop(server_conns);
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn rdma_read_of_a_registered_region() {
    let Pair {
        server,
        client,
        listener,
        addr,
        server_conn,
        client_conn: conn,
    } = connected_pair(addr_b(), 8, false, false);

    // The server exposes 1 MiB for reading and sends its (addr, len, rkey) to the client.
    const LEN: usize = 1 << 20;
    let source: Vec<u8> = (0..LEN).map(|i| (i * 7 + i / 4096) as u8).collect();
    let exposed = server
        .pd
        .register_from(&source, Access::REMOTE_READ)
        .unwrap();
    let remote = exposed.remote().expect("registered for remote read");
    assert!(
        server
            .pd
            .register(16, Access::SEND)
            .unwrap()
            .remote()
            .is_none(),
        "no rkey without REMOTE_READ"
    );
    let mut ad = [0u8; 16];
    ad[..8].copy_from_slice(&remote.addr.to_le_bytes());
    ad[8..12].copy_from_slice(&remote.len.to_le_bytes());
    ad[12..].copy_from_slice(&remote.rkey.to_le_bytes());
    let mut rbuf = client.pd.register(64, Access::LOCAL_WRITE).unwrap();
    rbuf.fill(0);
    conn.post_recv(rbuf, 1).map_err(|(e, _)| e).unwrap();
    server_conn.post_send_inline(&ad, 2).unwrap();
    collect(&server.cq, 1);
    let got = collect(&client.cq, 1).pop().unwrap();
    assert_eq!(got.byte_len, 16);
    let ad = &got.buffer.as_ref().unwrap()[..16];
    let remote = RemoteBuf {
        addr: u64::from_le_bytes(ad[..8].try_into().unwrap()),
        len: u32::from_le_bytes(ad[8..12].try_into().unwrap()),
        rkey: u32::from_le_bytes(ad[12..].try_into().unwrap()),
    };

    // The client reads it in four chunks, all in flight at once, straight into one buffer.
    let mut target = client.pd.register(LEN, Access::LOCAL_WRITE).unwrap();
    let chunk = LEN / 4;
    let mut pieces = Vec::new();
    for _ in 0..3 {
        let rest = target.split_off(chunk);
        pieces.push(target);
        target = rest;
    }
    pieces.push(target);
    let pieces = pieces
        .into_iter()
        .enumerate()
        .map(|(i, p)| (i * chunk, p))
        .collect();
    let mut read = read_pieces(&conn, &client.cq, remote, pieces).into_iter();
    let mut whole = read.next().unwrap();
    for piece in read {
        whole.unsplit(piece).expect("adjacent pieces of one region");
    }
    assert_eq!(whole.len(), LEN);
    assert!(
        whole[..] == source[..],
        "the READ copied the exposed bytes exactly"
    );

    // Reading past the exposed range is refused by the peer's NIC, not silently served.
    let target = client.pd.register(64, Access::LOCAL_WRITE).unwrap();
    let past = RemoteBuf {
        addr: remote.addr + LEN as u64,
        len: 64,
        rkey: remote.rkey,
    };
    conn.post_read(target, 64, past, 9)
        .map_err(|(e, _)| e)
        .unwrap();
    let failed = collect(&client.cq, 1).pop().unwrap();
    assert_eq!(
        failed.status,
        WcStatus::REMOTE_ACCESS,
        "a READ outside the region must fail: {failed:?}"
    );
    assert!(
        failed.buffer.is_some(),
        "the target comes back even when the READ fails"
    );

    // RDMA WRITE into the exposed region is refused too: rdmx never grants REMOTE_WRITE.
    // (The failed READ put the first QP in the error state, so this uses a second connection.)
    let accepted = accept_one(listener, server.config(), b"");
    let conn2 = connect(&dst(addr), &client.config(), b"", LONG).unwrap();
    let (_listener, _server_conn2, _) = accepted.join().unwrap();
    let write_source = client.pd.register_from(&[0xee; 64], Access::SEND).unwrap();
    let into = RemoteBuf {
        addr: remote.addr,
        len: 64,
        rkey: remote.rkey,
    };
    conn2
        .post_write(write_source, 64, into, 10)
        .map_err(|(e, _)| e)
        .unwrap();
    let refused = collect(&client.cq, 1).pop().unwrap();
    assert_eq!(refused.kind, WorkKind::Write);
    assert_eq!(
        refused.status,
        WcStatus::REMOTE_ACCESS,
        "a WRITE into a read-only region must fail: {refused:?}"
    );
    assert_eq!(
        refused.buffer.as_ref().map(|b| b.len()),
        Some(64),
        "the source comes back"
    );
    assert!(
        exposed[..64] == source[..64],
        "the exposed bytes are untouched"
    );
    drop(server_conn);
}

/// Scheduler state ('R', 'S', …) and user+system CPU ticks of one thread of this process.
fn thread_stat(tid: i32) -> (char, u64) {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After "pid (comm) ": state is field 3 of the line, utime 14, stime 15.
    let state = fields[0].chars().next().unwrap();
    let ticks = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    (state, ticks)
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn event_driven_wait_sleeps_and_loses_no_wakeup() {
    const MESSAGES: usize = 200;
    let Pair {
        server,
        client,
        client_conn: conn,
        server_conn: _server_conn,
        ..
    } = connected_pair(addr_a(), 64, true, false);

    let (tid_tx, tid_rx) = mpsc::channel();
    let cq = server.cq.clone();
    let srq = server.srq.clone().unwrap();
    let waiter = thread::spawn(move || {
        tid_tx.send(gettid()).unwrap();
        let mut got = Vec::new();
        let mut received = 0;
        while received < MESSAGES {
            let mut batch = Vec::new();
            let n = cq.wait(&mut batch, 16, Some(LONG)).unwrap();
            assert!(
                n > 0,
                "woke with nothing after {received} messages: a wakeup was lost"
            );
            for c in batch {
                assert!(c.status.is_success());
                got.push(c.buffer.as_ref().unwrap()[0]);
                srq.post_recv(c.buffer.unwrap(), 0)
                    .map_err(|(e, _)| e)
                    .unwrap();
                received += 1;
            }
        }
        got
    });
    let tid = tid_rx.recv().unwrap();

    // While nothing arrives, the waiter sleeps in the kernel and burns no CPU.
    let deadline = Instant::now() + LONG;
    while thread_stat(tid).0 != 'S' {
        assert!(Instant::now() < deadline, "the waiter never went to sleep");
        thread::sleep(Duration::from_millis(5));
    }
    let (_, ticks_before) = thread_stat(tid);
    thread::sleep(Duration::from_millis(500));
    let (state, ticks_after) = thread_stat(tid);
    println!(
        "event-mode waiter: {} CPU ticks (of {} per second) while asleep for 0.5 s",
        ticks_after - ticks_before,
        ticks_per_second()
    );
    assert_eq!(state, 'S', "the waiter is still asleep");
    assert!(
        ticks_after - ticks_before <= 2,
        "a sleeping waiter used {} CPU ticks in 0.5 s",
        ticks_after - ticks_before
    );

    // Messages at irregular moments, some back to back: every one wakes or is found by the waiter.
    for i in 0..MESSAGES {
        conn.post_send_inline(&[i as u8], i as u64).unwrap();
        if i % 7 == 0 {
            thread::sleep(Duration::from_millis((i % 5) as u64));
        }
        if i % 32 == 31 {
            collect(&client.cq, 32);
        }
    }
    let got = waiter.join().unwrap();
    assert_eq!(
        got,
        (0..MESSAGES).map(|i| i as u8).collect::<Vec<_>>(),
        "all messages, in order"
    );
}

fn ticks_per_second() -> u64 {
    // The kernel's USER_HZ, as getconf reports it; 100 on Linux/x86-64.
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100)
}

fn gettid() -> i32 {
    std::fs::read_link("/proc/thread-self")
        .unwrap()
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn connect_failures_are_errors_within_bounded_time() {
    let ip = addr_a();
    let client = Verbs::new(ip, None, false);

    // A port nobody listens on: the peer's CM rejects at once.
    let (listener, addr) = listen(ip);
    drop(listener);
    let err = connect(&dst(addr), &client.config(), b"", LONG).unwrap_err();
    assert!(err.is_refused(), "{err}");
    assert!(err.message().contains("nobody listens"), "{err}");

    // A listener that never answers: our deadline ends the wait (the CM would retry for a minute).
    let (listener, addr) = listen(ip);
    let err = connect(&dst(addr), &client.config(), b"", Duration::from_secs(3)).unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert!(
        listener
            .get_request(Some(Duration::from_secs(5)))
            .unwrap()
            .is_some(),
        "the request did arrive"
    );

    // A network with no route: address resolution fails (no packet leaves the guest).
    let unroutable: SocketAddr = "198.51.100.1:7471".parse().unwrap();
    let err = connect(&dst(unroutable), &client.config(), b"", LONG).unwrap_err();
    assert_eq!(err.call(), "rdma_create_ep", "{err}");
    assert!(err.message().contains("198.51.100.1:7471"), "{err}");

    // A name that does not resolve.
    let err = AddrInfo::resolve("no-such-host.invalid:7471", Side::Active).unwrap_err();
    assert_eq!(err.call(), "rdma_getaddrinfo");

    // No request waiting: get_request times out with None instead of blocking.
    assert!(listener
        .get_request(Some(Duration::from_millis(200)))
        .unwrap()
        .is_none());
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn disconnect_flushes_posted_work_and_is_reported_to_the_peer() {
    let Pair {
        client,
        server_conn,
        client_conn: conn,
        ..
    } = connected_pair(addr_a(), 8, false, false);

    for (i, buf) in client
        .pd
        .register_chunks(64, 4, Access::LOCAL_WRITE)
        .unwrap()
        .into_iter()
        .enumerate()
    {
        conn.post_recv(buf, i as u64).map_err(|(e, _)| e).unwrap();
    }
    assert_eq!(client.cq.pending(), 4);

    server_conn.disconnect().unwrap();
    let event = conn.next_event(Some(LONG)).unwrap().expect("an event");
    assert_eq!(
        event.kind,
        CmEventKind::DISCONNECTED,
        "{}",
        event.kind.name()
    );
    conn.disconnect().unwrap();
    let flushed = collect(&client.cq, 4);
    for c in &flushed {
        assert_eq!(c.status, WcStatus::FLUSHED, "{c:?}");
        assert_eq!(c.kind, WorkKind::Recv);
        assert_eq!(
            c.buffer.as_ref().map(|b| b.len()),
            Some(64),
            "the buffer comes back"
        );
    }
    assert_eq!(client.cq.pending(), 0);
    // Posting on a disconnected QP fails (or flushes); either way the buffer is not lost.
    let buf = client.pd.register(8, Access::SEND).unwrap();
    match conn.post_send(buf, 8, 77) {
        Err((err, buf)) => assert_eq!(buf.len(), 8, "{err}"),
        Ok(()) => assert_eq!(collect(&client.cq, 1)[0].status, WcStatus::FLUSHED),
    }
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn teardown_with_work_still_posted_in_any_order() {
    let Pair {
        server,
        client,
        listener,
        server_conn,
        client_conn: conn,
        ..
    } = connected_pair(addr_a(), 16, true, true);

    for buf in client
        .pd
        .register_chunks(128, 8, Access::LOCAL_WRITE)
        .unwrap()
    {
        conn.post_recv(buf, 0).map_err(|(e, _)| e).unwrap();
    }
    let exposed = client.pd.register(4096, Access::REMOTE_READ).unwrap();
    let client_cq = client.cq.clone();
    assert_eq!(client_cq.pending(), 8);

    // Drop the handles first, the connection last: ownership keeps QP before CQ/SRQ and MR
    // before PD, and the posted receives' buffers are released with the QP.
    let Verbs { pd, cq, srq } = client;
    drop(pd);
    drop(cq);
    drop(srq);
    drop(exposed);
    assert_eq!(client_cq.pending(), 8);
    drop(conn);
    assert_eq!(
        client_cq.pending(),
        0,
        "destroying the QP released its posted receives"
    );
    drop(client_cq);

    // Server: SRQ handle dropped while 16 receives are posted and a connection uses it.
    let server_cq = server.cq.clone();
    drop(server);
    assert_eq!(server_cq.pending(), 16);
    let event = server_conn
        .next_event(Some(LONG))
        .unwrap()
        .expect("the client's disconnect");
    assert_eq!(event.kind, CmEventKind::DISCONNECTED);
    drop(server_conn);
    assert_eq!(
        server_cq.pending(),
        0,
        "the SRQ was destroyed with its last connection"
    );
    drop(listener);
    let mut out = Vec::new();
    assert_eq!(
        server_cq.poll(&mut out, 16).unwrap(),
        0,
        "no completion refers to freed work"
    );
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn rdma_read_between_vecs_registered_in_place() {
    let Pair {
        server,
        client,
        server_conn: _server_conn,
        client_conn: conn,
        ..
    } = connected_pair(addr_b(), 8, false, false);

    // An empty Vec cannot be a region; it comes back with the error.
    let (err, empty) = server
        .pd
        .register_vec(Vec::with_capacity(16), Access::REMOTE_READ)
        .unwrap_err();
    assert_eq!(err.errno(), libc::EINVAL, "{err}");
    assert!(err.message().contains("empty"), "{err}");
    assert_eq!(empty.capacity(), 16, "the same Vec is given back");

    // The server exposes a Vec in place: the region is the Vec's own heap buffer.
    const LEN: usize = (1 << 20) + 3;
    let source: Vec<u8> = (0..LEN).map(|i| (i * 31 + i / 1000) as u8).collect();
    let exposed_vec = source.clone();
    let exposed_ptr = exposed_vec.as_ptr() as u64;
    let exposed = server
        .pd
        .register_vec(exposed_vec, Access::REMOTE_READ)
        .unwrap();
    assert_eq!(exposed.len(), LEN);
    assert_eq!(
        exposed.addr(),
        exposed_ptr,
        "registered in place, not copied"
    );
    let remote = exposed.remote().expect("registered for remote read");
    assert_eq!(remote.len as usize, LEN);
    assert_eq!(remote.addr, exposed_ptr);

    // The client reads it into its own Vec, registered in place too, in two uneven pieces.
    let target_vec = vec![0u8; LEN];
    let target_ptr = target_vec.as_ptr() as u64;
    let mut head = client
        .pd
        .register_vec(target_vec, Access::LOCAL_WRITE)
        .unwrap();
    assert_eq!(head.addr(), target_ptr, "registered in place, not copied");
    let split = LEN / 2 + 1;
    let tail = head.split_off(split);
    // A split buffer is not the whole region: into_vec gives it back.
    let mut head = head.into_vec().expect_err("only part of the region");
    assert_eq!((head.addr(), head.len()), (target_ptr, split));
    let tail = tail.into_vec().expect_err("only part of the region");
    assert_eq!(tail.len(), LEN - split);
    // Neither is a buffer of a region that was not made from a Vec.
    let allocated = client.pd.register(64, Access::LOCAL_WRITE).unwrap();
    assert_eq!(
        allocated.into_vec().expect_err("not a Vec region").len(),
        64
    );

    let mut read = read_pieces(&conn, &client.cq, remote, vec![(0, head), (split, tail)]);
    let tail = read.pop().unwrap();
    head = read.pop().unwrap();
    // While the tail is still out, the head alone cannot become the Vec.
    head = head
        .into_vec()
        .expect_err("the tail still holds the region");
    head.unsplit(tail).expect("adjacent pieces of one region");
    assert_eq!(head.len(), LEN);

    let read = head
        .into_vec()
        .expect("the whole region, and the last buffer of it");
    assert_eq!(read.len(), LEN);
    assert_eq!(
        read.as_ptr() as u64,
        target_ptr,
        "the very same Vec is given back"
    );
    assert!(read == source, "the READ copied the exposed bytes exactly");

    let exposed = exposed.into_vec().expect("the whole exposed region");
    assert_eq!(exposed.as_ptr() as u64, exposed_ptr);
    assert!(exposed == source, "the exposed bytes are unchanged");
}

#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn take_events_drains_the_channel_a_poller_woke_on() {
    let Pair {
        server,
        client,
        server_conn: _server_conn,
        client_conn: conn,
        ..
    } = connected_pair(addr_a(), 8, false, true);
    assert_eq!(server.cq.take_events().unwrap(), 0, "no channel, no events");
    assert_eq!(client.cq.take_events().unwrap(), 0, "nothing happened yet");

    const CQ: u64 = 1;
    const WAKER: u64 = 2;
    let poller = Poller::new().unwrap();
    let waker = Waker::new().unwrap();
    poller
        .add(client.cq.event_fd().expect("an events CQ").as_raw_fd(), CQ)
        .unwrap();
    poller.add(waker.fd(), WAKER).unwrap();
    let mut ready = Vec::new();
    assert_eq!(
        poller
            .wait(&mut ready, Some(Duration::from_millis(50)))
            .unwrap(),
        0
    );

    client.cq.request_notify().unwrap();
    conn.post_send_inline(b"ping", 5).unwrap();
    let deadline = Instant::now() + LONG;
    while !ready.contains(&CQ) {
        let remaining = deadline
            .checked_duration_since(Instant::now())
            .expect("the send's completion never made the channel readable");
        poller.wait(&mut ready, Some(remaining)).unwrap();
    }
    assert!(!ready.contains(&WAKER), "{ready:?}");
    let taken = client.cq.take_events().unwrap();
    assert!(
        taken >= 1,
        "the channel was readable but {taken} events taken"
    );
    assert_eq!(client.cq.take_events().unwrap(), 0, "all were taken");

    // The channel is quiet again; the completion itself is still in the CQ.
    ready.clear();
    assert_eq!(
        poller
            .wait(&mut ready, Some(Duration::from_millis(50)))
            .unwrap(),
        0,
        "{ready:?}"
    );
    let sent = collect(&client.cq, 1);
    assert_eq!(sent[0].cookie, 5);
    assert!(sent[0].status.is_success(), "{sent:?}");
    collect(&server.cq, 1);

    // The waker shares the poller without disturbing the CQ's registration.
    waker.wake();
    assert_eq!(poller.wait(&mut ready, Some(LONG)).unwrap(), 1);
    assert_eq!(ready, [WAKER]);
    waker.drain();
    poller
        .remove(client.cq.event_fd().unwrap().as_raw_fd())
        .unwrap();
}

/// A type-2 memory window grants RDMA READ of exactly its bytes, through exactly the QP it is
/// bound to, while it is bound: the region under it (registered with `Access::WINDOW_READ`)
/// grants nothing by its own rkey; another QP of the same protection domain holding the
/// window's rkey is refused; a READ one byte past the window is refused; and once the window
/// is dropped its rkey is dead. A refused access breaks the QP that made it, so each refusal
/// uses a connection of its own.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn memory_window_grants_read_of_its_range_to_one_qp_only() {
    let ip = addr_a();
    let server = Verbs::new(ip, Some(16), false);
    server.fill_srq(16, 64);
    let limits = server.pd.device().limits().unwrap();
    assert!(
        limits.memory_windows,
        "rxe supports type-2 memory windows: {limits:?}"
    );
    let client = Verbs::new(ip, None, false);
    let (listener, addr) = listen(ip);
    let mut listener = Some(listener);
    let mut connect_one = || {
        let accepted = accept_one(listener.take().unwrap(), server.config(), b"");
        let c = connect(&dst(addr), &client.config(), b"", LONG).unwrap();
        let (l, s, _) = accepted.join().unwrap();
        listener = Some(l);
        (s, c)
    };
    let windows_before = live_windows();

    const REGION: usize = 64 * 1024;
    const AT: usize = 4096;
    const LEN: usize = 8192;
    let source: Vec<u8> = (0..REGION).map(|i| (i * 13 + i / 512) as u8).collect();
    let mut region = server
        .pd
        .register_from(&source, Access::WINDOW_READ)
        .unwrap();
    assert!(
        region.remote().is_none(),
        "no rkey grants the region itself"
    );
    let mut piece = region.split_off(AT);
    let tail = piece.split_off(LEN + 4096);
    let window = MemoryWindow::new(&piece, LEN).unwrap();
    assert_eq!((window.addr(), window.len()), (piece.addr(), LEN as u64));
    assert!(MemoryWindow::new(&piece, piece.len() + 1).is_err());
    assert!(
        MemoryWindow::new(&client.pd.register(64, Access::REMOTE_READ).unwrap(), 64).is_err(),
        "windows need a WINDOW_READ region"
    );

    let (s1, c1) = connect_one();
    s1.post_bind(&window, 77).unwrap();
    let bound = collect(&server.cq, 1).pop().unwrap();
    assert_eq!((bound.kind, bound.cookie), (WorkKind::Bind, 77));
    assert!(bound.status.is_success(), "bind: {bound:?}");
    assert!(bound.buffer.is_none());
    assert!(window.is_posted());
    assert!(s1.post_bind(&window, 78).is_err(), "a window binds once");
    let remote = window.remote().expect("under 4 GiB");

    // The bound QP's peer reads the window's bytes exactly.
    let got = read_pieces(
        &c1,
        &client.cq,
        remote,
        vec![(0, client.pd.register(LEN, Access::LOCAL_WRITE).unwrap())],
    );
    assert!(
        got[0][..] == source[AT..AT + LEN],
        "READ through the window"
    );

    // Another QP of the same server PD, with the same rkey: refused.
    let (_s2, c2) = connect_one();
    let refused = read_status(&c2, &client, remote, LEN);
    println!("window: READ from another QP: {refused:?}");
    assert_eq!(refused, WcStatus::REMOTE_ACCESS, "the window is for one QP");

    // Past the window, inside its region, on the bound QP: the verbs contract refuses it,
    // but rxe checks READ ranges against the region (MR) under a window, not the window, so
    // there it succeeds (rdmx wipes its staging regions for this reason). Reported only.
    let past = RemoteBuf {
        len: LEN as u32 + 64,
        ..remote
    };
    let beyond = read_status(&c1, &client, past, LEN + 64);
    println!("window: READ 64 bytes past its end, inside its region: {beyond:?}");

    // A window over a whole region: one byte past it is refused.
    let exact = server
        .pd
        .register_from(&source[..LEN], Access::WINDOW_READ)
        .unwrap();
    let whole = MemoryWindow::new(&exact, LEN).unwrap();
    let (s4, c4) = connect_one();
    s4.post_bind(&whole, 80).unwrap();
    assert!(collect(&server.cq, 1).pop().unwrap().status.is_success());
    let past_end = RemoteBuf {
        len: LEN as u32 + 1,
        ..whole.remote().unwrap()
    };
    let refused = read_status(&c4, &client, past_end, LEN + 1);
    println!("window: READ one byte past the end of its region: {refused:?}");
    assert_eq!(refused, WcStatus::REMOTE_ACCESS);
    drop(whole);

    // A second window, bound on a fresh connection, is dead once dropped.
    let window2 = MemoryWindow::new(&piece, LEN).unwrap();
    assert_ne!(window2.rkey(), window.rkey());
    let (s3, c3) = connect_one();
    s3.post_bind(&window2, 79).unwrap();
    assert!(collect(&server.cq, 1).pop().unwrap().status.is_success());
    let remote2 = window2.remote().unwrap();
    assert_eq!(read_status(&c3, &client, remote2, 64), WcStatus::SUCCESS);
    assert_eq!(live_windows(), windows_before + 2);
    drop(window);
    drop(window2);
    assert_eq!(live_windows(), windows_before, "dropping invalidates");
    let late = read_status(&c3, &client, remote2, 64);
    println!("window: READ after the window was dropped: {late:?}");
    assert_eq!(
        late,
        WcStatus::REMOTE_ACCESS,
        "a dropped window's rkey is dead"
    );

    // The region was never written and can be reassembled and released.
    piece.unsplit(tail).unwrap();
    region.unsplit(piece).unwrap();
    assert!(region[..] == source[..]);
}

/// READs `len` bytes of `remote` on `conn` and returns the completion status.
fn read_status(conn: &Connection, side: &Verbs, remote: RemoteBuf, len: usize) -> WcStatus {
    let target = side.pd.register(len, Access::LOCAL_WRITE).unwrap();
    conn.post_read(target, len, remote, 1)
        .map_err(|(e, _)| e)
        .unwrap();
    let c = collect(&side.cq, 1).pop().unwrap();
    assert_eq!(c.kind, WorkKind::Read);
    c.status
}

/// When `ibv_destroy_qp` fails the QP may still be live and the NIC may still write the
/// buffers posted on it: dropping the connection must leak them (their region stays
/// registered and allocated), never free them. The failure is injected
/// (`fault::fail_next_qp_destroy`): the QP really stays alive, and a SEND from the peer still
/// lands in one of the leaked buffers afterwards.
#[test]
#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]
fn a_qp_that_cannot_be_destroyed_leaks_its_posted_buffers() {
    let Pair {
        server,
        client,
        server_conn,
        client_conn: conn,
        ..
    } = connected_pair(addr_a(), 16, false, false);
    for buf in client
        .pd
        .register_chunks(128, 8, Access::LOCAL_WRITE)
        .unwrap()
    {
        conn.post_recv(buf, 0).map_err(|(e, _)| e).unwrap();
    }
    let client_cq = client.cq.clone();
    drop(client);
    assert_eq!(client_cq.pending(), 8);
    let before = live_registrations();

    fault::fail_next_qp_destroy();
    drop(conn);
    assert_eq!(
        client_cq.pending(),
        0,
        "the records are gone from the table"
    );
    assert_eq!(
        live_registrations(),
        before,
        "the posted receive buffers were leaked, not deregistered and freed"
    );
    // The QP was not destroyed: the peer's SEND is still received into a leaked buffer.
    server_conn.post_send_inline(b"still there", 3).unwrap();
    let sent = collect(&server.cq, 1).pop().unwrap();
    println!("SEND to the undestroyable QP: {:?}", sent.status);
    assert!(sent.status.is_success(), "{sent:?}");
    let mut out = Vec::new();
    client_cq.poll(&mut out, 8).unwrap();
    assert!(
        out.is_empty(),
        "a completion into a leaked buffer is not handed out: {out:?}"
    );
}
