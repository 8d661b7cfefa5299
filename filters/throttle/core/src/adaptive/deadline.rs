//! A request's own deadline, from the headers its client or the next hop
//! set: `x-envoy-expected-rq-timeout-ms` (Envoy's, milliseconds) and
//! `grpc-timeout` (gRPC's: up to 8 digits and a unit, `H`, `M`, `S`, `m`,
//! `u` or `n`). The shorter one counts; a malformed value counts as none.

use crate::clock::{NS_PER_MS, NS_PER_S};

/// The deadline in ns from the two headers' raw values (None: neither, or
/// neither valid).
pub fn deadline_ns(expected_ms: Option<&[u8]>, grpc_timeout: Option<&[u8]>) -> Option<u64> {
    let envoy = expected_ms.and_then(|v| {
        let s = std::str::from_utf8(v).ok()?.trim();
        let ms: u64 = s.parse().ok()?;
        Some(ms.saturating_mul(NS_PER_MS))
    });
    let grpc = grpc_timeout.and_then(grpc_ns);
    match (envoy, grpc) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn grpc_ns(v: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(v).ok()?.trim();
    let (digits, unit) = s.split_at(s.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    let per = match unit {
        "H" => 3600 * NS_PER_S,
        "M" => 60 * NS_PER_S,
        "S" => NS_PER_S,
        "m" => NS_PER_MS,
        "u" => 1_000,
        "n" => 1,
        _ => return None,
    };
    Some(n.saturating_mul(per))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shorter_valid_deadline_counts() {
        let ms = NS_PER_MS;
        let cases: &[(Option<&str>, Option<&str>, Option<u64>)] = &[
            (None, None, None),
            (Some("1500"), None, Some(1500 * ms)),
            (Some(" 250 "), None, Some(250 * ms)),
            (None, Some("2S"), Some(2 * NS_PER_S)),
            (None, Some("100m"), Some(100 * ms)),
            (None, Some("1H"), Some(3600 * NS_PER_S)),
            (None, Some("5000u"), Some(5 * ms)),
            (None, Some("7n"), Some(7)),
            (Some("1500"), Some("1S"), Some(NS_PER_S)),
            (Some("500"), Some("1S"), Some(500 * ms)),
            (Some("soon"), Some("1S"), Some(NS_PER_S)),
            (None, Some("123456789S"), None),
            (None, Some("10x"), None),
            (None, Some("S"), None),
            (None, Some(""), None),
            (Some("-5"), None, None),
        ];
        for (envoy, grpc, want) in cases {
            assert_eq!(
                deadline_ns(envoy.map(str::as_bytes), grpc.map(str::as_bytes)),
                *want,
                "{envoy:?} {grpc:?}"
            );
        }
    }
}
