//! The seeded sweep of the fleet simulation (throttle_core::sim): draws
//! scenarios from seeds, runs each on what ships, checks every invariant,
//! and prints each failure with its seed and the command that replays it.
//!
//! ```text
//! fleet-sweep [--seconds S] [--from SEED] [--seeds N]   sweep (default: 60 s from seed 1)
//! fleet-sweep --seed SEED [--verbose]                    replay one seed
//! fleet-sweep --scenario NAME                            a named scenario (--scenario list)
//! fleet-sweep --seed SEED|--scenario NAME --trace RULE   every request of a rule and its end
//! fleet-sweep --seed SEED|--scenario NAME --logs         every proxy's log lines, in time order
//! fleet-sweep --seeds N --known FILE                     a ratchet (CI): see below
//! fleet-sweep --stall-search NAME [--starts N]           stalls of named scenario NAME: see below
//! fleet-sweep --scenario NAME --stall LEN@AT[/PROXY]     NAME with one stall (ms; PROXY: one, else all)
//! fleet-sweep --noise-search NAME|all [--runs N]         named scenarios at N other noises (default 20)
//! fleet-sweep --scenario NAME --noise K                  NAME at noise K (its own XOR K)
//! fleet-sweep --offset-search NAME [--offsets N]         NAME's bursts moved 0..N ms later (default 100)
//! fleet-sweep --scenario NAME --offset MS                NAME's bursts MS ms later
//! fleet-sweep ... --at-hour                               every seed over the top of the hour
//! fleet-sweep --scenario NAME --hour-at S                NAME started so that the hour ends S s in
//! fleet-sweep --start-search NAME [--starts N]           NAME started at N other times (7 s apart)
//! ```
//! Exit status 1 if any invariant failed.
//!
//! With `--known FILE` (lines `SEED KIND[,KIND...]`, `#` comments), the
//! counterexamples the sweep has found and not yet fixed: the run fails if a
//! seed breaks an invariant the file does not list for it (a new one), or if
//! a listed one holds now (fixed: take it off the list). Seeds and runs are
//! deterministic, so the list is exact.
//!
//! `--stall-search NAME` runs named scenario NAME with one stall in place of
//! its own, over every length of `sweep::STALL_LENGTHS_MS` (up to the
//! catch-up), of the whole fleet and of each proxy, at N starts 7 ms apart
//! from 3 s (default 60): what seeds draw too rarely to find (it found the
//! two whole-fleet stalls of scenarios `stall-late-answer` and `stall-prune`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use throttle_core::sim::process::End;
use throttle_core::sim::scenario::Scenario;
use throttle_core::sim::{
    fleet,
    sweep::{self, Outcome},
};

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn report(o: &Outcome, verbose: bool) -> bool {
    let what = if o.scenario.name.is_empty() {
        format!("seed {}", o.scenario.seed)
    } else {
        format!("scenario {}", o.scenario.name)
    };
    if let Some(e) = &o.refused {
        if verbose {
            println!("{what}: configuration refused: {e}");
        }
        return true;
    }
    if verbose || !o.violations.is_empty() {
        println!(
            "{what}: {} ({} requests)",
            o.scenario.describe(),
            o.requests
        );
    }
    if verbose {
        for line in &o.figures {
            println!("  {line}");
        }
    }
    for v in &o.violations {
        println!("  FAIL {v}");
    }
    if !o.violations.is_empty() {
        let replay = if o.scenario.name.is_empty() {
            format!("--seed {}", o.scenario.seed)
        } else {
            format!("--scenario {}", o.scenario.name)
        };
        // The same seed moved over the hour is another run: say so.
        let hour = if std::env::args().any(|a| a == "--at-hour") {
            " --at-hour"
        } else {
            ""
        };
        println!("  replay: make fleet-sweep ARGS='{replay}{hour} --verbose'");
    }
    o.violations.is_empty()
}

/// One line per request of rule `rule` (if any), in arrival order: proxy,
/// arrival and end, in ms from the start; with `logs`, then every proxy's
/// log lines (clock moves, fallbacks, warnings), in time order.
fn trace(sc: &Scenario, rule: Option<usize>, logs: bool) {
    let t = match fleet::run(sc) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("fleet-sweep: configuration refused: {e}");
            std::process::exit(2);
        }
    };
    let start = sc.start_ns();
    let ms = |x: u64| x.saturating_sub(start) as f64 / 1e6;
    let interval_ns = rule
        .and_then(|rule| sc.rules.get(rule))
        .map_or(1, |r| r.interval_ns());
    let mut rows: Vec<_> = t.records.iter().filter(|r| Some(r.rule) == rule).collect();
    rows.sort_by_key(|r| r.arrived);
    for r in rows {
        let end = match r.end {
            End::Released {
                at,
                held,
                slot,
                credit,
            } => format!(
                "released {:.1}{}{}{}",
                ms(at),
                if held { " after a hold" } else { "" },
                slot.map(|s| format!(" slot {s} (due {:.1})", ms(s * interval_ns)))
                    .unwrap_or_default(),
                if credit { " on credit" } else { "" }
            ),
            End::Refused {
                at,
                held,
                displaced,
            } => format!(
                "refused {:.1}{}{}",
                ms(at),
                if held { " after a hold" } else { "" },
                if displaced { " (displaced)" } else { "" }
            ),
            ref other => format!("{other:?}"),
        };
        println!(
            "proxy {} class {:?} key {:?} arrived {:.1}: {end}",
            r.proxy,
            r.class,
            r.key,
            ms(r.arrived)
        );
    }
    if logs {
        let mut lines: Vec<(u64, usize, &str)> = t
            .processes
            .iter()
            .enumerate()
            .flat_map(|(p, proc_)| proc_.log.iter().map(move |(at, l)| (*at, p, l.as_str())))
            .collect();
        lines.sort_by_key(|&(at, p, _)| (at, p));
        for (at, p, l) in lines {
            println!("{:.1} ms proxy {p}: {l}", ms(at));
        }
    }
}

/// `--stall LEN@AT[/PROXY]`: one stall of LEN ms at AT ms, of one proxy or all.
fn stall_arg(args: &[String]) -> Option<(u64, u64, Option<usize>)> {
    let v = arg(args, "--stall")?;
    let parsed = (|| {
        let (len, rest) = v.split_once('@')?;
        let (at, proxy) = match rest.split_once('/') {
            Some((at, p)) => (at, Some(p.parse().ok()?)),
            None => (rest, None),
        };
        Some((len.parse().ok()?, at.parse().ok()?, proxy))
    })();
    if parsed.is_none() {
        eprintln!("fleet-sweep: --stall takes LEN@AT or LEN@AT/PROXY (ms)");
        std::process::exit(2);
    }
    parsed
}

/// Named scenario `name`, with the stall of `--stall` and the noise of
/// `--noise` if given.
fn scenario(args: &[String], name: &str) -> Option<Scenario> {
    let mut sc = match (stall_arg(args), arg(args, "--offset")) {
        (Some((len, at, proxy)), _) => {
            let mut sc = sweep::with_stall(name, len, at, proxy)?;
            sc.name = stall_name(name, len, at, proxy);
            sc
        }
        (None, Some(by)) => {
            let Ok(by) = by.parse::<u64>() else {
                eprintln!("fleet-sweep: --offset takes a number (ms)");
                std::process::exit(2);
            };
            let mut sc = sweep::with_offset(name, by)?;
            sc.name = format!("{name} --offset {by}");
            sc
        }
        (None, None) => sweep::named(name)?,
    };
    if let Some(at) = arg(args, "--hour-at") {
        let Ok(at) = at.parse::<u64>() else {
            eprintln!("fleet-sweep: --hour-at takes whole seconds into the run");
            std::process::exit(2);
        };
        hour_at(&mut sc, at);
    }
    if let Some(k) = arg(args, "--noise") {
        let Ok(k) = k.parse::<u64>() else {
            eprintln!("fleet-sweep: --noise takes a number");
            std::process::exit(2);
        };
        sc.noise ^= k;
        sc.name = format!("{} --noise {k}", sc.name);
    }
    Some(sc)
}

/// Runs every scenario, reporting failures only: (runs, failed).
fn run_all(scenarios: impl Iterator<Item = Scenario>) -> (u64, u64) {
    let (mut runs, mut failed) = (0u64, 0u64);
    for sc in scenarios {
        runs += 1;
        if !report(&sweep::run_checked(&sc), false) {
            failed += 1;
        }
    }
    (runs, failed)
}

/// `sc` started so that the service's hour ends `at` whole seconds into it.
fn hour_at(sc: &mut Scenario, at: u64) {
    sc.start_s = throttle_core::sim::scenario::HOUR_S + 3600 - at;
    sc.name = format!("{} --hour-at {at}", sc.name);
}

/// `--offset-search NAME`: named scenario NAME with its bursts moved 0, 1,
/// .. `offsets - 1` ms later, over the phases of the engine calls. True if
/// nothing failed.
fn offset_search(name: &str, offsets: u64) -> bool {
    let started = Instant::now();
    let (runs, failed) = run_all((0..offsets).filter_map(|by| {
        let mut sc = sweep::with_offset(name, by)?;
        sc.name = format!("{name} --offset {by}");
        Some(sc)
    }));
    println!(
        "fleet-sweep: offset search of {name}: {runs} runs (its bursts 0..{offsets} ms later), {failed} failed, in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    runs > 0 && failed == 0
}

/// `--start-search NAME`: named scenario NAME started so that the service's
/// hour ends 7, 14, .. `7 * starts` s into it (`--hour-at`): every clock
/// reading in the run moves, and with it the phases of the grid's slots,
/// of the shares' rotation and of the first engine calls. A named scenario
/// otherwise always starts at the top of an hour (it found the pace held at
/// a late first call: `sporadic` waited at 8 of 60 starts). True if
/// nothing failed.
fn start_search(name: &str, starts: u64) -> bool {
    let started = Instant::now();
    let (runs, failed) = run_all((1..=starts).filter_map(|i| {
        let mut sc = sweep::named(name)?;
        hour_at(&mut sc, 7 * i);
        Some(sc)
    }));
    println!(
        "fleet-sweep: start search of {name}: {runs} runs (the hour 7..{} s in), {failed} failed, in {:.0} s",
        7 * starts,
        started.elapsed().as_secs_f64()
    );
    runs > 0 && failed == 0
}

/// `--noise-search NAME|all`: each named scenario at `runs` other noises
/// (its arrivals' jitter, ticks and call latencies drawn anew; the
/// configuration unchanged): whether it holds only at the draw it is named
/// with. True if nothing failed.
fn noise_search(name: &str, runs: u64) -> bool {
    let names: Vec<&str> = if name == "all" {
        sweep::NAMES.to_vec()
    } else {
        vec![name]
    };
    let started = Instant::now();
    let mut ok = true;
    for n in names {
        let Some(base) = sweep::named(n) else {
            eprintln!("fleet-sweep: no scenario {n} (--scenario list)");
            std::process::exit(2);
        };
        let mut failed = 0;
        for i in 1..=runs {
            // Spread over all bits: the draws hardly move for a small XOR.
            let k = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let mut sc = base.clone();
            sc.noise ^= k;
            sc.name = format!("{n} --noise {k}");
            if !report(&sweep::run_checked(&sc), false) {
                failed += 1;
            }
        }
        println!("fleet-sweep: noise search of {n}: {failed} of {runs} noises failed");
        ok &= failed == 0;
    }
    println!(
        "fleet-sweep: noise search done in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    ok
}

/// How a point of the stall search is named: the arguments that replay it.
fn stall_name(name: &str, len: u64, at: u64, proxy: Option<usize>) -> String {
    let who = proxy.map(|p| format!("/{p}")).unwrap_or_default();
    format!("{name} --stall {len}@{at}{who}")
}

/// `--stall-search NAME`: see the module docs. True if nothing failed.
fn stall_search(name: &str, starts: u64) -> bool {
    let Some(base) = sweep::named(name) else {
        eprintln!("fleet-sweep: no scenario {name} (--scenario list)");
        std::process::exit(2);
    };
    let started = Instant::now();
    let (mut runs, mut failed) = (0u64, 0u64);
    let whos: Vec<Option<usize>> = std::iter::once(None)
        .chain((0..base.proxies.len()).map(Some))
        .collect();
    for len in sweep::STALL_LENGTHS_MS {
        for &who in &whos {
            for k in 0..starts {
                let at = 3_000 + k * 7;
                let Some(mut sc) = sweep::with_stall(name, len, at, who) else {
                    continue;
                };
                sc.name = stall_name(name, len, at, who);
                runs += 1;
                if !report(&sweep::run_checked(&sc), false) {
                    failed += 1;
                }
            }
        }
    }
    println!(
        "fleet-sweep: stall search of {name}: {runs} runs (stalls of {:?} ms, of the fleet and of each of {} proxies, {starts} starts 7 ms apart from 3 s), {failed} failed, in {:.0} s",
        sweep::STALL_LENGTHS_MS,
        base.proxies.len(),
        started.elapsed().as_secs_f64()
    );
    failed == 0
}

/// The scenario of `seed`; with `--at-hour`, moved so that the service's
/// hour ends 2-12 s into it (a tenth of the seeds draw that themselves).
fn drawn(args: &[String], seed: u64) -> Scenario {
    let sc = sweep::draw(seed);
    if args.iter().any(|a| a == "--at-hour") {
        sweep::at_hour(sc)
    } else {
        sc
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(name) = arg(&args, "--noise-search") {
        let runs = arg(&args, "--runs")
            .and_then(|s| s.parse().ok())
            .unwrap_or(20);
        std::process::exit(if noise_search(&name, runs) { 0 } else { 1 });
    }
    if let Some(name) = arg(&args, "--offset-search") {
        let offsets = arg(&args, "--offsets")
            .and_then(|s| s.parse().ok())
            .unwrap_or(100);
        std::process::exit(if offset_search(&name, offsets) { 0 } else { 1 });
    }
    if let Some(name) = arg(&args, "--start-search") {
        let starts = arg(&args, "--starts")
            .and_then(|s| s.parse().ok())
            .unwrap_or(60);
        std::process::exit(if start_search(&name, starts) { 0 } else { 1 });
    }
    if let Some(name) = arg(&args, "--stall-search") {
        let starts = arg(&args, "--starts")
            .and_then(|s| s.parse().ok())
            .unwrap_or(60);
        std::process::exit(if stall_search(&name, starts) { 0 } else { 1 });
    }
    let verbose = args.iter().any(|a| a == "--verbose");
    let logs = args.iter().any(|a| a == "--logs");
    if arg(&args, "--trace").is_some() || logs {
        let rule = match arg(&args, "--trace").map(|r| r.parse::<usize>()) {
            None => None,
            Some(Ok(rule)) => Some(rule),
            Some(Err(_)) => {
                eprintln!("fleet-sweep: --trace takes a rule's index");
                std::process::exit(2);
            }
        };
        let sc = match (arg(&args, "--seed"), arg(&args, "--scenario")) {
            (Some(seed), _) => seed.parse().ok().map(|s| drawn(&args, s)),
            (None, Some(name)) => scenario(&args, &name),
            _ => None,
        };
        let Some(sc) = sc else {
            eprintln!("fleet-sweep: --trace and --logs need --seed SEED or --scenario NAME");
            std::process::exit(2);
        };
        trace(&sc, rule, logs);
        return;
    }
    if let Some(name) = arg(&args, "--scenario") {
        let names: Vec<&str> = if name == "all" {
            sweep::NAMES.to_vec()
        } else {
            vec![name.as_str()]
        };
        if name == "list" {
            println!("{}", sweep::NAMES.join("\n"));
            return;
        }
        let mut ok = true;
        for n in names {
            let Some(sc) = scenario(&args, n) else {
                eprintln!("fleet-sweep: no scenario {n} (--scenario list)");
                std::process::exit(2);
            };
            ok &= report(&sweep::run_checked(&sc), true);
        }
        std::process::exit(if ok { 0 } else { 1 });
    }
    if let Some(seed) = arg(&args, "--seed") {
        let Ok(seed) = seed.parse::<u64>() else {
            eprintln!("fleet-sweep: --seed takes a number");
            std::process::exit(2);
        };
        if args.iter().any(|a| a == "--dump") {
            println!("{:#?}", drawn(&args, seed));
        }
        let ok = report(&sweep::run_checked(&drawn(&args, seed)), true);
        std::process::exit(if ok { 0 } else { 1 });
    }
    let seconds: f64 = arg(&args, "--seconds")
        .and_then(|s| s.parse().ok())
        .unwrap_or(60.0);
    let from: u64 = arg(&args, "--from")
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let max_seeds: u64 = arg(&args, "--seeds")
        .and_then(|s| s.parse().ok())
        .unwrap_or(u64::MAX);
    let known: Option<BTreeMap<u64, BTreeSet<String>>> = arg(&args, "--known").map(|path| {
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            eprintln!("fleet-sweep: {path}: {e}");
            std::process::exit(2);
        });
        text.lines()
            .map(|l| l.split('#').next().unwrap_or("").trim())
            .filter(|l| !l.is_empty())
            .filter_map(|l| {
                let (seed, kinds) = l.split_once(char::is_whitespace)?;
                let kinds = kinds.split(',').map(|k| k.trim().to_string()).collect();
                Some((seed.parse().ok()?, kinds))
            })
            .collect()
    });
    let started = Instant::now();
    let mut news: Vec<String> = Vec::new();
    let (mut runs, mut refused, mut failed, mut requests) = (0u64, 0u64, 0u64, 0usize);
    let mut kinds = BTreeSet::new();
    let mut seed = from;
    while started.elapsed().as_secs_f64() < seconds && seed - from < max_seeds {
        let o = sweep::run_checked(&drawn(&args, seed));
        runs += 1;
        requests += o.requests;
        if o.refused.is_some() {
            refused += 1;
        } else {
            kinds.insert(o.kind.clone());
        }
        if !report(&o, verbose) {
            failed += 1;
        }
        if let Some(known) = &known {
            let got: BTreeSet<String> = o
                .violations
                .iter()
                .map(|v| v.invariant.to_string())
                .collect();
            let listed = known.get(&seed).cloned().unwrap_or_default();
            for k in got.difference(&listed) {
                news.push(format!(
                    "seed {seed}: {k} (new: fix it, or list it in the known file with the reason)"
                ));
            }
            for k in listed.difference(&got) {
                news.push(format!(
                    "seed {seed}: {k} holds now (take it off the known list)"
                ));
            }
        }
        seed += 1;
    }
    println!(
        "fleet-sweep: {runs} seeds ({from}..{}), {} distinct configurations, {refused} refused by the filter's validation, {requests} requests, {failed} failed, in {:.0} s",
        seed.saturating_sub(1),
        kinds.len(),
        started.elapsed().as_secs_f64()
    );
    if known.is_some() {
        for n in &news {
            println!("fleet-sweep: {n}");
        }
        println!(
            "fleet-sweep: against the known list: {}",
            if news.is_empty() {
                "as listed"
            } else {
                "CHANGED"
            }
        );
        std::process::exit(if news.is_empty() { 0 } else { 1 });
    }
    std::process::exit(if failed == 0 { 0 } else { 1 });
}
