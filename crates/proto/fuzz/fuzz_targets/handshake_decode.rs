//! Fuzzes the handshake decoder.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdmx_proto::Handshake;

fuzz_target!(|data: &[u8]| {
    if let Ok(hs) = Handshake::decode(data) {
        assert_eq!(Handshake::decode(&hs.encode()), Ok(hs));
    }
});
