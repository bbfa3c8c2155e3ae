//! The endpoint API suite (`tests/api`) over RDMA (Soft-RoCE). `#[ignore]`d on the host,
//! which has no RDMA; `scripts/test` runs it with `--ignored` in the guest (rxe0 on
//! $SOFTROCE_ADDR_A, rxe1 on $SOFTROCE_ADDR_B).

#[macro_use]
mod api;

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run the device tests through scripts/test (it boots the Soft-RoCE guest)")
    })
}

fn net() -> api::Net {
    api::Net {
        transport: rdmx::Transport::Rdma,
        addr_a: env("SOFTROCE_ADDR_A"),
        addr_b: env("SOFTROCE_ADDR_B"),
    }
}

all_api_tests!(#[ignore = "needs an RDMA device: scripts/test runs it in the Soft-RoCE guest"]);
