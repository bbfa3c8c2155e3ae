//! The async suite (`tests/async_suite`) over RDMA (Soft-RoCE). `#[ignore]`d on the host,
//! which has no RDMA; `scripts/test` runs it in the guest (rxe0 on $SOFTROCE_ADDR_A).
#![cfg(feature = "tokio")]

#[macro_use]
mod async_suite;

fn net() -> async_suite::Net {
    async_suite::Net {
        transport: rdmx::Transport::Rdma,
        addr: std::env::var("SOFTROCE_ADDR_A").unwrap_or_else(|_| {
            panic!("SOFTROCE_ADDR_A is not set: run the device tests through scripts/test")
        }),
        rounds: 10_000,
        // (Over Soft-RoCE in the guest 32 at once set up in 3 s, but 128, 200 and 256 at once
        // did not: after 40 s the server had taken 81 of 128 and 90 of 200 requests, after
        // 60 s 145 of 256. Why is not known yet: RDMX_ASYNC_CONNECTS=N runs it with N.)
        connects: 32,
    }
}

async_tests!(#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]);
