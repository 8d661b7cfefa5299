//! cluster-sim: N simulated Envoy processes (the core's own cluster code)
//! sharing one rule through the real rate limit service (`--url`), or through
//! the core's in-memory engine (`--fake`), in real time.
//!
//!     cluster-sim --url 127.0.0.1:8080 --proxies 50 --rate 2000 --seconds 10 --out r.json
//!
//! Each proxy gets an uneven share of the offered load (weights 1/(i+1)^0.8),
//! `--offered` times the rate in total. Calls go through `--threads` worker
//! threads (one kept-alive connection each). Prints one JSON object: the
//! released rate against the setting, the worst 100 ms and 1 s windows against
//! their bound, calls per proxy per second, call latency, failures, fallback.

mod http;

use std::collections::VecDeque;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::json;
use throttle_core::cluster::sim::{self, max_in_window, FakeEngine, SimProxy, SimRule};
use throttle_core::cluster::{Failure, Grid};
use throttle_core::config::{EngineConfig, OnEngineFailure};

const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;

struct Args {
    url: Option<String>,
    proxies: usize,
    rate: u64,
    offered: f64,
    seconds: u64,
    warmup: u64,
    threads: usize,
    timeout_ms: u64,
    fake_latency_us: u64,
    skew_ms: u64,
    out: Option<String>,
    probe: bool,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        url: None,
        proxies: 50,
        rate: 1000,
        offered: 1.5,
        seconds: 10,
        warmup: 2,
        threads: 16,
        timeout_ms: 50,
        fake_latency_us: 1000,
        skew_ms: 0,
        out: None,
        probe: false,
    };
    let mut it = std::env::args().skip(1);
    let mut fake = false;
    while let Some(k) = it.next() {
        let mut v = || it.next().ok_or_else(|| format!("{k} needs a value"));
        let num = |s: String| s.parse::<u64>().map_err(|e| format!("{k}: {e}"));
        match k.as_str() {
            "--url" => a.url = Some(v()?),
            "--fake" => fake = true,
            "--proxies" => a.proxies = num(v()?)? as usize,
            "--rate" => a.rate = num(v()?)?,
            "--offered" => a.offered = v()?.parse().map_err(|e| format!("--offered: {e}"))?,
            "--seconds" => a.seconds = num(v()?)?,
            "--warmup" => a.warmup = num(v()?)?,
            "--threads" => a.threads = num(v()?)? as usize,
            "--timeout-ms" => a.timeout_ms = num(v()?)?,
            "--fake-latency-us" => a.fake_latency_us = num(v()?)?,
            "--skew-ms" => a.skew_ms = num(v()?)?,
            "--out" => a.out = Some(v()?),
            "--probe" => a.probe = true,
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if fake == a.url.is_some() {
        return Err("give exactly one of --url HOST:PORT and --fake".into());
    }
    if a.proxies == 0 || a.rate == 0 || a.seconds == 0 || a.threads == 0 {
        return Err("--proxies, --rate, --seconds and --threads must be positive".into());
    }
    Ok(a)
}

fn wall() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A small deterministic generator (phases, skews).
fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

type Answer = Result<(u16, Vec<u8>), Failure>;

struct Sent {
    proxy: usize,
    body: Vec<u8>,
    sent: u64,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// `--probe`: the service's capacity alone. `--threads` clients, each
/// sending one call after another (6 descriptors, as one rule's call does),
/// for `--seconds`; prints calls per second and latency.
fn probe(a: &Args, url: &str) {
    let end = Instant::now() + Duration::from_secs(a.seconds);
    let handles: Vec<_> = (0..a.threads)
        .map(|t| {
            let url = url.to_string();
            std::thread::spawn(move || {
                let mut conn = http::Conn::new(&url, Duration::from_secs(5));
                let mut lat = Vec::new();
                let mut errors = 0u64;
                let mut k = 0u64;
                while Instant::now() < end {
                    k += 1;
                    let f = wall() / (100 * MS);
                    let d = |key: &str, e: u64, hits: u64| {
                        json!({"entries": [{"key": key, "value": format!("probe:500000:200:{e}")}], "hitsAddend": hits.to_string()})
                    };
                    let body = json!({"domain": "envoy_throttle", "descriptors": [
                        d("throttle_members", f + 1, 0), d("throttle_demand", f + 1, 0), d("throttle_slots", f + 1, 3),
                        d("throttle_members", f + 2, 1), d("throttle_demand", f + 2, 7), d("throttle_slots", f + 2, 5 + (k + t as u64) % 3)]})
                    .to_string();
                    let t0 = Instant::now();
                    match conn.post(body.as_bytes()) {
                        Ok((200, _)) => lat.push(t0.elapsed().as_secs_f64() * 1000.0),
                        _ => errors += 1,
                    }
                }
                (lat, errors)
            })
        })
        .collect();
    let mut lat = Vec::new();
    let mut errors = 0;
    for h in handles {
        if let Ok((l, e)) = h.join() {
            lat.extend(l);
            errors += e;
        }
    }
    lat.sort_by(|x, y| x.total_cmp(y));
    let out = json!({"probe": true, "threads": a.threads, "seconds": a.seconds,
        "calls_per_s": lat.len() as f64 / a.seconds as f64, "errors": errors,
        "call_ms": {"p50": percentile(&lat, 0.5), "p90": percentile(&lat, 0.9), "p99": percentile(&lat, 0.99)}});
    println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
}

fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("cluster-sim: {e}");
            std::process::exit(2);
        }
    };
    if a.probe {
        match &a.url {
            Some(url) => probe(&a, url),
            None => eprintln!("cluster-sim: --probe needs --url"),
        }
        return;
    }
    let engine_cfg = EngineConfig {
        cluster: "throttle_engine".into(),
        timeout_ns: a.timeout_ms * MS,
        fallback_after_ns: 250 * MS,
        domain: "envoy_throttle".into(),
        max_clock_skew_ns: 100 * MS,
    };
    let interval = S.div_ceil(a.rate);
    let grid = Grid::new(interval);
    // A name per run: counters of earlier runs never mix in.
    let name = format!("sim{}", wall() / S % 100_000);
    let rule = SimRule {
        name,
        rate_per_s: a.rate,
        burst: 0,
        max_queue_delay_ms: 1000,
        expected_replicas: a.proxies as u32,
        on_engine_failure: OnEngineFailure::LocalShare,
    };
    let config = match sim::config(&engine_cfg, &[rule]) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cluster-sim: {e}");
            std::process::exit(2);
        }
    };
    let skew_of = |i: usize| -> i64 {
        if a.skew_ms == 0 {
            return 0;
        }
        let span = a.skew_ms * MS;
        (mix(i as u64 + 77) % span) as i64 - (span / 2) as i64
    };
    let mut proxies: Vec<SimProxy> = Vec::with_capacity(a.proxies);
    for i in 0..a.proxies {
        match SimProxy::new(&config, skew_of(i)) {
            Ok(p) => proxies.push(p.with_phase(mix(i as u64) % 1000)),
            Err(e) => {
                eprintln!("cluster-sim: {e}");
                std::process::exit(2);
            }
        }
    }
    let weights: Vec<f64> = (0..a.proxies)
        .map(|i| 1.0 / ((i + 1) as f64).powf(0.8))
        .collect();
    let wsum: f64 = weights.iter().sum();
    let offered: Vec<f64> = weights
        .iter()
        .map(|w| a.offered * a.rate as f64 * w / wsum)
        .collect();

    // Transport: worker threads with one connection each, or the in-memory engine.
    let (to_workers, from_main) = mpsc::channel::<Sent>();
    let (to_main, answers) = mpsc::channel::<(usize, u64, Answer, u64)>();
    let from_main = Arc::new(Mutex::new(from_main));
    let mut workers = Vec::new();
    if let Some(url) = &a.url {
        for _ in 0..a.threads {
            let rx = Arc::clone(&from_main);
            let tx = to_main.clone();
            let url = url.clone();
            let timeout = Duration::from_millis(a.timeout_ms.max(1) * 4);
            workers.push(std::thread::spawn(move || {
                let mut conn = http::Conn::new(&url, timeout);
                loop {
                    let job = match rx.lock() {
                        Ok(rx) => rx.recv(),
                        Err(_) => return,
                    };
                    let Ok(job) = job else { return };
                    let answer = match conn.post(&job.body) {
                        Ok(r) => Ok(r),
                        Err(e)
                            if e.kind() == std::io::ErrorKind::WouldBlock
                                || e.kind() == std::io::ErrorKind::TimedOut =>
                        {
                            Err(Failure::Timeout)
                        }
                        Err(_) => Err(Failure::Transport),
                    };
                    if tx.send((job.proxy, job.sent, answer, wall())).is_err() {
                        return;
                    }
                }
            }));
        }
    }
    let mut fake = FakeEngine::default();
    let mut fake_queue: VecDeque<(u64, usize, u64, Answer)> = VecDeque::new();

    let start = wall();
    let end = start + (a.warmup + a.seconds) * S;
    let measure_from = start + a.warmup * S;
    let mut next_arrival: Vec<f64> = (0..a.proxies)
        .map(|i| {
            start as f64
                + (mix(i as u64 + 5) % 1000) as f64 / 1000.0 * (S as f64 / offered[i].max(1e-9))
        })
        .collect();
    let mut rtts: Vec<f64> = Vec::new();
    let mut calls_in_window = vec![0u64; a.proxies];
    let mut failures_in_window = 0u64;
    let mut late_answers = 0u64;
    let clock = Instant::now();
    let mut next_tick = start;
    while wall() < end {
        let t = wall();
        // Answers first.
        while let Ok((p, sent, answer, got)) = answers.try_recv() {
            let rtt = got.saturating_sub(sent);
            rtts.push(rtt as f64 / MS as f64);
            let answer = if rtt > a.timeout_ms * MS {
                late_answers += 1;
                Err(Failure::Timeout)
            } else {
                answer
            };
            if sent >= measure_from && answer.is_err() {
                failures_in_window += 1;
            }
            match &answer {
                Ok((s, b)) => proxies[p].answer(got, Ok((*s, b))),
                Err(f) => proxies[p].answer(got, Err(f.clone())),
            }
        }
        while fake_queue.front().is_some_and(|q| q.0 <= t) {
            if let Some((at, p, sent, answer)) = fake_queue.pop_front() {
                rtts.push((at - sent) as f64 / MS as f64);
                match &answer {
                    Ok((s, b)) => proxies[p].answer(at, Ok((*s, b))),
                    Err(f) => proxies[p].answer(at, Err(f.clone())),
                }
            }
        }
        // Arrivals up to now.
        for (i, p) in proxies.iter_mut().enumerate() {
            let gap = S as f64 / offered[i].max(1e-9);
            while next_arrival[i] <= t as f64 {
                p.arrive(0, next_arrival[i] as u64);
                next_arrival[i] += gap;
            }
        }
        // The calling VMs' ticks (every 5 ms) and the workers' retries.
        if t >= next_tick {
            next_tick = t + 5 * MS;
            for (i, p) in proxies.iter_mut().enumerate() {
                if let Some(call) = p.tick(t) {
                    if t >= measure_from {
                        calls_in_window[i] += 1;
                    }
                    if a.url.is_some() {
                        let _ = to_workers.send(Sent {
                            proxy: i,
                            body: call.request.body,
                            sent: t,
                        });
                    } else {
                        let served = fake.handle(&call.request.body, t + a.fake_latency_us * 500);
                        fake_queue.push_back((t + a.fake_latency_us * 1000, i, t, Ok(served)));
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    drop(to_workers);
    let elapsed = clock.elapsed().as_secs_f64();

    // Results over the measured window.
    let mut times: Vec<u64> = proxies
        .iter()
        .flat_map(|p| p.releases.iter().map(|r| r.at))
        .filter(|&t| t >= measure_from && t < end)
        .collect();
    times.sort_unstable();
    let seconds = (end - measure_from) as f64 / S as f64;
    let total_rate = times.len() as f64 / seconds;
    let spread = if a.skew_ms > 0 { a.skew_ms * MS } else { 0 };
    let bound = |w: u64| (w + spread).div_ceil(interval) + 2;
    let mut waits: Vec<f64> = proxies
        .iter()
        .flat_map(|p| p.releases.iter())
        .filter(|r| r.at >= measure_from && r.at < end)
        .map(|r| (r.at.saturating_sub(r.arrived)) as f64 / MS as f64)
        .collect();
    waits.sort_by(|x, y| x.total_cmp(y));
    rtts.sort_by(|x, y| x.total_cmp(y));
    let per_proxy_calls: Vec<f64> = calls_in_window
        .iter()
        .map(|c| *c as f64 / seconds)
        .collect();
    let max_calls = per_proxy_calls.iter().cloned().fold(0.0, f64::max);
    let mean_calls = per_proxy_calls.iter().sum::<f64>() / a.proxies as f64;
    let shares: Vec<f64> = proxies
        .iter()
        .map(|p| {
            p.releases
                .iter()
                .filter(|r| r.at >= measure_from && r.at < end)
                .count() as f64
                / seconds
        })
        .collect();
    let fallback_s: f64 = (0..a.proxies)
        .filter_map(|i| proxies[i].caller().stats(0))
        .map(|s| s.fallback_total_ns(end) as f64 / S as f64)
        .sum();
    // The worst 100 ms window of grid releases alone (fallback pacing excluded).
    let mut grid_times: Vec<u64> = proxies
        .iter()
        .flat_map(|p| p.releases.iter().filter(|r| r.slot.is_some()).map(|r| r.at))
        .filter(|&t| t >= measure_from && t < end)
        .collect();
    grid_times.sort_unstable();
    let local_releases = proxies
        .iter()
        .flat_map(|p| p.releases.iter())
        .filter(|r| r.at >= measure_from && r.at < end && r.slot.is_none())
        .count();
    let out = json!({
        "engine": if a.url.is_some() { "real" } else { "fake" },
        "proxies": a.proxies,
        "rate": a.rate,
        "offered_x": a.offered,
        "seconds": seconds,
        "wall_seconds": elapsed,
        "grid": {"interval_ns": grid.interval_ns, "slots_per_epoch": grid.slots_per_epoch, "epoch_ns": grid.epoch_ns},
        "released_per_s": total_rate,
        "rate_error_pct": (total_rate - a.rate as f64) / a.rate as f64 * 100.0,
        "worst_100ms": max_in_window(&times, 100 * MS),
        "bound_100ms": bound(100 * MS),
        "worst_1s": max_in_window(&times, S),
        "worst_100ms_grid_only": max_in_window(&grid_times, 100 * MS),
        "bound_1s": bound(S),
        "calls_per_proxy_per_s": {"mean": mean_calls, "max": max_calls},
        "engine_calls_per_s": mean_calls * a.proxies as f64,
        "call_ms": {"p50": percentile(&rtts, 0.5), "p99": percentile(&rtts, 0.99), "max": rtts.last().copied().unwrap_or(0.0)},
        "failed_calls": failures_in_window,
        "late_answers": late_answers,
        "fallback_proxy_seconds": fallback_s,
        "local_releases": local_releases,
        "wait_ms": {"p50": percentile(&waits, 0.5), "p99": percentile(&waits, 0.99)},
        "rejected": proxies.iter().map(|p| p.rejected).sum::<u64>(),
        "timed_out_waiting": proxies.iter().map(|p| p.timed_out).sum::<u64>(),
        "share_top3_per_s": shares.iter().take(3).collect::<Vec<_>>(),
        "offered_top3_per_s": offered.iter().take(3).collect::<Vec<_>>(),
        "fake_engine_redis_commands": fake.redis_commands,
    });
    let text = serde_json::to_string_pretty(&out).unwrap_or_default();
    if let Some(path) = &a.out {
        if let Err(e) = std::fs::write(path, &text) {
            eprintln!("cluster-sim: cannot write {path}: {e}");
            std::process::exit(1);
        }
    }
    println!("{text}");
    for w in workers {
        let _ = w.join();
    }
}
