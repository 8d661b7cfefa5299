//! Per-key rules: where a key comes from, and which slots of the rule's fixed
//! key table it may use.
//!
//! Memory stays bounded whatever keys clients send: a rule has `key_slots`
//! shared-data cells. A key's fingerprint is a SipHash of its value under a
//! secret per-process seed (so clients cannot aim collisions at someone
//! else's slots), and picks two candidate slots. The key uses the candidate
//! that already holds its fingerprint; else one whose schedule lies in the past
//! (taking it over loses nothing: such a schedule is the same as a fresh one);
//! else, when both candidates belong to other active keys, it shares the first
//! one's schedule: a collision can only make keys share a rate.

use siphasher::sip::SipHasher13;
use std::hash::Hasher;

use crate::matcher::{Facts, Request};

/// Where the key of a per-key rule comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// A request header's value (name lower case); several lines joined with `,`.
    Header(String),
    /// The downstream remote address as Envoy trusts it, without port.
    SourceAddress,
    /// The peer's mTLS identity (first URI SAN of its certificate).
    Principal,
    /// The normalised request path.
    Path,
    /// The request's host: lower case, without port and trailing dot.
    Authority,
}

impl KeySource {
    /// The key value of a request; None: no value (the rule's unkeyed schedule applies).
    pub fn extract<R: Request>(&self, req: &mut Facts<R>) -> Option<Vec<u8>> {
        let v = match self {
            KeySource::Header(name) => req.raw().header(name),
            KeySource::SourceAddress => req
                .raw()
                .source_address()
                .map(|a| strip_port(&a).as_bytes().to_vec()),
            KeySource::Principal => req.raw().principal().map(String::into_bytes),
            KeySource::Path => req.path().map(|p| p.as_bytes().to_vec()),
            KeySource::Authority => req.authority().map(|(host, _)| host.into_bytes()),
        };
        v.filter(|v| !v.is_empty())
    }

    /// For the log: `header x-user-id`, `source address`, ...
    pub fn describe(&self) -> String {
        match self {
            KeySource::Header(h) => format!("header {h}"),
            KeySource::SourceAddress => "source address".into(),
            KeySource::Principal => "source principal".into(),
            KeySource::Path => "path".into(),
            KeySource::Authority => "authority".into(),
        }
    }
}

/// The address part of `ip:port`, `[v6]:port`, or a bare address.
pub fn strip_port(addr: &str) -> &str {
    if let Some(rest) = addr.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match addr.rsplit_once(':') {
        // One colon: IPv4 (or name) with port. More: a bare IPv6 address.
        Some((host, port)) if !host.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            host
        }
        _ => addr,
    }
}

/// The secret-seeded hash of key values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyHasher {
    k0: u64,
    k1: u64,
}

impl KeyHasher {
    /// A hasher with this 128-bit seed.
    pub fn new(seed: (u64, u64)) -> Self {
        KeyHasher {
            k0: seed.0,
            k1: seed.1,
        }
    }

    /// The fingerprint of a key value within a rule (never 0: 0 marks an
    /// unkeyed cell).
    pub fn fingerprint(&self, rule: &str, value: &[u8]) -> u64 {
        let mut h = SipHasher13::new_with_keys(self.k0, self.k1);
        h.write(rule.as_bytes());
        h.write_u8(0xff);
        h.write(value);
        h.finish().max(1)
    }
}

/// The two candidate slots of a fingerprint in a table of `slots` cells
/// (equal when the table has one cell).
pub fn candidate_slots(fingerprint: u64, slots: u32) -> (u32, u32) {
    let n = u64::from(slots.max(1));
    let a = fingerprint % n;
    let b = (fingerprint >> 32 ^ fingerprint.rotate_left(17)) % n;
    // Keep the two candidates distinct when there is room.
    let b = if b == a && n > 1 { (a + 1) % n } else { b };
    (a as u32, b as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matcher::FakeRequest;

    #[test]
    fn ports_are_stripped() {
        assert_eq!(strip_port("10.1.2.3:5678"), "10.1.2.3");
        assert_eq!(strip_port("[::1]:80"), "::1");
        assert_eq!(strip_port("[2001:db8::1]:443"), "2001:db8::1");
        assert_eq!(strip_port("2001:db8::1"), "2001:db8::1");
        assert_eq!(strip_port("10.1.2.3"), "10.1.2.3");
    }

    #[test]
    fn key_values() {
        let mut r = Facts::new(FakeRequest {
            path: Some("//a/./b?x=1".into()),
            authority: Some("Shop.Example.:8080".into()),
            headers: vec![
                ("x-user-id".into(), b"u42".to_vec()),
                ("x-empty".into(), vec![]),
                ("x-two".into(), b"a".to_vec()),
                ("x-two".into(), b"b".to_vec()),
            ],
            source: Some("192.0.2.7:40000".into()),
            principal: Some("spiffe://cluster.local/ns/default/sa/client".into()),
            ..Default::default()
        });
        assert_eq!(
            KeySource::Header("x-user-id".into()).extract(&mut r),
            Some(b"u42".to_vec())
        );
        assert_eq!(KeySource::Header("x-none".into()).extract(&mut r), None);
        assert_eq!(
            KeySource::Header("x-empty".into()).extract(&mut r),
            None,
            "empty is no value"
        );
        assert_eq!(
            KeySource::Header("x-two".into()).extract(&mut r),
            Some(b"a,b".to_vec()),
            "every line counts"
        );
        assert_eq!(
            KeySource::SourceAddress.extract(&mut r),
            Some(b"192.0.2.7".to_vec())
        );
        assert_eq!(
            KeySource::Principal.extract(&mut r),
            Some(b"spiffe://cluster.local/ns/default/sa/client".to_vec())
        );
        assert_eq!(KeySource::Path.extract(&mut r), Some(b"/a/b".to_vec()));
        assert_eq!(
            KeySource::Authority.extract(&mut r),
            Some(b"shop.example".to_vec())
        );
    }

    #[test]
    fn equivalent_paths_and_hosts_are_one_key() {
        let key = |path: &str, host: &str, k: &KeySource| {
            let mut r = Facts::new(FakeRequest {
                path: Some(path.into()),
                authority: Some(host.into()),
                ..Default::default()
            });
            k.extract(&mut r)
        };
        let p = KeySource::Path;
        assert_eq!(key("/path/x", "h", &p), key("/path/%78", "h", &p));
        assert_eq!(
            key("/path/x", "h", &p),
            key("/path//x/", "h", &p).map(|mut v| {
                v.pop();
                v
            })
        );
        let a = KeySource::Authority;
        assert_eq!(key("/", "h1", &a), key("/", "h1:19003", &a));
        assert_eq!(key("/", "h1", &a), key("/", "H1.", &a));
    }

    #[test]
    fn fingerprints_depend_on_seed_rule_and_value() {
        let h = KeyHasher::new((1, 2));
        assert_eq!(h.fingerprint("r", b"a"), h.fingerprint("r", b"a"));
        assert_ne!(h.fingerprint("r", b"a"), h.fingerprint("r", b"b"));
        assert_ne!(h.fingerprint("r", b"a"), h.fingerprint("s", b"a"));
        assert_ne!(
            h.fingerprint("r", b"a"),
            KeyHasher::new((3, 4)).fingerprint("r", b"a")
        );
        // The rule/value boundary is unambiguous.
        assert_ne!(h.fingerprint("ab", b"c"), h.fingerprint("a", b"bc"));
    }

    #[test]
    fn candidate_slots_are_in_range_and_distinct() {
        let h = KeyHasher::new((7, 9));
        for i in 0..10_000u32 {
            let fp = h.fingerprint("r", &i.to_le_bytes());
            let (a, b) = candidate_slots(fp, 100);
            assert!(a < 100 && b < 100 && a != b);
        }
        assert_eq!(candidate_slots(12345, 1), (0, 0));
    }

    #[test]
    fn candidate_slots_spread_evenly() {
        let h = KeyHasher::new((11, 13));
        let mut counts = [0u32; 64];
        for i in 0..64_000u32 {
            let (a, _) = candidate_slots(h.fingerprint("r", &i.to_le_bytes()), 64);
            counts[a as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (800..1200).contains(&c)),
            "{counts:?}"
        );
    }
}
