//! The engine behind cluster scope, as one seam in the shape of Envoy's
//! `filters/common/ratelimit/ratelimit.h` `Client`: the caller plans
//! engine-neutral [`Claim`]s (add to, or look at, one counter of one rule's
//! epoch); an [`Engine`] builds the HTTP request that makes them and reads
//! the answer into one [`Counted`] per claim, or a typed [`Failure`]. The
//! glue only sends the request as given and hands back the status and body.
//!
//! Today's one implementation is envoyproxy/ratelimit's `POST /json`
//! ([`super::wire::RatelimitJson`]). Another engine is one file beside it
//! and a line in [`super::engine()`]; what an engine answers beyond the
//! counters (member counts, its clock) goes in [`Counted`], which only the
//! core reads.

use std::fmt::Debug;

/// The three counters a rule keeps per epoch (engine/config/throttle.yaml).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    /// Positions claimed on one epoch of the rule's grid.
    Slots,
    /// Proxies with demand for the rule in one epoch.
    Members,
    /// Their demand (arrivals per epoch) added up.
    Demand,
}

/// One claim of a call: add `hits` (0: only look) to one counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The caller's index of the rule.
    pub rule: usize,
    pub counter: Counter,
    /// The counter's name: `<rule>:<T>:<L>:<epoch>` ([`super::Grid::counter_key`]).
    pub key: String,
    pub hits: u64,
}

/// One claim's answer: the counter after the add.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counted {
    /// The counter after this claim's add.
    pub after: u64,
    /// Seconds until the engine's counting window ends (its hour).
    pub reset_s: u64,
}

/// Why a call gave nothing usable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// No answer: connection refused or reset, no healthy host, cluster missing.
    Transport,
    /// No answer within `engine.timeout`.
    Timeout,
    /// An HTTP status other than 200 (400: Redis down or bad request; 429: a
    /// counter over the limit; 500: the service failed).
    Status(u16),
    /// The engine answers, but not for our counters: no limit matches them
    /// (another domain, or a configuration without the throttle's
    /// descriptors), another unit than an hour, a limit too small.
    Config(String),
    /// The engine's clock is not ours (its hour ends at another time).
    Clock(String),
    /// Counters went back: the engine lost them (Redis restarted empty).
    Lost(String),
    /// Anything else that makes no sense for our counters.
    Nonsense(String),
}

impl Failure {
    /// Every kind, in the order of [`Failure::index`].
    pub const KINDS: [&'static str; 7] = [
        "transport",
        "timeout",
        "status",
        "config",
        "clock",
        "lost",
        "nonsense",
    ];

    /// A short label for logs and metrics.
    pub fn kind(&self) -> &'static str {
        Self::KINDS.get(self.index()).copied().unwrap_or("nonsense")
    }

    /// The kind's place in [`Failure::KINDS`].
    pub fn index(&self) -> usize {
        match self {
            Failure::Transport => 0,
            Failure::Timeout => 1,
            Failure::Status(_) => 2,
            Failure::Config(_) => 3,
            Failure::Clock(_) => 4,
            Failure::Lost(_) => 5,
            Failure::Nonsense(_) => 6,
        }
    }

    /// What happened, and what usually fixes it, for the log. `cluster` and
    /// `domain`: the configuration's `engine` block.
    pub fn explain(&self, cluster: &str, domain: &str) -> String {
        match self {
            Failure::Transport => format!(
                "no answer from the engine's cluster {cluster:?} (connection refused or reset, no healthy endpoint): is the rate limit service running and is {cluster:?} its Envoy cluster?"
            ),
            Failure::Timeout => "no answer within engine.timeout: the rate limit service (or its Redis) is overloaded or far; keep its p99 well under engine.timeout, or raise it".into(),
            Failure::Status(400) => "HTTP 400 from the rate limit service: its Redis is down or unreachable (or it refused the request)".into(),
            Failure::Status(code) => format!("HTTP {code} from the rate limit service"),
            Failure::Config(why) => format!(
                "{why}: the rate limit service's configuration must have domain {domain:?} with the descriptors throttle_slots, throttle_members and throttle_demand, unit: hour (engine/config/throttle.yaml)"
            ),
            Failure::Clock(why) => format!("{why}: set every proxy's and the service's clock by NTP"),
            Failure::Lost(why) => format!("{why}: run Redis with persistence, or accept a short excess after each loss"),
            Failure::Nonsense(why) => format!("an answer that makes no sense: {why}"),
        }
    }
}

/// An HTTP request to the engine's Envoy cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Every header, the pseudo-headers (`:method`, `:path`, `:authority`) included.
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

impl Request {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A rate limit engine: how claims travel to it and how its answers read.
pub trait Engine: Debug + Send + Sync {
    /// The request that makes `claims`, in order.
    fn request(&self, claims: &[Claim]) -> Request;
    /// Its answer (`status`, `body`) to the request of `claims`: one
    /// [`Counted`] per claim, in order, or why not. Strict: anything
    /// unexpected is a [`Failure`], never a guess.
    fn read(&self, status: u16, body: &[u8], claims: &[Claim]) -> Result<Vec<Counted>, Failure>;
}
