//! The ping-pong demo (`examples/pingpong`) as a user runs it, over TCP on loopback: the table,
//! the JSON, bandwidth mode, a separate server and client, and one clear line with a non-zero
//! exit for every kind of mistake.

mod pingpong_util;

use std::process::Output;

use pingpong_util::{one_line_error, pingpong_env, rows, server_and_client, start_server, text};

/// pingpong over TCP.
fn pingpong(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut all = vec![("RDMX_TRANSPORT", "tcp")];
    all.extend_from_slice(env);
    pingpong_env(args, &all)
}

#[test]
fn loopback_prints_the_header_and_one_row_per_size() {
    let out = pingpong(&["-s", "1,8K,64K", "-n", "20", "--no-progress"], &[]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("# transport tcp"), "{stdout}");
    assert!(
        stdout.contains("# RDMX_EAGER_THRESHOLD 65496 B (default); eager up to 65496 B"),
        "{stdout}"
    );
    assert_eq!(
        rows(&stdout),
        vec![
            ("1 B".into(), "eager".into(), 20),
            ("8 KiB".into(), "eager".into(), 20),
            ("64 KiB".into(), "rndv".into(), 20),
        ]
    );
}

#[test]
fn the_threshold_from_the_environment_moves_the_switch() {
    let out = pingpong(
        &["-s", "8K,8K", "-n", "5"],
        &[
            ("RDMX_EAGER_THRESHOLD", "16K"),
            ("RDMX_RECV_BUF_SIZE", "32K"),
        ],
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(
        stdout.contains("# RDMX_EAGER_THRESHOLD 16384 B (environment); eager up to 16384 B"),
        "{stdout}"
    );
    assert!(rows(&stdout).iter().all(|r| r.1 == "eager"), "{stdout}");
}

#[test]
fn json_has_every_figure_per_size() {
    let out = pingpong(&["-s", "0:4,100K", "-n", "10", "-w", "2", "--json"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!(doc["tool"], "rdmx-pingpong");
    assert_eq!(doc["transport"], "tcp");
    assert_eq!(doc["mode"], "latency");
    // TCP's defaults (rdmx::TCP_EAGER_THRESHOLD).
    assert_eq!(doc["eager_threshold"], 65496);
    assert_eq!(doc["eager_limit"], 65496);
    let results = doc["results"].as_array().expect("results");
    let sizes: Vec<u64> = results
        .iter()
        .map(|r| r["size"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes, vec![0, 1, 2, 4, 100 << 10]);
    for r in results {
        let f = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k} in {r}"));
        assert_eq!(r["iterations"], 10);
        assert_eq!(r["warmup"], 2);
        assert!(f("min_us") > 0.0 && f("min_us") <= f("p50_us"), "{r}");
        assert!(f("p50_us") <= f("p99_us"), "{r}");
        assert!(f("mean_us") >= f("min_us"), "{r}");
        assert!(f("msgs_per_s") > 0.0, "{r}");
        let expect = if r["size"].as_u64() <= Some(65496) {
            "eager"
        } else {
            "rndv"
        };
        assert_eq!(r["protocol"], expect);
    }
}

#[test]
fn a_run_clock_gives_the_mean_of_the_whole_run_as_every_figure() {
    let out = pingpong(&["-s", "8", "-n", "200", "--run-clock", "--json"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    let r = &doc["results"][0];
    let f = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k} in {r}"));
    assert_eq!(r["iterations"], 200);
    assert!(f("mean_us") > 0.0, "{r}");
    // One value recorded for every round trip: the percentiles are the mean (within the
    // histogram's 3 significant digits).
    for k in ["min_us", "p50_us", "p99_us"] {
        assert!(
            (f(k) - f("mean_us")).abs() <= f("mean_us") / 500.0,
            "{k}: {r}"
        );
    }
    let result = pingpong(&["-s", "8", "-n", "50", "--run-clock", "--result"], &[]);
    assert!(result.status.success(), "{}", text(&result.stderr));
    assert!(
        text(&result.stdout).starts_with("RESULT size=8 lat_us="),
        "{}",
        text(&result.stdout)
    );
}

#[test]
fn bandwidth_mode_keeps_a_window_outstanding() {
    // From one shared buffer (the default) and from a buffer per send.
    for own in [None, Some("--own-buffers")] {
        let mut args = vec![
            "--bw", "--window", "4", "-s", "4K,256K", "-n", "8", "--json",
        ];
        args.extend(own);
        let out = pingpong(&args, &[]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert_eq!(doc["mode"], "bandwidth");
        assert_eq!(doc["window"], 4);
        for r in doc["results"].as_array().unwrap() {
            assert_eq!(r["iterations"], 8, "{r}");
            let size = r["size"].as_f64().unwrap();
            let (bps, mps) = (
                r["bytes_per_s"].as_f64().unwrap(),
                r["msgs_per_s"].as_f64().unwrap(),
            );
            assert!(bps > 0.0 && ((bps / mps) - size).abs() < 1e-6 * size, "{r}");
        }
    }
}

#[test]
fn a_server_may_keep_fewer_receives_posted_than_the_window() {
    // One receive posted for a window of 8: the other rendezvous messages of a window wait
    // at the server unexpected, and each repost takes the next.
    let (mut server, addr) = start_server("127.0.0.1:0", &[("RDMX_TRANSPORT", "tcp")], "tcp");
    let out = pingpong(
        &[
            "--client",
            &addr,
            "--bw",
            "--window",
            "8",
            "--recv-window",
            "1",
            "-s",
            "64K,1M",
            "-n",
            "24",
            "--json",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let results = doc["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    for r in results {
        assert_eq!(r["iterations"], 24, "{r}");
    }
    assert!(server.0.wait().unwrap().success());
    one_line_error(
        &pingpong(&["--bw", "--window", "4", "--recv-window", "5"], &[]),
        2,
        "receive window 5",
    );
}

#[test]
fn server_and_client_in_two_processes() {
    let (mut server, addr) = start_server("127.0.0.1:0", &[("RDMX_TRANSPORT", "tcp")], "tcp");
    let out = pingpong(&["--client", &addr, "-s", "16,1M", "-n", "10"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains(&format!("server {addr}")), "{stdout}");
    assert_eq!(rows(&stdout).len(), 2);
    assert!(
        server.0.wait().unwrap().success(),
        "the server exits after its client"
    );
}

/// What `scripts/demo` shows first: a server and a client process on the auto transport,
/// on one host, talk over shared memory, eager and rendezvous.
#[test]
fn two_processes_on_the_auto_transport_use_shared_memory() {
    let stdout = server_and_client(
        None,
        &[],
        "shm",
        &["-s", "8,1M", "-n", "10", "--no-progress"],
    );
    assert!(stdout.contains("# transport shm"), "{stdout}");
    let protocols: Vec<String> = rows(&stdout).into_iter().map(|r| r.1).collect();
    assert_eq!(protocols, ["eager", "rndv"], "{stdout}");
}

#[test]
fn mistakes_give_one_line_and_a_non_zero_exit() {
    one_line_error(
        &pingpong(&["--bogus"], &[]),
        2,
        "unexpected argument '--bogus'",
    );
    one_line_error(&pingpong(&["-s", "1:x"], &[]), 2, "`x` is not a size");
    one_line_error(
        &pingpong(&["-n", "-3"], &[]),
        2,
        "`-3` is not a whole number",
    );
    one_line_error(
        &pingpong(&["--client", "h:99999"], &[]),
        2,
        "not a port number",
    );
    one_line_error(
        &pingpong(&["-s", "8"], &[("RDMX_EAGER_THRESHOLD", "banana")]),
        1,
        "RDMX_EAGER_THRESHOLD",
    );
}

#[test]
fn an_unreachable_server_is_one_line() {
    // Port 1 on loopback: nothing listens, the connection is refused.
    one_line_error(
        &pingpong(&["--client", "127.0.0.1:1", "-s", "8"], &[]),
        1,
        "cannot connect to 127.0.0.1:1",
    );
    // A name that does not resolve.
    one_line_error(
        &pingpong(&["--client", "no-such-host.invalid", "-s", "8"], &[]),
        1,
        "cannot connect to no-such-host.invalid:13337",
    );
}

#[test]
fn help_lists_the_options() {
    let out = pingpong(&["--help"], &[]);
    assert!(out.status.success());
    let s = text(&out.stdout);
    for opt in [
        "--server",
        "--client",
        "--sizes",
        "--iters",
        "--warmup",
        "--bw",
        "--window",
        "--recv-window",
        "--json",
    ] {
        assert!(s.contains(opt), "{opt} in {s}");
    }
}

/// `--async`: both sides await their requests as futures (eager and rendezvous sizes, both
/// wait modes, TCP and shared memory), with the same rows; and an async client against a
/// server process that waits for its requests (each side chooses for itself).
#[test]
fn async_sides_await_their_requests() {
    for transport in ["tcp", "shm"] {
        for mode in ["poll", "event"] {
            let env = [("RDMX_TRANSPORT", transport), ("RDMX_WAIT_MODE", mode)];
            let out = pingpong_env(
                &["-s", "8,1M", "-n", "50", "--no-progress", "--async"],
                &env,
            );
            let stdout = text(&out.stdout);
            assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
            assert!(stdout.contains("awaited as futures (--async)"), "{stdout}");
            assert_eq!(
                rows(&stdout),
                vec![
                    ("8 B".into(), "eager".into(), 50),
                    ("1 MiB".into(), "rndv".into(), 50),
                ],
                "{transport} {mode}"
            );
        }
    }
    // A waiting server, an async client.
    let (mut server, addr) = start_server("127.0.0.1:0", &[("RDMX_TRANSPORT", "tcp")], "tcp");
    let out = pingpong(&["--client", &addr, "-s", "8", "-n", "20", "--async"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        rows(&text(&out.stdout)),
        vec![("8 B".into(), "eager".into(), 20)]
    );
    assert!(server.0.wait().unwrap().success());
}

/// `--bw --async`: the sliding window of sends and the server's window of receives are
/// awaited as futures (eager and rendezvous sizes, both wait modes, TCP and shared memory),
/// with the same rows as waiting for them.
#[test]
fn async_bandwidth_awaits_its_windows() {
    for transport in ["tcp", "shm"] {
        for mode in ["poll", "event"] {
            let env = [("RDMX_TRANSPORT", transport), ("RDMX_WAIT_MODE", mode)];
            let out = pingpong_env(
                &["--bw", "-s", "8,1M", "-n", "64", "--no-progress", "--async"],
                &env,
            );
            let stdout = text(&out.stdout);
            assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
            assert!(stdout.contains("awaited as futures (--async)"), "{stdout}");
            assert_eq!(
                rows(&stdout),
                vec![
                    ("8 B".into(), "eager".into(), 64),
                    ("1 MiB".into(), "rndv".into(), 64),
                ],
                "{transport} {mode}"
            );
        }
    }
}
