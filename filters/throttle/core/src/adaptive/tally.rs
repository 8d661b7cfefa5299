//! What the filter saw of a rule's traffic during one round (one learner
//! tick): requests that arrived, requests sent upstream, how each answer
//! came back, and where the bad answers came from (by [`Origin`]). A
//! [`Tally`] is counters only, so workers can add theirs into one
//! process-wide tally (shared data, compare-and-swap) and the learner can
//! take it as a whole ([`Tally::to_words`] / [`Tally::from_words`]).

/// How one request sent upstream ended, as the filter sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The upstream answered with this status; `retry_after_s` is its
    /// `Retry-After` in whole seconds (only read on 429 and 503).
    Answered {
        status: u16,
        retry_after_s: Option<u64>,
    },
    /// No answer from the upstream: reset, refused, connection failure, or
    /// Envoy's upstream timeout (response flags `UF`, `UR`, `UC`, `UT`, `URX`).
    Failed,
    /// The client went away before the answer: neither good nor an overload
    /// signal (clients go away for their own reasons).
    Cancelled,
}

/// One request sent upstream and how it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    /// When it went upstream (continued at once, or released from hold), ns.
    pub sent_at: u64,
    /// When its response headers came (or it failed, or its client left), ns.
    pub done_at: u64,
    pub outcome: Outcome,
    /// Its own deadline, counted from `sent_at` (from `grpc-timeout` or
    /// `x-envoy-expected-rq-timeout-ms`), if it carried one: an answer later
    /// than this is not good.
    pub deadline_ns: Option<u64>,
    /// Where it came from: read for every bad answer (shed, failed, late)
    /// and for one in [`SAMPLE_EVERY`] of the others (`sampled`).
    pub origin: Option<Origin>,
    pub sampled: bool,
}

/// Groups of each partition of the answers by origin.
pub const GROUPS: usize = 8;
/// Partitions: four hashes of the path, four of the client. Two paths (or
/// two clients) share every group of their kind with a chance of 8^-4 =
/// 1/4096 per process: then one client's errors on one path, with every
/// client behind one address, read as the load's. Three (1/512) were seen
/// to do so in CI (`tests/test_adaptive_attacks.py`, 2026-12-01).
pub const PARTITIONS: usize = 8;
/// One answer in this many (that is not bad) carries its origin: enough to
/// know how the traffic spreads over the groups, at a fraction of the host
/// calls (the path and the client are read only for those).
pub const SAMPLE_EVERY: u64 = 8;

/// Where a request came from, as groups: its path in four partitions and
/// its client (the rule's key value, else the source address) in four
/// more, each under the process's secret seed, so that no client can choose
/// whose group it shares. Errors that stay within a few groups of either
/// kind while the others are answered well are the clients' or the paths'
/// own, not the upstream's overload (see [`Tally::load_bad`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Origin {
    groups: [u8; PARTITIONS],
}

impl Origin {
    /// The groups of a request from `client` to `path`, given their
    /// fingerprints (secret-seeded hashes).
    pub fn new(path_fp: u64, client_fp: u64) -> Origin {
        let mut groups = [0u8; PARTITIONS];
        for (i, g) in groups.iter_mut().enumerate() {
            let (fp, row) = if i < PARTITIONS / 2 {
                (path_fp, i)
            } else {
                (client_fp, i - PARTITIONS / 2)
            };
            // Three bits per row: independent groups of one good hash.
            *g = ((fp >> (8 * row + 3)) % GROUPS as u64) as u8;
        }
        Origin { groups }
    }

    /// Its group in each partition.
    pub fn groups(&self) -> [u8; PARTITIONS] {
        self.groups
    }
}

/// What an answer says about the upstream's capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Served (any status but the ones below), within its deadline if any.
    Good,
    /// The upstream shed it: 429 or 503.
    Shed,
    /// Any other 5xx but 504, or no answer (reset, connection failure).
    Failed,
    /// Served, but after the request's own deadline; or 504 (a timeout:
    /// Envoy's route timeout, or a gateway's behind it). Latency, not
    /// failure: a queue longer than the timeout says "too slow", and the
    /// few answered in time say nothing of the capacity.
    Late,
    /// The client left first.
    Cancelled,
}

impl Observation {
    /// The class of this answer.
    pub fn class(&self) -> Class {
        match self.outcome {
            Outcome::Cancelled => Class::Cancelled,
            Outcome::Failed => Class::Failed,
            Outcome::Answered { status, .. } if status == 429 || status == 503 => Class::Shed,
            Outcome::Answered { status: 504, .. } => Class::Late,
            Outcome::Answered { status, .. } if (500..600).contains(&status) => Class::Failed,
            Outcome::Answered { .. } => {
                let took = self.done_at.saturating_sub(self.sent_at);
                if self.deadline_ns.is_some_and(|d| took > d) {
                    Class::Late
                } else {
                    Class::Good
                }
            }
        }
    }
}

/// Longest `Retry-After` taken into account, in seconds (an upstream that
/// asks for an hour still gets probed again after this long).
pub const MAX_RETRY_AFTER_S: u64 = 60;

/// Counters of one round. All additions saturate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    /// Requests of the rule that arrived (continued, held or rejected).
    pub arrivals: u64,
    /// Requests sent upstream (continued at once, or released from hold).
    pub sent: u64,
    pub good: u64,
    pub shed: u64,
    pub failed: u64,
    pub late: u64,
    pub cancelled: u64,
    /// Sum of the latencies (sent to response headers, or to the client
    /// leaving) of the good, late and cancelled requests, µs: what the
    /// upstream took or at least took (shed and failed answers are left
    /// out: they come back fast and would hide a queue).
    pub latency_us: u64,
    /// Sum of the squares of the same latencies, in ms² (for the spread).
    pub latency_sq_ms2: u64,
    /// Largest `Retry-After` on a shed answer (0: none), seconds, at most
    /// [`MAX_RETRY_AFTER_S`].
    pub retry_after_s: u64,
    /// By partition and group: the bad answers (shed, failed, late), and
    /// the sampled others.
    pub bad_by: [[u64; GROUPS]; PARTITIONS],
    pub sampled_by: [[u64; GROUPS]; PARTITIONS],
}

impl Default for Tally {
    fn default() -> Self {
        Tally::EMPTY
    }
}

/// Number of words of [`Tally::to_words`].
pub const TALLY_WORDS: usize = 10 + 2 * PARTITIONS * GROUPS;

impl Tally {
    /// Nothing seen.
    pub const EMPTY: Tally = Tally {
        arrivals: 0,
        sent: 0,
        good: 0,
        shed: 0,
        failed: 0,
        late: 0,
        cancelled: 0,
        latency_us: 0,
        latency_sq_ms2: 0,
        retry_after_s: 0,
        bad_by: [[0; GROUPS]; PARTITIONS],
        sampled_by: [[0; GROUPS]; PARTITIONS],
    };

    /// A request of the rule arrived.
    pub fn arrived(&mut self) {
        self.arrivals = self.arrivals.saturating_add(1);
    }

    /// A request went upstream.
    pub fn sent(&mut self) {
        self.sent = self.sent.saturating_add(1);
    }

    /// A request sent upstream ended.
    pub fn record(&mut self, o: &Observation) {
        let class = o.class();
        if matches!(class, Class::Good | Class::Late | Class::Cancelled) {
            let us = o.done_at.saturating_sub(o.sent_at) / 1_000;
            self.latency_us = self.latency_us.saturating_add(us);
            let ms = us / 1_000;
            self.latency_sq_ms2 = self.latency_sq_ms2.saturating_add(ms.saturating_mul(ms));
        }
        let n = match class {
            Class::Good => &mut self.good,
            Class::Shed => {
                if let Outcome::Answered {
                    retry_after_s: Some(s),
                    ..
                } = o.outcome
                {
                    self.retry_after_s = self.retry_after_s.max(s.min(MAX_RETRY_AFTER_S));
                }
                &mut self.shed
            }
            Class::Failed => &mut self.failed,
            Class::Late => &mut self.late,
            Class::Cancelled => &mut self.cancelled,
        };
        *n = n.saturating_add(1);
        if let Some(origin) = o.origin {
            let bad = matches!(class, Class::Shed | Class::Failed | Class::Late);
            let by = if bad {
                &mut self.bad_by
            } else if o.sampled {
                &mut self.sampled_by
            } else {
                return;
            };
            for (row, g) in by.iter_mut().zip(origin.groups) {
                if let Some(n) = row.get_mut(usize::from(g)) {
                    *n = n.saturating_add(1);
                }
            }
        }
    }

    /// Answers that say "too much" or "too slow": shed, failed or late.
    pub fn bad(&self) -> u64 {
        self.overload().saturating_add(self.late)
    }

    /// Of `n` bad answers of one kind, how many the load's ([`Tally::load_bad`]).
    pub fn load_part(&self, n: u64) -> u64 {
        let bad = self.bad();
        if bad == 0 {
            return 0;
        }
        u64::try_from(u128::from(n) * u128::from(self.load_bad()) / u128::from(bad)).unwrap_or(n)
    }

    /// Of the bad answers (shed, failed, late), how many come from the load: the
    /// share of bad answers in the better-answered half of the traffic, in
    /// the partition where it is lowest, times the answers. Overload sheds
    /// and fails requests of every path and client alike, so every half of
    /// the traffic shows it; errors of some clients or paths (a broken
    /// endpoint, one client's bad requests or quota) leave the other groups
    /// answered well, and count for nothing. The traffic of each group is its
    /// bad answers plus the rest in proportion to the sampled ones (evenly
    /// when none were sampled); bad answers without an origin form a group
    /// of their own; a tally with no origins at all counts every bad answer.
    pub fn load_bad(&self) -> u64 {
        let done = self.done().saturating_sub(self.cancelled);
        let bad = self.bad();
        if bad == 0 || done == 0 {
            return 0;
        }
        let others = done.saturating_sub(bad) as f64;
        let mut lowest = f64::MAX;
        for (bad_row, sampled_row) in self.bad_by.iter().zip(&self.sampled_by) {
            let sampled: u64 = sampled_row.iter().sum();
            let known: u64 = bad_row.iter().sum();
            if sampled == 0 && known == 0 {
                // Nothing known of where the answers came from: as spread.
                lowest = lowest.min(bad as f64 / done as f64);
                continue;
            }
            // (bad, traffic) of each group, and of the answers without an origin.
            let mut groups: Vec<(f64, f64)> = bad_row
                .iter()
                .zip(sampled_row)
                .map(|(&b, &s)| {
                    let rest = if sampled > 0 {
                        others * s as f64 / sampled as f64
                    } else {
                        others / GROUPS as f64
                    };
                    (b as f64, b as f64 + rest)
                })
                .collect();
            groups.push((
                bad.saturating_sub(known) as f64,
                bad.saturating_sub(known) as f64,
            ));
            groups.retain(|(_, n)| *n > 0.0);
            groups.sort_by(|a, b| (a.0 * b.1).total_cmp(&(b.0 * a.1)));
            let total: f64 = groups.iter().map(|(_, n)| n).sum();
            let (mut b_half, mut n_half) = (0.0, 0.0);
            for (b, n) in groups {
                if n_half >= total / 2.0 {
                    break;
                }
                b_half += b;
                n_half += n;
            }
            if n_half > 0.0 {
                lowest = lowest.min(b_half / n_half);
            }
        }
        if lowest == f64::MAX {
            return bad;
        }
        ((lowest * done as f64).round() as u64).min(bad)
    }

    /// Requests that ended (whatever the outcome).
    pub fn done(&self) -> u64 {
        self.good
            .saturating_add(self.shed)
            .saturating_add(self.failed)
            .saturating_add(self.late)
            .saturating_add(self.cancelled)
    }

    /// Requests whose latency is in `latency_us`.
    pub fn timed(&self) -> u64 {
        self.good
            .saturating_add(self.late)
            .saturating_add(self.cancelled)
    }

    /// Their mean latency, µs.
    pub fn mean_latency_us(&self) -> Option<u64> {
        let n = self.timed();
        (n > 0).then(|| self.latency_us / n)
    }

    /// The variance of those latencies, ms² (None with fewer than two).
    pub fn latency_var_ms2(&self) -> Option<f64> {
        let n = self.timed();
        if n < 2 {
            return None;
        }
        let n = n as f64;
        let mean_ms = self.latency_us as f64 / 1_000.0 / n;
        let var = self.latency_sq_ms2 as f64 / n - mean_ms * mean_ms;
        Some(var.max(0.0) * n / (n - 1.0))
    }

    /// Answers that say "too much": shed or failed.
    pub fn overload(&self) -> u64 {
        self.shed.saturating_add(self.failed)
    }

    /// Adds another tally (another worker's, or another round's).
    pub fn merge(&mut self, o: &Tally) {
        let add = |a: &mut u64, b: u64| *a = a.saturating_add(b);
        add(&mut self.arrivals, o.arrivals);
        add(&mut self.sent, o.sent);
        add(&mut self.good, o.good);
        add(&mut self.shed, o.shed);
        add(&mut self.failed, o.failed);
        add(&mut self.late, o.late);
        add(&mut self.cancelled, o.cancelled);
        add(&mut self.latency_us, o.latency_us);
        add(&mut self.latency_sq_ms2, o.latency_sq_ms2);
        self.retry_after_s = self.retry_after_s.max(o.retry_after_s);
        for (mine, theirs) in [
            (&mut self.bad_by, &o.bad_by),
            (&mut self.sampled_by, &o.sampled_by),
        ] {
            for (a, b) in mine.iter_mut().flatten().zip(theirs.iter().flatten()) {
                add(a, *b);
            }
        }
    }

    /// The counters as words (for shared data: fixed size, little-endian
    /// when stored as bytes).
    pub fn to_words(&self) -> [u64; TALLY_WORDS] {
        let mut w = [0u64; TALLY_WORDS];
        let head = [
            self.arrivals,
            self.sent,
            self.good,
            self.shed,
            self.failed,
            self.late,
            self.cancelled,
            self.latency_us,
            self.latency_sq_ms2,
            self.retry_after_s,
        ];
        let groups = self.bad_by.iter().chain(&self.sampled_by).flatten();
        for (slot, v) in w.iter_mut().zip(head.iter().chain(groups)) {
            *slot = *v;
        }
        w
    }

    /// The counters from words; missing words read as 0, `retry_after_s`
    /// is capped at [`MAX_RETRY_AFTER_S`].
    pub fn from_words(w: &[u64]) -> Tally {
        let g = |i: usize| w.get(i).copied().unwrap_or(0);
        Tally {
            arrivals: g(0),
            sent: g(1),
            good: g(2),
            shed: g(3),
            failed: g(4),
            late: g(5),
            cancelled: g(6),
            latency_us: g(7),
            latency_sq_ms2: g(8),
            retry_after_s: g(9).min(MAX_RETRY_AFTER_S),
            bad_by: std::array::from_fn(|p| std::array::from_fn(|i| g(10 + p * GROUPS + i))),
            sampled_by: std::array::from_fn(|p| {
                std::array::from_fn(|i| g(10 + (PARTITIONS + p) * GROUPS + i))
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(status: u16, took_ms: u64, deadline_ms: Option<u64>) -> Observation {
        Observation {
            sent_at: 1_000_000_000,
            done_at: 1_000_000_000 + took_ms * 1_000_000,
            outcome: Outcome::Answered {
                status,
                retry_after_s: Some(3),
            },
            deadline_ns: deadline_ms.map(|d| d * 1_000_000),
            origin: None,
            sampled: false,
        }
    }

    #[test]
    fn answers_are_classed_by_status_deadline_and_fate() {
        let cases = [
            (answered(200, 10, None), Class::Good),
            (answered(404, 10, None), Class::Good),
            (answered(200, 10, Some(10)), Class::Good),
            (answered(200, 11, Some(10)), Class::Late),
            (answered(429, 1, None), Class::Shed),
            (answered(503, 1, None), Class::Shed),
            (answered(500, 1, None), Class::Failed),
            (answered(504, 1, None), Class::Late),
            (answered(502, 1, None), Class::Failed),
        ];
        for (o, want) in cases {
            assert_eq!(o.class(), want, "{o:?}");
        }
        let mut o = answered(200, 5, None);
        o.outcome = Outcome::Failed;
        assert_eq!(o.class(), Class::Failed);
        o.outcome = Outcome::Cancelled;
        assert_eq!(o.class(), Class::Cancelled);
    }

    #[test]
    fn a_tally_counts_latency_of_what_the_upstream_kept_and_the_longest_retry_after() {
        let mut t = Tally::EMPTY;
        t.record(&answered(200, 10, None));
        t.record(&answered(200, 30, None));
        t.record(&answered(429, 1, None));
        t.record(&answered(500, 1, None));
        let mut gone = answered(200, 50, None);
        gone.outcome = Outcome::Cancelled;
        t.record(&gone);
        let mut long = answered(503, 1, None);
        long.outcome = Outcome::Answered {
            status: 503,
            retry_after_s: Some(3_600),
        };
        t.record(&long);
        assert_eq!(
            (t.good, t.shed, t.failed, t.cancelled, t.done()),
            (2, 2, 1, 1, 6)
        );
        assert_eq!(
            t.latency_us, 90_000,
            "good and cancelled, not shed or failed"
        );
        assert_eq!(t.mean_latency_us(), Some(30_000));
        // 10, 30 and 50 ms: variance 400 ms².
        let v = t.latency_var_ms2().unwrap_or(0.0);
        assert!((v - 400.0).abs() < 1e-6, "{v}");
        assert_eq!(t.retry_after_s, MAX_RETRY_AFTER_S);
    }

    #[test]
    fn tallies_merge_and_round_trip_through_words() {
        let mut a = Tally {
            arrivals: 5,
            sent: 4,
            good: 3,
            retry_after_s: 2,
            ..Tally::EMPTY
        };
        let b = Tally {
            arrivals: u64::MAX,
            shed: 1,
            retry_after_s: 1,
            ..Tally::EMPTY
        };
        a.merge(&b);
        assert_eq!(a.arrivals, u64::MAX, "saturates");
        assert_eq!((a.sent, a.good, a.shed, a.retry_after_s), (4, 3, 1, 2));
        a.bad_by[5][7] = 9;
        a.sampled_by[0][1] = 3;
        assert_eq!(Tally::from_words(&a.to_words()), a);
        assert_eq!(Tally::from_words(&[7]).arrivals, 7, "short input reads 0");
    }

    /// `n` answers from `paths` x `clients` origins, of which those for
    /// which `bad` says so are 503; every origin sampled.
    fn answers(paths: u64, clients: u64, per: u64, bad: impl Fn(u64, u64) -> bool) -> Tally {
        let mut t = Tally::EMPTY;
        for p in 0..paths {
            for c in 0..clients {
                let origin = Origin::new(
                    (p + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                    (c + 1).wrapping_mul(0xC2B2_AE3D_27D4_EB4F),
                );
                for i in 0..per {
                    let mut o = answered(if bad(p, c) { 503 } else { 200 }, 5, None);
                    o.origin = Some(origin);
                    o.sampled = i % SAMPLE_EVERY == 0;
                    t.record(&o);
                }
            }
        }
        t
    }

    #[test]
    fn errors_of_some_paths_or_clients_are_not_the_loads() {
        // One path of ten fails for everyone: 10% of the answers, none the load's.
        let t = answers(10, 5, 16, |p, _| p == 3);
        assert_eq!((t.overload(), t.load_bad()), (80, 0));
        // One client of five fails on every path.
        let t = answers(10, 5, 16, |_, c| c == 2);
        assert_eq!((t.overload(), t.load_bad()), (160, 0));
        // One path, one client (all the traffic): the upstream is down.
        let t = answers(1, 1, 100, |_, _| true);
        assert_eq!(t.load_bad(), 100);
    }

    #[test]
    fn one_clients_broken_path_reads_as_the_loads_in_few_processes() {
        // Every client behind one address (the test's Vegeta), one path
        // answered well and one answering 503 (2 of 20 in a window): in how
        // many processes (secret seeds) do the two paths share every group?
        let keys = crate::keys::KeyHasher::new((7, 11));
        let client = keys.fingerprint("\u{1}client", b"127.0.0.1");
        let (mut read_as_load, processes) = (0u64, 40_000u64);
        for seed in 0..processes {
            let h = crate::keys::KeyHasher::new((seed, seed ^ 0x5eed));
            let legit = Origin::new(h.fingerprint("\u{1}path", b"/api/items"), client);
            let broken = Origin::new(h.fingerprint("\u{1}path", b"/_fail/503"), client);
            let mut t = Tally::EMPTY;
            for (i, (status, origin)) in (0..18)
                .map(|_| (200, legit))
                .chain((0..2).map(|_| (503, broken)))
                .enumerate()
            {
                let mut o = answered(status, 5, None);
                o.sampled = status == 200 && i % 8 == 0;
                o.origin = (status != 200 || o.sampled).then_some(origin);
                t.record(&o);
            }
            read_as_load += u64::from(t.load_bad() > 0);
        }
        // 8^-4 = 1/4096: ~10 of 40,000; 8^-3 (three partitions) gave 91.
        assert!(
            read_as_load <= 25,
            "{read_as_load} of {processes} processes"
        );
    }

    #[test]
    fn overload_spread_over_every_path_and_client_counts() {
        // Every fourth answer of every origin is shed.
        let mut t = Tally::EMPTY;
        for p in 0..10u64 {
            for c in 0..5u64 {
                let origin = Origin::new(
                    p.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
                    c.wrapping_mul(0xC2B2_AE3D_27D4_EB4F) | 1,
                );
                for i in 0..16u64 {
                    let mut o = answered(if i % 4 == 0 { 503 } else { 200 }, 5, None);
                    o.origin = Some(origin);
                    o.sampled = i % SAMPLE_EVERY == 1;
                    t.record(&o);
                }
            }
        }
        let (bad, load) = (t.overload(), t.load_bad());
        assert_eq!(bad, 200);
        assert!(load >= 150, "{load} of {bad} read as the load's");
        // Bad answers without an origin (none sampled either) count as spread.
        let mut t = Tally::EMPTY;
        for i in 0..40 {
            t.record(&answered(if i % 2 == 0 { 503 } else { 200 }, 5, None));
        }
        assert_eq!(t.load_bad(), 20);
    }
}
