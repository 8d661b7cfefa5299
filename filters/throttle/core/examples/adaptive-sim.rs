//! Prints the adaptive learner's figures in the simulated anchors' scenarios
//! (filters/throttle/core/src/adaptive/sim.rs), per scenario, phase and seed:
//! time to adapt, share of 1 s windows within ±10% of the target, goodput,
//! p99, upstream 429s after 2 s, errors.
//!
//! cargo run -p throttle-core --release --example adaptive-sim --features testing [-- SEEDS]

use throttle_core::adaptive::sim::{anchors, learner, Mode, Pacer};

fn main() {
    let seeds: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(6);
    println!("| scenario | phase | target /s | seed | time to adapt s | within ±10% | range | goodput | p99 ms | upstream 429 after 2 s | timeouts or 504 | throttle 429s |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (label, pacer) in [
        ("adaptive", learner(500.0, Mode::Enforce)),
        ("static 500/s", Pacer::Static { rate_per_s: 500.0 }),
        ("static 200/s", Pacer::Static { rate_per_s: 200.0 }),
        ("no limiter", Pacer::None),
    ] {
        for seed in 1..=seeds {
            for s in anchors(pacer, seed) {
                let (_, phases) = s.run();
                for p in phases {
                    let f = p.figures;
                    println!(
                        "| {} {} | {:.0} s | {:.0} | {seed} | {} | {:.0}% | {:.2}..{:.2} | {:.0}% | {:.0} | {:.2}% | {} | {} |",
                        s.name,
                        label,
                        p.at_s,
                        p.target_per_s,
                        p.time_to_adapt_s.map_or("never".into(), |t| format!("{t:.1}")),
                        p.in_band * 100.0,
                        p.lowest,
                        p.highest,
                        f.goodput_per_s / p.target_per_s * 100.0,
                        f.p99_ms,
                        p.upstream_429_after_2s * 100.0,
                        f.timeouts + f.gateway_504,
                        f.local_429,
                    );
                }
            }
            if label != "adaptive" {
                break;
            }
        }
    }
}
