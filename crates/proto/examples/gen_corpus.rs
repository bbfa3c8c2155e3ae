//! Writes the seed corpus of the `frame_decode` fuzz target:
//! `cargo run -p rdmx-proto --example gen_corpus` (from the workspace root).

use rdmx_proto::wire::{FrameBuf, Header, Opcode, RtsBody, WireStatus, RTS_BODY_LEN};
use rdmx_proto::{Config, Engine};

fn frame(op: Opcode, f: impl FnOnce(&mut Header), rts: Option<RtsBody>, payload: &[u8]) -> Vec<u8> {
    let mut h = Header::new(op);
    f(&mut h);
    let mut v = FrameBuf::encode(&h, rts.as_ref()).as_bytes().to_vec();
    v.extend_from_slice(payload);
    v
}

fn main() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/frame_decode");
    std::fs::create_dir_all(&dir).expect("create corpus dir");
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    let rts = RtsBody {
        addr: 0x7f00_0000_1000,
        rkey: 0x1234,
        len: 1 << 20,
    };
    for (i, len) in [0usize, 1, 13, 100, 200].into_iter().enumerate() {
        files.push((
            format!("eager_{i}"),
            frame(
                Opcode::Eager,
                |h| {
                    h.tag = 0xABCD;
                    h.payload_len = len as u32;
                    h.seq = i as u32
                },
                None,
                &vec![0x5A; len],
            ),
        ));
    }
    files.push((
        "rts".into(),
        frame(
            Opcode::Rts,
            |h| {
                h.tag = 7;
                h.sreq = 42;
                h.payload_len = RTS_BODY_LEN as u32
            },
            Some(rts),
            &[],
        ),
    ));
    files.push((
        "rts_zero_len".into(),
        frame(
            Opcode::Rts,
            |h| h.payload_len = RTS_BODY_LEN as u32,
            Some(RtsBody { len: 0, ..rts }),
            &[],
        ),
    ));
    files.push((
        "rts_huge".into(),
        frame(
            Opcode::Rts,
            |h| h.payload_len = RTS_BODY_LEN as u32,
            Some(RtsBody {
                addr: u64::MAX,
                rkey: u32::MAX,
                len: u64::MAX,
            }),
            &[],
        ),
    ));
    for (n, st) in [
        ("ok", WireStatus::Ok),
        ("trunc", WireStatus::Truncated),
        ("readfail", WireStatus::ReadFailed),
        ("proto", WireStatus::Protocol),
    ] {
        files.push((
            format!("ats_{n}"),
            frame(
                Opcode::Ats,
                |h| {
                    h.sreq = 1;
                    h.status = st
                },
                None,
                &[],
            ),
        ));
    }
    files.push((
        "error".into(),
        frame(
            Opcode::Error,
            |h| h.status = WireStatus::Protocol,
            None,
            &[],
        ),
    ));
    files.push((
        "credit".into(),
        frame(Opcode::Credit, |h| h.credits = 4, None, &[]),
    ));
    files.push((
        "credit_overflow".into(),
        frame(Opcode::Credit, |h| h.credits = u16::MAX, None, &[]),
    ));
    let hs = Engine::new(Config::default()).local_handshake().encode();
    files.push((
        "handshake".into(),
        frame(
            Opcode::Handshake,
            |h| h.payload_len = hs.len() as u32,
            None,
            &hs,
        ),
    ));
    files.push(("handshake_raw".into(), hs.clone()));
    let good = frame(
        Opcode::Eager,
        |h| {
            h.tag = 1;
            h.payload_len = 8
        },
        None,
        b"12345678",
    );
    for cut in [0usize, 1, 2, 20, 39, 40, 44] {
        files.push((format!("truncated_{cut}"), good[..cut].to_vec()));
    }
    for (off, val, name) in [
        (0, 0u8, "bad_magic"),
        (2, 7, "bad_version"),
        (3, 0, "opcode_0"),
        (3, 200, "opcode_200"),
        (4, 0x80, "flags"),
        (5, 9, "status"),
        (12, 0xFF, "len_mismatch"),
    ] {
        let mut v = good.clone();
        v[off] = val;
        files.push((name.into(), v));
    }
    let mut v = frame(
        Opcode::Rts,
        |h| h.payload_len = RTS_BODY_LEN as u32,
        Some(rts),
        &[],
    );
    v[HEADER_RESERVED] = 1;
    files.push(("rts_reserved".into(), v));
    files.push((
        "ats_with_body".into(),
        frame(Opcode::Ats, |h| h.payload_len = 3, None, b"xyz"),
    ));
    files.push((
        "garbage_ascii".into(),
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
    ));
    files.push(("garbage_ff".into(), vec![0xFF; 64]));
    files.push(("zeros".into(), vec![0; 40]));
    for (name, bytes) in &files {
        std::fs::write(dir.join(name), bytes).expect("write corpus file");
    }
    println!("wrote {} files to {}", files.len(), dir.display());
}

/// Offset of the RTS body's reserved word.
const HEADER_RESERVED: usize = rdmx_proto::HEADER_LEN + 12;
