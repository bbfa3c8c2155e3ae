//! File descriptors: a thousand endpoints on one worker in a process started with Linux's
//! default soft limit of 1024 descriptors, and what each endpoint costs in descriptors.

use super::*;

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

/// Client workers of [`a_thousand_endpoints_at_the_default_descriptor_limit`], each in a
/// thread of its own.
const CLIENT_WORKERS: usize = 16;
/// The tag bit of the server's answers.
const ANSWER: u64 = 1 << 62;

/// What one endpoint costs in file descriptors, both of its sides in this process: over RDMA
/// none (a worker's connections share its rdmacm event channel); over TCP a socket on each
/// side; over shared memory, on each side, the Unix socket whose hang-up says the peer is
/// gone and the peer worker's doorbell (the TCP socket of the setup is closed, and the
/// segment's memfd once mapped).
fn descriptors_per_endpoint() -> usize {
    match crate::net().transport {
        Transport::Rdma => 0,
        Transport::Tcp => 2,
        Transport::Shm => 4,
        other => panic!("no descriptor figure for {other}"),
    }
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// One server worker and 16 client workers in this process, 1024 endpoints in all (64 per
/// client worker, each connecting from a thread of its own; `RDMX_SCALE_EPS` fewer under
/// valgrind), with the process's soft descriptor limit lowered to Linux's default of 1024
/// (the hard limit unchanged) before the context is made. Over TCP and shared memory making
/// the context raises the soft limit to the hard one; over RDMA it is left at 1024
/// (`RDMX_RAISE_NOFILE=0`). Every endpoint connects and exchanges a message both ways; and
/// each costs exactly its transport's descriptors ([`descriptors_per_endpoint`]: RDMA none),
/// counted in `/proc/self/fd` between the first endpoint of every worker (which makes the
/// worker's own resources) and the last.
pub fn a_thousand_endpoints_at_the_default_descriptor_limit() {
    init_log();
    // The limit is the process's: run alone.
    let role = "fd-limit";
    if std::env::var("RDMX_TEST_ROLE").as_deref() != Ok(role) {
        return isolated("a_thousand_endpoints_at_the_default_descriptor_limit", role);
    }
    let hard = getrlimit(Resource::Nofile).maximum;
    let default_soft = hard.map_or(1024, |h| h.min(1024));
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(default_soft),
            maximum: hard,
        },
    )
    .expect("lower the soft descriptor limit");
    let n = (env_count("RDMX_SCALE_EPS", 1024) / CLIENT_WORKERS).max(2) * CLIENT_WORKERS;
    let fds_at_start = open_fds();

    // The server with the defaults; the clients with small receive queues (seventeen
    // workers' default SRQs would take half a gigabyte of registered memory over RDMA).
    // Over RDMA an endpoint costs no descriptor: the limit is left at 1024 there
    // (`RDMX_RAISE_NOFILE=0`), and the thousand endpoints fit in it. TCP's and shared
    // memory's descriptors are inherent: making the context raises the soft limit.
    let raise = descriptors_per_endpoint() > 0;
    let ctx = Context::builder()
        .env_lookup(test_env)
        .transport(crate::net().transport)
        .raise_nofile(raise)
        .build()
        .unwrap();
    let soft = getrlimit(Resource::Nofile).current;
    if raise {
        assert_eq!(
            soft, hard,
            "making the context raised the soft descriptor limit to the hard one"
        );
    } else {
        assert_eq!(soft, Some(default_soft), "the soft limit left as it was");
    }
    let client_ctx = builder()
        .srq_depth(256)
        .raise_nofile(raise)
        .build()
        .unwrap();
    let server = new_worker(&ctx);
    let listener = server.listen(&format!("{}:0", addr_a())).expect("listen");
    let addr = listener.local_addr().expect("bound").to_string();
    let clients: Vec<Worker> = (0..CLIENT_WORKERS)
        .map(|_| new_worker(&client_ctx))
        .collect();

    // Every client worker connects `per_client` endpoints, each from a thread of its own,
    // while this thread accepts them.
    let connect = |per_client: usize| -> (Vec<Ep>, Vec<Vec<Ep>>) {
        let threads: Vec<_> = clients
            .iter()
            .map(|w| {
                let (w, a) = (w.clone(), addr.clone());
                thread::spawn(move || {
                    (0..per_client)
                        .map(|i| {
                            w.connect(&a)
                                .unwrap_or_else(|e| panic!("connect #{i} of a client: {e}"))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let accepted = accept_n(&listener, per_client * CLIENT_WORKERS, "endpoints");
        let connected = threads
            .into_iter()
            .map(|t| t.join().expect("a client's connecting thread"))
            .collect();
        (accepted, connected)
    };
    // The first endpoint of every worker makes its resources (RDMA's device resources and
    // event channel, shared memory's rings and doorbell)...
    let (mut sep, mut cep) = connect(1);
    let fds_first = open_fds();
    // ...and every endpoint after it costs only its own descriptors.
    let (more_sep, more_cep) = connect(n / CLIENT_WORKERS - 1);
    let fds_all = open_fds();
    sep.extend(more_sep);
    for (mine, more) in cep.iter_mut().zip(more_cep) {
        mine.extend(more);
    }
    let per = descriptors_per_endpoint();
    println!(
        "{n} {} endpoints at a soft limit of {soft:?} (set to {default_soft} at the start): descriptors \
         {fds_at_start} at the start, {fds_first} with the workers and their first \
         endpoints, {fds_all} with all ({} per endpoint after the first of each worker)",
        crate::net().transport,
        (fds_all - fds_first) as f64 / (n - CLIENT_WORKERS) as f64,
    );
    assert_eq!(server.stats().eps, n);
    assert_eq!(
        fds_all - fds_first,
        per * (n - CLIENT_WORKERS),
        "each {} endpoint costs {per} descriptors",
        crate::net().transport
    );

    // Each endpoint sends its index; the server answers on the endpoint it came from.
    let sends: Vec<Request> = cep
        .iter()
        .enumerate()
        .flat_map(|(c, eps)| {
            eps.iter().enumerate().map(move |(j, ep)| {
                let i = (j * CLIENT_WORKERS + c) as u64;
                ep.tag_send(i, i.to_le_bytes().to_vec())
            })
        })
        .collect();
    let by_id: HashMap<_, &Ep> = sep.iter().map(|ep| (ep.id(), ep)).collect();
    let mut answers = Vec::new();
    for i in 0..n as u64 {
        let got = finish(server.tag_recv(i, TAG_MASK_ALL, vec![0; 8])).expect("a message");
        assert_eq!(got.buf, i.to_le_bytes(), "message {i}");
        let from = by_id[&got.conn.expect("the sending endpoint")];
        answers.push(from.tag_send(ANSWER | i, (!i).to_le_bytes().to_vec()));
    }
    for s in sends.into_iter().chain(answers) {
        finish(s).expect("send");
    }
    for (c, w) in clients.iter().enumerate() {
        for j in 0..n / CLIENT_WORKERS {
            let i = (j * CLIENT_WORKERS + c) as u64;
            let got = finish(w.tag_recv(ANSWER | i, TAG_MASK_ALL, vec![0; 8])).expect("answer");
            assert_eq!(got.buf, (!i).to_le_bytes(), "answer {i}");
        }
    }
}

/// Running out of descriptors is said as such, wherever it happens, with the limit reached;
/// and it fails only what needed a descriptor. In a process whose soft limit is lowered to
/// 256 (and not raised: `RDMX_RAISE_NOFILE=0`), with an endpoint up, the descriptor table is
/// filled: a new worker fails (its epoll set), a connect fails (its socket; RDMA: rdmacm's
/// channel for resolving the route), and a request taken just before is accepted where that
/// needs no descriptor (TCP; RDMA, whose request is checked against the worker's device
/// without listing the devices) or refused saying why (shared memory connects a Unix socket)
/// — each error naming EMFILE and the limit. The endpoint up meanwhile keeps working, and
/// once descriptors are free again new endpoints connect.
pub fn running_out_of_descriptors_is_said_as_such() {
    init_log();
    let role = "emfile";
    if std::env::var("RDMX_TEST_ROLE").as_deref() != Ok(role) {
        return isolated("running_out_of_descriptors_is_said_as_such", role);
    }
    let hard = getrlimit(Resource::Nofile).maximum;
    let limit = hard.map_or(256, |h| h.min(256));
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(limit),
            maximum: hard,
        },
    )
    .expect("lower the soft descriptor limit");
    let ctx = builder().raise_nofile(false).build().unwrap();
    assert_eq!(
        getrlimit(Resource::Nofile).current,
        Some(limit),
        "not raised"
    );
    let note = format!(
        "too many open files (EMFILE): the process's descriptor limit ({limit}) is reached"
    );
    let server = new_worker(&ctx);
    let listener = server.listen(&format!("{}:0", addr_a())).expect("listen");
    let addr = listener.local_addr().expect("bound").to_string();
    let client = new_worker(&ctx);
    let connect = |client: &Worker| {
        let (w, a) = (client.clone(), addr.clone());
        thread::spawn(move || w.connect(&a))
    };
    let exchange = |cep: &Ep, sep: &Ep, tag: u64| {
        let r = server.tag_recv(tag, TAG_MASK_ALL, vec![0; 8]);
        finish(cep.tag_send(tag, vec![1; 8])).expect("send");
        finish(r).expect("receive");
        let r = client.tag_recv(tag, TAG_MASK_ALL, vec![0; 8]);
        finish(sep.tag_send(tag, vec![2; 8])).expect("send back");
        finish(r).expect("receive back");
    };
    let t = connect(&client);
    let sep = accept_n(&listener, 1, "the first endpoint").remove(0);
    let cep = t.join().unwrap().expect("the first endpoint");
    exchange(&cep, &sep, 1);

    // A request taken; then the descriptors run out.
    let pending = connect(&client);
    let request = listener
        .next_request(Some(long()))
        .expect("a request")
        .expect("a request in time");
    let mut filler = Vec::new();
    let full = loop {
        match std::fs::File::open("/dev/null") {
            Ok(f) => filler.push(f),
            Err(e) => break e,
        }
    };
    assert_eq!(
        full.raw_os_error(),
        Some(rustix::io::Errno::MFILE.raw_os_error()),
        "{full}"
    );
    let said = |what: &str, err: rdmx::Error| {
        let text = err.to_string();
        println!("{what} at the limit: {text}");
        assert!(text.contains(&note), "{what}: {text}");
    };
    said(
        "a new worker",
        ctx.worker().err().expect("no descriptor for its epoll set"),
    );
    said(
        "a connect",
        client
            .connect(&addr)
            .expect_err("no descriptor to connect with"),
    );
    match (crate::net().transport, request.accept()) {
        (Transport::Tcp | Transport::Rdma, Ok(ep)) => drop(ep),
        (Transport::Tcp, Err(e)) => said("a TCP accept", e),
        (_, Ok(_)) => panic!("accepted with no descriptor to spare"),
        (transport, Err(e)) => said(&format!("an {transport} accept"), e),
    }
    // The endpoint up meanwhile works all along.
    exchange(&cep, &sep, 2);
    drop(filler);
    let refused = pending.join().unwrap();
    println!(
        "the connect whose request was taken: {:?}",
        refused.map(|ep| ep.transport())
    );

    // Descriptors free again: endpoints connect and exchange messages.
    let t = connect(&client);
    let sep2 = accept_n(&listener, 1, "an endpoint after").remove(0);
    let cep2 = t.join().unwrap().expect("an endpoint after");
    exchange(&cep2, &sep2, 3);
    exchange(&cep, &sep, 4);
    ctx.worker().expect("a worker after");
}
