//! The process-wide cells the decisions read and update, by identity. The
//! glue maps each [`CellId`] to a proxy-wasm shared-data key; tests use
//! `testing::MemStore` (feature `testing`).

use crate::cluster::SharedBlob;
use crate::schedule::{KeyTable, SharedCell, StoreError};

/// Which shared cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CellId {
    /// A rule's unkeyed rate schedule (`[0, tat]`).
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
}

/// Which shared variable-size value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BlobId {
    /// Cluster scope: a rule's grants (mode and owned slot ranges).
    Grants(usize),
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
