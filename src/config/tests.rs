//! Tests of the configuration: defaults, the environment, builder overrides and errors.

use super::*;
use std::collections::HashMap;

fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let m: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| m.get(k).cloned()
}

#[test]
fn defaults_and_sources() {
    let c = Config::from_lookup(lookup(&[])).unwrap();
    assert!(c.entries().iter().all(|e| e.source == Source::Default));
    let c = Config::from_lookup(lookup(&[
        ("RDMX_EAGER_THRESHOLD", "4k"),
        ("RDMX_WAIT_MODE", "event"),
        ("RDMX_SRQ_DEPTH", "512"),
    ]))
    .unwrap();
    assert_eq!(c.eager_threshold(), 4096);
    assert_eq!(c.wait_mode(), WaitMode::Event);
    let by_var: HashMap<_, _> = c.entries().into_iter().map(|e| (e.var, e)).collect();
    assert_eq!(by_var["RDMX_EAGER_THRESHOLD"].source, Source::Environment);
    assert_eq!(by_var["RDMX_SRQ_DEPTH"].value, "512");
    assert_eq!(by_var["RDMX_CREDITS"].source, Source::Default);
    assert!(c.raise_nofile(), "raised unless turned off");
    let off = Config::from_lookup(lookup(&[("RDMX_RAISE_NOFILE", "0")])).unwrap();
    assert!(!off.raise_nofile());
    assert!(c.to_string().contains("RDMX_WAIT_MODE"));
}

#[test]
fn rndv_chunk_sets_the_reads_in_flight() {
    let c = Config::from_lookup(lookup(&[])).unwrap();
    assert_eq!((c.rndv_chunk(), c.reads_in_flight()), (256 * 1024, 4));
    let proto = c.proto().unwrap();
    assert_eq!(
        (proto.rndv_chunk_size, proto.max_reads_in_flight),
        (256 * 1024, 4)
    );
    for (chunk, reads) in [("16k", 64), ("64K", 16), ("4k", 64), ("16M", 4)] {
        let c = Config::from_lookup(lookup(&[("RDMX_RNDV_CHUNK", chunk)])).unwrap();
        assert_eq!(c.reads_in_flight(), reads, "{chunk}");
        assert_eq!(c.proto().unwrap().max_reads_in_flight, reads, "{chunk}");
    }
}

#[test]
fn invalid_values_name_the_variable() {
    for (var, val) in [
        ("RDMX_EAGER_THRESHOLD", "lots"),
        ("RDMX_EAGER_THRESHOLD", "2M"),
        ("RDMX_WAIT_MODE", "nap"),
        ("RDMX_SRQ_DEPTH", "-1"),
        ("RDMX_PROGRESS_THREAD", "maybe"),
        ("RDMX_RAISE_NOFILE", "maybe"),
        ("RDMX_RNDV_REG", "sometimes"),
        ("RDMX_CONNECT_TIMEOUT_MS", "0"),
        ("RDMX_KEEPALIVE_MS", "soon"),
        ("RDMX_KEEPALIVE_MS", "-1"),
        ("RDMX_MAX_PENDING_HANDSHAKES", "0"),
        ("RDMX_MAX_PENDING_HANDSHAKES", "many"),
        ("RDMX_TRANSPORT", "carrier-pigeon"),
        ("RDMX_TRANSPORT", "rdma,rdma"),
        ("RDMX_TRANSPORT", "auto,tcp"),
        ("RDMX_TRANSPORT", "tcp,"),
        ("RDMX_RECV_BUF_SIZE", "1"),
        ("RDMX_RECV_BUF_SIZE", "64 KiB"),
        ("RDMX_RCACHE_SIZE", "big"),
        ("RDMX_RNDV_CHUNK", "1k"),
        ("RDMX_RNDV_CHUNK", "32M"),
        ("RDMX_RNDV_CHUNK", "small"),
    ] {
        let err = Config::from_lookup(lookup(&[(var, val)])).unwrap_err();
        // One variant for every bad setting, whichever layer checks it.
        assert!(matches!(err, Error::Config(_)), "{var}={val}: {err:?}");
        let msg = err.to_string();
        assert!(msg.contains(var), "{msg}");
        assert!(msg.contains(val), "{msg}");
    }
    // A combination only the protocol engine refuses is a configuration error too.
    let c = Config::from_lookup(lookup(&[("RDMX_SRQ_DEPTH", "8")])).unwrap();
    let err = c.proto().unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    assert!(err.to_string().contains("RDMX_SRQ_DEPTH"), "{err}");
}

#[test]
fn keepalive_interval_sets_the_rc_ack_timeout() {
    let c = Config::default();
    assert_eq!(c.keepalive(), Duration::from_secs(1));
    // 7 tries of 134 ms fit in a second.
    assert_eq!(c.rc_ack_timeout(), Some(15));
    let at = |ms: &str| {
        let c = Config::from_lookup(lookup(&[(KEEPALIVE_VAR, ms)])).unwrap();
        (c.keepalive(), c.rc_ack_timeout())
    };
    assert_eq!(at("0"), (Duration::ZERO, None), "off: rdma_cm's default");
    assert_eq!(at("10000"), (Duration::from_secs(10), Some(18)));
    assert_eq!(
        at("1"),
        (Duration::from_millis(1), Some(12)),
        "at least 17 ms"
    );
    assert_eq!(at("3600000").1, Some(20), "at most 4.3 s");
    for (ms, exponent) in [("1000", 15u8), ("10000", 18)] {
        let (interval, _) = at(ms);
        let tries = 7.0 * 4.096e-6 * f64::from(1u32 << exponent);
        assert!(tries <= interval.as_secs_f64(), "{ms}: {tries}");
    }
}

/// The value `rdmx-info` shows for `var`.
fn shown(c: &Config, var: &str) -> String {
    c.entries()
        .into_iter()
        .find(|e| e.var == var)
        .expect("an entry for each variable")
        .value
}

#[test]
fn transport_lists_and_per_transport_defaults() {
    let c = Config::from_lookup(lookup(&[("RDMX_TRANSPORT", " tcp , rdma ")])).unwrap();
    assert_eq!(c.transports(), [Transport::Tcp, Transport::Rdma]);
    let c = Config::from_lookup(lookup(&[])).unwrap();
    assert_eq!(c.transports(), [Transport::Auto]);
    // Unset, each transport has its own eager threshold and buffer size; the preferred
    // (first resolved) transport's are the plain accessors'.
    let mut c = Config::from_lookup(lookup(&[])).unwrap();
    c.resolved = vec![Transport::Rdma, Transport::Tcp];
    assert_eq!(c.eager_threshold(), 8152);
    assert_eq!(c.eager_threshold_for(Transport::Tcp), TCP_EAGER_THRESHOLD);
    assert_eq!(c.recv_buf_size_for(Transport::Tcp), TCP_RECV_BUF_SIZE);
    assert_eq!(shown(&c, EAGER_THRESHOLD_VAR), "8152 (tcp 65496)");
    let engine = c.proto().unwrap();
    assert_eq!(
        (engine.eager_threshold, engine.recv_buf_size),
        (TCP_EAGER_THRESHOLD, TCP_RECV_BUF_SIZE),
        "the engine's defaults are the largest; connections get their own"
    );
    c.resolved = vec![Transport::Tcp];
    assert_eq!(c.eager_threshold(), TCP_EAGER_THRESHOLD);
    // Auto's order: shared memory first. RDMA keeps its own 8 KiB buffers (its SRQ is sized
    // by `recv_buf_size_for(Rdma)`, not by the preferred transport's).
    c.resolved = vec![Transport::Shm, Transport::Rdma, Transport::Tcp];
    assert_eq!(c.eager_threshold(), SHM_EAGER_THRESHOLD);
    assert_eq!(c.recv_buf_size_for(Transport::Shm), SHM_RECV_BUF_SIZE);
    assert_eq!(
        (
            c.eager_threshold_for(Transport::Rdma),
            c.recv_buf_size_for(Transport::Rdma)
        ),
        (8152, 8192)
    );
    assert_eq!(c.limits(Transport::Shm, 4).eager_threshold, 16384);
    assert_eq!(
        shown(&c, EAGER_THRESHOLD_VAR),
        "16384 (rdma 8152) (tcp 65496)"
    );
    // Set, a value applies to every transport.
    let mut c = Config::from_lookup(lookup(&[("RDMX_EAGER_THRESHOLD", "1k")])).unwrap();
    c.resolved = vec![Transport::Rdma, Transport::Tcp];
    assert_eq!(c.eager_threshold_for(Transport::Tcp), 1024);
    assert_eq!(c.limits(Transport::Rdma, 4).eager_threshold, 1024);
}

#[test]
fn shared_memory_reads_rendezvous_in_larger_chunks_unless_set() {
    let mut c = Config::from_lookup(lookup(&[])).unwrap();
    c.resolved = vec![Transport::Shm, Transport::Tcp];
    assert_eq!(c.rndv_chunk_for(Transport::Shm), SHM_RNDV_CHUNK);
    assert_eq!(c.rndv_chunk_for(Transport::Tcp), 256 << 10);
    assert_eq!(c.limits(Transport::Shm, 4).rndv_chunk, SHM_RNDV_CHUNK);
    assert_eq!(c.limits(Transport::Tcp, 4).rndv_chunk, 256 << 10);
    assert_eq!(shown(&c, RNDV_CHUNK_VAR), "1048576 (tcp 262144)");
    // Set, a value applies to every transport.
    let mut c = Config::from_lookup(lookup(&[("RDMX_RNDV_CHUNK", "64k")])).unwrap();
    c.resolved = vec![Transport::Shm];
    assert_eq!(c.limits(Transport::Shm, 4).rndv_chunk, 64 << 10);
}

#[test]
fn the_unexpected_budget_and_the_rendezvous_timeout_reach_the_engine() {
    let c = Config::from_lookup(lookup(&[])).unwrap();
    assert_eq!(
        (c.max_unexpected(), c.rndv_timeout()),
        (64 << 20, Duration::ZERO)
    );
    let proto = c.proto().unwrap();
    assert_eq!((proto.max_unexpected, proto.rndv_timeout_ns), (64 << 20, 0));
    let c = Config::from_lookup(lookup(&[
        (MAX_UNEXPECTED_VAR, "4M"),
        (RNDV_TIMEOUT_VAR, "250"),
    ]))
    .unwrap();
    let proto = c.proto().unwrap();
    assert_eq!(
        (proto.max_unexpected, proto.rndv_timeout_ns),
        (4 << 20, 250_000_000)
    );
    assert_eq!(shown(&c, MAX_UNEXPECTED_VAR), "4194304");
    assert_eq!(shown(&c, RNDV_TIMEOUT_VAR), "250");
    for (var, bad) in [
        (MAX_UNEXPECTED_VAR, "lots"),
        (MAX_UNEXPECTED_VAR, "2048M0"),
        (RNDV_TIMEOUT_VAR, "-1"),
        (RNDV_TIMEOUT_VAR, "1s"),
    ] {
        let e = Config::from_lookup(lookup(&[(var, bad)])).unwrap_err();
        assert!(
            e.to_string().contains(var) && e.to_string().contains(bad),
            "{e}"
        );
    }
}
