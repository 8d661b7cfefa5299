//! Test support, shared by the unit tests, the property tests, the glue's
//! tests and the cluster simulation (feature `testing`): in-memory shared
//! cells and values with compare-and-swap, as Envoy keeps them.
//!
//! Envoy's shared data (proxy-wasm-cpp-host `SharedData::set`) writes a key
//! that does not exist whatever the token, and overwrites an existing one
//! when the token is 0: only a non-zero token of an existing key is checked.
//! These stores do the same, so that a test sees the races Envoy has (two
//! workers that both read a missing cell both write it). A store a token
//! did not guard is counted in [`MemCells::unconditional`], so tests can
//! check that nothing but the cells created at configure is ever written
//! that way.

use std::cell::RefCell;
use std::collections::BTreeMap;

use crate::store::{BlobId, CellId, SharedBlob, SharedCell, Store, StoreError};

/// Whether Envoy's `SharedData::set` writes a value whose current token is
/// `current` (None: the key does not exist) when given `token`.
pub fn host_writes(current: Option<u32>, token: u32) -> bool {
    match current {
        None => true,
        Some(c) => token == 0 || token == c,
    }
}

/// The token of a value at `version` (0 only for a value never stored, as
/// in Envoy, whose tokens of existing keys are never 0).
fn token_of(exists: bool, version: u32) -> Option<u32> {
    exists.then(|| version.wrapping_add(1).max(1))
}

/// One shared cell in memory; `store` fails when the token is stale, as
/// Envoy's shared data does ([`host_writes`]). A cell never stored reads
/// token 0.
#[derive(Debug, Default, Clone)]
pub struct MemCell {
    pub v: Option<[u64; 2]>,
    pub version: u32,
}

impl SharedCell for MemCell {
    type Token = u32;
    fn load(&mut self) -> Result<(Option<[u64; 2]>, u32), StoreError> {
        Ok((
            self.v,
            token_of(self.v.is_some(), self.version).unwrap_or(0),
        ))
    }
    fn store(&mut self, v: [u64; 2], token: u32) -> Result<bool, StoreError> {
        let current = token_of(self.v.is_some(), self.version);
        if !host_writes(current, token) {
            return Ok(false);
        }
        self.v = Some(v);
        self.version += 1;
        Ok(true)
    }
}

/// One variable-size shared value in memory with compare-and-swap, as
/// Envoy's shared data ([`host_writes`]).
#[derive(Debug, Default, Clone)]
pub struct MemBlob {
    pub v: Option<Vec<u8>>,
    pub version: u32,
}

impl SharedBlob for MemBlob {
    type Token = u32;
    fn load(&mut self) -> Result<(Option<Vec<u8>>, u32), StoreError> {
        let token = token_of(self.v.is_some(), self.version).unwrap_or(0);
        Ok((self.v.clone(), token))
    }
    fn store(&mut self, value: &[u8], token: u32) -> Result<bool, StoreError> {
        if !host_writes(token_of(self.v.is_some(), self.version), token) {
            return Ok(false);
        }
        self.v = Some(value.to_vec());
        self.version += 1;
        Ok(true)
    }
}

/// The cells of a [`MemStore`], with faults to inject.
#[derive(Debug, Default)]
pub struct MemCells {
    pub cells: BTreeMap<CellId, ([u64; 2], u32)>,
    pub blobs: BTreeMap<BlobId, (Vec<u8>, u32)>,
    next_version: u32,
    /// Every load and store fails (the host's shared data is broken).
    pub broken: bool,
    /// The next this-many stores lose their race (another worker wrote first).
    pub lost_races: u32,
    /// Stores no token guarded (the key was missing, or the token was 0),
    /// by cell or blob: where two writers can both win. [`MemCells::configured`]
    /// clears it after the cells created at configure.
    pub unconditional: BTreeMap<String, u32>,
    /// Another worker's writes, landing just before the next write of this
    /// value (so that write loses its race and reads again): to test the
    /// interleavings of two workers step by step ([`MemCells::interleave`]).
    pub before_write: Option<(BlobId, Snapshot)>,
}

/// Every cell and value of a [`MemCells`] at one instant.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub cells: BTreeMap<CellId, ([u64; 2], u32)>,
    pub blobs: BTreeMap<BlobId, (Vec<u8>, u32)>,
}

impl MemCells {
    /// The value of a cell.
    pub fn get(&self, id: CellId) -> Option<[u64; 2]> {
        self.cells.get(&id).map(|(v, _)| *v)
    }

    /// Configure is over: the unguarded writes counted from now on are races.
    pub fn configured(&mut self) {
        self.unconditional.clear();
    }

    /// The unguarded writes since configure (a key table's buckets too:
    /// configure creates them all).
    pub fn unguarded_writes(&self) -> Vec<(String, u32)> {
        self.unconditional
            .iter()
            .map(|(k, n)| (k.clone(), *n))
            .collect()
    }

    /// Every cell and value now.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            cells: self.cells.clone(),
            blobs: self.blobs.clone(),
        }
    }

    /// Puts the cells and values back as `s` had them.
    pub fn restore(&mut self, s: &Snapshot) {
        self.cells = s.cells.clone();
        self.blobs = s.blobs.clone();
    }

    /// `later` (what another worker made of the store) lands just before
    /// the next write of `blob`: every value it changed gets a new version.
    pub fn interleave(&mut self, blob: BlobId, later: Snapshot) {
        self.before_write = Some((blob, later));
    }

    fn land(&mut self, s: Snapshot) {
        for (id, (v, version)) in s.cells {
            if self.cells.get(&id).is_none_or(|(_, now)| *now != version) {
                self.next_version += 1;
                self.cells.insert(id, (v, self.next_version));
            }
        }
        for (id, (v, version)) in s.blobs {
            if self.blobs.get(&id).is_none_or(|(_, now)| *now != version) {
                self.next_version += 1;
                self.blobs.insert(id, (v, self.next_version));
            }
        }
    }

    fn note(&mut self, what: String, current: Option<u32>, token: u32) {
        if current.is_none() || token == 0 {
            *self.unconditional.entry(what).or_default() += 1;
        }
    }
}

/// A [`Store`] in memory: `MemStore(&cells)`.
#[derive(Debug, Clone, Copy)]
pub struct MemStore<'a>(pub &'a RefCell<MemCells>);

impl Store for MemStore<'_> {
    fn load(&self, id: CellId) -> Result<(Option<[u64; 2]>, u32), StoreError> {
        let c = self.0.borrow();
        if c.broken {
            return Err(StoreError(10));
        }
        Ok(match c.cells.get(&id) {
            Some((v, version)) => (Some(*v), *version),
            None => (None, 0),
        })
    }

    fn store(&self, id: CellId, value: [u64; 2], token: u32) -> Result<bool, StoreError> {
        let mut c = self.0.borrow_mut();
        if c.broken {
            return Err(StoreError(10));
        }
        if c.lost_races > 0 {
            c.lost_races -= 1;
            return Ok(false);
        }
        let current = c.cells.get(&id).map(|(_, v)| *v);
        if !host_writes(current, token) {
            return Ok(false);
        }
        c.note(format!("{id:?}"), current, token);
        c.next_version += 1;
        let version = c.next_version;
        c.cells.insert(id, (value, version));
        Ok(true)
    }

    fn load_blob(&self, id: BlobId) -> Result<(Option<Vec<u8>>, u32), StoreError> {
        let c = self.0.borrow();
        if c.broken {
            return Err(StoreError(10));
        }
        Ok(match c.blobs.get(&id) {
            Some((v, version)) => (Some(v.clone()), *version),
            None => (None, 0),
        })
    }

    fn store_blob(&self, id: BlobId, value: &[u8], token: u32) -> Result<bool, StoreError> {
        let mut c = self.0.borrow_mut();
        if c.broken {
            return Err(StoreError(10));
        }
        if c.before_write.as_ref().is_some_and(|(b, _)| *b == id) {
            if let Some((_, later)) = c.before_write.take() {
                c.land(later);
            }
        }
        let current = c.blobs.get(&id).map(|(_, v)| *v);
        if !host_writes(current, token) {
            return Ok(false);
        }
        c.note(format!("{id:?}"), current, token);
        c.next_version += 1;
        let version = c.next_version;
        c.blobs.insert(id, (value.to_vec(), version));
        Ok(true)
    }
}

/// How far a simulated host's monotonic clock runs behind the true time:
/// Envoy's steady clock counts from boot, not from 1970, so code that mixes
/// it with the wall clock fails in a simulation as it would in Envoy.
pub const MONO_BEHIND_NS: u64 = 1_700_000_000 * crate::clock::NS_PER_S;

/// A simulated host's clocks at true time `t`, its wall clock `skew_ns` off
/// the true time and its monotonic clock [`MONO_BEHIND_NS`] behind it.
pub fn host_clocks(t: u64, skew_ns: i64) -> crate::clock::Fixed {
    crate::clock::Fixed {
        mono: t.saturating_sub(MONO_BEHIND_NS),
        wall: t.saturating_add_signed(skew_ns),
    }
}
