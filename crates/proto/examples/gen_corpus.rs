//! Writes the named seeds of the fuzz targets (`crates/proto/fuzz/seeds/<target>`):
//! `cargo run -p rdmx-proto --example gen_corpus` (from the workspace root). The seeds it
//! does not make (most of `engine_frames`' and `handshake_decode`'s) were written by hand and
//! are left alone; `crates/proto/tests/corpus.rs` replays every seed and checks that the
//! named ones reach the states their names promise.
//!
//! - `frame_decode`: one frame of each kind, valid and broken ones, one-sided frames
//!   included (PUT, GET, FETCH_ADD, COMPARE_SWAP, RMA_REPLY);
//! - `handshake_decode`: the default handshake, and receive buffers at and over the largest
//!   a handshake may declare;
//! - `engine_frames` (`rma_*`): a peer's one-sided operations on the regions the harness maps
//!   (valid, stale, read-only and bogus keys), replies to this side's operations (by
//!   messages and by verbs), and the lies about buffer sizes and credits that issue 48 found.

use std::path::Path;

use rdmx_proto::rma::KeyRef;
use rdmx_proto::wire::{
    FrameBuf, Header, Opcode, RmaBody, RtsBody, WireStatus, MAX_RECV_BUF_SIZE, RTS_BODY_LEN,
};
use rdmx_proto::{Config, Engine, Handshake, HEADER_LEN};

fn frame(op: Opcode, f: impl FnOnce(&mut Header), rts: Option<RtsBody>, payload: &[u8]) -> Vec<u8> {
    let mut h = Header::new(op);
    f(&mut h);
    let mut v = FrameBuf::encode(&h, rts.as_ref()).as_bytes().to_vec();
    v.extend_from_slice(payload);
    v
}

/// A one-sided frame: `op` on `key` with `word`, at `tag`, with `data` after the body.
fn rma(op: Opcode, f: impl FnOnce(&mut Header), key: KeyRef, word: u64, data: &[u8]) -> Vec<u8> {
    let mut h = Header::new(op);
    f(&mut h);
    h.payload_len = (RmaBody::LEN + data.len()) as u32;
    let mut v = FrameBuf::encode_rma(&h, &RmaBody { key, word })
        .as_bytes()
        .to_vec();
    v.extend_from_slice(data);
    v
}

/// An RMA reply to the request (or, in `engine_frames`, to the operation index) `sreq`.
fn reply(sreq: u64, tag: u64, status: WireStatus, value: u64, data: &[u8]) -> Vec<u8> {
    frame(
        Opcode::RmaReply,
        |h| {
            h.sreq = sreq;
            h.tag = tag;
            h.status = status;
            h.rreq = value;
            h.payload_len = data.len() as u32;
        },
        None,
        data,
    )
}

/// The keys of the regions the `engine_frames` harness maps (its `one_sided::peer_keys`):
/// region 0 (16 KiB, every access), region 1's stale generation, region 1 (64 bytes, read
/// only).
const SECRETS: [u64; 3] = [
    0x5ec2_e700_0000_0001,
    0x5ec2_e700_0000_0002,
    0x5ec2_e700_0000_0003,
];
const VALID: KeyRef = KeyRef {
    region: 0,
    generation: 0,
    secret: SECRETS[0],
};
const STALE: KeyRef = KeyRef {
    region: 1,
    generation: 0,
    secret: SECRETS[1],
};
const READ_ONLY: KeyRef = KeyRef {
    region: 1,
    generation: 1,
    secret: SECRETS[2],
};
const BOGUS: KeyRef = KeyRef {
    region: 0,
    generation: 0,
    secret: 0xbad,
};

/// `engine_frames`' flag bits (its `flag` module) and RMA bits (`one_sided::rma_flag`).
const HANDSHAKE: u8 = 1;
const AUTO_SEQ: u8 = 1 << 5;
const RMA: u8 = 1 << 7;
const NO_MEMORY: u8 = 1;
const VERBS: u8 = 1 << 1;
const PUT: u8 = 1 << 2;
const GET: u8 = 1 << 3;
const ATOMICS: u8 = 1 << 4;
const FLUSH: u8 = 1 << 5;
const VERBS_LATE: u8 = 1 << 6;
const VERBS_FAIL: u8 = 1 << 7;

/// An `engine_frames` input: flags, the RMA byte, a handshake, then the frames.
fn engine(flags: u8, rma_bits: u8, hs: Option<Handshake>, frames: &[Vec<u8>]) -> Vec<u8> {
    let mut v = vec![
        flags | RMA | if hs.is_some() { HANDSHAKE } else { 0 },
        rma_bits,
    ];
    if let Some(hs) = hs {
        let b = hs.encode();
        v.push(b.len() as u8);
        v.extend_from_slice(&b);
    }
    for f in frames {
        v.extend_from_slice(&(f.len() as u16).to_le_bytes());
        v.extend_from_slice(f);
    }
    v
}

/// The `engine_frames` harness's engine's handshake, with `f` applied: what its seeds'
/// peers send.
fn peer_handshake(f: impl FnOnce(&mut Handshake)) -> Handshake {
    let cfg = Config::builder()
        .initial_credits(Config::default().credits)
        .build()
        .unwrap();
    let mut hs = Engine::new(cfg).local_handshake();
    f(&mut hs);
    hs
}

fn frame_decode_seeds(default_hs: &[u8]) -> Vec<(String, Vec<u8>)> {
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
    files.push((
        "handshake".into(),
        frame(
            Opcode::Handshake,
            |h| h.payload_len = default_hs.len() as u32,
            None,
            default_hs,
        ),
    ));
    files.push(("handshake_raw".into(), default_hs.to_vec()));
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

    // One-sided frames, each valid (the engine of `frame_decode` has the harness's memory:
    // region 0 is reached by VALID).
    let at = |tag: u64| move |h: &mut Header| h.tag = tag;
    files.push(("put".into(), rma(Opcode::Put, at(16), VALID, 0, &[7; 100])));
    files.push(("put_empty".into(), rma(Opcode::Put, at(0), VALID, 0, &[])));
    files.push(("get".into(), rma(Opcode::Get, at(0), VALID, 4096, &[])));
    files.push((
        "get_huge".into(),
        rma(Opcode::Get, at(0), BOGUS, u64::from(u32::MAX), &[]),
    ));
    files.push((
        "fetch_add".into(),
        rma(Opcode::FetchAdd, |h| h.rreq = 5, VALID, 0, &[]),
    ));
    files.push((
        "compare_swap".into(),
        rma(
            Opcode::CompareSwap,
            |h| {
                h.tag = 8;
                h.rreq = 9
            },
            VALID,
            0,
            &[],
        ),
    ));
    files.push(("rma_reply".into(), reply(1, 0, WireStatus::Ok, 0, &[])));
    files.push((
        "rma_reply_data".into(),
        reply(1, 0, WireStatus::Ok, 0, &[3; 64]),
    ));
    files.push((
        "rma_reply_refused".into(),
        reply(1, 0, WireStatus::NotPermitted, 0, &[]),
    ));
    // ... and broken ones.
    let mut short = rma(Opcode::Get, at(0), VALID, 8, &[]);
    short.truncate(HEADER_LEN + 16);
    short[12..16].copy_from_slice(&16u32.to_le_bytes());
    files.push(("bad_get_body".into(), short));
    files.push((
        "bad_get_with_bytes".into(),
        rma(Opcode::Get, at(0), VALID, 8, &[1; 8]),
    ));
    files.push((
        "bad_fetch_add_word".into(),
        rma(Opcode::FetchAdd, |_| {}, VALID, 1, &[]),
    ));
    files.push((
        "bad_reply_status".into(),
        reply(1, 0, WireStatus::Truncated, 0, &[]),
    ));
    files
}

fn handshake_decode_seeds(default_hs: &[u8]) -> Vec<(String, Vec<u8>)> {
    let hs = Handshake::decode(default_hs).unwrap();
    vec![
        ("default".into(), default_hs.to_vec()),
        (
            "largest_buffers".into(),
            Handshake {
                recv_buf_size: MAX_RECV_BUF_SIZE,
                ..hs
            }
            .encode(),
        ),
        (
            "buffers_over_largest".into(),
            Handshake {
                recv_buf_size: MAX_RECV_BUF_SIZE + 1,
                ..hs
            }
            .encode(),
        ),
    ]
}

fn engine_frames_seeds() -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    let chunk = u64::from(Config::default().recv_buf_size) - HEADER_LEN as u64;
    let req = |sreq: u64| move |h: &mut Header| h.sreq = sreq;
    let req_at = |sreq: u64, tag: u64| {
        move |h: &mut Header| {
            h.sreq = sreq;
            h.tag = tag
        }
    };
    // The peer's operations, served from the harness's memory: four done, five refused,
    // each reply in order.
    files.push((
        "rma_peer_operations".into(),
        engine(
            AUTO_SEQ,
            0,
            None,
            &[
                rma(Opcode::Put, req_at(1, 100), VALID, 0, &[9; 200]),
                rma(Opcode::Get, req_at(2, 96), VALID, 300, &[]),
                rma(
                    Opcode::FetchAdd,
                    |h| {
                        h.sreq = 3;
                        h.tag = 8;
                        h.rreq = 5
                    },
                    VALID,
                    0,
                    &[],
                ),
                rma(
                    Opcode::CompareSwap,
                    |h| {
                        h.sreq = 4;
                        h.tag = 16;
                        h.rreq = 9
                    },
                    VALID,
                    0,
                    &[],
                ),
                rma(Opcode::Get, req(5), STALE, 8, &[]),
                rma(Opcode::Get, req_at(6, 60), READ_ONLY, 8, &[]),
                rma(Opcode::Put, req(7), READ_ONLY, 0, &[1; 8]),
                rma(Opcode::FetchAdd, req_at(8, 4), VALID, 0, &[]),
                rma(Opcode::Get, req(9), BOGUS, chunk, &[]),
            ],
        ),
    ));
    // Without memory every access is refused.
    files.push((
        "rma_no_memory".into(),
        engine(
            AUTO_SEQ,
            NO_MEMORY,
            None,
            &[rma(Opcode::Get, req(1), VALID, 8, &[])],
        ),
    ));
    // A get for more than a reply into the engine's 8 KiB buffers carries, from a peer
    // with 16 MiB ones: a protocol error, nothing allocated for it.
    files.push((
        "rma_get_past_the_reply".into(),
        engine(
            AUTO_SEQ,
            0,
            Some(peer_handshake(|h| h.recv_buf_size = MAX_RECV_BUF_SIZE)),
            &[
                rma(Opcode::Get, req(1), VALID, chunk, &[]),
                rma(
                    Opcode::Get,
                    req(2),
                    BOGUS,
                    u64::from(MAX_RECV_BUF_SIZE) - 40,
                    &[],
                ),
            ],
        ),
    ));
    // Issue 48's 64-byte get with a bogus key from a peer declaring 4 GiB buffers: the
    // handshake is refused (the get once allocated what the peer declared).
    files.push((
        "rma_huge_buffers_declared".into(),
        engine(
            AUTO_SEQ,
            0,
            Some(peer_handshake(|h| h.recv_buf_size = u32::MAX)),
            &[rma(
                Opcode::Get,
                req(1),
                BOGUS,
                u64::from(u32::MAX) - 40,
                &[],
            )],
        ),
    ));
    // A peer that grants 4 credits and never more sends gets: the engine answers 4 (a
    // CREDIT frame costs no credit, so none is kept for one), holds the other replies with
    // their credits, and the peer's 69th frame overruns its window of 64 (plus the 4
    // credits returned).
    let gets: Vec<Vec<u8>> = (0..70)
        .map(|i| rma(Opcode::Get, req(i + 1), VALID, 64, &[]))
        .collect();
    files.push((
        "rma_replies_held".into(),
        engine(AUTO_SEQ, 0, Some(peer_handshake(|h| h.credits = 4)), &gets),
    ));
    // This side's put (3 frames), get (3 replies), fetch-and-add, fence, compare-and-swap
    // and flushes, answered by replies aimed at them by index (0 put, 1 get, 2 add, 3 cas,
    // 4 flush, 5 worker flush).
    let get_remote = 5000;
    let tail = 20_000 - 2 * chunk;
    files.push((
        "rma_own_operations".into(),
        engine(
            AUTO_SEQ,
            PUT | GET | ATOMICS | FLUSH,
            None,
            &[
                reply(0, 100, WireStatus::Ok, 0, &[]),
                reply(1, get_remote, WireStatus::Ok, 0, &vec![1; chunk as usize]),
                reply(0, 100, WireStatus::Ok, 0, &[]),
                reply(
                    1,
                    get_remote + chunk,
                    WireStatus::Ok,
                    0,
                    &vec![2; chunk as usize],
                ),
                reply(2, 8, WireStatus::Ok, 41, &[]),
                reply(0, 100, WireStatus::Ok, 0, &[]),
                reply(
                    1,
                    get_remote + 2 * chunk,
                    WireStatus::Ok,
                    0,
                    &vec![3; tail as usize],
                ),
                reply(3, 16, WireStatus::Ok, 0, &[]),
            ],
        ),
    ));
    // Refusals complete them as refused; a reply with the wrong bytes closes.
    files.push((
        "rma_own_refused".into(),
        engine(
            AUTO_SEQ,
            PUT | ATOMICS,
            None,
            &[
                reply(0, 100, WireStatus::Ok, 0, &[]),
                reply(0, 100, WireStatus::BadKey, 0, &[]),
                reply(0, 100, WireStatus::Ok, 0, &[]),
                reply(1, 8, WireStatus::OutOfBounds, 0, &[]),
                reply(2, 16, WireStatus::Unaligned, 0, &[]),
            ],
        ),
    ));
    files.push((
        "rma_reply_to_a_flush".into(),
        engine(
            AUTO_SEQ,
            ATOMICS | FLUSH,
            None,
            &[reply(2, 0, WireStatus::Ok, 0, &[])],
        ),
    ));
    files.push((
        "rma_get_reply_short".into(),
        engine(
            AUTO_SEQ,
            GET,
            None,
            &[reply(0, get_remote, WireStatus::Ok, 0, &[1; 100])],
        ),
    ));
    // A put to a peer whose 64-byte buffers hold no byte of it is refused as it is made
    // (found by the first campaign with one-sided operations: a false alarm of the harness);
    // the get still goes.
    files.push((
        "rma_put_to_small_buffers".into(),
        engine(
            AUTO_SEQ,
            PUT | GET,
            Some(peer_handshake(|h| h.recv_buf_size = 64)),
            &[reply(0, get_remote, WireStatus::Ok, 0, &[5; 24])],
        ),
    ));
    // A peer declaring the smallest buffers a put frame fits (65 bytes: one byte a frame)
    // and 65 472 credits: one put has at most 64 frames out (found by the campaign: the
    // put queued 20 000 frames, 1.8 MB of actions, at once).
    files.push((
        "rma_put_tiny_buffers_many_credits".into(),
        engine(
            AUTO_SEQ,
            PUT,
            Some(peer_handshake(|h| {
                h.recv_buf_size = 65;
                h.credits = 65_472;
                h.max_credits = u16::MAX
            })),
            &[reply(0, 100, WireStatus::Ok, 0, &[])],
        ),
    ));
    // By verbs: the NIC's reports complete the operations; a reply frame for one is a
    // protocol error.
    files.push((
        "rma_verbs".into(),
        engine(AUTO_SEQ, VERBS | PUT | GET | ATOMICS | FLUSH, None, &[]),
    ));
    files.push((
        "rma_verbs_reply".into(),
        engine(
            AUTO_SEQ,
            VERBS | VERBS_LATE | ATOMICS,
            None,
            &[reply(0, 8, WireStatus::Ok, 77, &[])],
        ),
    ));
    files.push((
        "rma_verbs_refused".into(),
        engine(AUTO_SEQ, VERBS | VERBS_FAIL | PUT | GET, None, &[]),
    ));
    files
}

fn main() {
    let seeds = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
    let default_hs = Engine::new(Config::default()).local_handshake().encode();
    let mut n = 0;
    for (target, files) in [
        ("frame_decode", frame_decode_seeds(&default_hs)),
        ("handshake_decode", handshake_decode_seeds(&default_hs)),
        ("engine_frames", engine_frames_seeds()),
    ] {
        let dir = seeds.join(target);
        std::fs::create_dir_all(&dir).expect("create seed dir");
        for (name, bytes) in &files {
            std::fs::write(dir.join(name), bytes).expect("write seed");
        }
        n += files.len();
    }
    println!("wrote {n} seeds under {}", seeds.display());
}

/// Offset of the RTS body's reserved word.
const HEADER_RESERVED: usize = HEADER_LEN + 12;
