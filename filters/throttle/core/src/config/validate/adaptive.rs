//! The `adaptive` block of a rule: bounds, mode, and the combinations it
//! refuses.

use serde_json::{Map, Value};

use super::{join, spec, Validator};
use crate::config::adaptive::{Mode, Settings};
use crate::units::{parse_rate, rate_for_people};

impl Validator {
    /// `adaptive` at `path` in the rule `rule`, whose `rate` has this
    /// interval. None (with errors reported) if anything is wrong.
    pub(super) fn adaptive(
        &mut self,
        path: &str,
        value: &Value,
        rule: &Map<String, Value>,
        rate_interval_ns: Option<u64>,
    ) -> Option<Settings> {
        let obj = self.object(path, value, spec::ADAPTIVE_FIELDS)?;
        let before = self.errors.len();
        let bound = |v: &mut Validator, f: &spec::Field, what: &str| {
            let value = v.get(path, obj, f, what)?;
            parse_rate(value)
                .map(|(interval, _)| interval)
                .map_err(|e| v.error(&join(path, f.name), e))
                .ok()
        };
        // A lower rate is a longer interval.
        let min_rate = bound(
            self,
            &spec::ADAPTIVE_MIN_RATE,
            "the lowest rate it may learn",
        );
        let max_rate = bound(
            self,
            &spec::ADAPTIVE_MAX_RATE,
            "the highest rate it may learn",
        );
        let mode = self.one_of(path, obj, &spec::ADAPTIVE_MODE, "enforce");
        if let (Some(lo), Some(hi)) = (min_rate, max_rate) {
            if lo < hi {
                self.error(&join(path, "min_rate"), "must not exceed `max_rate`");
            }
        }
        match rate_interval_ns {
            None => self.error(
                path,
                "requires `rate` (the rate it starts at, before anything is learned)",
            ),
            Some(rate) => {
                if min_rate.is_some_and(|lo| lo < rate) {
                    self.error(
                        &join(path, "min_rate"),
                        "must not exceed `rate` (the rate it starts at lies within its bounds)",
                    );
                }
                // A lower rate is a longer interval: min_rate below 1% of rate.
                if let Some(lo) = min_rate.filter(|lo| *lo / 100 > rate) {
                    self.error(
                        &join(path, "min_rate"),
                        format!(
                            "must be at least 1% of `rate` ({}), got {}: a floor the learner would take minutes to climb back from, with few answers to learn from at that rate; set it to what the service must always get",
                            rate_for_people(rate),
                            rate_for_people(lo)
                        ),
                    );
                }
                if max_rate.is_some_and(|hi| hi > rate) {
                    self.error(
                        &join(path, "max_rate"),
                        "must not be below `rate` (the rate it starts at lies within its bounds)",
                    );
                }
            }
        }
        let has = |f: &spec::Field| rule.contains_key(f.name);
        if has(&spec::KEY) && !has(&spec::KEY_QUOTA) {
            self.error(
                path,
                "cannot be combined with `key` without `key_quota` (the learned rate is the upstream's, one for all keys: add `key_quota` to share it fairly among them)",
            );
        }
        if rule.get(spec::SCOPE.name).and_then(Value::as_str) == Some("cluster") {
            self.error(
                path,
                "cannot be combined with `scope: \"cluster\"` (one learned rate for a fleet needs every proxy's answers in one place; on a sidecar's inbound side, where it belongs, the process scope already covers the one replica behind it)",
            );
        }
        if self.errors.len() != before {
            return None;
        }
        Some(Settings {
            // The highest rate has the shortest interval.
            min_interval_ns: max_rate?,
            max_interval_ns: min_rate?,
            mode: if mode? == "observe" {
                Mode::Observe
            } else {
                Mode::Enforce
            },
        })
    }
}
