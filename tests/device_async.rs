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
        connects: 256,
    }
}

async_tests!(#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]);
