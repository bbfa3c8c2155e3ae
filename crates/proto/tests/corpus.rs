//! Replays the committed fuzz seed corpus through the decoder and the engine.

use rdmx_proto::wire::{self, Body};
use rdmx_proto::{Action, CloseReason, Config, ConnId, Engine, Handshake, RecvBufId, UserBufId};

fn corpus() -> Vec<(String, Vec<u8>)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/frame_decode");
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .expect("corpus directory exists")
        .map(|e| {
            let p = e.unwrap().path();
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    files.sort();
    files
}

#[test]
fn corpus_replays_without_panic() {
    let files = corpus();
    assert!(files.len() >= 30, "seed corpus too small: {}", files.len());
    let mut valid = 0;
    for (name, bytes) in &files {
        let decoded = wire::decode(bytes);
        let expect_valid = !(name.starts_with("truncated")
            || name.starts_with("bad_")
            || name.starts_with("opcode_")
            || name.starts_with("garbage")
            || matches!(
                name.as_str(),
                "flags"
                    | "status"
                    | "len_mismatch"
                    | "rts_reserved"
                    | "ats_with_body"
                    | "zeros"
                    | "handshake_raw"
            ));
        assert_eq!(decoded.is_ok(), expect_valid, "{name}: {decoded:?}");
        if let Ok(f) = decoded {
            valid += 1;
            assert_eq!(
                f.header.payload_len as usize,
                bytes.len() - wire::HEADER_LEN
            );
            if let Body::Handshake(h) = f.body {
                assert!(Handshake::decode(h).is_ok(), "{name}");
            }
        }
        // Through the engine: the buffer is always reposted; invalid frames close the
        // connection with a protocol error, and nothing panics.
        let cfg = Config::default();
        let mut e = Engine::new(cfg.clone());
        e.handle_connection_up(ConnId(1), &Engine::new(cfg).local_handshake())
            .unwrap();
        e.tag_recv(0, 0, UserBufId(1), 1 << 20);
        e.handle_frame(ConnId(1), RecvBufId(9), bytes);
        let mut reposts = 0;
        let mut closed = None;
        while let Some(a) = e.poll_action() {
            match a {
                Action::RepostRecv { buf } => {
                    assert_eq!(buf, RecvBufId(9));
                    reposts += 1;
                }
                Action::CloseConnection { reason, .. } => closed = Some(reason),
                _ => {}
            }
        }
        assert_eq!(reposts, 1, "{name}");
        if !expect_valid {
            assert!(
                matches!(closed, Some(CloseReason::ProtocolError(_))),
                "{name}: {closed:?}"
            );
        }
    }
    assert!(valid >= 15);
}

#[test]
fn handshake_corpus_entry_roundtrips() {
    let files = corpus();
    let raw = &files.iter().find(|f| f.0 == "handshake_raw").unwrap().1;
    let hs = Handshake::decode(raw).unwrap();
    assert_eq!(hs.encode(), *raw);
}
