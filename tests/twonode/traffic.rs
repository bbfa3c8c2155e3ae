//! Traffic across the wire: messages both ways on each transport, and the pingpong demo.

use super::pingpong_util::{pingpong_env, rows, start_server, text};
use super::*;

/// Eager and rendezvous messages, byte-exact, both ways across the wire, over each
/// transport (the guests' TCP crosses the same wire).
#[test]
#[ignore = "runs on two Soft-RoCE nodes: scripts/test runs it with scripts/softroce-twonode"]
fn messages_cross_the_wire_both_ways_byte_exact() {
    for (transport, port) in [(Transport::Rdma, 7601), (Transport::Tcp, 7602)] {
        let ctx = context(transport);
        let w = ctx.worker().unwrap();
        let ep = connected(&w, port);
        assert_eq!(ep.transport(), transport);
        let sizes = [0, 100, 8 * 1024, 64 * 1024, MIB, 16 * MIB];
        let started = Instant::now();
        for (i, &len) in sizes.iter().enumerate() {
            let tag = i as u64;
            // Each side sends its message and receives the other's.
            let seed = if is_server() { 1 } else { 2 };
            let peer_seed = 3 - seed;
            let recv = w.tag_recv(tag, TAG_MASK_ALL, vec![0; len]);
            let send = ep.tag_send(tag, pattern(len, seed));
            let got = finish(recv).expect("received");
            assert_eq!(got.length, len, "{transport} {len} B");
            assert!(
                got.buf == pattern(len, peer_seed),
                "{transport}: {len} bytes arrived intact"
            );
            finish(send).expect("sent");
        }
        println!(
            "node {}: {transport}: {} messages each way ({} MiB) in {:?}",
            env("RDMX_NODE"),
            sizes.len(),
            sizes.iter().sum::<usize>() / MIB,
            started.elapsed()
        );
        ep.close().expect("close");
    }
}

/// The demo across the wire, as a user runs it between two machines: `pingpong --server` on
/// node A (awaited by its "listening" line), `pingpong --client` on node B, eager and
/// rendezvous sizes, over RDMA.
#[test]
#[ignore = "runs on two Soft-RoCE nodes: scripts/test runs it with scripts/softroce-twonode"]
fn pingpong_demo_across_the_wire() {
    const PORT: u16 = 7661;
    let rdma = [("RDMX_TRANSPORT", "rdma")];
    if is_server() {
        let (mut server, bound) =
            start_server(&format!("{}:{PORT}", env("RDMX_NODE_ADDR")), &rdma, "rdma");
        println!("node A: pingpong listening on {bound}");
        twonode(&["signal", "pingpong-listening"]);
        let deadline = Instant::now() + LONG;
        let status = loop {
            if let Some(status) = server.0.try_wait().expect("the server's status") {
                break status;
            }
            assert!(Instant::now() < deadline, "the pingpong server still runs");
            thread::sleep(Duration::from_millis(50));
        };
        assert!(status.success(), "the pingpong server failed: {status}");
    } else {
        twonode(&["wait", "pingpong-listening", "120"]);
        let addr = format!("{}:{PORT}", env("RDMX_PEER_ADDR"));
        let out = pingpong_env(&["--client", &addr, "-s", "8,4K,64K,1M", "-n", "20"], &rdma);
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{}", text(&out.stderr));
        println!("node B: pingpong across the wire:\n{stdout}");
        let protocols: Vec<(String, String)> = rows(&stdout)
            .into_iter()
            .map(|(size, protocol, n)| {
                assert_eq!(n, 20, "iterations of {size}");
                (size, protocol)
            })
            .map(|(s, p)| (s.split_whitespace().next().unwrap_or("").to_string(), p))
            .collect();
        assert_eq!(
            protocols
                .iter()
                .map(|(_, p)| p.as_str())
                .collect::<Vec<_>>(),
            ["eager", "eager", "rndv", "rndv"],
            "{protocols:?}"
        );
    }
}
