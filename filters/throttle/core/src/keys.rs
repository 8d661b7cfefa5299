//! Per-key rules: where a key comes from, and where in the rule's fixed key
//! table its schedule lives.
//!
//! Memory stays bounded whatever keys clients send: a rule's table holds
//! `key_slots` entries (`[fingerprint, tat]`), in buckets of [`WAYS`]
//! entries, one shared-data value per bucket. A key's fingerprint is a
//! SipHash of its value under a secret per-process seed (so clients cannot
//! aim collisions at someone else's entries), and picks two candidate
//! buckets. The key uses the entry that already holds its fingerprint, in
//! either bucket; else a free entry (empty, or a schedule that lies in the
//! past: taking it over loses nothing, such a schedule is the same as a
//! fresh one): in the first bucket while it keeps two free, else in the one
//! with more room ([`Bucket::place`]); else, when all 16 entries belong to
//! other active keys, it shares the schedule that ends soonest: a collision
//! can only make keys share a rate. Sixteen candidates in two reads instead
//! of two candidates in two reads: at half occupancy, a new key finds both
//! buckets full about once in 70,000 (two single slots: once in six).

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

/// Entries per bucket of a key table (fewer only if the table is smaller).
pub const WAYS: u32 = 8;

/// Where a key's schedule may live: two buckets of `ways` entries (the
/// same bucket twice when the table has only one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidates {
    pub first: u32,
    pub second: u32,
    pub ways: u32,
}

/// A table of `key_slots` entries: `ceil(key_slots / ways)` buckets of
/// `ways = min(8, key_slots)` entries. Returns `(buckets, ways)`.
pub fn table_shape(key_slots: u32) -> (u32, u32) {
    let ways = WAYS.min(key_slots.max(1));
    (key_slots.max(1).div_ceil(ways), ways)
}

/// The candidate buckets of a fingerprint in a table of `key_slots`
/// entries ([`table_shape`]).
pub fn candidates(fingerprint: u64, key_slots: u32) -> Candidates {
    let (buckets, ways) = table_shape(key_slots);
    let (first, second) = candidate_slots(fingerprint, buckets);
    Candidates {
        first,
        second,
        ways,
    }
}

/// Bytes of one entry: fingerprint and TAT, little-endian.
const ENTRY: usize = 16;
/// Bytes of a full bucket.
const BUCKET: usize = WAYS as usize * ENTRY;

/// One bucket of a key table: up to `ways` entries `[fingerprint, tat]`
/// (fingerprint 0: empty), stored as 16 little-endian bytes each. Kept as
/// its bytes: the fast path reads one entry and writes it back, with no
/// decoding of the others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    bytes: [u8; BUCKET],
    ways: usize,
}

/// Where a key that has no entry of its own goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// A free entry of the first (false) or the second (true) bucket.
    Free { second: bool, entry: usize },
    /// Every entry is another active key's: share the schedule that ends
    /// soonest (it stays stored under that key's fingerprint).
    Share { second: bool, entry: usize },
}

fn word(bytes: &[u8], at: usize) -> u64 {
    bytes
        .get(at..at + 8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

impl Bucket {
    /// A bucket of `ways` entries from its stored bytes (missing or short:
    /// empty entries).
    pub fn decode(stored: Option<&[u8]>, ways: u32) -> Bucket {
        let ways = (ways.clamp(1, WAYS)) as usize;
        let mut bytes = [0u8; BUCKET];
        if let Some(stored) = stored {
            let n = stored.len().min(ways * ENTRY) / ENTRY * ENTRY;
            if let (Some(to), Some(from)) = (bytes.get_mut(..n), stored.get(..n)) {
                to.copy_from_slice(from);
            }
        }
        Bucket { bytes, ways }
    }

    /// The bytes to store.
    pub fn encode(&self) -> &[u8] {
        self.bytes.get(..self.ways * ENTRY).unwrap_or_default()
    }

    /// The entry holding `fingerprint`'s schedule.
    pub fn find(&self, fingerprint: u64) -> Option<usize> {
        (0..self.ways).find(|i| word(&self.bytes, i * ENTRY) == fingerprint)
    }

    /// The entry `i` (`[fingerprint, tat]`).
    pub fn get(&self, i: usize) -> Option<[u64; 2]> {
        (i < self.ways).then(|| {
            [
                word(&self.bytes, i * ENTRY),
                word(&self.bytes, i * ENTRY + 8),
            ]
        })
    }

    /// Sets entry `i`.
    pub fn set(&mut self, i: usize, [fp, tat]: [u64; 2]) {
        if i < self.ways {
            if let Some(e) = self.bytes.get_mut(i * ENTRY..(i + 1) * ENTRY) {
                let (f, t) = e.split_at_mut(8);
                f.copy_from_slice(&fp.to_le_bytes());
                t.copy_from_slice(&tat.to_le_bytes());
            }
        }
    }

    fn entries(&self) -> impl Iterator<Item = [u64; 2]> + '_ {
        (0..self.ways).filter_map(|i| self.get(i))
    }

    fn is_free([fp, tat]: [u64; 2], now: u64) -> bool {
        fp == 0 || tat <= now
    }

    /// Entries free at `now`.
    pub fn free(&self, now: u64) -> usize {
        self.entries().filter(|e| Bucket::is_free(*e, now)).count()
    }

    fn first_free(&self, now: u64) -> Option<usize> {
        self.entries().position(|e| Bucket::is_free(e, now))
    }

    /// The entry whose schedule ends soonest, and when.
    fn soonest(&self) -> (usize, u64) {
        self.entries()
            .enumerate()
            .min_by_key(|(_, [_, t])| *t)
            .map_or((0, 0), |(i, [_, t])| (i, t))
    }

    /// Where a key that holds no entry in `first` nor in `second` goes at
    /// `now`: a free entry of the first bucket while it has two or more (so
    /// most keys are found with one read), else of the bucket with more
    /// room (two choices keep the buckets even); else it shares.
    pub fn place(first: &Bucket, second: Option<&Bucket>, now: u64) -> Place {
        let (fa, fb) = (first.free(now), second.map_or(0, |b| b.free(now)));
        let in_first = fa >= 2 || (fa > 0 && fa >= fb);
        match (in_first, second) {
            (true, _) | (false, None) => {
                if let Some(entry) = first.first_free(now) {
                    return Place::Free {
                        second: false,
                        entry,
                    };
                }
            }
            (false, Some(b)) => {
                if let Some(entry) = b.first_free(now) {
                    return Place::Free {
                        second: true,
                        entry,
                    };
                }
            }
        }
        let (ia, ta) = first.soonest();
        match second.map(Bucket::soonest) {
            Some((ib, tb)) if tb < ta => Place::Share {
                second: true,
                entry: ib,
            },
            _ => Place::Share {
                second: false,
                entry: ia,
            },
        }
    }
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
    fn buckets_round_trip_and_tables_are_cut_into_buckets_of_eight() {
        let mut b = Bucket::decode(None, 8);
        assert_eq!(b.free(0), 8);
        b.set(3, [7, 100]);
        b.set(9, [1, 1]); // beyond the bucket: ignored
        let bytes = b.encode();
        assert_eq!(bytes.len(), 128);
        let back = Bucket::decode(Some(bytes), 8);
        assert_eq!(back, b);
        assert_eq!(back.find(7), Some(3));
        assert_eq!(back.get(3), Some([7, 100]));
        assert_eq!(
            (back.free(99), back.free(100)),
            (7, 8),
            "a past schedule is free"
        );
        assert_eq!(
            Bucket::decode(Some(&bytes[..20]), 8).free(0),
            8,
            "short: empty"
        );
        // 4096 entries: 512 buckets of 8; 5 entries: one bucket of 5.
        let c = candidates(0xdead_beef_1234_5678, 4096);
        assert!(c.first < 512 && c.second < 512 && c.first != c.second && c.ways == 8);
        let c = candidates(99, 5);
        assert_eq!((c.first, c.second, c.ways), (0, 0, 5));
        assert_eq!(Bucket::decode(None, 5).encode().len(), 80);
        assert_eq!(candidates(99, 12).ways, 8, "12 entries: 2 buckets of 8");
    }

    #[test]
    fn a_new_key_keeps_to_the_first_bucket_while_it_has_room() {
        let now = 1_000;
        let busy = |n: usize| {
            let mut b = Bucket::decode(None, 8);
            for i in 0..n {
                b.set(i, [100 + i as u64, now + 10 + i as u64]);
            }
            b
        };
        let free = |second, entry| Place::Free { second, entry };
        assert_eq!(Bucket::place(&busy(0), Some(&busy(0)), now), free(false, 0));
        assert_eq!(Bucket::place(&busy(6), Some(&busy(0)), now), free(false, 6));
        // One left in the first: the second, with more room, takes it.
        assert_eq!(Bucket::place(&busy(7), Some(&busy(3)), now), free(true, 3));
        assert_eq!(Bucket::place(&busy(7), Some(&busy(7)), now), free(false, 7));
        assert_eq!(Bucket::place(&busy(8), Some(&busy(7)), now), free(true, 7));
        assert_eq!(Bucket::place(&busy(7), None, now), free(false, 7));
        // All busy: share the schedule that ends soonest (first bucket's
        // entry 0 ends at now + 10; the second's shifted later).
        let mut later = busy(8);
        for i in 0..8 {
            later.set(i, [200 + i as u64, now + 50]);
        }
        assert_eq!(
            Bucket::place(&busy(8), Some(&later), now),
            Place::Share {
                second: false,
                entry: 0
            }
        );
        assert_eq!(
            Bucket::place(&later, Some(&busy(8)), now),
            Place::Share {
                second: true,
                entry: 0
            }
        );
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
