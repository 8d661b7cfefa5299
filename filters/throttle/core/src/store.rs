//! The ground floor: the process-wide values the decisions read and update
//! with compare-and-swap, by identity, and where each one lives.
//!
//! * [`SharedCell`] (16 bytes) and [`SharedBlob`] (variable size): one value
//!   with a version token; [`KeyTable`]: a per-key rule's buckets of entries.
//! * [`Store`]: every cell and blob of one configuration, by [`CellId`] and
//!   [`BlobId`]. The glue maps them to proxy-wasm shared data; tests use
//!   `testing::MemStore` (feature `testing`).
//! * The key layout ([`CellId::key`], [`BlobId::key`], [`SEED_KEY`], ...):
//!   a contract across the VMs of a process and across filter versions
//!   (another layout takes another version prefix than [`KEY_ROOT`]).

/// A 16-byte cell shared by all workers: proxy-wasm shared data in the filter,
/// a plain value in tests. `load` returns the value and a version token;
/// `store` succeeds only if the value has not changed since that token was read.
///
/// Rate cells hold `[0, tat]` (or the interval an adaptive rule's learner
/// keeps there: `[interval, tat]`); gate cells hold `[next, done]`.
pub trait SharedCell {
    /// Version token of a loaded value.
    type Token: Copy;
    /// Reads the cell (None if never stored). Err: the store failed.
    fn load(&mut self) -> Result<(Option<[u64; 2]>, Self::Token), StoreError>;
    /// Compare-and-swap. Ok(false): someone else changed it first (retry).
    fn store(&mut self, value: [u64; 2], token: Self::Token) -> Result<bool, StoreError>;
}

/// A variable-size value shared by all workers: proxy-wasm shared data in the
/// filter, a plain value in tests. `store` succeeds only if the value has not
/// changed since `load` returned `token`.
pub trait SharedBlob {
    /// Version token of a loaded value.
    type Token: Copy;
    /// Reads the value (None if never stored).
    fn load(&mut self) -> Result<(Option<Vec<u8>>, Self::Token), StoreError>;
    /// Compare-and-swap. Ok(false): changed since `token` (retry).
    fn store(&mut self, value: &[u8], token: Self::Token) -> Result<bool, StoreError>;
}

/// The buckets of a per-key rule's key table (`crate::keys::Bucket`: up to
/// 8 entries `[fingerprint, tat]` each), by number.
pub trait KeyTable {
    type Bucket: SharedBlob;
    /// Bucket `n`.
    fn bucket(&mut self, n: u32) -> Self::Bucket;
}

/// The store could not be read or written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreError(pub u32);

/// How many compare-and-swap attempts an update makes before giving up.
/// Each failed attempt means another worker changed the value in between, so
/// running out takes sustained, extreme contention.
pub const MAX_CAS_ATTEMPTS: u32 = 64;

/// Which shared cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CellId {
    /// A rule's unkeyed rate schedule (`[0, tat]`; an adaptive rule keeps
    /// its learned interval in the first word: `[interval, tat]`).
    Rate(usize),
    /// A rule's concurrency gate (`[next, done]`).
    Gate(usize),
    /// Cluster scope: a rule's cursor over its owned grid slots and its count
    /// of requests waiting for grants ([`crate::cluster::Cursor`]).
    Cursor(usize),
    /// Cluster scope: a rule's process schedule while the engine fails (`[0, tat]`).
    Fallback(usize),
    /// Cluster scope: how far the process went ahead of its grants
    /// (`[owed, until_ms]`, [`crate::cluster::Ahead`]); read off the fast path only.
    Ahead(usize),
    /// Cluster scope: grants an engine call that failed cost the process
    /// (`[count, until_ms]`, [`crate::cluster::forgive`]): as many held
    /// requests whose `max_queue_delay` runs out before `until_ms` go
    /// instead of being refused; read and written off the fast path only.
    Forgiven(usize),
    /// Cluster scope: which VM of the process calls the engine (`[holder, until]`).
    Caller,
    /// Adaptive: which VM of the process learns a rule's rate (`[holder,
    /// until]`; a newer configuration's holder takes it at once).
    Learner(usize),
    /// Adaptive: a fingerprint of the settings the rule's rate was learned
    /// under (`[fingerprint, 0]`): a configuration that changes them
    /// starts again at `rate`.
    Learned(usize),
    /// A per-key rule's key table exists: `[buckets, ways]` once configure
    /// created every bucket (the next configure reads this cell alone).
    Table(usize),
}

/// Which shared variable-size value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BlobId {
    /// Cluster scope: a rule's grants (mode and owned slot ranges).
    Grants(usize),
    /// A rule with priority classes: its tickets per class
    /// ([`crate::classes::Tickets`]).
    Classes(usize),
    /// Adaptive: what the workers saw of a rule's answers since the learner
    /// last took it (`adaptive::Tally` as little-endian words).
    Tally(usize),
    /// Bucket `n` of a rule's key table (`crate::keys::Bucket`).
    Bucket(usize, u32),
}

/// Shared 16-byte cells with compare-and-swap, addressed by [`CellId`]. A
/// handle is `Copy` (the host is process-wide), so decisions can hold several
/// cells at once.
pub trait Store: Copy {
    /// Reads a cell (None if never stored) and its version token.
    fn load(&self, id: CellId) -> Result<(Option<[u64; 2]>, u32), StoreError>;
    /// Compare-and-swap. Ok(false): someone else changed it first.
    fn store(&self, id: CellId, value: [u64; 2], token: u32) -> Result<bool, StoreError>;
    /// Reads a variable-size value (None if never stored) and its token.
    fn load_blob(&self, id: BlobId) -> Result<(Option<Vec<u8>>, u32), StoreError>;
    /// Compare-and-swap of a variable-size value.
    fn store_blob(&self, id: BlobId, value: &[u8], token: u32) -> Result<bool, StoreError>;

    /// The cell `id` as a [`SharedCell`].
    fn cell(self, id: CellId) -> Cell<Self> {
        Cell { store: self, id }
    }

    /// Rule `rule`'s key table as a [`KeyTable`].
    fn table(self, rule: usize) -> Table<Self> {
        Table { store: self, rule }
    }

    /// The blob `id` as a [`SharedBlob`].
    fn blob(self, id: BlobId) -> Blob<Self> {
        Blob { store: self, id }
    }
}

/// One variable-size value of a [`Store`].
#[derive(Debug, Clone, Copy)]
pub struct Blob<S> {
    store: S,
    id: BlobId,
}

impl<S: Store> SharedBlob for Blob<S> {
    type Token = u32;
    fn load(&mut self) -> Result<(Option<Vec<u8>>, u32), StoreError> {
        self.store.load_blob(self.id)
    }
    fn store(&mut self, value: &[u8], token: u32) -> Result<bool, StoreError> {
        self.store.store_blob(self.id, value, token)
    }
}

/// One cell of a [`Store`].
#[derive(Debug, Clone, Copy)]
pub struct Cell<S> {
    store: S,
    id: CellId,
}

impl<S: Store> SharedCell for Cell<S> {
    type Token = u32;
    fn load(&mut self) -> Result<(Option<[u64; 2]>, u32), StoreError> {
        self.store.load(self.id)
    }
    fn store(&mut self, value: [u64; 2], token: u32) -> Result<bool, StoreError> {
        self.store.store(self.id, value, token)
    }
}

/// A rule's key table in a [`Store`].
#[derive(Debug, Clone, Copy)]
pub struct Table<S> {
    store: S,
    rule: usize,
}

impl<S: Store> KeyTable for Table<S> {
    type Bucket = Blob<S>;
    fn bucket(&mut self, n: u32) -> Blob<S> {
        self.store.blob(BlobId::Bucket(self.rule, n))
    }
}

// ---------------------------------------------------------------- key layout

/// The prefix of the process-wide keys of this layout (seed, wake queues,
/// caller lease).
pub const KEY_ROOT: &str = "throttle/v3/";
/// The prefix of every rule's keys: `t3/<rule id>/<cell>`, where the rule id
/// is [`rule_id`] of its name. Short on purpose: the keys a request reads
/// and writes stay within 22 bytes, which Envoy's `std::string` (libc++)
/// keeps inline, so a shared-data call allocates no key.
pub const RULE_ROOT: &str = "t3/";
/// Shared-data key of the key-hashing seed (16 bytes, process-wide).
pub const SEED_KEY: &str = "throttle/v3/seed";
/// Shared-data key of the list of workers' wake queues (little-endian u32 ids).
pub const WAKE_KEY: &str = "throttle/v3/wake";
/// Name prefix of a worker's wake queue (`<prefix><16 hex digits>`).
pub const WAKE_QUEUE_PREFIX: &str = "throttle/v3/wake/";
/// The longest key a request reads or writes whose bytes Envoy's strings keep
/// inline (libc++: 22 bytes); the layout keeps every rule key within it.
pub const INLINE_KEY_BYTES: usize = 22;

/// A shared-data key, built on the stack: no allocation per request.
#[derive(Clone, Copy)]
pub struct Key {
    buf: [u8; Key::CAPACITY],
    len: usize,
}

impl Key {
    /// Longest key: the caller lease's (`throttle/v3/caller/` and 16 hex digits).
    pub const CAPACITY: usize = 40;

    fn new() -> Key {
        Key {
            buf: [0; Key::CAPACITY],
            len: 0,
        }
    }

    fn push(mut self, bytes: &[u8]) -> Option<Key> {
        let end = self.len.checked_add(bytes.len())?;
        self.buf.get_mut(self.len..end)?.copy_from_slice(bytes);
        self.len = end;
        Some(self)
    }

    /// `n` in decimal, or in 16 hex digits.
    fn number(self, mut n: u64, hex: bool) -> Option<Key> {
        let (base, width) = if hex { (16, 16) } else { (10, 1) };
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        while i > digits.len() - width || n > 0 {
            i -= 1;
            *digits.get_mut(i)? = b"0123456789abcdef".get((n % base) as usize).copied()?;
            n /= base;
        }
        self.push(digits.get(i..)?)
    }

    /// The key as text (ASCII by construction).
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(self.buf.get(..self.len).unwrap_or_default()).unwrap_or_default()
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key({:?})", self.as_str())
    }
}

/// A rule's id in the key layout: 64 bits of SipHash-1-3 of its name (under
/// a fixed key: names come from the configuration, not from clients) in 11
/// characters of base64url. Rules of the same name share their cells across
/// the plugin configurations of a `vm_id`, as before; two different names
/// share an id with probability 2^-64 per pair.
pub fn rule_id(name: &str) -> [u8; 11] {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    // As a key's fingerprint (`keys::KeyHasher`) of the name under "rule",
    // without importing upward.
    let mut s =
        siphasher::sip::SipHasher13::new_with_keys(0x7468_726f_7474_6c65, 0x7275_6c65_2d69_6433);
    std::hash::Hasher::write(&mut s, b"rule");
    std::hash::Hasher::write_u8(&mut s, 0xff);
    std::hash::Hasher::write(&mut s, name.as_bytes());
    let h = std::hash::Hasher::finish(&s).max(1);
    let mut out = [b'A'; 11];
    for (i, c) in out.iter_mut().enumerate() {
        let six = (h >> (6 * i)) & 63;
        *c = ALPHABET.get(six as usize).copied().unwrap_or(b'A');
    }
    out
}

/// `t3/<rule id>/<suffix>`.
fn rule_key(name: &str, suffix: &str) -> Option<Key> {
    Key::new()
        .push(RULE_ROOT.as_bytes())?
        .push(&rule_id(name))?
        .push(b"/")?
        .push(suffix.as_bytes())
}

impl CellId {
    /// The rule the cell belongs to (None: one per configuration).
    pub fn rule(self) -> Option<usize> {
        match self {
            CellId::Rate(i)
            | CellId::Gate(i)
            | CellId::Cursor(i)
            | CellId::Fallback(i)
            | CellId::Ahead(i)
            | CellId::Forgiven(i)
            | CellId::Learner(i)
            | CellId::Learned(i)
            | CellId::Table(i) => Some(i),
            CellId::Caller => None,
        }
    }

    /// The cell's shared-data key: under its rule's id (of `rule_name`, see
    /// [`CellId::rule`]), or under the configuration's hash for the caller
    /// lease. None only if the key would not fit a [`Key`].
    pub fn key(self, rule_name: &str, config_hash: u64) -> Option<Key> {
        match self {
            CellId::Rate(_) => rule_key(rule_name, "r"),
            CellId::Gate(_) => rule_key(rule_name, "g"),
            CellId::Cursor(_) => rule_key(rule_name, "c"),
            CellId::Fallback(_) => rule_key(rule_name, "f"),
            CellId::Ahead(_) => rule_key(rule_name, "a"),
            CellId::Forgiven(_) => rule_key(rule_name, "x"),
            CellId::Caller => Key::new()
                .push(KEY_ROOT.as_bytes())?
                .push(b"caller/")?
                .number(config_hash, true),
            CellId::Learner(_) => rule_key(rule_name, "l"),
            CellId::Learned(_) => rule_key(rule_name, "s"),
            CellId::Table(_) => rule_key(rule_name, "t"),
        }
    }
}

impl BlobId {
    /// The rule the value belongs to.
    pub fn rule(self) -> usize {
        match self {
            BlobId::Grants(i) | BlobId::Classes(i) | BlobId::Tally(i) | BlobId::Bucket(i, _) => i,
        }
    }

    /// The value's shared-data key, under its rule's name.
    pub fn key(self, rule_name: &str) -> Option<Key> {
        match self {
            BlobId::Grants(_) => rule_key(rule_name, "G"),
            BlobId::Classes(_) => rule_key(rule_name, "C"),
            BlobId::Tally(_) => rule_key(rule_name, "T"),
            // Buckets of 8 entries (layout v3 had one 16-byte slot per
            // entry under `k<n>`: another name, so the two never meet).
            BlobId::Bucket(_, n) => rule_key(rule_name, "b")?.number(n.into(), false),
        }
    }
}

/// A shared value a configuration needs before its first request, so that
/// every later update carries a compare-and-swap token (a token of 0 would
/// skip the check).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Initial {
    /// A cell, created as `[0, 0]`.
    Cell(CellId),
    /// A variable-size value, created with these bytes.
    Blob(BlobId, Vec<u8>),
    /// Rule `rule`'s key table: each of its `buckets` buckets created empty
    /// (`ways` entries), then [`CellId::Table`] set to `[buckets, ways]`.
    Table {
        rule: usize,
        buckets: u32,
        ways: u32,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout is a contract across VMs and filter versions: pinned here.
    #[test]
    fn every_key_of_the_layout() {
        let name = "users";
        let id = std::str::from_utf8(&rule_id(name)).unwrap().to_string();
        assert_eq!(id, "1D4HXr-Q1oG");
        let cells = [
            (CellId::Rate(3), format!("t3/{id}/r")),
            (CellId::Gate(3), format!("t3/{id}/g")),
            (CellId::Cursor(3), format!("t3/{id}/c")),
            (CellId::Fallback(3), format!("t3/{id}/f")),
            (CellId::Ahead(3), format!("t3/{id}/a")),
            (CellId::Forgiven(3), format!("t3/{id}/x")),
            (CellId::Caller, "throttle/v3/caller/00000000000000ab".into()),
            (CellId::Learner(3), format!("t3/{id}/l")),
            (CellId::Learned(3), format!("t3/{id}/s")),
            (CellId::Table(3), format!("t3/{id}/t")),
        ];
        for (id, want) in cells {
            assert_eq!(id.key(name, 0xab).unwrap().as_str(), want, "{id:?}");
            let per_process = matches!(id, CellId::Caller);
            assert_eq!(id.rule(), (!per_process).then_some(3));
        }
        assert_eq!(
            CellId::Caller.key("", u64::MAX).unwrap().as_str(),
            "throttle/v3/caller/ffffffffffffffff"
        );
        assert_eq!(
            BlobId::Grants(3).key(name).unwrap().as_str(),
            format!("t3/{id}/G")
        );
        assert_eq!(BlobId::Grants(3).rule(), 3);
        assert_eq!(
            BlobId::Classes(3).key(name).unwrap().as_str(),
            format!("t3/{id}/C")
        );
        assert_eq!(BlobId::Classes(3).rule(), 3);
        assert_eq!(
            BlobId::Tally(3).key(name).unwrap().as_str(),
            format!("t3/{id}/T")
        );
        assert_eq!(BlobId::Tally(3).rule(), 3);
        for (n, want) in [
            (0, "b0"),
            (511, "b511"),
            (124_999, "b124999"),
            (u32::MAX, "b4294967295"),
        ] {
            assert_eq!(
                BlobId::Bucket(3, n).key(name).unwrap().as_str(),
                format!("t3/{id}/{want}")
            );
        }
        assert_eq!(BlobId::Bucket(3, 1).rule(), 3);
        for k in [SEED_KEY, WAKE_KEY, WAKE_QUEUE_PREFIX] {
            assert!(k.starts_with(KEY_ROOT));
        }
    }

    #[test]
    fn every_key_a_request_touches_stays_inline_in_envoys_strings() {
        // key_slots is at most 1,000,000: buckets up to 124,999.
        for name in ["a", &"n".repeat(64)] {
            for id in [
                CellId::Rate(0),
                CellId::Gate(0),
                CellId::Cursor(0),
                CellId::Fallback(0),
                CellId::Ahead(0),
            ] {
                let k = id.key(name, 0).unwrap();
                assert!(k.as_str().len() <= INLINE_KEY_BYTES, "{k:?}");
            }
            for id in [
                BlobId::Grants(0),
                BlobId::Classes(0),
                BlobId::Bucket(0, 124_999),
            ] {
                assert!(id.key(name).unwrap().as_str().len() <= INLINE_KEY_BYTES);
            }
        }
    }

    #[test]
    fn rule_ids_differ_by_name_and_are_stable() {
        let names = [
            "users", "user", "users ", "a", "b", "default", "api-v1", "api-v2",
        ];
        let ids: std::collections::BTreeSet<[u8; 11]> = names.iter().map(|n| rule_id(n)).collect();
        assert_eq!(ids.len(), names.len());
        assert_eq!(rule_id("users"), rule_id("users"));
        assert!(rule_id("users")
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'_'));
    }
}
