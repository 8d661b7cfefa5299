//! The process-wide cells of the core's [`Store`] in proxy-wasm shared data
//! (at the keys the core's layout gives each [`CellId`] and [`BlobId`]),
//! and the other shared values: the key-hashing seed and the list of wake
//! queues. Shared data is scoped by `vm_id`.

use throttle_core::store::{
    BlobId, CellId, Key, Store, StoreError, MAX_CAS_ATTEMPTS, SEED_KEY, WAKE_KEY,
};
use throttle_core::stream::create_initial;
use throttle_core::Config;

use crate::host::Host;

/// At most this many wake queues are remembered (the newest).
const MAX_WAKE_QUEUES: usize = 64;

fn decode16(bytes: &[u8]) -> Option<[u64; 2]> {
    let a = u64::from_le_bytes(bytes.get(0..8)?.try_into().ok()?);
    let b = u64::from_le_bytes(bytes.get(8..16)?.try_into().ok()?);
    Some([a, b])
}

fn encode16([a, b]: [u64; 2]) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&a.to_le_bytes());
    out[8..].copy_from_slice(&b.to_le_bytes());
    out
}

/// The shared-data keys of a configuration's rule cells, built once (at
/// configure) rather than on every request: by rule, the keys of its
/// [`CellId::Rate`], [`CellId::Gate`], [`CellId::Cursor`],
/// [`CellId::Fallback`] and [`CellId::Ahead`] cells (the same layout as [`CellId::key`]).
#[derive(Debug, Default)]
pub struct Keys {
    cells: Vec<[String; 5]>,
}

impl Keys {
    /// Every rule's keys (a key that does not fit the layout stays empty:
    /// its cell's decisions fail closed, as [`CellId::key`] says).
    pub fn new(config: &Config) -> Keys {
        let cells = config
            .rules
            .iter()
            .enumerate()
            .map(|(i, r)| {
                [
                    CellId::Rate(i),
                    CellId::Gate(i),
                    CellId::Cursor(i),
                    CellId::Fallback(i),
                    CellId::Ahead(i),
                ]
                .map(|id| {
                    id.key(&r.name, 0)
                        .map(|k| k.as_str().to_string())
                        .unwrap_or_default()
                })
            })
            .collect();
        Keys { cells }
    }

    /// The cached key of a rule cell (None for a slot or the caller lease).
    fn cached(&self, id: CellId) -> Option<&str> {
        let (rule, which) = match id {
            CellId::Rate(i) => (i, 0),
            CellId::Gate(i) => (i, 1),
            CellId::Cursor(i) => (i, 2),
            CellId::Fallback(i) => (i, 3),
            CellId::Ahead(i) => (i, 4),
            CellId::Caller
            | CellId::Forgiven(_)
            | CellId::Learner(_)
            | CellId::Learned(_)
            | CellId::Table(_) => return None,
        };
        self.cells
            .get(rule)
            .and_then(|k| k.get(which))
            .map(String::as_str)
    }
}

/// The cells of one plugin configuration in the host's shared data.
#[derive(Clone, Copy)]
pub struct SharedStore<'c, H> {
    pub host: H,
    pub config: &'c Config,
    /// Names the configuration's caller lease.
    pub config_hash: u64,
    /// The rule cells' keys, built once.
    pub keys: &'c Keys,
}

/// A key the layout could not give (no such rule, or too long): the
/// decisions fail closed.
const NO_KEY: StoreError = StoreError(u32::MAX);

impl<H: Host> SharedStore<'_, H> {
    fn rule_name(&self, rule: usize) -> Result<&str, StoreError> {
        self.config
            .rules
            .get(rule)
            .map(|r| r.name.as_str())
            .ok_or(NO_KEY)
    }

    fn cell_key(&self, id: CellId) -> Result<Key, StoreError> {
        let name = match id.rule() {
            Some(i) => self.rule_name(i)?,
            None => "",
        };
        id.key(name, self.config_hash).ok_or(NO_KEY)
    }

    /// `f` of the cell's key: the cached one, else built.
    fn with_cell_key<T>(
        &self,
        id: CellId,
        f: impl FnOnce(&str) -> Result<T, u32>,
    ) -> Result<T, StoreError> {
        match self.keys.cached(id) {
            Some("") => Err(NO_KEY),
            Some(key) => f(key).map_err(StoreError),
            None => f(self.cell_key(id)?.as_str()).map_err(StoreError),
        }
    }

    fn blob_key(&self, id: BlobId) -> Result<Key, StoreError> {
        id.key(self.rule_name(id.rule())?).ok_or(NO_KEY)
    }

    /// Creates every shared value that must exist before the first request
    /// ([`create_initial`]). Returns what could not be created: rule names,
    /// or "the leases" for the process's calling and learning leases.
    pub fn create_initial(&self) -> Vec<&str> {
        create_initial(*self, self.config)
            .into_iter()
            .map(|rule| match rule.and_then(|i| self.config.rules.get(i)) {
                Some(r) => r.name.as_str(),
                None => "the leases",
            })
            .collect()
    }
}

impl<H: Host> Store for SharedStore<'_, H> {
    fn load(&self, id: CellId) -> Result<(Option<[u64; 2]>, u32), StoreError> {
        let (value, cas) = self.with_cell_key(id, |key| self.host.shared_get(key))?;
        Ok((value.as_deref().and_then(decode16), cas))
    }

    fn store(&self, id: CellId, value: [u64; 2], token: u32) -> Result<bool, StoreError> {
        let bytes = encode16(value);
        self.with_cell_key(id, |key| self.host.shared_set(key, &bytes, token))
    }

    fn load_blob(&self, id: BlobId) -> Result<(Option<Vec<u8>>, u32), StoreError> {
        let key = self.blob_key(id)?;
        self.host.shared_get(key.as_str()).map_err(StoreError)
    }

    fn store_blob(&self, id: BlobId, value: &[u8], token: u32) -> Result<bool, StoreError> {
        let key = self.blob_key(id)?;
        self.host
            .shared_set(key.as_str(), value, token)
            .map_err(StoreError)
    }
}

/// The secret seed of key hashing, shared by all VMs of the process: read
/// from shared data, or created there from WASI randomness by the first VM
/// (the main thread's, which is configured before any worker's).
pub fn shared_seed<H: Host>(host: H) -> Option<(u64, u64)> {
    if let Ok((Some(v), _)) = host.shared_get(SEED_KEY) {
        return decode16(&v).map(|[a, b]| (a, b));
    }
    let mut bytes = [0u8; 16];
    if !host.random(&mut bytes) {
        return None;
    }
    let (_, cas) = host.shared_get(SEED_KEY).ok()?;
    // If another VM won the race, its seed is the one.
    let _ = host.shared_set(SEED_KEY, &bytes, cas);
    let (v, _) = host.shared_get(SEED_KEY).ok()?;
    v.as_deref().and_then(decode16).map(|[a, b]| (a, b))
}

fn decode_queues(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .filter_map(|c| c.try_into().ok().map(u32::from_le_bytes))
        .collect()
}

/// Adds a worker's wake queue to the process-wide list.
pub fn add_wake_queue<H: Host>(host: H, queue: u32) -> bool {
    for _ in 0..MAX_CAS_ATTEMPTS {
        let Ok((value, cas)) = host.shared_get(WAKE_KEY) else {
            return false;
        };
        let mut queues = value.as_deref().map(decode_queues).unwrap_or_default();
        queues.retain(|&q| q != queue);
        queues.push(queue);
        let skip = queues.len().saturating_sub(MAX_WAKE_QUEUES);
        let bytes: Vec<u8> = queues
            .iter()
            .skip(skip)
            .flat_map(|q| q.to_le_bytes())
            .collect();
        match host.shared_set(WAKE_KEY, &bytes, cas) {
            Ok(true) => return true,
            Ok(false) => continue,
            Err(_) => return false,
        }
    }
    false
}

/// Wakes every worker (a concurrency slot went back and a waiter may go):
/// each one's `on_queue_ready` runs on its own event loop, outside any
/// stream's callback, where resuming another stream is safe.
pub fn wake_all<H: Host>(host: H) {
    if let Ok((Some(v), _)) = host.shared_get(WAKE_KEY) {
        for q in decode_queues(&v) {
            let _ = host.enqueue(q, b"w");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_round_trip() {
        assert_eq!(decode16(&encode16([1, u64::MAX])), Some([1, u64::MAX]));
        assert_eq!(decode16(&[1, 2, 3]), None);
    }
}
