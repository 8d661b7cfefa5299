//! The process-wide cells of the core's [`Store`] in proxy-wasm shared data,
//! and the other shared values: the key-hashing seed and the list of wake
//! queues. Shared data is scoped by `vm_id`.

use throttle_core::schedule::StoreError;
use throttle_core::store::{BlobId, CellId, Store};

use crate::host::Host;
use crate::plugin::Plugin;

/// Shared-data key of the key-hashing seed.
pub const SEED_KEY: &str = "throttle/v2/seed";
/// Shared-data key of the list of workers' wake queues (little-endian u32 ids).
pub const WAKE_KEY: &str = "throttle/v2/wake";
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

/// The rules' cells of one plugin configuration in the host's shared data.
#[derive(Clone, Copy)]
pub struct SharedStore<'p, H> {
    pub host: H,
    pub plugin: &'p Plugin,
}

/// A key built on the stack (`<prefix><slot>`): no allocation per request.
struct KeyBuf {
    buf: [u8; 128],
    len: usize,
}

impl KeyBuf {
    fn new(prefix: &str, slot: u32) -> Option<Self> {
        let mut k = KeyBuf {
            buf: [0; 128],
            len: 0,
        };
        k.push(prefix.as_bytes())?;
        let mut digits = [0u8; 10];
        let mut n = slot;
        let mut i = digits.len();
        loop {
            i -= 1;
            *digits.get_mut(i)? = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        k.push(digits.get(i..)?)?;
        Some(k)
    }

    fn push(&mut self, bytes: &[u8]) -> Option<()> {
        let end = self.len.checked_add(bytes.len())?;
        self.buf.get_mut(self.len..end)?.copy_from_slice(bytes);
        self.len = end;
        Some(())
    }

    fn as_str(&self) -> &str {
        std::str::from_utf8(self.buf.get(..self.len).unwrap_or_default()).unwrap_or_default()
    }
}

impl<H: Host> SharedStore<'_, H> {
    fn with_key<T>(
        &self,
        id: CellId,
        f: impl FnOnce(&str) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let missing = StoreError(u32::MAX);
        match id {
            CellId::Rate(i) => f(&self.plugin.rules.get(i).ok_or(missing)?.rate_key),
            CellId::Gate(i) => f(&self.plugin.rules.get(i).ok_or(missing)?.gate_key),
            CellId::Slot(i, slot) => {
                let prefix = &self.plugin.rules.get(i).ok_or(missing)?.slot_prefix;
                f(KeyBuf::new(prefix, slot).ok_or(missing)?.as_str())
            }
            CellId::Cursor(i) => f(&self.plugin.rules.get(i).ok_or(missing)?.cursor_key),
            CellId::Waiting(i) => f(&self.plugin.rules.get(i).ok_or(missing)?.waiting_key),
            CellId::Fallback(i) => f(&self.plugin.rules.get(i).ok_or(missing)?.fallback_key),
            CellId::Caller => f(&self.plugin.caller_key),
        }
    }

    fn blob_key(&self, id: BlobId) -> Result<&str, StoreError> {
        match id {
            BlobId::Grants(i) => self
                .plugin
                .rules
                .get(i)
                .map(|r| r.grants_key.as_str())
                .ok_or(StoreError(u32::MAX)),
        }
    }
}

impl<H: Host> Store for SharedStore<'_, H> {
    fn load(&self, id: CellId) -> Result<(Option<[u64; 2]>, u32), StoreError> {
        self.with_key(id, |key| {
            let (value, cas) = self.host.shared_get(key).map_err(StoreError)?;
            Ok((value.as_deref().and_then(decode16), cas))
        })
    }

    fn store(&self, id: CellId, value: [u64; 2], token: u32) -> Result<bool, StoreError> {
        self.with_key(id, |key| {
            self.host
                .shared_set(key, &encode16(value), token)
                .map_err(StoreError)
        })
    }

    fn load_blob(&self, id: BlobId) -> Result<(Option<Vec<u8>>, u32), StoreError> {
        self.host.shared_get(self.blob_key(id)?).map_err(StoreError)
    }

    fn store_blob(&self, id: BlobId, value: &[u8], token: u32) -> Result<bool, StoreError> {
        self.host
            .shared_set(self.blob_key(id)?, value, token)
            .map_err(StoreError)
    }
}

/// Creates a cell if it does not exist yet, so that every later update
/// carries a compare-and-swap token (a token of 0 would skip the check).
pub fn ensure_cell<H: Host>(host: H, key: &str) -> bool {
    match host.shared_get(key) {
        Ok((Some(_), _)) => true,
        Ok((None, cas)) => host
            .shared_set(key, &encode16([0, 0]), cas)
            .unwrap_or(false),
        Err(_) => false,
    }
}

/// Creates a variable-size value if it does not exist yet (so that updates
/// carry a compare-and-swap token).
pub fn ensure_blob<H: Host>(host: H, key: &str, initial: &[u8]) -> bool {
    match host.shared_get(key) {
        Ok((Some(_), _)) => true,
        Ok((None, cas)) => host.shared_set(key, initial, cas).unwrap_or(false),
        Err(_) => false,
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
    for _ in 0..throttle_core::schedule::MAX_CAS_ATTEMPTS {
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
    fn slot_keys_are_built_without_allocation() {
        let k = KeyBuf::new("throttle/v2/rule/users/k/", 4095).unwrap();
        assert_eq!(k.as_str(), "throttle/v2/rule/users/k/4095");
        assert_eq!(KeyBuf::new("p/", 0).unwrap().as_str(), "p/0");
        assert_eq!(
            KeyBuf::new("p/", u32::MAX).unwrap().as_str(),
            "p/4294967295"
        );
        assert!(KeyBuf::new(&"x".repeat(121), 12_345_678).is_none());
    }

    #[test]
    fn cells_round_trip() {
        assert_eq!(decode16(&encode16([1, u64::MAX])), Some([1, u64::MAX]));
        assert_eq!(decode16(&[1, 2, 3]), None);
    }
}
