//! Property tests of the adaptive learner: whatever the answers say, and
//! however the clock behaves, the rate stays within its bounds and nothing
//! panics (bounded runs in CI).

use proptest::prelude::*;
use throttle_core::adaptive::{
    interval_of_rate, rate_of_interval, Controller, Tally, Tuning, MICRO,
};

fn tally() -> impl Strategy<Value = Tally> {
    (
        (0u64..5_000, 0u64..5_000, 0u64..5_000, 0u64..500),
        (0u64..500, 0u64..50, 0u64..50, 0u64..120),
        (0u64..10_000_000, any::<bool>(), any::<u64>()),
    )
        .prop_map(
            |((arrivals, sent, good, shed), (failed, late, cancelled, ra), (lat, huge, seed))| {
                let timed = good + late + cancelled;
                Tally {
                    arrivals,
                    sent,
                    good,
                    shed,
                    failed,
                    late,
                    cancelled,
                    latency_us: if huge {
                        u64::MAX
                    } else {
                        lat.saturating_mul(timed)
                    },
                    latency_sq_ms2: if huge {
                        u64::MAX
                    } else {
                        (lat / 1000).pow(2).saturating_mul(timed)
                    },
                    retry_after_s: ra,
                    // Origins: any counts, even ones that do not add up.
                    bad_by: std::array::from_fn(|p| {
                        std::array::from_fn(|g| seed.rotate_left((p * 8 + g) as u32) % 64)
                    }),
                    sampled_by: std::array::from_fn(|p| {
                        std::array::from_fn(|g| seed.rotate_right((p * 8 + g) as u32) % 32)
                    }),
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn the_rate_never_leaves_its_bounds(
        lo in 1u64..1_000,
        span in 1u64..1_000,
        start in 0u64..3_000,
        rounds in proptest::collection::vec((tally(), 0u64..400, 0u64..2_000, any::<bool>()), 1..300),
    ) {
        // Bounds come as intervals (rounded up from the configured rates).
        let (min_i, max_i) = (interval_of_rate((lo + span) * MICRO), interval_of_rate(lo * MICRO));
        let (min, max) = (rate_of_interval(max_i), rate_of_interval(min_i));
        let mut c = Controller::new(
            interval_of_rate(start.max(1) * MICRO),
            min_i,
            max_i,
            Tuning::default(),
        );
        let mut now: u64 = 1_000_000_000;
        for (t, step_ms, ahead_ms, back) in rounds {
            // Mostly forward, sometimes back (a clock that seems to go back).
            now = if back { now.saturating_sub(step_ms * 1_000_000) } else { now.saturating_add(step_ms * 1_000_000) };
            let u = c.update(now, &t, ahead_ms * 1_000_000);
            prop_assert!(u.rate >= min && u.rate <= max, "{} outside {}..{}", u.rate, min, max);
            prop_assert!(u.interval_ns >= min_i && u.interval_ns <= max_i);
        }
    }

    #[test]
    fn the_end_of_time_does_not_panic(t in tally()) {
        let mut c = Controller::new(1, 1, u64::MAX, Tuning::default());
        for now in [u64::MAX - 1, u64::MAX, u64::MAX, 0, u64::MAX] {
            c.update(now, &t, u64::MAX);
        }
    }
}
