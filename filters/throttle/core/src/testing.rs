//! Test support: an in-memory [`SharedCell`] with compare-and-swap.

pub use crate::cluster::sim::MemCell;
