//! `RDMX_EAGER_THRESHOLD` parsing and config validation.

use rdmx_proto::config::{ConfigBuilder, DEFAULT_EAGER_THRESHOLD, MAX_EAGER_THRESHOLD};
use rdmx_proto::{Config, Error};

fn threshold(v: Option<&str>) -> Result<u64, Error> {
    let v = v.map(str::to_string);
    ConfigBuilder::from_lookup(|name| {
        assert_eq!(name, "RDMX_EAGER_THRESHOLD");
        v.clone()
    })?
    .build()
    .map(|c| c.eager_threshold)
}

#[test]
fn parses_sizes_and_suffixes() {
    assert_eq!(threshold(None).unwrap(), DEFAULT_EAGER_THRESHOLD);
    assert_eq!(DEFAULT_EAGER_THRESHOLD, 8152);
    for (s, v) in [
        ("0", 0),
        ("1", 1),
        ("4096", 4096),
        (" 8k ", 8192),
        ("8K", 8192),
        ("8KiB", 8192),
        ("1m", 1 << 20),
        ("1M", 1 << 20),
        ("1MiB", 1 << 20),
        ("1048576", 1 << 20),
    ] {
        assert_eq!(threshold(Some(s)).unwrap(), v, "{s}");
    }
}

#[test]
fn rejects_invalid_values_naming_var_and_range() {
    for s in [
        "",
        "abc",
        "-1",
        "1.5k",
        "8kb",
        "8 KiB",
        "2M",
        "1048577",
        "99999999999999999999",
        "1025k",
    ] {
        let e = threshold(Some(s)).unwrap_err();
        match &e {
            Error::InvalidConfig {
                var,
                value,
                min,
                max,
                ..
            } => {
                assert_eq!(*var, "RDMX_EAGER_THRESHOLD");
                assert_eq!(value, s);
                assert_eq!((*min, *max), (0, MAX_EAGER_THRESHOLD));
            }
            other => panic!("{other:?}"),
        }
        let msg = e.to_string();
        assert!(msg.contains("RDMX_EAGER_THRESHOLD"), "{msg}");
        assert!(msg.contains("0..=1048576"), "{msg}");
    }
}

#[test]
fn programmatic_override_wins() {
    let b = ConfigBuilder::from_lookup(|_| Some("4k".into())).unwrap();
    assert_eq!(b.clone().build().unwrap().eager_threshold, 4096);
    assert_eq!(b.eager_threshold(100).build().unwrap().eager_threshold, 100);
    assert!(Config::builder()
        .eager_threshold(MAX_EAGER_THRESHOLD + 1)
        .build()
        .is_err());
    assert!(Config::builder().credits(3).build().is_err());
    assert!(Config::builder().recv_buf_size(63).build().is_err());
    assert!(Config::builder().rndv_chunk_size(0).build().is_err());
    assert!(Config::builder().srq_depth(10).credits(11).build().is_err());
    assert_eq!(Config::builder().build().unwrap(), Config::default());
}

#[test]
fn counts_are_not_described_as_byte_sizes() {
    let none = || ConfigBuilder::from_lookup(|_| None).unwrap();
    let e = none().credits(64).srq_depth(16).build().unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("srq_depth") && msg.contains("64..=") && msg.contains("a whole number"),
        "{msg}"
    );
    assert!(!msg.contains("bytes") && !msg.contains("KiB"), "{msg}");
    let e = none().recv_buf_size(1).build().unwrap_err();
    assert!(e.to_string().contains("bytes"), "{e}");
}
