//! The schedule against nginx's `limit_req`, request by request: a model of
//! `ngx_http_limit_req_module.c` (`ngx_http_limit_req_lookup` with accounting,
//! then `ngx_http_limit_req_account`: the "leaky bucket" of excess in
//! milli-requests, whole milliseconds) and the filter's [`admit`] on a shared
//! cell, fed the same bursts. The admitted set, and every admitted request's
//! release time, must be identical.
//!
//! nginx `rate=R r/s burst=B delay=D` corresponds to the rule `rate: R/s`,
//! `burst: D` (requests let through at once beyond the rate) and
//! `max_queue_delay: (B - D) / R` (nginx rejects once the excess passes
//! `B`, i.e. once a request's delay beyond the first `D` would pass
//! `(B - D) / R`). nginx keeps milliseconds and divides in integers, so the
//! two agree exactly where nginx's arithmetic is exact: arrivals on whole
//! milliseconds and `R` dividing 1000. (Its defaults: `delay=0`, and
//! `nodelay` is `D = B`.)
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

use proptest::prelude::*;
use throttle_core::schedule::{admit, Admission, Schedule};
use throttle_core::testing::MemCell;

const MS: u64 = 1_000_000;

/// One zone node of nginx's `limit_req` (one key), in nginx's own units:
/// `rate` in requests per 1000 s, `excess` and `burst` in milli-requests.
struct NginxLimitReq {
    rate: i64,
    burst: i64,
    delay: i64,
    node: Option<(i64, i64)>, // (last ms, excess)
}

/// nginx's answer: rejected, or passed after `delay` ms (0: at once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Nginx {
    Busy,
    Pass { delay_ms: i64 },
}

impl NginxLimitReq {
    fn new(rate_per_s: i64, burst: i64, delay: i64) -> Self {
        NginxLimitReq {
            rate: rate_per_s * 1000,
            burst: burst * 1000,
            delay: delay * 1000,
            node: None,
        }
    }

    /// One request at `now` (ngx_current_msec).
    fn request(&mut self, now: i64) -> Nginx {
        let excess = match self.node {
            // A new node: last = now, excess = 0 (nothing to wait for).
            None => {
                self.node = Some((now, 0));
                0
            }
            Some((last, old)) => {
                let mut ms = now - last;
                if ms < -60000 {
                    ms = 1;
                } else if ms < 0 {
                    ms = 0;
                }
                let excess = (old - self.rate * ms / 1000 + 1000).max(0);
                if excess > self.burst {
                    return Nginx::Busy;
                }
                // account: the excess is stored; `last` only moves when ms != 0
                self.node = Some((if ms != 0 { now } else { last }, excess));
                excess
            }
        };
        // ngx_http_limit_req_account
        let delay_ms = if excess <= self.delay {
            0
        } else {
            (excess - self.delay) * 1000 / self.rate
        };
        Nginx::Pass { delay_ms }
    }
}

/// The filter's answer in nginx's terms.
fn filter(cell: &mut MemCell, s: &Schedule, now_ms: u64) -> Nginx {
    let now = now_ms * MS;
    match admit(cell, s, now, true) {
        Admission::Now { .. } => Nginx::Pass { delay_ms: 0 },
        Admission::Hold { release_at, .. } => {
            assert_eq!(
                (release_at - now) % MS,
                0,
                "a release off the millisecond grid"
            );
            Nginx::Pass {
                delay_ms: ((release_at - now) / MS) as i64,
            }
        }
        Admission::Reject { .. } => Nginx::Busy,
        Admission::Contention => panic!("no contention in one cell"),
    }
}

/// Arrivals in whole milliseconds: bursts (several in one millisecond), gaps
/// long and short, in order.
fn arrivals() -> impl Strategy<Value = Vec<u64>> {
    prop::collection::vec((0u64..40, 1usize..12), 1..60).prop_map(|steps| {
        let mut t = 1_000;
        let mut out = Vec::new();
        for (gap, n) in steps {
            t += gap * gap; // mostly short gaps, some long (up to 1.5 s)
            out.extend(std::iter::repeat_n(t, n));
        }
        out
    })
}

/// Rates nginx divides exactly: R divides 1000.
const RATES: [i64; 10] = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000];

fn differential(rate: i64, burst: i64, delay: i64, at: &[u64]) -> Result<(), TestCaseError> {
    let mut nginx = NginxLimitReq::new(rate, burst, delay);
    let interval = 1000 / rate as u64 * MS;
    let s = Schedule::new(interval, delay as u64, (burst - delay) as u64 * interval);
    let mut cell = MemCell::default();
    for (i, &t) in at.iter().enumerate() {
        let want = nginx.request(t as i64);
        let got = filter(&mut cell, &s, t);
        prop_assert_eq!(
            got,
            want,
            "request {} at {} ms (rate {}/s, burst {}, delay {}): filter {:?}, nginx {:?}",
            i,
            t,
            rate,
            burst,
            delay,
            got,
            want
        );
    }
    Ok(())
}

proptest! {
    #[test]
    fn the_admitted_set_and_release_times_are_nginx_limit_reqs(
        rate in prop::sample::select(RATES.to_vec()),
        burst in 0i64..30,
        delay_frac in 0i64..=4,
        at in arrivals(),
    ) {
        // delay = 0 (nginx's default), up to burst (nodelay), and between.
        let delay = burst * delay_frac / 4;
        differential(rate, burst, delay, &at)?;
    }
}

#[test]
fn a_burst_of_ten_at_5_per_s_burst_5() {
    // nginx: rate=5r/s burst=5 (no nodelay): the first goes, the next five are
    // delayed 200 ms apart, the rest are rejected.
    let mut nginx = NginxLimitReq::new(5, 5, 0);
    let got: Vec<Nginx> = (0..10).map(|_| nginx.request(1000)).collect();
    let pass = |d| Nginx::Pass { delay_ms: d };
    assert_eq!(
        got,
        [
            pass(0),
            pass(200),
            pass(400),
            pass(600),
            pass(800),
            pass(1000),
            Nginx::Busy,
            Nginx::Busy,
            Nginx::Busy,
            Nginx::Busy
        ]
    );
    differential(5, 5, 0, &[1000; 10]).unwrap();
    // nodelay (delay = burst): six at once, the rest rejected.
    differential(5, 5, 5, &[1000; 10]).unwrap();
}
