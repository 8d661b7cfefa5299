//! What the root context hands to every HTTP context: the validated
//! configuration, its key hasher, its metrics, and where its shared values
//! live.

use throttle_core::keys::KeyHasher;
use throttle_core::Config;

use crate::host::Host;
use crate::metrics::Metrics;
use crate::shared::{Keys, SharedStore};

/// A validated configuration with its runtime handles.
pub struct Plugin {
    pub config: Config,
    pub hasher: KeyHasher,
    pub metrics: Metrics,
    /// A hash of the configuration's bytes: names its caller lease.
    pub config_hash: u64,
    /// Its rule cells' shared-data keys, built once.
    pub keys: Keys,
}

impl Plugin {
    /// Defines the rules' metrics.
    pub fn new<H: Host>(host: H, config: Config, seed: (u64, u64), config_hash: u64) -> Self {
        Plugin {
            metrics: Metrics::new(host, &config),
            keys: Keys::new(&config),
            config,
            hasher: KeyHasher::new(seed),
            config_hash,
        }
    }

    /// The configuration's cells in the host's shared data.
    pub fn store<H: Host>(&self, host: H) -> SharedStore<'_, H> {
        SharedStore {
            host,
            config: &self.config,
            config_hash: self.config_hash,
            keys: &self.keys,
        }
    }
}
