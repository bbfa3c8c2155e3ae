//! Fuzzes the handshake decoder and connection setup
//! (checks: `rdmx_proto_fuzz::handshake_decode`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    rdmx_proto_fuzz::handshake_decode(data);
});
