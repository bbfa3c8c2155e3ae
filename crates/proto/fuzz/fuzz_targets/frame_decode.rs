//! Fuzzes the frame decoder, and one frame through a fresh engine
//! (checks: `rdmx_proto_fuzz::frame_decode`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    rdmx_proto_fuzz::frame_decode(data);
});
