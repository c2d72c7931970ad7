//! Byte counts as settings write them: `1048576`, `512K`, `64M`, `2G`, `64MiB`.
use crate::error::{Error, Result};

/// Parse `1048576`, `512K`, `64M`, `2G` (binary units; `64MiB`, `64MB` and `4096B` are read the
/// same) into bytes.
pub fn parse_bytes(s: &str) -> Result<usize> {
    let t = s.trim();
    let upper = t.to_ascii_uppercase();
    let t = &t[..upper
        .strip_suffix("IB")
        .or_else(|| upper.strip_suffix('B'))
        .unwrap_or(&upper)
        .len()];
    let (num, mult) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1usize << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    num.trim()
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| {
            Error::invalid(
                "parse_bytes",
                format!("'{s}' is not a byte count (e.g. 4096, 512K, 64M, 2G, 64MiB)"),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn byte_counts_with_units() {
        assert_eq!(parse_bytes("1024").unwrap(), 1024);
        assert_eq!(parse_bytes("2k").unwrap(), 2048);
        assert_eq!(parse_bytes(" 64M ").unwrap(), 64 << 20);
        assert_eq!(parse_bytes("1G").unwrap(), 1 << 30);
        assert_eq!(parse_bytes("8MiB").unwrap(), 8 << 20);
        assert_eq!(parse_bytes("8mb").unwrap(), 8 << 20);
        assert_eq!(parse_bytes("4096B").unwrap(), 4096);
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("MiB").is_err());
        assert!(parse_bytes("").is_err());
    }
}
