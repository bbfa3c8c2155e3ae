//! The socket a connector is handed its shared segment over on. Processes of other users
//! cannot reach it; idle streams and streams under tokens no connect of the worker waits for
//! cost it nothing past its connects: a legitimate connect during an attack succeeds, and
//! afterwards the worker holds no stream but its connections'.

use std::collections::HashSet;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};

use rdmx::{Ep, Transport, Worker};

use crate::shm_raw::{connect_now, offered_socket};
use crate::{context, exchange, init_log, listening, LONG};

/// The connect timeout of the workers here: short, so that a connect the attack delays by
/// a second per idle stream fails.
const CONNECT_TIMEOUT_MS: &str = "2000";

/// The attacker's user (`nobody`).
const OTHER_UID: u32 = 65534;

/// Connections each attacker makes (more than a Unix socket's backlog of 128).
const ATTACKERS_CONNECTIONS: usize = 200;

fn shm_context() -> rdmx::Context {
    context(
        Transport::Shm,
        &[(rdmx::CONNECT_TIMEOUT_VAR, CONNECT_TIMEOUT_MS)],
    )
}

/// The name of `victim`'s hand-over socket, read off the offer its connect sends (to a raw
/// TCP listener, which turns it away).
fn hand_over_socket(victim: &Worker) -> String {
    let raw = rdmx_tcp::Listener::bind("127.0.0.1:0").expect("raw listener");
    let addr = raw.local_addr().expect("bound").to_string();
    let v = victim.clone();
    let connecting = std::thread::spawn(move || v.connect(&addr));
    let req = raw
        .get_request(Some(LONG))
        .expect("the victim's HELLO")
        .expect("the victim connects");
    let name = offered_socket(req.private_data());
    req.reject(b"").expect("reject");
    assert!(connecting.join().expect("connector").is_err());
    name
}

/// Streams accepted on the socket `name` that this process holds: its descriptors that are
/// sockets connected under that name in `/proc/net/unix` (the listening socket aside).
fn held_streams(name: &str) -> usize {
    let shown = if name.starts_with('/') {
        name.to_string()
    } else {
        format!("@{name}")
    };
    let ours: HashSet<u64> = std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            let l = l.to_str()?.to_string();
            l.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect();
    let table = std::fs::read_to_string("/proc/net/unix").expect("/proc/net/unix");
    table
        .lines()
        .skip(1)
        .filter(|line| {
            // Num RefCount Protocol Flags Type St Inode Path
            let f: Vec<&str> = line.split_whitespace().collect();
            f.len() == 8
                && f[7] == shown
                && f[5] == "03"
                && f[6].parse().is_ok_and(|inode: u64| ours.contains(&inode))
        })
        .count()
}

/// A thread of user [`OTHER_UID`] (the kernel's checks, a socket's path and `SO_PEERCRED`,
/// look at the calling thread's credentials) that opens up to
/// [`ATTACKERS_CONNECTIONS`] connections to `name`, reports how many it got, holds them
/// idle until told to leave, and leaves.
fn other_user_attacker(name: String) -> (mpsc::Receiver<usize>, mpsc::Sender<()>) {
    let (report, reported) = mpsc::channel();
    let (leave, told) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        use rustix::process::{Gid, Uid};
        use rustix::thread::{set_thread_groups, set_thread_res_gid, set_thread_res_uid};
        let (gid, uid) = (Gid::from_raw(OTHER_UID), Uid::from_raw(OTHER_UID));
        set_thread_groups(&[]).expect("setgroups: the test runs as root");
        set_thread_res_gid(gid, gid, gid).expect("setresgid");
        set_thread_res_uid(uid, uid, uid).expect("setresuid");
        let mut refused = None;
        let held: Vec<OwnedFd> = (0..ATTACKERS_CONNECTIONS)
            .filter_map(|_| connect_now(&name).map_err(|e| refused = Some(e)).ok())
            .collect();
        if let Some(e) = refused {
            log::info!("the other user's connects to {name}: {e}");
        }
        report.send(held.len()).expect("report");
        let _ = told.recv();
        drop(held);
    });
    (reported, leave)
}

/// A worker of `ctx` listening on loopback, accepting `n` connections on a thread of its
/// own: the worker, its address, and the endpoints it accepts, as they come.
fn serving(ctx: &rdmx::Context, n: usize) -> (Worker, String, mpsc::Receiver<Ep>) {
    let (server, listener, addr) = listening(ctx);
    let (accepted, eps) = mpsc::channel();
    std::thread::spawn(move || {
        for _ in 0..n {
            let ep = listener.accept().expect("the server accepts");
            if accepted.send(ep).is_err() {
                return;
            }
        }
    });
    (server, addr, eps)
}

/// `victim` connects to the server at `addr` over shared memory: both endpoints.
fn connect(victim: &Worker, addr: &str, accepted: &mpsc::Receiver<Ep>) -> (Ep, Ep) {
    let ep = victim
        .connect(addr)
        .expect("a legitimate shared-memory connect during the attack");
    let server_ep = accepted.recv_timeout(LONG).expect("the server's endpoint");
    assert_eq!(ep.transport(), Transport::Shm);
    (ep, server_ep)
}

/// Another user holds 200 idle connections to the victim's hand-over socket (or tries: a
/// socket under a private directory refuses them), processes of the victim's own user hold
/// 40 idle ones and one that sent a token no connect waits for. Before the checks, each
/// idle stream cost the victim's next connect a blocking second (18 of them: 13.2 s, and
/// the connect failed), streams under unknown tokens stayed for good, and nothing looked
/// at who connected. Now the victim's connect succeeds within a 2 s connect timeout and
/// exchanges messages, holding at most 34 streams meanwhile, and then holds no stream but
/// its connection's own, with the idle ones still open.
#[test]
fn hand_over_socket_attackers_cost_the_victim_nothing() {
    init_log();
    let ctx = shm_context();
    let victim = ctx.worker().expect("victim");
    let name = hand_over_socket(&victim);
    let (server, addr, accepted) = serving(&shm_context(), 2);

    let (reported, leave) = other_user_attacker(name.clone());
    let others = reported.recv().expect("the attacker's report");
    log::info!("the other user's attacker got {others} connections to {name}");
    let idle: Vec<OwnedFd> = (0..40).filter_map(|_| connect_now(&name).ok()).collect();
    let mut garbage = UnixStream::from(connect_now(&name).expect("the same user connects"));
    garbage
        .write_all(b"not a token, nor a hand-over")
        .expect("garbage");

    // While the victim connects and exchanges, the streams it holds are sampled: at most the
    // 32 whose token has not come, the one being claimed and the connection's own.
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (sampling, name) = (sampling.clone(), name.clone());
        std::thread::spawn(move || {
            let mut most = 0;
            while sampling.load(Ordering::Relaxed) {
                most = most.max(held_streams(&name));
            }
            most
        })
    };
    let (ep, server_ep) = connect(&victim, &addr, &accepted);
    exchange(&victim, &ep, &server, &server_ep);
    sampling.store(false, Ordering::Relaxed);
    let most = sampler.join().expect("sampler");
    log::info!("the victim held at most {most} streams during the attack");
    assert!(
        most <= 34,
        "the victim held {most} streams during the attack"
    );
    // The idle streams (still open) and the garbage one: none held, the connection's own
    // stream alone.
    assert_eq!(held_streams(&name), 1, "streams the victim holds");

    leave.send(()).expect("the attacker leaves");
    drop(idle);
    drop(garbage);
    let (ep2, server_ep2) = connect(&victim, &addr, &accepted);
    exchange(&victim, &ep2, &server, &server_ep2);
    assert_eq!(
        held_streams(&name),
        2,
        "streams of the victim's two connections"
    );
    exchange(&victim, &ep, &server, &server_ep);
}
