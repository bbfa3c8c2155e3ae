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
    }
}

two_sided_api_tests!(#[ignore = "needs two Soft-RoCE nodes: scripts/test runs it with scripts/softroce-twonode"]);
two_sided_hostile_tests!(#[ignore = "needs two Soft-RoCE nodes: scripts/test runs it with scripts/softroce-twonode"]);
