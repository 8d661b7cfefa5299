//! The ground floor: the process-wide values the decisions read and update
//! with compare-and-swap, by identity, and where each one lives.
//!
//! * [`SharedCell`] (16 bytes) and [`SharedBlob`] (variable size): one value
//!   with a version token; [`KeyTable`]: a per-key rule's cells by slot.
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
/// Rate cells hold `[fingerprint, tat]` (for unkeyed cells, 0 or the interval
/// an adaptive rule's learner keeps there); gate cells hold `[next, done]`.
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

/// The cells of a per-key rule's key table, by slot.
pub trait KeyTable {
    type Cell: SharedCell;
    /// The cell of `slot`.
    fn cell(&mut self, slot: u32) -> Self::Cell;
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
    /// Slot `n` of a rule's key table (`[fingerprint, tat]`).
    Slot(usize, u32),
    /// A rule's concurrency gate (`[next, done]`).
    Gate(usize),
    /// Cluster scope: a rule's cursor over its owned grid slots (`[next, end]`).
    Cursor(usize),
    /// Cluster scope: a rule's count of requests waiting for grants (`[n, 0]`).
    Waiting(usize),
    /// Cluster scope: a rule's process schedule while the engine fails (`[0, tat]`).
    Fallback(usize),
    /// Cluster scope: which VM of the process calls the engine (`[holder, until]`).
    Caller,
    /// Adaptive rules: which VM of the process learns their rates (`[holder, until]`).
    Learner,
}

/// Which shared variable-size value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BlobId {
    /// Cluster scope: a rule's grants (mode and owned slot ranges).
    Grants(usize),
    /// Adaptive: what the workers saw of a rule's answers since the learner
    /// last took it (`adaptive::Tally` as little-endian words).
    Tally(usize),
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
    type Cell = Cell<S>;
    fn cell(&mut self, slot: u32) -> Cell<S> {
        self.store.cell(CellId::Slot(self.rule, slot))
    }
}

// ---------------------------------------------------------------- key layout

/// The prefix of every shared-data key of this layout.
pub const KEY_ROOT: &str = "throttle/v2/";
/// Shared-data key of the key-hashing seed (16 bytes, process-wide).
pub const SEED_KEY: &str = "throttle/v2/seed";
/// Shared-data key of the list of workers' wake queues (little-endian u32 ids).
pub const WAKE_KEY: &str = "throttle/v2/wake";
/// Name prefix of a worker's wake queue (`<prefix><16 hex digits>`).
pub const WAKE_QUEUE_PREFIX: &str = "throttle/v2/wake/";

/// A shared-data key, built on the stack: no allocation per request.
#[derive(Clone, Copy)]
pub struct Key {
    buf: [u8; Key::CAPACITY],
    len: usize,
}

impl Key {
    /// Longest key: the root, a 64-byte rule name and the longest suffix fit.
    pub const CAPACITY: usize = 128;

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

    /// The key as text.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(self.buf.get(..self.len).unwrap_or_default()).unwrap_or_default()
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key({:?})", self.as_str())
    }
}

/// `throttle/v2/rule/<name>/<suffix>`.
fn rule_key(name: &str, suffix: &str) -> Option<Key> {
    Key::new()
        .push(KEY_ROOT.as_bytes())?
        .push(b"rule/")?
        .push(name.as_bytes())?
        .push(b"/")?
        .push(suffix.as_bytes())
}

impl CellId {
    /// The rule the cell belongs to (None: one per configuration).
    pub fn rule(self) -> Option<usize> {
        match self {
            CellId::Rate(i)
            | CellId::Slot(i, _)
            | CellId::Gate(i)
            | CellId::Cursor(i)
            | CellId::Waiting(i)
            | CellId::Fallback(i) => Some(i),
            CellId::Caller | CellId::Learner => None,
        }
    }

    /// The cell's shared-data key: under its rule's name (`rule_name`, see
    /// [`CellId::rule`]), or under the configuration's hash for the caller
    /// lease. None only if the key would not fit a [`Key`].
    pub fn key(self, rule_name: &str, config_hash: u64) -> Option<Key> {
        match self {
            CellId::Rate(_) => rule_key(rule_name, "rate"),
            CellId::Slot(_, n) => rule_key(rule_name, "k/")?.number(n.into(), false),
            CellId::Gate(_) => rule_key(rule_name, "gate"),
            CellId::Cursor(_) => rule_key(rule_name, "cursor"),
            CellId::Waiting(_) => rule_key(rule_name, "waiting"),
            CellId::Fallback(_) => rule_key(rule_name, "fallback"),
            CellId::Caller => Key::new()
                .push(KEY_ROOT.as_bytes())?
                .push(b"caller/")?
                .number(config_hash, true),
            CellId::Learner => Key::new()
                .push(KEY_ROOT.as_bytes())?
                .push(b"learner/")?
                .number(config_hash, true),
        }
    }
}

impl BlobId {
    /// The rule the value belongs to.
    pub fn rule(self) -> usize {
        match self {
            BlobId::Grants(i) | BlobId::Tally(i) => i,
        }
    }

    /// The value's shared-data key, under its rule's name.
    pub fn key(self, rule_name: &str) -> Option<Key> {
        match self {
            BlobId::Grants(_) => rule_key(rule_name, "grants"),
            BlobId::Tally(_) => rule_key(rule_name, "tally"),
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout is a contract across VMs and filter versions: pinned here.
    #[test]
    fn every_key_of_the_layout() {
        let name = "users";
        let cells = [
            (CellId::Rate(3), "throttle/v2/rule/users/rate"),
            (CellId::Slot(3, 0), "throttle/v2/rule/users/k/0"),
            (CellId::Slot(3, 4095), "throttle/v2/rule/users/k/4095"),
            (
                CellId::Slot(3, u32::MAX),
                "throttle/v2/rule/users/k/4294967295",
            ),
            (CellId::Gate(3), "throttle/v2/rule/users/gate"),
            (CellId::Cursor(3), "throttle/v2/rule/users/cursor"),
            (CellId::Waiting(3), "throttle/v2/rule/users/waiting"),
            (CellId::Fallback(3), "throttle/v2/rule/users/fallback"),
            (CellId::Caller, "throttle/v2/caller/00000000000000ab"),
            (CellId::Learner, "throttle/v2/learner/00000000000000ab"),
        ];
        for (id, want) in cells {
            assert_eq!(id.key(name, 0xab).unwrap().as_str(), want, "{id:?}");
            let per_process = matches!(id, CellId::Caller | CellId::Learner);
            assert_eq!(id.rule(), (!per_process).then_some(3));
        }
        assert_eq!(
            CellId::Caller.key("", u64::MAX).unwrap().as_str(),
            "throttle/v2/caller/ffffffffffffffff"
        );
        assert_eq!(
            BlobId::Grants(3).key(name).unwrap().as_str(),
            "throttle/v2/rule/users/grants"
        );
        assert_eq!(BlobId::Grants(3).rule(), 3);
        assert_eq!(
            BlobId::Tally(3).key(name).unwrap().as_str(),
            "throttle/v2/rule/users/tally"
        );
        assert_eq!(BlobId::Tally(3).rule(), 3);
        for k in [SEED_KEY, WAKE_KEY, WAKE_QUEUE_PREFIX] {
            assert!(k.starts_with(KEY_ROOT));
        }
    }

    #[test]
    fn the_longest_rule_name_fits_every_key() {
        let name = "n".repeat(64);
        let longest = CellId::Slot(0, u32::MAX).key(&name, 0).unwrap();
        assert_eq!(longest.as_str().len(), 17 + 64 + 3 + 10);
        assert!(CellId::Fallback(0).key(&name, 0).is_some());
        // Too long for a key: None, never a truncated key.
        assert!(CellId::Rate(0).key(&"n".repeat(120), 0).is_none());
    }
}
