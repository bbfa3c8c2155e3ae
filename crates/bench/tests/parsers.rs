//! Parser tests on real tool outputs committed under tests/data (see tests/data/README.md).

use std::fs;
use std::path::{Path, PathBuf};

use rdmx_bench::inputs::{
    parse_perftest, parse_qperf, parse_ucx, QperfKind, IB_READ_BW, IB_SEND_LAT,
};
use rdmx_bench::schema::PingpongDoc;

fn data(rel: &str) -> (PathBuf, String) {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(rel);
    let text = fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    (p, text)
}

#[test]
fn ib_send_lat_single_size() {
    let (p, t) = data("run/guest/ib_send_lat-8.txt");
    let r = parse_perftest(&IB_SEND_LAT, &t, &p).unwrap();
    assert_eq!(r.rows.len(), 1);
    let row = &r.rows[&8];
    assert_eq!(row["#iterations"], 200.0);
    assert_eq!(row["t_min"], 30.99);
    assert_eq!(row["t_typical"], 56.02);
    assert_eq!(row["t_avg"], 63.16);
    assert_eq!(row["99.9%"], 411.26);
    assert!(r.unusable.is_empty());
}

#[test]
fn ib_send_lat_clock_correlation_failure_is_missing() {
    let (p, t) = data("run/guest/ib_send_lat-65536.txt");
    let r = parse_perftest(&IB_SEND_LAT, &t, &p).unwrap();
    assert!(r.rows.is_empty());
    assert_eq!(r.unusable.iter().copied().collect::<Vec<_>>(), vec![65536]);
}

#[test]
fn ib_send_lat_all_sizes() {
    let (p, t) = data("samples/ib_send_lat-a.txt");
    let r = parse_perftest(&IB_SEND_LAT, &t, &p).unwrap();
    let failed: Vec<u64> = r.unusable.iter().copied().collect();
    assert_eq!(failed, vec![4, 8, 16, 32768, 1 << 20]);
    assert_eq!(r.rows.len(), 23 - failed.len());
    assert_eq!(r.rows[&2]["t_typical"], 52.46);
    assert_eq!(r.rows[&4096]["t_typical"], 244.42);
    // perftest overflows t_stdev for 8 MiB; the timings themselves are fine.
    let big = &r.rows[&(8 << 20)];
    assert!(big["t_stdev"].is_nan());
    assert_eq!(big["t_typical"], 410025.31);
}

#[test]
fn ib_read_bw() {
    let (p, t) = data("run/guest/ib_read_bw-1048576.txt");
    let r = parse_perftest(&IB_READ_BW, &t, &p).unwrap();
    let row = &r.rows[&(1 << 20)];
    assert_eq!(row["#iterations"], 20.0);
    assert_eq!(row["BW peak[MB/sec]"], 22.21);
    assert_eq!(row["BW average[MB/sec]"], 20.53);
    assert_eq!(row["MsgRate[Mpps]"], 0.000021);
    // A truncated row is an error naming the file and the line.
    let cut = t.replace("20.53  \t\t   0.000021", "20.53");
    let e = parse_perftest(&IB_READ_BW, &cut, &p)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("ib_read_bw-1048576.txt:25: data row has 4 fields"),
        "{e}"
    );
    let (p, t) = data("run/guest/ib_read_bw-65536.txt");
    assert_eq!(
        parse_perftest(&IB_READ_BW, &t, &p).unwrap().rows[&65536]["BW average[MB/sec]"],
        27.66
    );
}

#[test]
fn qperf_rc_lat() {
    let (p, t) = data("run/guest/qperf-rc_lat.txt");
    let r = parse_qperf(&t, &p, "rc_lat", QperfKind::Latency).unwrap();
    let sizes: Vec<u64> = r.rows.keys().copied().collect();
    assert_eq!(sizes, vec![1, 4, 16, 64, 256, 1024, 4096, 16384, 65536]);
    assert_eq!(r.rows[&1], 448.0);
    assert_eq!(r.rows[&4096], 461.0);
    assert_eq!(r.rows[&16384], 1160.0);
    assert_eq!(r.rows[&65536], 3400.0);
}

#[test]
fn qperf_rc_bw_is_si() {
    let (p, t) = data("run/guest/qperf-rc_bw.txt");
    let r = parse_qperf(&t, &p, "rc_bw", QperfKind::Bandwidth).unwrap();
    assert_eq!(r.rows[&1024], 5.8e6);
    assert_eq!(r.rows[&32768], 17e6);
    assert_eq!(r.rows[&(1 << 20)], 16.8e6);
}

#[test]
fn qperf_zero_bandwidth_is_missing() {
    let (p, t) = data("run/guest/qperf-rc_rdma_read_bw.txt");
    let r = parse_qperf(&t, &p, "rc_rdma_read_bw", QperfKind::Bandwidth).unwrap();
    assert!(r.rows.is_empty());
    assert_eq!(
        r.unusable.iter().copied().collect::<Vec<_>>(),
        vec![65536, 1 << 20]
    );
}

#[test]
fn qperf_without_vu_is_an_error_naming_file_and_line() {
    let (p, t) = data("samples/qperf-no-vu.txt");
    let e = parse_qperf(&t, &p, "rc_lat", QperfKind::Latency)
        .unwrap_err()
        .to_string();
    assert!(e.contains("samples/qperf-no-vu.txt:1: "), "{e}");
    assert!(e.contains("msg_size"), "{e}");
}

#[test]
fn ucx_perftest_final_lines() {
    let (p, t) = data("run/host/ucx-tag_lat-8.txt");
    let f = parse_ucx(&t, &p).unwrap().unwrap();
    assert_eq!(f["iterations"], 1000.0);
    assert_eq!(f["typical latency"], 10.976);
    assert_eq!(f["average latency"], 13.512);
    assert_eq!(f["overall message rate"], 74008.0);
    let (p, t) = data("samples/ucx-tag_bw-1048576.txt");
    let f = parse_ucx(&t, &p).unwrap().unwrap();
    assert_eq!(f["iterations"], 2000.0);
    assert_eq!(f["overall bandwidth"], 2220.38);
    assert_eq!(f["average message rate"], 2220.0);
}

#[test]
fn socket_pingpong_outputs_use_the_pingpong_schema() {
    for (rel, mode) in [
        ("run/host/socket-lat.json", "latency"),
        ("run/host/socket-bw.json", "bandwidth"),
    ] {
        let (p, t) = data(rel);
        let d = PingpongDoc::from_json(&t, &p).unwrap();
        assert_eq!(d.tool, "socket-pingpong");
        assert_eq!(d.transport, "tcp");
        assert_eq!(d.mode, mode);
        assert_eq!(
            (d.eager_threshold, d.eager_limit, d.device.as_deref()),
            (None, None, None)
        );
        assert!(d.results.iter().all(|r| r.protocol == "stream"));
    }
}
