//! Test support: an in-memory [`SharedCell`] with compare-and-swap.

use crate::schedule::{SharedCell, StoreError};

/// One shared cell in memory; `store` fails when the token is stale.
#[derive(Default)]
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
