//! The size-list syntax every benchmark tool of rdmx shares (`pingpong -s`, `rdmx-bench
//! socket-pingpong --sizes`, `rdmx-bench sizes`, the file names of a run directory), and the
//! way sizes are printed.

/// Largest message size any tool accepts (1 GiB).
pub const MAX_SIZE: u64 = 1 << 30;

/// Parses one byte count: digits with an optional 1024-based suffix (`K`, `KiB`, `KB`, `M`,
/// `MiB`, `MB`, `G`, `GiB`, `GB`, any case) or a trailing `B`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    if num.is_empty() {
        return Err(format!("`{s}` is not a size (expected e.g. 64, 4K, 1MiB)"));
    }
    let shift = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" | "kb" => 10,
        "m" | "mib" | "mb" => 20,
        "g" | "gib" | "gb" => 30,
        other => {
            return Err(format!(
                "`{s}`: unknown size suffix `{other}` (use K, KiB, M, MiB, G or GiB)"
            ))
        }
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .ok_or_else(|| format!("`{s}`: number too large"))
}

/// Parses a size list: comma-separated items, each a byte count ([`parse_size`]) or a range
/// `MIN:MAX`: MIN, its doublings below MAX, then MAX (for power-of-two bounds, e.g. the
/// default `1:16M`, exactly the powers of two from MIN to MAX; `3:20` is 3, 6, 12, 20 and
/// `0:4` is 0, 1, 2, 4). Sizes are at most [`MAX_SIZE`]; the result keeps the order given, without
/// duplicates.
pub fn parse_sizes(list: &str) -> Result<Vec<u64>, String> {
    let mut out = Vec::new();
    let mut push = |v: u64| {
        if v > MAX_SIZE {
            return Err(format!(
                "message size {v} is larger than the limit of 1 GiB"
            ));
        }
        if !out.contains(&v) {
            out.push(v);
        }
        Ok(())
    };
    for item in list.split(',') {
        if item.trim().is_empty() {
            return Err(format!("empty item in size list `{list}`"));
        }
        let Some((lo, hi)) = item.split_once(':') else {
            push(parse_size(item)?)?;
            continue;
        };
        let (lo, hi) = (parse_size(lo)?, parse_size(hi)?);
        if lo > hi {
            return Err(format!("range `{item}`: MIN is larger than MAX"));
        }
        push(lo)?;
        let mut p = lo.max(1);
        while p < hi {
            if p > lo {
                push(p)?;
            }
            p *= 2;
        }
        push(hi)?;
    }
    Ok(out)
}

/// Formats a byte count exactly: `16 MiB`, `4 KiB`, `8152 B`.
pub fn format_size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_sizes() {
        for (s, v) in [
            ("64", 64),
            ("4K", 4096),
            ("4k", 4096),
            ("4KiB", 4096),
            ("8KB", 8192),
        ] {
            assert_eq!(parse_size(s), Ok(v), "{s}");
        }
        assert_eq!(parse_size("16M"), Ok(16 << 20));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size(" 8 "), Ok(8));
        for bad in ["", "K", "-1", "99999999999999999999", "99999999999999G"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        assert!(parse_size("4X")
            .unwrap_err()
            .contains("unknown size suffix `x`"));
        assert!(parse_size("x").unwrap_err().contains("`x` is not a size"));
    }

    #[test]
    fn lists_and_ranges() {
        assert_eq!(parse_sizes("1:16").unwrap(), vec![1, 2, 4, 8, 16]);
        assert_eq!(parse_sizes("3:20").unwrap(), vec![3, 6, 12, 20]);
        assert_eq!(parse_sizes("0:4").unwrap(), vec![0, 1, 2, 4]);
        assert_eq!(parse_sizes("256:256K").unwrap().len(), 11);
        assert_eq!(parse_sizes("8:8").unwrap(), vec![8]);
        let full = parse_sizes("1:16M").unwrap();
        assert_eq!((full.len(), full[24]), (25, 16 << 20));
        assert_eq!(parse_sizes("8,1K,8").unwrap(), vec![8, 1024]);
        assert_eq!(parse_sizes("1,4K:16K").unwrap(), vec![1, 4096, 8192, 16384]);
        assert_eq!(parse_sizes("1:4,100K").unwrap(), vec![1, 2, 4, 100 << 10]);
        for bad in ["", "1,,2", "16:1", "2G", "1:2G", "1:x", "a", "1:2:3"] {
            assert!(parse_sizes(bad).is_err(), "{bad} should fail");
        }
    }

    #[test]
    fn formatting() {
        assert_eq!(format_size(1), "1 B");
        assert_eq!(format_size(8152), "8152 B");
        assert_eq!(format_size(1024), "1 KiB");
        assert_eq!(format_size(1536), "1536 B");
        assert_eq!(format_size(16 << 20), "16 MiB");
        assert_eq!(format_size(1 << 30), "1 GiB");
    }
}
