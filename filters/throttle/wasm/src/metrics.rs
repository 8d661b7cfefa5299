//! The filter's metrics, one set per rule (bounded cardinality: rule names,
//! never request data). Envoy exposes them as `wasmcustom.throttle.rule.<rule>.<stat>`;
//! with the `throttle_rule` tag extractor of `envoy/` they become Prometheus
//! series such as `throttle_admitted{throttle_rule="default"}`.

use throttle_core::stats;

use crate::host::{define_metric, increment_metric, record_metric, MetricType};

/// Metric ids of one rule (None where the host refused the definition).
#[derive(Debug, Default)]
pub struct RuleMetrics {
    /// Requests within the rate, continued at once.
    pub admitted: Option<u32>,
    /// Requests held for later release.
    pub queued: Option<u32>,
    /// Held requests resumed at their turn.
    pub released: Option<u32>,
    /// Requests answered at once with the reject status.
    pub rejected: Option<u32>,
    /// Held requests whose client went away before their turn.
    pub cancelled: Option<u32>,
    /// Held requests whose stream was gone when their turn came.
    pub gone: Option<u32>,
    /// Requests rejected because the shared schedule could not be updated.
    pub contention: Option<u32>,
    /// Dry-run: requests that would have been held.
    pub would_queue: Option<u32>,
    /// Dry-run: requests that would have been rejected.
    pub would_reject: Option<u32>,
    /// Concurrency mode: requests in flight to the upstream now (gauge).
    pub in_flight: Option<u32>,
    /// Requests held now (gauge, summed over workers).
    pub held: Option<u32>,
    /// Time released requests were held, in milliseconds (histogram).
    pub wait_ms: Option<u32>,
}

impl RuleMetrics {
    /// Defines the metrics of rule `name`.
    pub fn define(name: &str) -> Self {
        let m = |kind, stat: &str| define_metric(kind, &format!("throttle.rule.{name}.{stat}"));
        RuleMetrics {
            admitted: m(MetricType::Counter, stats::ADMITTED),
            queued: m(MetricType::Counter, stats::QUEUED),
            released: m(MetricType::Counter, stats::RELEASED),
            rejected: m(MetricType::Counter, stats::REJECTED),
            cancelled: m(MetricType::Counter, stats::CANCELLED),
            gone: m(MetricType::Counter, stats::GONE),
            contention: m(MetricType::Counter, stats::CONTENTION),
            would_queue: m(MetricType::Counter, stats::WOULD_QUEUE),
            would_reject: m(MetricType::Counter, stats::WOULD_REJECT),
            in_flight: m(MetricType::Gauge, stats::IN_FLIGHT),
            held: m(MetricType::Gauge, stats::HELD),
            wait_ms: m(MetricType::Histogram, stats::WAIT_MS),
        }
    }

    /// Counts one event.
    pub fn inc(id: Option<u32>) {
        increment_metric(id, 1);
    }

    /// Adds to a counter or gauge.
    pub fn add(id: Option<u32>, delta: i64) {
        increment_metric(id, delta);
    }

    /// One request started being held.
    pub fn on_hold(&self) {
        increment_metric(self.queued, 1);
        increment_metric(self.held, 1);
    }

    /// One held request left the queue (released, cancelled or gone).
    pub fn on_unhold(&self) {
        increment_metric(self.held, -1);
    }

    /// Records a released request's wait.
    pub fn record_wait(&self, wait_ns: u64) {
        record_metric(self.wait_ms, wait_ns / throttle_core::NS_PER_MS);
    }
}
