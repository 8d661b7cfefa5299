//! The calling VM's answers: what a good answer grants (and the checks
//! that catch counters lost, clocks apart, or a service that answers
//! nonsense), and when failures switch the rules to their fallback.

use super::*;

impl Caller {
    /// The answer to the call in flight: `Ok((status, body))`, or the failure
    /// the host reported (transport error, timeout). Returns one update per
    /// rule (new grants, mode) to publish.
    pub fn on_answer(
        &mut self,
        now: u64,
        answer: Result<(u16, &[u8]), Failure>,
    ) -> Vec<RuleUpdate> {
        let Some(call) = self.in_flight.take() else {
            return Vec::new();
        };
        let late = now.saturating_sub(call.sent_at) > self.timeout_ns;
        let counted = answer
            .and_then(|(status, body)| self.engine.read(status, body, &call.claims))
            .and_then(|c| {
                if late && !self.counted_in_its_hour(&call, now) {
                    return Err(Failure::Timeout);
                }
                self.check(&call, &c, now).map(|()| c)
            });
        match counted {
            Ok(c) => self.succeeded(now, &call, &c, late),
            Err(f) => {
                self.in_flight = Some(call);
                self.failed(now, f)
            }
        }
    }

    /// Whether an answer the host delivered after `timeout` was still
    /// counted inside the hour of every counter it claims on: the host
    /// enforces the timeout, so an answer it delivers late was held up here
    /// (the process stalled: the machine, or a pod's CPU quota, with the
    /// answer waiting in the socket), and it was served by `now`. A claim is
    /// sent only while the hour has `max_clock_skew + timeout` left
    /// ([`Grid::may_claim`]), which keeps every answer within the timeout
    /// inside it; a later one is inside it if `now` still has `max_clock_skew`
    /// left of the hour the call was sent in. Until 2026-11-29 every late
    /// answer counted as a timeout, and the slots the service had counted
    /// for it belonged to no proxy (CI: 282 of 300 in the second around a
    /// 47 ms stall of three Envoys, against a 50 ms timeout).
    fn counted_in_its_hour(&self, call: &InFlight, now: u64) -> bool {
        rules_of(&call.plan).into_iter().all(|i| {
            self.rules.get(i).is_some_and(|r| {
                let (sent, now) = (r.fleet_time(call.sent_at), r.fleet_time(now));
                now.saturating_add(self.skew_ns) / WINDOW_NS == sent / WINDOW_NS
            })
        })
    }

    /// Consistency of a parsed answer with what this process knows: the
    /// per-hour call count grows, its own member adds show, slot counters
    /// never go back, and the service's hour is ours.
    fn check(&self, call: &InFlight, counted: &[Counted], now: u64) -> Result<(), Failure> {
        let waited = now.saturating_sub(call.sent_at).max(self.timeout_ns);
        let tolerance = (self.skew_ns + waited).div_ceil(NS_PER_S) + 1;
        for (p, c) in call.plan.iter().zip(counted) {
            let Some(r) = self.rules.get(p.rule) else {
                continue;
            };
            let sent = r.fleet_time(call.sent_at);
            let ours = (WINDOW_NS - sent % WINDOW_NS).div_ceil(NS_PER_S);
            // Counted in the next hour (the service's clock ahead, or ours
            // behind, by more than max_clock_skew) is as wrong as in the
            // last: claims are sent only where every clock within
            // max_clock_skew is in the hour of their epoch, so a counter of
            // that epoch in another hour is one no other proxy counts on.
            // Until 2026-12-01 the next hour passed, and a proxy 1.3 s
            // behind the others took shares of the hour's first epochs by a
            // total only it had counted (fleet sweep --at-hour, seed 2: a
            // slot granted twice).
            if c.reset_s.abs_diff(ours) > tolerance {
                return Err(Failure::Clock(format!(
                    "the service's hour ends in {} s, ours in {ours} s: clocks differ by more than max_clock_skew",
                    c.reset_s
                )));
            }
            let lost = |why: String| {
                Err(Failure::Lost(format!(
                    "{why}: counters were lost (Redis restarted?)"
                )))
            };
            match p.purpose {
                Purpose::Gen => {
                    let hour = sent / WINDOW_NS;
                    if let Some((h, last)) = r.gen {
                        if h == hour && c.after <= last {
                            return lost(format!(
                                "the hour's call count went back from {last} to {}",
                                c.after
                            ));
                        }
                    }
                }
                Purpose::MemberLook if c.after == 0 && r.member_adds.contains(&p.epoch) => {
                    return lost("a member counter this proxy added to reads 0".into());
                }
                Purpose::Share | Purpose::Leftover => {
                    let before = c.after - p.hits;
                    let seen = lookup(&r.seen, p.epoch);
                    if before < seen {
                        return lost(format!("slot counter went back from {seen} to {before}"));
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// A `late` answer (held up here past the timeout) grants its slots
    /// and carries its counts, but is no evidence of the clocks: when the
    /// service read the member counters it looked at is unknown.
    fn succeeded(
        &mut self,
        now: u64,
        call: &InFlight,
        counted: &[Counted],
        late: bool,
    ) -> Vec<RuleUpdate> {
        if let Some(since) = self.failing_since.take() {
            if self.rules.iter().any(|r| r.mode != Mode::Grid) {
                self.events.push(format!(
                    "the engine answers again after {} ms of failures: cluster rules are back on the grid",
                    now.saturating_sub(since) / crate::clock::NS_PER_MS
                ));
            }
        }
        self.warned_at = None;
        if !late {
            if let Some(c) = counted.first() {
                self.service.observe(call.sent_at, now, c.reset_s);
            }
        }
        let mut ranges: Vec<Vec<(u64, u64)>> = vec![Vec::new(); self.rules.len()];
        for (p, c) in call.plan.iter().zip(counted) {
            let Some(r) = self.rules.get_mut(p.rule) else {
                continue;
            };
            let g = r.spec.grid;
            match p.purpose {
                Purpose::Probe(_) | Purpose::Recheck if late => {}
                Purpose::Probe(j) => {
                    let mine = r.own_adds.iter().filter(|&&f| f == p.epoch).count();
                    r.skew.record(j, p.epoch, c.after, mine as u64);
                }
                Purpose::Recheck => {
                    let mine = r.own_adds.iter().filter(|&&f| f == p.epoch).count();
                    r.skew.rechecked(p.epoch, c.after, mine as u64);
                }
                Purpose::Gen => r.gen = Some((r.fleet_time(call.sent_at) / WINDOW_NS, c.after)),
                Purpose::NameAdd | Purpose::GridAdd => {}
                Purpose::NameLook | Purpose::GridLook => {
                    if r.seen_second.0 != p.epoch {
                        r.seen_second = (p.epoch, None, None);
                    }
                    if p.purpose == Purpose::NameLook {
                        r.seen_second.1 = Some(c.after);
                    } else {
                        r.seen_second.2 = Some(c.after);
                    }
                    if let (_, Some(name), Some(grid)) = r.seen_second {
                        if name > grid {
                            r.stats.mismatch += 1;
                            let due = r
                                .mismatch_warned
                                .is_none_or(|t| now.saturating_sub(t) >= WARN_EVERY_NS);
                            if due {
                                r.mismatch_warned = Some(now);
                                self.events.push(format!(
                                    "rule {}: {name} proxies carry a rule of this name, {grid} of them at this rate ({}): the others count on another grid with its own full rate (a rollout of a new rate, or configurations that differ?) (said at most every {} s)",
                                    r.spec.name,
                                    crate::units::rate_for_people(r.spec.grid.interval_ns),
                                    WARN_EVERY_NS / NS_PER_S
                                ));
                            }
                        }
                        r.seen_second = (p.epoch, None, None);
                    }
                }
                Purpose::MemberLook => {
                    r.stats.members = c.after.max(1);
                    r.member_looks.push(r.stats.members);
                    if r.member_looks.len() > MEMBERS_MEMORY {
                        r.member_looks.remove(0);
                    }
                    r.stats.members_recent_max = r.member_looks.iter().copied().max().unwrap_or(1);
                }
                Purpose::DemandLook => {
                    // The fleet's demand, for the spare: an epoch this proxy
                    // sent no add for (it made no call then) lacks its own
                    // demand, and a lone proxy's reads 0, which is not a fleet
                    // without spare (until 2026-11-28 it claimed no spare
                    // then: fleet sweep seed 4). The shares keep the engine's
                    // total: every proxy must compute them from the same one.
                    let own = r
                        .demand_ranges
                        .iter()
                        .find(|&&(f, ..)| f == p.epoch)
                        .map(|&(_, d0, d1)| d1.saturating_sub(d0));
                    let added = own.is_some();
                    r.others_demand = c.after.saturating_sub(own.unwrap_or(0));
                    r.stats.demand = if added {
                        c.after
                    } else {
                        c.after.saturating_add(r.demand)
                    };
                    bump(&mut r.demand_totals, p.epoch, |_| c.after);
                    r.demand_seen = true;
                }
                Purpose::ReferenceLook => {
                    bump(&mut r.demand_totals, p.epoch, |_| c.after);
                    r.reference_read = Some(p.epoch);
                }
                Purpose::MemberAdd => {
                    r.member_adds.push(p.epoch);
                    r.own_adds.push(p.epoch);
                    if r.own_adds.len() > OWN_ADDS_MEMORY {
                        r.own_adds.remove(0);
                    }
                }
                Purpose::DemandAdd => r.demand_ranges.push((p.epoch, c.after - p.hits, c.after)),
                Purpose::Share | Purpose::Leftover => {
                    bump(&mut r.seen, p.epoch, |v| v.max(c.after));
                    let before = (c.after - p.hits).saturating_add(p.base);
                    let end = c.after.saturating_add(p.base).min(g.slots_in(p.epoch));
                    if before < end {
                        let granted = r.grant_positions(p.epoch, before, end);
                        if let Some(list) = ranges.get_mut(p.rule) {
                            list.extend(granted);
                        }
                    }
                }
            }
        }
        for (i, list) in ranges.iter_mut().enumerate() {
            let Some(r) = self.rules.get_mut(i) else {
                continue;
            };
            r.first_answer.get_or_insert(now);
            let keep = share_memory(&r.spec.grid);
            if r.shares.len() > keep {
                r.shares.drain(..r.shares.len() - keep);
            }
            let e = i64::try_from(r.spec.grid.epoch_ns).unwrap_or(i64::MAX);
            let skew = i64::try_from(self.skew_ns).unwrap_or(i64::MAX);
            let vote = r.skew.estimate();
            let decision = self.service.decide(
                vote,
                r.skew.pending_move(),
                r.skew.offset_epochs,
                e,
                skew,
                late,
            );
            if let Decision::Refuse(to) = decision {
                // The others are off the service's clock, not this proxy:
                // they move (see `service_clock`).
                if r.move_refused != Some(to) {
                    r.move_refused = Some(to);
                    self.events.push(format!(
                        "rule {}: the other proxies' clocks are about {} ms {} this proxy's, but the rate limit service's clock agrees with this one: its grid stays, theirs follow it; set the clocks by NTP",
                        r.spec.name,
                        to.saturating_mul(e).unsigned_abs() / crate::clock::NS_PER_MS,
                        if to > 0 { "behind" } else { "ahead of" },
                    ));
                }
                r.skew.restart();
            } else if let Decision::Move { to, by_service } = decision {
                let delta = to - r.skew.offset_epochs;
                r.skew.offset_epochs = r.skew.offset_epochs.saturating_add(delta);
                let ms = r.offset_ns().unsigned_abs() / crate::clock::NS_PER_MS;
                r.stats.clock_offset_ms = ms;
                if let Some(n) = r
                    .stats
                    .failed
                    .get_mut(Failure::Clock(String::new()).index())
                {
                    *n += 1;
                }
                self.events.push(format!(
                    "rule {}: this proxy's clock is about {ms} ms {} {} (max_clock_skew {} ms): its grid now follows theirs; set the clocks by NTP",
                    r.spec.name,
                    if r.skew.offset_epochs > 0 { "ahead of" } else { "behind" },
                    if by_service {
                        "the rate limit service's"
                    } else {
                        "the other proxies' of the rule"
                    },
                    self.skew_ns / crate::clock::NS_PER_MS
                ));
                r.skew.restart();
                // The same fleet slots, at other local times: granted
                // before, and in this answer.
                let shift = r.spec.grid.shift_slots(delta);
                r.shift = r.shift.saturating_add(shift);
                r.last_epoch = None;
                for range in list.iter_mut() {
                    *range = (
                        range.0.saturating_add_signed(shift),
                        range.1.saturating_add_signed(shift),
                    );
                }
            }
        }
        ranges
            .into_iter()
            .enumerate()
            .filter_map(|(i, list)| {
                let r = self.rules.get_mut(i)?;
                if let Some(since) = r.stats.fallback_since.take() {
                    r.stats.fallback_ns += now.saturating_sub(since);
                }
                r.mode = Mode::Grid;
                let rates = grant_rate(r, now);
                Some(RuleUpdate {
                    rule: i,
                    mode: Mode::Grid,
                    grant_rate_per_s: rates.0,
                    spare_per_s: rates.1,
                    lead_ns: r.lead_ns(now),
                    ranges: list,
                    reset: std::mem::take(&mut r.reset),
                    shift: std::mem::take(&mut r.shift),
                })
            })
            .collect()
    }

    pub(super) fn failed(&mut self, now: u64, why: Failure) -> Vec<RuleUpdate> {
        let mut updates = Vec::new();
        if let Some(call) = self.in_flight.take() {
            for i in rules_of(&call.plan) {
                let Some(r) = self.rules.get_mut(i) else {
                    continue;
                };
                r.stats.failures += 1;
                if let Some(n) = r.stats.failed.get_mut(why.index()) {
                    *n += 1;
                }
                if matches!(why, Failure::Lost(_)) {
                    // Slots granted ahead may be granted again from the
                    // fresh counters: drop them, and start counting anew.
                    r.forget_counters();
                    let reset = std::mem::take(&mut r.reset);
                    updates.push(r.no_grants(i, now, reset));
                    continue;
                }
                // The call cost this proxy its share of epoch `e+k`, and
                // the shares it would have computed from what it asked:
                // the next call's (from the demand total it looked at)
                // and the one `lag + 1` epochs later (from its demand's
                // place). Nothing is claimed for those, and their slots go
                // to whoever claims the leftovers. Its turns were reckoned
                // on all three: forgiven, as many go at their deadline.
                let of = |purpose| {
                    call.plan
                        .iter()
                        .filter(move |p| p.rule == i && p.purpose == purpose)
                };
                // (The later shares as the largest of the last ones
                // computed: a call that failed after another claims none
                // of its own.)
                let share: u64 = of(Purpose::Share).map(|p| p.hits).sum();
                let last = r.shares.iter().map(|s| s.1).max().unwrap_or(0).max(share);
                let look = u64::from(of(Purpose::DemandLook).next().is_some());
                let place = u64::from(of(Purpose::DemandAdd).next().is_some());
                let slots = share.saturating_add(last.saturating_mul(look + place));
                if slots > 0 {
                    let epochs = r
                        .ahead
                        .saturating_add(1)
                        .saturating_add(look.max(place * (r.lag + 1)));
                    self.forgiven.push(Forgiven {
                        rule: i,
                        slots,
                        epoch_end: now.saturating_add(epochs.saturating_mul(r.spec.grid.epoch_ns)),
                    });
                }
            }
        }
        self.failing_since.get_or_insert(now);
        let fell_back = self.fallback_if_due(now);
        let due = self
            .warned_at
            .is_none_or(|t| now.saturating_sub(t) >= WARN_EVERY_NS);
        let in_fallback = self.rules.iter().any(|r| r.mode != Mode::Grid);
        if !fell_back.is_empty() || (in_fallback && due) {
            self.warned_at = Some(now);
            let since = self.failing_since.map_or(0, |t| now.saturating_sub(t));
            self.events.push(format!(
                "engine calls failing for {} ms ({}), cluster rules in their on_engine_failure fallback: {} (said at most every {} s while it lasts)",
                since / crate::clock::NS_PER_MS,
                why.kind(),
                why.explain(&self.cluster, &self.domain),
                WARN_EVERY_NS / NS_PER_S
            ));
        }
        updates.extend(fell_back);
        updates
    }

    pub(super) fn fallback_if_due(&mut self, now: u64) -> Vec<RuleUpdate> {
        let Some(since) = self.failing_since else {
            return Vec::new();
        };
        if now.saturating_sub(since) < self.fallback_after_ns {
            return Vec::new();
        }
        let mut out = Vec::new();
        for (i, r) in self.rules.iter_mut().enumerate() {
            if r.mode != Mode::Grid {
                continue;
            }
            // The proxies the engine last counted (the most over ~5 s before
            // the failure), kept while it lasts; `expected_replicas` only if
            // it never counted any.
            let divisor = match r.stats.members_recent_max {
                0 => u64::from(r.spec.expected_replicas.max(1)),
                seen => seen,
            };
            r.mode = match r.spec.on_engine_failure {
                OnEngineFailure::Deny => Mode::Deny,
                OnEngineFailure::LocalFull => Mode::Local {
                    interval_ns: r.spec.grid.interval_ns,
                },
                OnEngineFailure::LocalShare => Mode::Local {
                    interval_ns: r.spec.grid.interval_ns.saturating_mul(divisor),
                },
            };
            r.stats.fallback_since = Some(now);
            out.push(r.no_grants(i, now, false));
        }
        out
    }
}
