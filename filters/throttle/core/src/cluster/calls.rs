//! One VM's calling side of cluster scope, all of it but the I/O: the
//! caller lease (one calling VM per process, [`crate::lease`]), the facts
//! a tick reads, the [`Caller`]'s plan and the engine's request to send,
//! what answers grant published into shared data ([`super::publish`]), and
//! the caller's statistics as counts. The glue sends the request and hands
//! back the answer; the simulation does the same in memory.

use crate::clock::{Clock, NS_PER_MS, NS_PER_S};
use crate::config::Config;
use crate::lease;
use crate::stats::{Counts, Stat};
use crate::store::{BlobId, CellId, Store};

use super::caller::{Call, Caller, RuleFacts, RuleStats, RuleUpdate};
use super::engine::Failure;
use super::{
    fallback_after_grants, publish, repay, reset_grants, rule_reach, rule_spec, shift_grants, Mode,
    Reach,
};
use super::{forgive, owned_this_epoch, set_gap, Ahead, Cursor};

/// The process-wide value of a rule's counter (`rule`: the configuration's
/// index), as the host keeps it: the flushed counts of every VM.
pub type Totals<'a> = &'a dyn Fn(usize, Stat) -> u64;

/// What the glue carries out after a tick or an answer.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Effects {
    /// The call to send now.
    pub call: Option<Call>,
    /// Statistics to move, by the configuration's rule index.
    pub counts: Vec<(usize, Counts)>,
    /// What went wrong, for the log (at warn).
    pub problems: Vec<String>,
    /// What was published (by caller rule index): for observation, such as
    /// the simulation's record of every range granted.
    pub published: Vec<RuleUpdate>,
}

impl Effects {
    fn count(&mut self, rule: usize, counts: Counts) {
        match self.counts.iter_mut().find(|(r, _)| *r == rule) {
            Some((_, c)) => c.merge(&counts),
            None => self.counts.push((rule, counts)),
        }
    }
}

/// The calling side of one configuration in one VM.
#[derive(Debug, Clone)]
pub struct Calls {
    caller: Caller,
    /// The configuration's index of each of the caller's rules.
    rules: Vec<usize>,
    /// What each caller rule's requests may reach on the grid.
    reaches: Vec<Reach>,
    /// This VM's lease token (never 0).
    me: u64,
    /// Statistics last reported, per caller rule.
    reported: Vec<RuleStats>,
}

impl Calls {
    /// The calling side of `config`, if it has cluster rules and an engine.
    /// `me`: this VM's lease token; `phase_permille`: its call phase
    /// ([`Caller::with_phase`]).
    pub fn new(config: &Config, me: u64, phase_permille: u64) -> Option<Calls> {
        let engine = config.engine.as_ref()?;
        let mut rules = Vec::new();
        let mut reaches = Vec::new();
        let mut specs = Vec::new();
        for (i, r) in config.rules.iter().enumerate() {
            if let (Some(spec), Some(reach)) = (rule_spec(r), rule_reach(r)) {
                rules.push(i);
                reaches.push(reach);
                specs.push(spec);
            }
        }
        if rules.is_empty() {
            return None;
        }
        Some(Calls {
            caller: Caller::new(engine, specs).with_phase(phase_permille),
            reported: vec![RuleStats::default(); rules.len()],
            rules,
            reaches,
            me: me.max(1),
        })
    }

    /// The caller (its statistics, whether a call is in flight).
    pub fn caller(&self) -> &Caller {
        &self.caller
    }

    /// The configuration's index of caller rule `i`.
    pub fn rule_index(&self, i: usize) -> Option<usize> {
        self.rules.get(i).copied()
    }

    /// One tick of this VM: if it holds the lease (monotonic clock), read
    /// the rules' facts, let the caller plan (wall clock), publish what
    /// changed, and return the call to send. The clock is read only as far
    /// as needed (a VM without the lease reads the monotonic clock alone).
    pub fn on_tick<S: Store>(
        &mut self,
        store: S,
        clock: &mut impl Clock,
        totals: Totals<'_>,
    ) -> Effects {
        let mut out = Effects::default();
        if !lease::hold(&mut store.cell(CellId::Caller), self.me, clock.mono()) {
            return out;
        }
        let (mono, now) = (clock.mono(), clock.wall());
        let facts: Vec<RuleFacts> = self
            .rules
            .iter()
            .zip(&self.reaches)
            .enumerate()
            .map(|(ci, (&i, reach))| {
                // The cursor counts the waiters of the rule's line or
                // classes (as of the last tick; a dry-run rule's tickets,
                // which wait without their requests, too); the `held` gauge
                // the requests held now. Until issue 29 only the first was
                // read, and without an enforced rule's classes: a proxy
                // whose arrivals stopped claimed nothing for its held class
                // requests; until issue 30 a dry-run class rule claimed as
                // if nobody waited.
                let cursor = store
                    .load(CellId::Cursor(i))
                    .map_or(Cursor::default(), |(v, _)| Cursor::decode(v));
                let waiting = cursor.waiting.max(totals(i, Stat::Held));
                RuleFacts {
                    arrived_total: totals(i, Stat::Requests),
                    waiting,
                    owed: store
                        .load(CellId::Ahead(i))
                        .map_or(0, |(v, _)| Ahead::decode(v).owed),
                    // Read only while requests wait, on the ticks that
                    // may plan a claim (the grants blob is the costly
                    // read): they take these slots first.
                    owned_soon: if waiting > 0 && self.caller.may_plan(now, ci) {
                        owned_this_epoch(
                            &mut store.blob(BlobId::Grants(i)),
                            reach,
                            cursor.next,
                            now,
                        )
                    } else {
                        0
                    },
                }
            })
            .collect();
        let (call, updates) = self.caller.tick(now, &facts);
        out.problems.extend(self.caller.take_events());
        self.forgive(store, now, &mut out);
        self.publish(store, mono, now, &updates, totals, &mut out);
        for (i, fact) in facts.iter().enumerate() {
            if fact.owed > 0 {
                self.repay(store, i, now, &mut out);
            }
        }
        out.call = call;
        out.published = updates;
        self.report(now, &mut out);
        out
    }

    /// The answer to the call in flight, now: `(status, body)`, or the
    /// failure the host reported (it refused to send the call, no answer, a
    /// timeout).
    pub fn on_answer<S: Store>(
        &mut self,
        store: S,
        clock: &mut impl Clock,
        answer: Result<(u16, &[u8]), Failure>,
        totals: Totals<'_>,
    ) -> Effects {
        let mut out = Effects::default();
        let (mono, now) = (clock.mono(), clock.wall());
        let updates = self.caller.on_answer(now, answer);
        out.problems.extend(self.caller.take_events());
        self.forgive(store, now, &mut out);
        self.publish(store, mono, now, &updates, totals, &mut out);
        for u in &updates {
            if u.mode == Mode::Grid && !u.ranges.is_empty() {
                self.repay(store, u.rule, now, &mut out);
            }
        }
        out.published = updates;
        self.report(now, &mut out);
        out
    }

    /// Writes each update into its rule's grants; `slots_unused` = granted -
    /// taken - still usable.
    fn publish<S: Store>(
        &self,
        store: S,
        mono: u64,
        now: u64,
        updates: &[RuleUpdate],
        totals: Totals<'_>,
        out: &mut Effects,
    ) {
        for u in updates {
            let (Some(&index), Some(reach)) = (self.rules.get(u.rule), self.reaches.get(u.rule))
            else {
                continue;
            };
            if u.shift != 0 {
                let shifted = shift_grants(
                    &mut store.blob(BlobId::Grants(index)),
                    &mut store.cell(CellId::Cursor(index)),
                    u.shift,
                );
                if shifted.is_err() {
                    out.problems.push(format!(
                        "rule {index}: could not move its grants in shared data"
                    ));
                }
            }
            if u.reset {
                let reset = reset_grants(
                    &mut store.blob(BlobId::Grants(index)),
                    &mut store.cell(CellId::Cursor(index)),
                );
                if reset.is_err() {
                    out.problems.push(format!(
                        "rule {index}: could not drop its grants in shared data"
                    ));
                }
            }
            let usable = publish(
                &mut store.blob(BlobId::Grants(index)),
                &mut store.cell(CellId::Cursor(index)),
                reach,
                now,
                u.mode,
                (u.grant_rate_per_s, u.lead_ns, u.spare_per_s),
                &u.ranges,
            );
            let gap_ns = match u.grant_rate_per_s {
                0 => 0,
                rate => (NS_PER_S / rate).max(reach.grid.interval_ns),
            };
            if set_gap(&mut store.cell(CellId::Ahead(index)), gap_ns).is_err() {
                out.problems.push(format!(
                    "rule {index}: could not record its slot gap in shared data"
                ));
            }
            match usable {
                Ok(usable) => {
                    let granted = self.caller.stats(u.rule).map_or(0, |s| s.granted);
                    let taken = totals(index, Stat::SlotsTaken);
                    let mut c = Counts::NONE;
                    c.record(
                        Stat::SlotsUnused,
                        granted.saturating_sub(taken).saturating_sub(usable),
                    );
                    out.count(index, c);
                }
                Err(_) => out.problems.push(format!(
                    "rule {index}: could not publish grants to shared data"
                )),
            }
            if matches!(u.mode, Mode::Local { .. }) && u.ranges.is_empty() {
                let started = fallback_after_grants(
                    &mut store.cell(CellId::Fallback(index)),
                    &mut store.blob(BlobId::Grants(index)),
                    reach,
                    mono,
                    now,
                );
                if started.is_err() {
                    out.problems.push(format!(
                        "rule {index}: could not start the fallback schedule after the grants"
                    ));
                }
            }
        }
    }

    /// Forgives each rule the share its failed calls claimed ([`forgive`]),
    /// until `max_queue_delay` after the epoch the share was for.
    fn forgive<S: Store>(&mut self, store: S, now: u64, out: &mut Effects) {
        for f in self.caller.take_forgiven() {
            let (Some(&index), Some(reach)) = (self.rules.get(f.rule), self.reaches.get(f.rule))
            else {
                continue;
            };
            let until = f.epoch_end.saturating_add(reach.max_delay_ns);
            if forgive(
                &mut store.cell(CellId::Forgiven(index)),
                f.slots,
                until,
                now,
            )
            .is_err()
            {
                out.problems.push(format!(
                    "rule {index}: could not forgive the slots of a failed call in shared data"
                ));
            }
        }
    }

    /// Repays what caller rule `i`'s requests took on credit, from its
    /// earliest slots ([`repay`]).
    fn repay<S: Store>(&self, store: S, i: usize, now: u64, out: &mut Effects) {
        let (Some(&index), Some(reach)) = (self.rules.get(i), self.reaches.get(i)) else {
            return;
        };
        let repaid = repay(
            &mut store.cell(CellId::Cursor(index)),
            &mut store.blob(BlobId::Grants(index)),
            &mut store.cell(CellId::Ahead(index)),
            reach,
            now,
        );
        if repaid.is_err() {
            out.problems.push(format!(
                "rule {index}: could not repay its credit in shared data"
            ));
        }
    }

    /// The caller's counters since the last report, and the time in fallback.
    fn report(&mut self, now: u64, out: &mut Effects) {
        for (i, &index) in self.rules.iter().enumerate() {
            let (Some(stats), Some(last)) = (self.caller.stats(i), self.reported.get_mut(i)) else {
                continue;
            };
            let mut c = Counts::NONE;
            for (stat, new, old) in [
                (Stat::EngineCalls, stats.calls, last.calls),
                (Stat::EngineFailures, stats.failures, last.failures),
                (Stat::SlotsGranted, stats.granted, last.granted),
                (Stat::GridMismatch, stats.mismatch, last.mismatch),
            ] {
                c.add(
                    stat,
                    i32::try_from(new.saturating_sub(old)).unwrap_or(i32::MAX),
                );
            }
            for ((stat, new), old) in Stat::FAILURES.iter().zip(stats.failed).zip(last.failed) {
                c.add(
                    *stat,
                    i32::try_from(new.saturating_sub(old)).unwrap_or(i32::MAX),
                );
            }
            c.record(Stat::FallbackMs, stats.fallback_total_ns(now) / NS_PER_MS);
            c.record(Stat::ClockOffsetMs, stats.clock_offset_ms);
            out.count(index, c);
            *last = stats;
        }
    }
}
