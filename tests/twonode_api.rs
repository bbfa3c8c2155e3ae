//! The two-sided tests of the endpoint API suite (`tests/api`, [`api::two_sided`]) and of the
//! hostile peer (`tests/hostile`: malformed frames, rkey scope) across a wire:
//! each node of `scripts/softroce-twonode` runs this binary, node A the server side and node B
//! the client side of every test, so every message of the suite crosses from one kernel's rxe
//! to the other's. `#[ignore]`d everywhere else; `scripts/test` runs it with the fault tests
//! of `tests/twonode/` (nextest profiles `twonode-A` and `twonode-B`).

// Only the two-sided parts of the suites run here.
#[macro_use]
#[allow(dead_code, unused_imports, unused_macros)]
mod api;
#[macro_use]
#[allow(dead_code)]
mod hostile;

/// The keepalive of the suite's contexts across the wire, 8 s: RC retransmits unacknowledged
/// work 6 times at 1.07 s (7.5 s) before it gives a connection up, where the default 1 s
/// gives 7 tries of 134 ms (0.94 s). Queueing on the emulated wire outlasts the default under
/// the suite's bursts: while a_thousand_endpoints_on_one_worker's 256 endpoints sent at once,
/// a ping from node A to node B took up to 1.6 s, up to 3.6 s with the host's other core
/// busy, and RC cannot tell frames waiting in a queue from a dead peer: the test failed with
/// RETRY_EXC in about half the runs with the default, and in 1 of 4 with 4 s and the host
/// busy. A wire a thousand times faster drains the same burst in milliseconds. The fault
/// tests of tests/twonode keep the default and its 5 s bound.
const KEEPALIVE_MS: u64 = 8000;

fn net() -> api::Net {
    let sides = api::Sides::from_twonode_env();
    let api::Sides::Nodes { server_ip, .. } = &sides else {
        unreachable!("a side per node")
    };
    api::Net {
        transport: rdmx::Transport::Rdma,
        addr_a: server_ip.clone(),
        addr_b: server_ip.clone(),
        sides,
        keepalive_ms: Some(KEEPALIVE_MS),
        settings: Vec::new(),
    }
}

two_sided_api_tests!(#[ignore = "needs two Soft-RoCE nodes: scripts/test runs it with scripts/softroce-twonode"]);
two_sided_hostile_tests!(#[ignore = "needs two Soft-RoCE nodes: scripts/test runs it with scripts/softroce-twonode"]);
