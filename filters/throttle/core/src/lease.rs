//! Which VM of a process does a process-wide job (calls the engine, learns
//! a rate): a lease in one shared cell `[holder, until]`
//! ([`crate::store::CellId::Caller`], `Learner`), renewed by its holder on
//! each of its ticks and taken over by another VM once it lapses (the
//! holder's VM went away, or stopped ticking).

use crate::clock::NS_PER_MS;
use crate::store::{SharedCell, MAX_CAS_ATTEMPTS};

/// How long the lease lasts without renewal (its holder renews it on every
/// tick: every few ms while it holds requests, else every 20 ms).
pub const LEASE_NS: u64 = 300 * NS_PER_MS;

/// Whether `me` (a VM's token, not 0) holds the lease at monotonic `now`:
/// renews it, or takes it if nobody holds it or its holder's lapsed. False
/// also if the cell cannot be read or updated (nobody calls rather than two).
pub fn hold<C: SharedCell>(cell: &mut C, me: u64, now: u64) -> bool {
    for _ in 0..MAX_CAS_ATTEMPTS {
        let Ok((value, token)) = cell.load() else {
            return false;
        };
        let [holder, until] = value.unwrap_or([0, 0]);
        if holder != me && holder != 0 && until > now {
            return false;
        }
        match cell.store([me, now.saturating_add(LEASE_NS)], token) {
            Ok(true) => return true,
            Ok(false) => continue,
            Err(_) => return false,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::MemCell;

    #[test]
    fn one_holder_until_it_lapses() {
        let mut cell = MemCell::default();
        assert!(hold(&mut cell, 7, 1000), "free: taken");
        assert_eq!(cell.v, Some([7, 1000 + LEASE_NS]));
        assert!(!hold(&mut cell, 9, 1000 + LEASE_NS - 1), "held by 7");
        assert!(hold(&mut cell, 7, 1000 + 100), "renewed by its holder");
        assert_eq!(cell.v, Some([7, 1100 + LEASE_NS]));
        assert!(!hold(&mut cell, 9, 1100 + LEASE_NS - 1));
        assert!(hold(&mut cell, 9, 1100 + LEASE_NS), "lapsed: taken over");
        assert!(!hold(&mut cell, 7, 1100 + LEASE_NS + 1), "7 lost it");
    }

    /// A cell that fails, or whose value another VM always changes first.
    struct Flaky {
        fail: bool,
    }

    impl SharedCell for Flaky {
        type Token = u32;
        fn load(&mut self) -> Result<(Option<[u64; 2]>, u32), crate::store::StoreError> {
            if self.fail {
                return Err(crate::store::StoreError(1));
            }
            Ok((None, 0))
        }
        fn store(&mut self, _: [u64; 2], _: u32) -> Result<bool, crate::store::StoreError> {
            Ok(false)
        }
    }

    #[test]
    fn a_broken_or_endlessly_raced_cell_means_nobody_calls() {
        assert!(!hold(&mut Flaky { fail: true }, 7, 0));
        assert!(!hold(&mut Flaky { fail: false }, 7, 0));
    }
}
