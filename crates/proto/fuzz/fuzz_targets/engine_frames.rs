//! Fuzzes an engine with a hostile peer: a handshake, then a stream of frames
//! (input layout and checks: `rdmx_proto_fuzz::engine_frames`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    rdmx_proto_fuzz::engine_frames(data);
});
