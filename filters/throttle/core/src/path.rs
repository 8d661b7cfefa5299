//! What rules see of a request's path and host: one spelling for every
//! equivalent one, whatever the connection manager's own normalisation, so a
//! client cannot escape a path rule (or make a fresh path key) by spelling
//! the same resource differently.
//!
//! [`normalize_path`] takes the `:path` up to its query (`?`) or fragment
//! (`#`), then
//! * decodes percent-encoded unreserved characters (`%61` → `a`, `%2E` → `.`)
//!   and upper-cases the hex digits of every other escape (`%2f` is decoded,
//!   see below; `%3f` → `%3F`);
//! * treats `%2F`, `%5C` and `\` as `/` (as Istio's strictest
//!   `DECODE_AND_MERGE_SLASHES`: a backend that decodes them sees a slash);
//! * merges repeated slashes;
//! * removes dot segments (`.` and `..`, RFC 3986 section 5.2.4), keeping a
//!   trailing slash.
//!
//! Decoding is one level deep (`%2561` becomes `%61`, not `a`), as HTTP
//! servers decode once.
//!
//! [`normalize_host`] lower-cases an authority and drops a trailing dot; the
//! port is split off separately ([`split_port`]).

/// Whether `b` is an unreserved character (RFC 3986 section 2.3).
fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// The path part of a raw `:path` (before `?` or `#`).
pub fn strip_query(raw: &[u8]) -> &[u8] {
    match raw.iter().position(|&b| b == b'?' || b == b'#') {
        Some(i) => raw.get(..i).unwrap_or(raw),
        None => raw,
    }
}

/// One level of percent-decoding of unreserved characters and slashes; other
/// escapes are kept with upper-case hex digits; `\` becomes `/`.
fn decode(path: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(path.len());
    let mut i = 0;
    while let Some(&b) = path.get(i) {
        if b == b'%' {
            if let (Some(h), Some(l)) = (
                path.get(i + 1).copied().and_then(hex),
                path.get(i + 2).copied().and_then(hex),
            ) {
                let v = h * 16 + l;
                if unreserved(v) || v == b'/' || v == b'\\' {
                    out.push(if v == b'\\' { b'/' } else { v });
                } else {
                    out.push(b'%');
                    out.extend_from_slice(&[
                        path.get(i + 1)
                            .copied()
                            .unwrap_or(b'0')
                            .to_ascii_uppercase(),
                        path.get(i + 2)
                            .copied()
                            .unwrap_or(b'0')
                            .to_ascii_uppercase(),
                    ]);
                }
                i += 3;
                continue;
            }
        }
        out.push(if b == b'\\' { b'/' } else { b });
        i += 1;
    }
    out
}

/// The normalised path of a raw `:path` value (see the module docs). A path
/// that does not start with `/` (`*`, or an authority for CONNECT) is only
/// decoded.
pub fn normalize_path(raw: &[u8]) -> String {
    let decoded = decode(strip_query(raw));
    if decoded.first() != Some(&b'/') {
        return lossy(decoded);
    }
    let mut segments: Vec<&[u8]> = Vec::new();
    let mut trailing = false;
    for seg in decoded.split(|&b| b == b'/').skip(1) {
        trailing = false;
        match seg {
            b"" => trailing = true,
            b"." => trailing = true,
            b".." => {
                segments.pop();
                trailing = true;
            }
            s => segments.push(s),
        }
    }
    let mut out = Vec::with_capacity(decoded.len());
    for s in &segments {
        out.push(b'/');
        out.extend_from_slice(s);
    }
    if trailing || segments.is_empty() {
        out.push(b'/');
    }
    lossy(out)
}

fn lossy(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// An authority's host and port: `h1:8080` → (`h1`, Some(`8080`)),
/// `[::1]:80` → (`[::1]`, Some(`80`)), `h1` → (`h1`, None).
pub fn split_port(authority: &str) -> (&str, Option<&str>) {
    if authority.starts_with('[') {
        return match authority.find(']') {
            Some(end) => {
                let (host, rest) = authority.split_at(end + 1);
                (host, rest.strip_prefix(':'))
            }
            None => (authority, None),
        };
    }
    match authority.rsplit_once(':') {
        Some((host, port))
            if !host.contains(':')
                && !port.is_empty()
                && port.bytes().all(|b| b.is_ascii_digit()) =>
        {
            (host, Some(port))
        }
        _ => (authority, None),
    }
}

/// A host name as rules see it: lower case, without a trailing dot
/// (`Example.COM.` → `example.com`).
pub fn normalize_host(host: &str) -> String {
    let h = host.strip_suffix('.').unwrap_or(host);
    h.to_ascii_lowercase()
}

/// An authority as rules see it: the normalised host and the port, if any.
pub fn normalize_authority(authority: &str) -> (String, Option<&str>) {
    let (host, port) = split_port(authority.trim());
    (normalize_host(host), port)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(p: &str) -> String {
        normalize_path(p.as_bytes())
    }

    #[test]
    fn equivalent_spellings_are_one_path() {
        for p in [
            "/admin",
            "/%61dmin",
            "/%61%64%6D%69%6E",
            "//admin",
            "///admin",
            "/./admin",
            "/x/../admin",
            "/x/%2e%2e/admin",
            "/%2Fadmin",
            "/%5cadmin",
            "/\\admin",
            "/admin?x=1",
            "/admin#frag",
            "/../admin",
        ] {
            assert_eq!(n(p), "/admin", "{p}");
        }
    }

    #[test]
    fn trailing_slashes_and_roots() {
        assert_eq!(n("/admin/"), "/admin/");
        assert_eq!(n("/admin/."), "/admin/");
        assert_eq!(n("/admin/x/.."), "/admin/");
        assert_eq!(n("/admin//"), "/admin/");
        assert_eq!(n("/"), "/");
        assert_eq!(n("//"), "/");
        assert_eq!(n("/.."), "/");
        assert_eq!(n(""), "");
        assert_eq!(n("*"), "*");
    }

    #[test]
    fn other_escapes_are_kept_with_upper_case_hex() {
        assert_eq!(n("/a%3fb"), "/a%3Fb");
        assert_eq!(n("/a%20b"), "/a%20b");
        assert_eq!(n("/a%zzb"), "/a%zzb");
        assert_eq!(n("/a%2"), "/a%2");
        assert_eq!(n("/%2561"), "/%2561", "one level only");
        assert_eq!(n("/path/%78"), "/path/x");
        assert_eq!(n("/A/B"), "/A/B", "case is kept");
    }

    #[test]
    fn non_utf8_bytes_never_fail() {
        assert_eq!(normalize_path(b"/a\xffb"), "/a\u{fffd}b");
        assert_eq!(normalize_path(b"/a%ffb"), "/a%FFb");
    }

    #[test]
    fn hosts_and_ports() {
        assert_eq!(split_port("h1:19003"), ("h1", Some("19003")));
        assert_eq!(split_port("h1"), ("h1", None));
        assert_eq!(split_port("[::1]:80"), ("[::1]", Some("80")));
        assert_eq!(split_port("[::1]"), ("[::1]", None));
        assert_eq!(split_port("h1:"), ("h1:", None));
        assert_eq!(
            normalize_authority("Example.COM.:8080"),
            ("example.com".into(), Some("8080"))
        );
        assert_eq!(normalize_authority("h1."), ("h1".into(), None));
    }
}
