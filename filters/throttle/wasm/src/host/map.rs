//! The proxy-wasm ABI's encoding of a header map (used for local replies):
//! a little-endian u32 count, then (name length, value length) u32 pairs,
//! then each name and value followed by a NUL byte.

/// Encodes header pairs in the proxy-wasm map format.
pub fn serialize_pairs(pairs: &[(&str, &str)]) -> Vec<u8> {
    let size = 4 + pairs
        .iter()
        .map(|(n, v)| 10 + n.len() + v.len())
        .sum::<usize>();
    let mut out = Vec::with_capacity(size);
    let len32 = |n: usize| u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes();
    out.extend_from_slice(&len32(pairs.len()));
    for (n, v) in pairs {
        out.extend_from_slice(&len32(n.len()));
        out.extend_from_slice(&len32(v.len()));
    }
    for (n, v) in pairs {
        out.extend_from_slice(n.as_bytes());
        out.push(0);
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn layout() {
        let b = super::serialize_pairs(&[("retry-after", "2"), ("a", "")]);
        let mut want = vec![2, 0, 0, 0, 11, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0];
        want.extend_from_slice(b"retry-after\x002\x00a\x00\x00");
        assert_eq!(b, want);
        assert_eq!(super::serialize_pairs(&[]), vec![0, 0, 0, 0]);
    }
}
