//! Prints the adaptive learner's figures in the simulated anchors' scenarios
//! (filters/throttle/core/src/adaptive/sim.rs), per scenario, phase and seed:
//! time to adapt, share of 1 s windows within ±10% of the target, goodput,
//! p99, upstream 429s after 2 s, errors.
//!
//! cargo run -p throttle-core --release --example adaptive-sim --features testing [-- SEEDS [adaptive] [NAMES...]]
//!
//! `adaptive`: the learner only (not the static and unlimited arms); NAMES:
//! only these scenarios (of the anchors' and `sim::more`'s).

use throttle_core::adaptive::sim::{anchors, learner, more, Mode, Pacer};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("trace") {
        // trace NAME SEED: every 100 ms of one run of the learner.
        let name = args.get(1).cloned().unwrap_or_default();
        let seed = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1);
        let pacer = learner(500.0, Mode::Enforce);
        let Some(s) = anchors(pacer, seed)
            .into_iter()
            .chain(more(pacer, seed))
            .find(|s| s.name == name)
        else {
            eprintln!("no scenario {name}");
            return;
        };
        let (r, _) = s.run();
        println!("t s | capacity | arrivals | sent | ok | 429 local | 504 | backlog | rate | in flight | ahead ms | reasons");
        for (i, b) in r.buckets.iter().enumerate() {
            let reasons: Vec<&str> = b.reasons.iter().map(|x| x.name()).collect();
            println!(
                "{:5.1} | {:4.0} | {:3} | {:3} | {:3} | {:3} | {:3} | {:4} | {:6.1} | {:4} | {:4} | {}",
                i as f64 / 10.0, b.capacity_per_s, b.arrivals, b.sent, b.ok, b.local_429, b.gateway_504,
                b.backlog, b.rate_per_s, b.in_flight, b.ahead_ms, reasons.join(",")
            );
        }
        return;
    }
    let seeds: u64 = args.first().and_then(|s| s.parse().ok()).unwrap_or(6);
    let only_adaptive = args.iter().any(|a| a == "adaptive");
    let names: Vec<&String> = args.iter().skip(1).filter(|a| *a != "adaptive").collect();
    println!("| scenario | phase | target /s | seed | time to adapt s | within ±10% | range | goodput | p99 ms | upstream 429 after 2 s | timeouts or 504 | throttle 429s |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (label, pacer) in [
        ("adaptive", learner(500.0, Mode::Enforce)),
        ("static 500/s", Pacer::Static { rate_per_s: 500.0 }),
        ("static 200/s", Pacer::Static { rate_per_s: 200.0 }),
        ("no limiter", Pacer::None),
    ] {
        if only_adaptive && label != "adaptive" {
            break;
        }
        for seed in 1..=seeds {
            let all = anchors(pacer, seed).into_iter().chain(more(pacer, seed));
            for s in all.filter(|s| names.is_empty() || names.iter().any(|n| **n == s.name)) {
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
