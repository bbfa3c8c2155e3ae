//! Time inside accept, and the descriptors of connections whose handshake has not arrived
//! (issue 48, item 1): no one connection blocks the listener. Idle, partial, slow and
//! malformed connectors, a thousand idle sockets, the bound on pending handshakes, and a
//! shared-memory offer naming a socket that takes no connection — meanwhile a legitimate
//! client connects (within the connect timeout) and exchanges messages, the application's
//! accept loop ([`Listener::accept`], as `examples/pingpong --server` runs it) keeps
//! going, and the victim's descriptors for the attacker's connections stay within the bound
//! and are released when those close or time out.
//!
//! The descriptors counted are the victim's own: this process's sockets whose local port is
//! the listener's (the accepted side; the attacking sockets, also in this process, have
//! the listener's port as their remote one), from `/proc/net/tcp` and `/proc/self/fd`.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use rdmx::{Context, Ep, Listener, Transport, Worker, CONNECT_TIMEOUT_VAR};

use super::shm_raw::{connect_now, hello_offering};
use super::{context, exchange, init_log, listening, test_env, LONG};

/// The connect timeout of most of these tests: a connection taken has this long for its
/// handshake, and the legitimate client this long to connect (the old code failed it with
/// "wait for ACCEPT: timed out").
const CONNECT_TIMEOUT_MS: &str = "3000";

/// The descriptors of this process that are TCP sockets accepted on `port` (the listener
/// itself excluded).
fn accepted_fds(port: u16) -> usize {
    let mut inodes = HashSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid
            // timeout inode
            let f: Vec<&str> = line.split_whitespace().collect();
            let Some(local) = f.get(1).and_then(|a| a.rsplit(':').next()) else {
                continue;
            };
            let listening = f.get(3) == Some(&"0A");
            if u16::from_str_radix(local, 16) == Ok(port) && !listening {
                if let Some(inode) = f.get(9) {
                    inodes.insert(format!("socket:[{inode}]"));
                }
            }
        }
    }
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|l| inodes.contains(l.to_string_lossy().as_ref()))
        .count()
}

/// Waits for `done`, failing the test after [`LONG`] (a hang guard, not a timing).
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < LONG, "{what}: not within {LONG:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The application's accept loop, in a thread: `n` calls of [`Listener::accept`], each
/// result sent back as it comes. The listener lives on with the test's clone (pending
/// connections are released by their deadline while a call is in progress, not by the
/// listener going away).
fn accept_loop(listener: Listener, n: usize) -> (mpsc::Receiver<rdmx::Result<Ep>>, Arc<Listener>) {
    let (tx, rx) = mpsc::channel();
    let listener = Arc::new(listener);
    let l = listener.clone();
    std::thread::spawn(move || {
        for _ in 0..n {
            if tx.send(l.accept()).is_err() {
                return;
            }
        }
    });
    (rx, listener)
}

/// A legitimate client of `ctx` connects to `addr`, the accept loop `accepted` hands over
/// the server's endpoint, and the two exchange eager and rendezvous messages.
fn legitimate(
    ctx: &Context,
    server: &Worker,
    addr: &str,
    accepted: &mpsc::Receiver<rdmx::Result<Ep>>,
) -> (Worker, Ep, Ep) {
    let client = ctx.worker().expect("client worker");
    let cep = client
        .connect(addr)
        .expect("the legitimate client connects within the connect timeout");
    let sep = accepted
        .recv_timeout(LONG)
        .expect("the accept loop answered")
        .expect("the accept loop keeps going: Listener::accept returns the legitimate client");
    exchange(&client, &cep, server, &sep);
    (client, cep, sep)
}

/// `n` connections to `addr` that send nothing. Each TCP connect must complete (the kernel
/// completes it while the listener takes connections; one that does not is a listener that
/// stopped taking them).
fn idle_connections(addr: &str, n: usize) -> Vec<TcpStream> {
    let to: SocketAddr = addr.parse().unwrap();
    (0..n)
        .map(|i| {
            TcpStream::connect_timeout(&to, Duration::from_secs(3)).unwrap_or_else(|e| {
                panic!("idle connection #{i} to a listener that should take it: {e}")
            })
        })
        .collect()
}

/// Whether the listener closed `s`: EOF or a reset (waiting at most [`LONG`]).
fn closed_by_listener(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(LONG)).unwrap();
    match s.read(&mut [0u8; 16]) {
        Ok(0) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        Ok(_) => false,
    }
}

/// Raises this process's open-file limit to its hard limit: a thousand idle connections
/// cost a descriptor on each side, in this one process, over the usual soft limit of 1024.
fn raise_fd_limit(needed: u64) {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut lim = getrlimit(Resource::Nofile);
    if lim.current < lim.maximum {
        lim.current = lim.maximum;
        setrlimit(Resource::Nofile, lim).expect("raise the open-file limit to the hard limit");
    }
    let have = getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX);
    assert!(
        have >= needed,
        "this test needs {needed} descriptors; the hard limit allows {have}"
    );
}

/// The regression (item 1): one TCP connection that sends nothing held `Listener::accept`
/// (reading its HELLO without a deadline), and a legitimate client then failed with "wait
/// for ACCEPT: timed out".
#[test]
fn an_idle_connection_does_not_stop_accepts() {
    init_log();
    let ctx = context(Transport::Tcp, &[(CONNECT_TIMEOUT_VAR, CONNECT_TIMEOUT_MS)]);
    let (server, listener, addr) = listening(&ctx);
    let port = listener.local_addr().unwrap().port();
    let idle = TcpStream::connect(&addr).unwrap();
    let (accepted, _listener) = accept_loop(listener, 1);
    let (_client, _cep, _sep) = legitimate(&ctx, &server, &addr, &accepted);
    // The victim holds the idle connection and the endpoint: two descriptors, no more.
    assert!(
        accepted_fds(port) <= 2,
        "{} descriptors",
        accepted_fds(port)
    );
    drop(idle);
}

/// The Done-when: 1000 idle sockets held open against a listener; a legitimate client
/// still connects within the connect timeout, and the victim's descriptors for the idle
/// ones (exactly one each while they are pending, the bound being 4096) are released when
/// they close, and when they time out while still open. Then another legitimate client.
#[test]
fn a_thousand_idle_connections() {
    const IDLE: usize = 1000;
    init_log();
    raise_fd_limit(2 * IDLE as u64 + 200);
    // (Long enough that none expires before all are taken and counted, however busy the
    // machine: their expiry is a phase of its own.)
    let ctx = context(Transport::Tcp, &[(CONNECT_TIMEOUT_VAR, "10000")]);
    let (server, listener, addr) = listening(&ctx);
    let port = listener.local_addr().unwrap().port();
    let (accepted, _listener) = accept_loop(listener, 2);

    let idle = idle_connections(&addr, IDLE);
    wait_until("the listener took the idle connections", || {
        accepted_fds(port) == IDLE
    });
    let (_client, _cep, _sep) = legitimate(&ctx, &server, &addr, &accepted);
    assert_eq!(
        accepted_fds(port),
        IDLE + 1,
        "the idle ones and the endpoint"
    );

    drop(idle);
    wait_until("released when they close", || accepted_fds(port) == 1);

    let mut idle = idle_connections(&addr, IDLE);
    let mut most = 0;
    wait_until("released when they time out", || {
        let n = accepted_fds(port);
        most = most.max(n);
        n == 1
    });
    assert!(most <= IDLE + 1, "{most} descriptors");
    // Still open on the attacker's side: the listener closed them.
    assert!(idle.iter_mut().all(closed_by_listener));
    let (_client2, _cep2, _sep2) = legitimate(&ctx, &server, &addr, &accepted);
    drop(idle);
}

/// A partial HELLO (its header, then silence), a slow-loris HELLO (a byte every 100 ms),
/// garbage bytes, and a well-formed TCP HELLO whose rdmx handshake is a lie: none blocks a
/// legitimate client, the application's accept loop keeps going (the lie is rejected, with
/// the reason, and costs only its connector), and the victim's descriptors for them are
/// released (the garbage at once, the partial and slow ones at their deadline); then
/// another legitimate client.
#[test]
fn partial_slow_and_garbage_handshakes_block_no_one() {
    init_log();
    let ctx = context(Transport::Tcp, &[(CONNECT_TIMEOUT_VAR, CONNECT_TIMEOUT_MS)]);
    let (server, listener, addr) = listening(&ctx);
    let port = listener.local_addr().unwrap().port();
    let (accepted, _listener) = accept_loop(listener, 2);
    // (The longest HELLO: 270 bytes, 27 s at the slow-loris's pace.)
    let hello = {
        let mut data = default_hello_data();
        data.resize(rdmx_tcp::MAX_PRIVATE_DATA, 0);
        let mut m = vec![1u8, 0, 0, 0];
        m.extend_from_slice(&(6 + data.len() as u32).to_le_bytes());
        m.extend_from_slice(b"RXTC\x01\x00");
        m.extend_from_slice(&data);
        m
    };

    let mut partial = TcpStream::connect(&addr).unwrap();
    partial.write_all(&hello[..8]).unwrap();
    let mut garbage = TcpStream::connect(&addr).unwrap();
    let noise: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    garbage.write_all(&noise).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let slow = {
        let mut s = TcpStream::connect(&addr).unwrap();
        s.set_nodelay(true).unwrap();
        let (hello, stop) = (hello.clone(), stop.clone());
        std::thread::spawn(move || {
            // Until the whole HELLO is out, the listener closed the connection, or the test
            // is over.
            for b in hello {
                if stop.load(Ordering::Relaxed) || s.write_all(&[b]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let lie = rdmx_tcp::connect(&addr, b"not an rdmx handshake", LONG)
        .expect_err("a handshake that is a lie is rejected");
    assert!(lie.is_refused(), "{lie}");

    let (_client, _cep, _sep) = legitimate(&ctx, &server, &addr, &accepted);
    assert!(
        accepted_fds(port) <= 4,
        "{} descriptors",
        accepted_fds(port)
    );
    assert!(closed_by_listener(&mut garbage));
    // The partial and slow ones expire at their deadline (both still open on this side),
    // while the accept loop waits for the next client.
    wait_until("the partial and slow ones released", || {
        accepted_fds(port) == 1
    });
    assert!(closed_by_listener(&mut partial));
    stop.store(true, Ordering::Relaxed);
    slow.join().unwrap();
    let (_client2, _cep2, _sep2) = legitimate(&ctx, &server, &addr, &accepted);
}

/// Past `RDMX_MAX_PENDING_HANDSHAKES`, the oldest pending connection is closed for room:
/// 300 idle connections against a bound of 100 cost the victim at most 101 descriptors
/// (100, and one for the moment the newest is read before the oldest is closed), and a
/// legitimate client still connects and exchanges messages.
#[test]
fn pending_handshakes_are_bounded() {
    const BOUND: usize = 100;
    init_log();
    raise_fd_limit(800);
    let ctx = context(
        Transport::Tcp,
        &[
            (CONNECT_TIMEOUT_VAR, "20000"),
            ("RDMX_MAX_PENDING_HANDSHAKES", "100"),
        ],
    );
    let (server, listener, addr) = listening(&ctx);
    let port = listener.local_addr().unwrap().port();
    let (accepted, _listener) = accept_loop(listener, 1);
    let mut most = 0;
    let mut idle = Vec::new();
    for _ in 0..3 {
        idle.extend(idle_connections(&addr, BOUND));
        most = most.max(accepted_fds(port));
    }
    // (The first 200 closed for room: their side reads EOF.)
    wait_until("the oldest closed for room", || {
        most = most.max(accepted_fds(port));
        idle[..2 * BOUND].iter_mut().all(|s| {
            s.set_nonblocking(true).unwrap();
            matches!(s.read(&mut [0u8; 8]), Ok(0))
        })
    });
    // (One more for the moment a new connection is read before the oldest is closed.)
    assert!(most <= BOUND + 1, "{most} descriptors");
    let (_client, _cep, _sep) = legitimate(&ctx, &server, &addr, &accepted);
    assert!(accepted_fds(port) <= BOUND + 1, "{}", accepted_fds(port));
    drop(idle);
}

/// A shared-memory offer naming a socket that takes no connection (its backlog
/// full): the acceptor's connect to it waited for room for as long as its owner liked,
/// holding up every accept. Now it fails at once, the offer is declined (the connection
/// stays TCP) and a legitimate shared-memory client connects and exchanges messages.
#[test]
fn an_offer_naming_a_full_socket_blocks_no_one() {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    init_log();
    let ctx = Context::builder()
        .env_lookup(test_env)
        .transports(&[Transport::Shm, Transport::Tcp])
        .build()
        .expect("context");
    let (server, listener, addr) = listening(&ctx);
    let (accepted, _listener) = accept_loop(listener, 2);

    // The trap: a socket where a worker's hand-over socket would be, listening with a
    // backlog of 0, filled by one connect.
    let dir = std::env::temp_dir().join(format!(
        "rdmx-shm-trap-{}-{:x}",
        std::process::id(),
        rand::random::<u64>()
    ));
    std::fs::create_dir(&dir).unwrap();
    let name = dir.join("s").to_str().unwrap().to_string();
    let trap = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    )
    .unwrap();
    rustix::net::bind(&trap, &SocketAddrUnix::new(name.as_str()).unwrap()).unwrap();
    rustix::net::listen(&trap, 0).unwrap();
    let filler = connect_now(&name).unwrap();
    let another = connect_now(&name);
    assert_eq!(
        another.as_ref().map_err(|e| e.kind()).err(),
        Some(std::io::ErrorKind::WouldBlock),
        "the trap's backlog is full: {another:?}"
    );

    // A TCP HELLO offering shared memory over the trap.
    let private = hello_offering(&super::default_handshake(), &name);
    let hostile = rdmx_tcp::connect(&addr, &private, LONG)
        .expect("the offer is declined and the connection stays TCP");
    let answer = &hostile.peer_private_data()[rdmx::proto::MAX_HANDSHAKE_LEN..];
    assert!(
        String::from_utf8_lossy(answer).contains("backlog is full"),
        "declined, saying why: {:?}",
        String::from_utf8_lossy(answer)
    );
    let hostile_ep = accepted
        .recv_timeout(LONG)
        .expect("the accept loop answered")
        .expect("the hostile connection, on TCP");
    assert_eq!(hostile_ep.transport(), Transport::Tcp);

    let (_client, cep, sep) = legitimate(&ctx, &server, &addr, &accepted);
    assert_eq!(cep.transport(), Transport::Shm);
    assert_eq!(sep.transport(), Transport::Shm);
    drop((hostile, filler, another, trap));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The rdmx handshake of a default engine, as the private data of a TCP HELLO.
fn default_hello_data() -> Vec<u8> {
    super::default_handshake().encode()
}
