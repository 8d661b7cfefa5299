//! Test support, shared by the unit tests, the property tests, the glue's
//! tests and the cluster simulation (feature `testing`): in-memory shared
//! cells and values with compare-and-swap.

use std::cell::RefCell;
use std::collections::BTreeMap;

use crate::store::{BlobId, CellId, SharedBlob, SharedCell, Store, StoreError};

/// One shared cell in memory; `store` fails when the token is stale.
#[derive(Debug, Default, Clone)]
pub struct MemCell {
    pub v: Option<[u64; 2]>,
    pub version: u32,
}

impl SharedCell for MemCell {
    type Token = u32;
    fn load(&mut self) -> Result<(Option<[u64; 2]>, u32), StoreError> {
        Ok((self.v, self.version))
    }
    fn store(&mut self, v: [u64; 2], token: u32) -> Result<bool, StoreError> {
        if token != self.version {
            return Ok(false);
        }
        self.v = Some(v);
        self.version += 1;
        Ok(true)
    }
}

/// One variable-size shared value in memory with compare-and-swap.
#[derive(Debug, Default, Clone)]
pub struct MemBlob {
    pub v: Option<Vec<u8>>,
    pub version: u32,
}

impl SharedBlob for MemBlob {
    type Token = u32;
    fn load(&mut self) -> Result<(Option<Vec<u8>>, u32), StoreError> {
        Ok((self.v.clone(), self.version))
    }
    fn store(&mut self, value: &[u8], token: u32) -> Result<bool, StoreError> {
        if token != self.version {
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
}

impl MemCells {
    /// The value of a cell.
    pub fn get(&self, id: CellId) -> Option<[u64; 2]> {
        self.cells.get(&id).map(|(v, _)| *v)
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
        let current = c.cells.get(&id).map_or(0, |(_, v)| *v);
        if token != current {
            return Ok(false);
        }
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
        let current = c.blobs.get(&id).map_or(0, |(_, v)| *v);
        if token != current {
            return Ok(false);
        }
        c.next_version += 1;
        let version = c.next_version;
        c.blobs.insert(id, (value.to_vec(), version));
        Ok(true)
    }
}
