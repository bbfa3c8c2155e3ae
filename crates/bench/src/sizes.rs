//! Message sizes: parsing `--sizes` lists and formatting byte counts.

/// Largest message size socket-pingpong accepts (1 GiB).
pub const MAX_SIZE: u64 = 1 << 30;

/// Parses one byte count: digits with an optional 1024-based suffix `K`, `KiB`, `M`, `MiB`,
/// `G`, `GiB` (case-insensitive), or a trailing `B`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits_end);
    if num.is_empty() {
        return Err(format!(
            "`{s}` is not a byte count (expected e.g. 64, 4K, 1MiB)"
        ));
    }
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{s}`: number too large"))?;
    let mult: u64 = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        other => {
            return Err(format!(
                "`{s}`: unknown size suffix `{other}` (use K, KiB, M, MiB, G or GiB)"
            ))
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("`{s}`: number too large"))
}

/// Parses a `--sizes` list: comma-separated items, each a byte count ([`parse_size`]) or a
/// range `MIN:MAX`: MIN, its doublings below MAX, then MAX — for power-of-two bounds (the
/// usual case, e.g. the default `1:16M`) exactly the powers of two from MIN to MAX. This is
/// the same rule as rdmx's `examples/pingpong` and `scripts/bench` use, so every tool of a
/// run measures the same sizes. Sizes must be positive and at most [`MAX_SIZE`]; the result
/// is in the order given, without duplicates.
pub fn parse_sizes(list: &str) -> Result<Vec<u64>, String> {
    let mut out = Vec::new();
    for item in list.split(',') {
        let item = item.trim();
        if item.is_empty() {
            return Err(format!("empty item in size list `{list}`"));
        }
        let mut push = |v: u64| {
            if !out.contains(&v) {
                out.push(v);
            }
        };
        if let Some((lo, hi)) = item.split_once(':') {
            let lo = parse_size(lo)?;
            let hi = parse_size(hi)?;
            check_size(lo)?;
            check_size(hi)?;
            if lo > hi {
                return Err(format!("range `{item}`: MIN is larger than MAX"));
            }
            let mut p = lo;
            while p < hi {
                push(p);
                p *= 2;
            }
            push(hi);
        } else {
            let v = parse_size(item)?;
            check_size(v)?;
            push(v);
        }
    }
    Ok(out)
}

fn check_size(v: u64) -> Result<(), String> {
    if v == 0 {
        Err("message size 0 is not allowed".into())
    } else if v > MAX_SIZE {
        Err(format!(
            "message size {v} is larger than the limit of 1 GiB"
        ))
    } else {
        Ok(())
    }
}

/// Formats a byte count exactly: `16 MiB`, `4 KiB`, `8152 B`.
pub fn format_size(bytes: u64) -> String {
    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    if bytes >= GIB && bytes % GIB == 0 {
        format!("{} GiB", bytes / GIB)
    } else if bytes >= MIB && bytes % MIB == 0 {
        format!("{} MiB", bytes / MIB)
    } else if bytes >= KIB && bytes % KIB == 0 {
        format!("{} KiB", bytes / KIB)
    } else {
        format!("{bytes} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_sizes() {
        assert_eq!(parse_size("64"), Ok(64));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("16M"), Ok(16 << 20));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert_eq!(parse_size(" 8 "), Ok(8));
        assert!(parse_size("").is_err());
        assert!(parse_size("K").is_err());
        assert!(parse_size("4X").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999999999999").is_err());
        assert!(parse_size("99999999999999G").is_err());
    }

    #[test]
    fn lists_and_ranges() {
        assert_eq!(parse_sizes("1:16").unwrap(), vec![1, 2, 4, 8, 16]);
        assert_eq!(parse_sizes("3:20").unwrap(), vec![3, 6, 12, 20]);
        assert_eq!(parse_sizes("256:256K").unwrap().len(), 11);
        assert_eq!(parse_sizes("8:8").unwrap(), vec![8]);
        let full = parse_sizes("1:16M").unwrap();
        assert_eq!(full.len(), 25);
        assert_eq!(*full.last().unwrap(), 16 << 20);
        assert_eq!(parse_sizes("8,1K,8").unwrap(), vec![8, 1024]);
        assert_eq!(parse_sizes("1,4K:16K").unwrap(), vec![1, 4096, 8192, 16384]);
        for bad in ["", "1,,2", "0", "0:8", "16:1", "2G", "1:2G", "1:x", "a"] {
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
