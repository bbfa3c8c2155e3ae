//! The async suite (`tests/async_suite`) over TCP on loopback.
#![cfg(feature = "tokio")]

#[macro_use]
mod async_suite;

fn net() -> async_suite::Net {
    async_suite::Net {
        transport: rdmx::Transport::Tcp,
        addr: "127.0.0.1".into(),
        rounds: 100_000,
        connects: 256,
    }
}

async_tests!();
