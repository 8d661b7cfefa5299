//! Stage: the rule's rate schedule in this process (per key if keyed, each
//! key within its quota with `key_quota`), and the rate-limit headers it
//! leaves for the response.

use crate::adaptive::{deadline::deadline_ns, Mode};
use crate::config::{Config, Rule};
use crate::keys::candidates;
use crate::matcher::{Facts, Request};
use crate::ratelimit::{self, HeaderStyle};
use crate::schedule::{admit_keyed, admit_paced, admit_with_quota_paced, Admission};
use crate::store::{CellId, Store};

use super::{Ctx, Outcome};

/// What the rate stage left for the response's rate-limit headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Seen {
    /// The schedule after this request (or as it stood, if rejected).
    tat: u64,
    rejected: bool,
}

/// Admits one request on the rule's schedule (Go for a rule without `rate`).
/// An adaptive rule in enforce mode paces at the learned interval (in its
/// shared cell) and answers at once a request whose turn lies beyond its own
/// deadline; its deadline headers are read only when it would be held.
pub(super) fn admit_rate<S: Store, R: Request>(
    cx: &Ctx<'_, S>,
    req: &mut Facts<R>,
) -> (Outcome, Option<Seen>) {
    let rule = cx.rule;
    let Some(schedule) = rule.schedule.as_ref() else {
        return (Outcome::Go, None);
    };
    let (store, index, now, can_hold) = (cx.env.store, cx.index, cx.now, cx.can_hold);
    let learned = rule.adaptive.is_some_and(|a| a.mode == Mode::Enforce);
    let key = rule.key.as_ref().and_then(|k| k.extract(req));
    let admission = match (key, &rule.quota) {
        // Fairness: the shared schedule decides, each key within its quota
        // (requests without a key value count as one key).
        (key, Some(quota)) => {
            let fp = cx.key_fingerprint(key.as_deref());
            admit_with_quota_paced(
                &mut store.cell(CellId::Rate(index)),
                &mut store.table(index),
                fp,
                candidates(fp, rule.key_slots),
                (schedule, learned),
                quota,
                now,
                can_hold,
            )
        }
        (Some(value), None) => {
            let fp = cx.key_fingerprint(Some(&value));
            admit_keyed(
                &mut store.table(index),
                fp,
                candidates(fp, rule.key_slots),
                schedule,
                now,
                can_hold,
            )
        }
        (None, None) => {
            let mut deadline = || {
                if !learned {
                    return None;
                }
                let raw = req.raw();
                let envoy = raw.header("x-envoy-expected-rq-timeout-ms");
                let grpc = raw.header("grpc-timeout");
                deadline_ns(envoy.as_deref(), grpc.as_deref())
            };
            admit_paced(
                &mut store.cell(CellId::Rate(index)),
                schedule,
                learned,
                now,
                can_hold,
                &mut deadline,
            )
        }
    };
    outcome(admission)
}

/// An admission on a schedule as a stage's outcome, with what it leaves
/// for the rate-limit headers.
pub(super) fn outcome(admission: Admission) -> (Outcome, Option<Seen>) {
    let seen = |tat, rejected| Some(Seen { tat, rejected });
    match admission {
        Admission::Now { tat } => (Outcome::Go, seen(tat, false)),
        Admission::Hold { release_at, tat } => {
            (Outcome::Hold { until: release_at }, seen(tat, false))
        }
        Admission::Reject {
            retry_after_s, tat, ..
        } => (Outcome::Reject { retry_after_s }, seen(tat, true)),
        Admission::Contention => (Outcome::Contention, None),
    }
}

impl Seen {
    /// What a stage that is not the rate's leaves: the schedule at `tat`.
    pub(super) fn new(tat: u64, rejected: bool) -> Seen {
        Seen { tat, rejected }
    }

    /// The rate-limit headers of this request at `now` (none for dry-run
    /// rules unless clients see dry runs).
    pub(super) fn headers(
        &self,
        config: &Config,
        rule: &Rule,
        now: u64,
    ) -> Vec<(&'static str, String)> {
        let (Some(s), Some(w)) = (&rule.schedule, rule.rate_window) else {
            return Vec::new();
        };
        if config.rate_limit_headers == HeaderStyle::Off
            || (rule.dry_run && !config.dry_run_headers)
        {
            return Vec::new();
        }
        let remaining = if self.rejected && !rule.dry_run {
            0
        } else {
            ratelimit::remaining(s, w, self.tat, now)
        };
        let reset = ratelimit::reset_s(self.tat, now);
        ratelimit::headers(config.rate_limit_headers, &rule.name, w, remaining, reset)
    }
}
