//! Fuzzes the frame decoder and the engine's frame handling.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rdmx_proto::wire;
use rdmx_proto::{Action, Config, ConnId, Engine, RecvBufId};

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = wire::decode(data) {
        assert_eq!(f.header.payload_len as usize, data.len() - wire::HEADER_LEN);
    }
    let cfg = Config::default();
    let mut e = Engine::new(cfg.clone());
    let hs = Engine::new(cfg).local_handshake();
    e.handle_connection_up(ConnId(1), &hs).expect("fresh engine accepts a connection");
    e.tag_recv(0, 0, rdmx_proto::UserBufId(1), 1 << 20);
    e.handle_frame(ConnId(1), RecvBufId(0), data);
    let mut reposted = false;
    while let Some(a) = e.poll_action() {
        if let Action::RepostRecv { buf } = a {
            assert_eq!(buf, RecvBufId(0));
            reposted = true;
        }
    }
    assert!(reposted);
});
