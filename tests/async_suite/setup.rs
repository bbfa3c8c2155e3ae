//! Connection setup and teardown without blocking a task: `Worker::connect_nb`,
//! `rdmx::tokio::accept`, `Ep::flush_nb` and `Ep::close_nb`.

use super::*;
use rdmx::Error;

/// A context of the suite's transport in event mode whose connect timeout is `ms`.
fn context_timeout(ms: u64) -> Context {
    Context::builder()
        .env_lookup(|_| None)
        .transport(crate::net().transport)
        .wait_mode(WaitMode::Event)
        .set(rdmx::CONNECT_TIMEOUT_VAR, &ms.to_string())
        .build()
        .expect("a context")
}

/// `Net::connects` (256 on the host) connects started at once are set up at once: the
/// server takes all their requests before it answers any (a connect waits for its answer,
/// so one connect at a time would leave a single request to take), then accepts them, and
/// every connect completes with a working endpoint. Then as many more through
/// `rdmx::tokio::accept` in two tasks at once, the client's futures awaited together; the
/// server has two drivers.
pub fn many_connects_proceed_at_once() {
    init_log();
    run(async move {
        let n = env_count("RDMX_ASYNC_CONNECTS", crate::net().connects);
        let ctx = context(WaitMode::Event);
        let server = ctx.worker().unwrap();
        let client = ctx.worker().unwrap();
        // (Two drivers of the server: more than one does no harm.)
        let _drivers = (
            rdmx::tokio::drive(&server).unwrap(),
            rdmx::tokio::drive(&server).expect("a second driver of one worker"),
            rdmx::tokio::drive(&client).unwrap(),
        );
        let listener = Arc::new(
            server
                .listen(&format!("{}:0", crate::net().addr))
                .expect("listen"),
        );
        let addr = listener.local_addr().unwrap().to_string();
        let connecting: Vec<_> = (0..n).map(|_| client.connect_nb(&addr)).collect();
        // (next_request waits on the listener: off the runtime's threads.)
        let l = listener.clone();
        let requests = tokio::task::spawn_blocking(move || {
            (0..n)
                .map(|i| {
                    l.next_request(Some(long()))
                        .expect("next_request")
                        .unwrap_or_else(|| panic!("only {i} of {n} connects were under way"))
                })
                .collect::<Vec<_>>()
        })
        .await
        .unwrap();
        assert!(
            connecting.iter().all(|c| !c.is_done()),
            "a connect ended before its request was answered"
        );
        let seps = tokio::task::spawn_blocking(move || {
            requests
                .into_iter()
                .map(|r| r.accept().expect("accept"))
                .collect::<Vec<_>>()
        });
        let mut ceps = Vec::new();
        for c in connecting {
            ceps.push(c.await.expect("connect"));
        }
        let seps = seps.await.unwrap();
        assert_eq!((ceps.len(), seps.len()), (n, n));
        // Each endpoint carries a message.
        for (i, ep) in ceps.iter().enumerate() {
            ep.tag_send(i as u64, vec![i as u8]).await.unwrap();
        }
        for i in 0..n as u64 {
            let got = server.tag_recv(i, TAG_MASK_ALL, vec![0; 1]).await.unwrap();
            assert_eq!(got.buf, [i as u8]);
        }

        // The same through the async accept, which answers each request as it comes: two
        // tasks accepting on the listener at once.
        let accepting: Vec<_> = [n / 2, n - n / 2]
            .into_iter()
            .map(|count| {
                let l = listener.clone();
                tokio::spawn(async move {
                    let mut eps = Vec::new();
                    for _ in 0..count {
                        eps.push(rdmx::tokio::accept(&l).await.expect("accept"));
                    }
                    eps
                })
            })
            .collect();
        let connecting: Vec<_> = (0..n).map(|_| client.connect_nb(&addr)).collect();
        let mut more = Vec::new();
        for c in connecting {
            more.push(c.await.expect("connect"));
        }
        let mut accepted = Vec::new();
        for a in accepting {
            accepted.extend(a.await.unwrap());
        }
        assert_eq!((more.len(), accepted.len()), (n, n));
        more[n - 1].tag_send(7, b"last".to_vec()).await.unwrap();
        let got = server.tag_recv(7, TAG_MASK_ALL, vec![0; 8]).await.unwrap();
        assert_eq!(&got.buf[..got.length], b"last");
        println!("{n} connects set up at once, then {n} more through the async accept");
    });
}

/// A connect to an address where nothing answers fails with the connect timeout while a
/// timer task on the same (single) runtime thread keeps ticking: nothing blocks the thread.
/// A connect to a port where nothing listens fails at once; a dropped connect leaves
/// nothing behind; the worker connects afterwards.
pub fn a_dead_address_blocks_no_task() {
    init_log();
    // A listener that never takes or answers a connection: the connect's handshake waits
    // for an answer that never comes (TCP: a listening socket; RDMA: an rdmacm listener
    // whose requests are never taken).
    let silent = Silent::listen(&crate::net().addr);
    let silent_addr = silent.addr();
    // (A port of the suite's address that nothing listens on, TCP's or rdmacm's.)
    let refused = {
        let l = std::net::TcpListener::bind(format!("{}:0", crate::net().addr)).unwrap();
        l.local_addr().unwrap()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let ctx = context_timeout(1000);
        let client = ctx.worker().unwrap();
        let _driver = rdmx::tokio::drive(&client).unwrap();
        let ticks = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let t = ticks.clone();
        let ticker = tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_millis(10));
            loop {
                every.tick().await;
                t.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        });
        {
            let started = std::time::Instant::now();
            let err = tokio::time::timeout(long(), client.connect_nb(&silent_addr.to_string()))
                .await
                .expect("the connect ends")
                .expect_err("nothing answers");
            let took = started.elapsed();
            let ticked = ticks.load(std::sync::atomic::Ordering::Relaxed);
            println!("silent peer: {err} after {took:?}; the timer ticked {ticked} times");
            let text = err.to_string();
            assert!(
                text.contains("timed out") || text.contains("no connection with"),
                "{err:?}"
            );
            // A thread blocked in the connect would have let it tick at most once.
            assert!(ticked >= 5, "the timer task ticked only {ticked} times");
        }
        let err = tokio::time::timeout(long(), client.connect_nb(&refused.to_string()))
            .await
            .expect("the connect ends")
            .expect_err("nobody listens");
        println!("nobody listening: {err}");
        assert!(
            err.to_string().contains(&refused.port().to_string()),
            "{err}"
        );
        // Dropped while under way.
        drop(client.connect_nb(&silent_addr.to_string()));
        ticker.abort();
    });
    drop(silent);
    // The worker connects afterwards.
    let ctx = context(WaitMode::Event);
    let (cep, _sep) = connected(&ctx.worker().unwrap(), &ctx.worker().unwrap());
    cep.send(1, b"after").unwrap();
}

/// A listener that takes no connection.
enum Silent {
    Tcp(std::net::TcpListener),
    Rdma(rdmx::conn::Listener),
}

impl Silent {
    fn listen(host: &str) -> Silent {
        match crate::net().transport {
            Transport::Rdma => {
                let info =
                    rdmx::conn::AddrInfo::resolve(&format!("{host}:0"), rdmx::conn::Side::Passive)
                        .expect("resolve");
                Silent::Rdma(rdmx::conn::Listener::bind(&info, 16).expect("an rdmacm listener"))
            }
            _ => Silent::Tcp(std::net::TcpListener::bind(format!("{host}:0")).unwrap()),
        }
    }

    fn addr(&self) -> std::net::SocketAddr {
        match self {
            Silent::Tcp(l) => l.local_addr().unwrap(),
            Silent::Rdma(l) => l.local_addr().expect("bound"),
        }
    }
}

/// Flushing and closing as futures: a flush waits for a rendezvous send until the peer has
/// read it; a close of a flushed endpoint completes and the peer sees it closed; a close
/// with a send the peer never takes ends at the connect timeout with an error, that send
/// failed; a dropped close still closes.
pub fn flush_and_close_are_futures() {
    init_log();
    run(async move {
        let p = pair(&context_timeout(1000), 3).await;
        let big = 1 << 20;
        // (Endpoints by id: the client's i-th is the server's with the same peer address.)
        let sep_of = |cep: &Ep| {
            p.seps
                .values()
                .find(|s| s.peer_addr() == cep.local_addr())
                .expect("the server's side")
                .clone()
        };
        let (cep, sep) = (&p.ceps[0], sep_of(&p.ceps[0]));
        let send = cep.tag_send(1, vec![5u8; big]);
        let mut flush = std::pin::pin!(cep.flush_nb());
        assert!(
            tokio::time::timeout(Duration::from_millis(50), flush.as_mut())
                .await
                .is_err(),
            "flushed before the peer read the rendezvous data"
        );
        let got = p
            .server
            .tag_recv(1, TAG_MASK_ALL, vec![0; big])
            .await
            .unwrap();
        assert_eq!(got.length, big);
        flush.await.expect("flushed");
        send.await.unwrap();
        cep.close_nb().await.expect("closed");
        assert!(!cep.is_connected());
        let deadline = tokio::time::Instant::now() + long();
        while sep.is_connected() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the peer never saw the close"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }

        // A send the peer never takes: the close ends at the connect timeout.
        let cep = &p.ceps[1];
        let stuck = cep.tag_send(2, vec![6u8; big]);
        let err = cep.close_nb().await.expect_err("a send was still pending");
        println!("close with a send pending: {err}");
        assert!(matches!(err, Error::Timeout(..)), "{err:?}");
        let err = stuck.await.expect_err("the pending send fails");
        println!("the pending send: {err}");

        // A close dropped at once still closes.
        let cep = p.ceps[2].clone();
        drop(cep.close_nb());
        let deadline = tokio::time::Instant::now() + long();
        while cep.is_connected() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the dropped close never closed"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let s = p.client.stats();
        println!("after the closes: {s:?}");
    });
}
