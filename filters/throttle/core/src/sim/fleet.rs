//! A fleet of simulated processes ([`Process`]) against the in-memory engine
//! ([`FakeEngine`]), in virtual time: the requests of a [`Scenario`] arrive,
//! every VM ticks as Envoy ticks it (every few ms while it holds requests,
//! every 20 ms for the calling side), calls reach the engine over a network
//! with latency and faults, the upstream answers after its service time, and
//! clients give up after their timeout. Same scenario, same trace.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::clock::NS_PER_MS;
use crate::cluster::Failure;
use crate::config::Config;

use super::engine::FakeEngine;
use super::process::{End, Out, Process, Record, SimRequest};
use super::rng::Rng;
use super::scenario::{Fault, Scenario, Shape};

/// The tick of a VM that holds nothing but may call the engine (the glue's
/// `CALLER_TICK_MS`).
const CALLER_TICK_NS: u64 = 20 * NS_PER_MS;
/// The tick of a VM that holds nothing and does not call (the flush tick).
const IDLE_TICK_NS: u64 = 100 * NS_PER_MS;

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// The next request of load `i`.
    Arrive(usize),
    /// VM `vm` of proxy `p` ticks (if it is still its scheduled tick).
    Tick { p: usize, vm: usize },
    /// The upstream answers stream `id` of proxy `p`.
    Upstream { p: usize, id: u32 },
    /// The client of stream `id` of proxy `p` gives up.
    Gone { p: usize, id: u32 },
    /// A call reaches the engine.
    Serve {
        p: usize,
        vm: usize,
        body: Vec<u8>,
        back_ns: u64,
        late: bool,
    },
    /// The engine's answer reaches VM `vm` of proxy `p`.
    Answer {
        p: usize,
        vm: usize,
        status: u16,
        body: Vec<u8>,
    },
    /// The call fails: a timeout (true) or a transport error.
    Fail { p: usize, vm: usize, timeout: bool },
    /// Redis restarts: every counter is lost.
    LoseCounters,
    /// Proxy `p`'s clock steps by `by_ms`.
    Step { p: usize, by_ms: i64 },
    /// Load `i`'s request that arrived while its proxy was stalled (the
    /// load has already moved on to its next).
    Held(usize),
    /// `ev`, due at `at` at a proxy that was stalled then.
    Late { at: u64, ev: Box<Ev> },
}

/// The result of a run: every request's record, and the processes as they
/// ended (their statistics, grants, logs).
#[derive(Debug)]
pub struct Trace {
    pub scenario: Scenario,
    pub config: Config,
    pub records: Vec<Record>,
    pub processes: Vec<Process>,
    pub engine_calls: u64,
    pub redis_commands: u64,
    /// True time the run ended, ns.
    pub end: u64,
}

/// The world of one run.
pub struct Fleet {
    sc: Scenario,
    config: Config,
    processes: Vec<Process>,
    engine: FakeEngine,
    rng: Rng,
    events: BinaryHeap<Reverse<(u64, u64, Ev)>>,
    seq: u64,
    /// Per proxy and VM: the time of its scheduled tick.
    next_tick: Vec<Vec<u64>>,
    records: Vec<Record>,
    /// Per load: its generator and how many it sent.
    load_rng: Vec<Rng>,
    /// Each VM's own draws (its ticks), and each process's (its calls'
    /// latency): what one rule's requests do never shifts another's draws.
    vm_rng: Vec<Vec<Rng>>,
    call_rng: Vec<Rng>,
    load_sent: Vec<u64>,
}

impl Fleet {
    /// The fleet of `sc` (Err: the configuration is refused).
    pub fn new(sc: &Scenario) -> Result<Fleet, String> {
        let config = sc.config()?;
        let mut rng = Rng::new(sc.seed);
        let processes: Vec<Process> = sc
            .proxies
            .iter()
            .enumerate()
            .map(|(i, p)| {
                Process::new(
                    &config,
                    p.vms,
                    p.skew_ms.saturating_mul(NS_PER_MS as i64),
                    sc.seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9),
                )
            })
            .collect();
        // VM 0 of each process is the main thread's (no requests).
        let next_tick = sc
            .proxies
            .iter()
            .map(|p| vec![0; p.vms.max(1) + 1])
            .collect();
        let load_rng = (0..sc.loads.len()).map(|i| rng.fork(i as u64)).collect();
        let vm_rng = sc
            .proxies
            .iter()
            .enumerate()
            .map(|(p, spec)| {
                (0..=spec.vms.max(1))
                    .map(|vm| rng.fork(((p as u64) << 16) | vm as u64).fork(sc.noise))
                    .collect()
            })
            .collect();
        let call_rng = (0..sc.proxies.len())
            .map(|p| rng.fork(0xCA11_0000 | p as u64).fork(sc.noise))
            .collect();
        let mut f = Fleet {
            sc: sc.clone(),
            config,
            processes,
            engine: FakeEngine::default(),
            rng,
            events: BinaryHeap::new(),
            seq: 0,
            next_tick,
            records: Vec::new(),
            load_rng,
            vm_rng,
            call_rng,
            load_sent: vec![0; sc.loads.len()],
        };
        f.schedule();
        Ok(f)
    }

    fn push(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.events.push(Reverse((at, self.seq, ev)));
    }

    fn schedule(&mut self) {
        let sc = self.sc.clone();
        for (i, l) in sc.loads.iter().enumerate() {
            if let Some(t) = self.next_arrival(i, None) {
                self.push(t, Ev::Arrive(i));
            }
            let _ = l;
        }
        for (p, spec) in sc.proxies.iter().enumerate() {
            for vm in 0..=spec.vms.max(1) {
                // VMs start ticking at a spread of phases; the main thread's
                // first (it is configured first).
                let first = if vm == 0 { 2 } else { 20 };
                let t = sc.at(spec.start_ms) + self.draw(p, vm, 0, first) * NS_PER_MS;
                if let Some(n) = self.next_tick.get_mut(p).and_then(|v| v.get_mut(vm)) {
                    *n = t;
                }
                self.push(t, Ev::Tick { p, vm });
            }
            for &(at_ms, by_ms) in &spec.steps {
                self.push(sc.at(at_ms), Ev::Step { p, by_ms });
            }
        }
        for f in &sc.faults {
            if let Fault::RedisRestart { at_ms, .. } = f {
                self.push(sc.at(*at_ms), Ev::LoseCounters);
            }
        }
    }

    /// The time of load `i`'s next request after `after` (None: its first).
    fn next_arrival(&mut self, i: usize, after: Option<u64>) -> Option<u64> {
        let l = self.sc.loads.get(i)?.clone();
        let (from, to) = (
            self.sc.at(l.from_ms),
            self.sc.at(l.to_ms.min(self.sc.duration_ms)),
        );
        let sent = self.load_sent.get(i).copied().unwrap_or(0);
        let rng = self.load_rng.get_mut(i)?;
        let t = match l.shape {
            Shape::Uniform { per_s, phase_ms } => {
                if per_s <= 0.0 {
                    return None;
                }
                let gap = 1e9 / per_s;
                from + phase_ms * NS_PER_MS + (sent as f64 * gap) as u64
            }
            Shape::Poisson { per_s } => {
                if per_s <= 0.0 {
                    return None;
                }
                after.unwrap_or(from) + rng.exp(1e9 / per_s)
            }
            Shape::Burst {
                n,
                at_ms,
                spread_ms,
            } => {
                if sent >= u64::from(n) {
                    return None;
                }
                self.sc.at(at_ms) + sent * spread_ms * NS_PER_MS / u64::from(n)
            }
        };
        (t < to).then_some(t)
    }

    /// Runs the scenario to its end.
    pub fn run(mut self) -> Trace {
        let end = self.sc.at(self.sc.duration_ms);
        while let Some(Reverse((t, _, ev))) = self.events.pop() {
            if t > end {
                break;
            }
            self.deliver(t, ev);
        }
        Trace {
            scenario: self.sc,
            config: self.config,
            records: self.records,
            processes: self.processes,
            engine_calls: self.engine.calls,
            redis_commands: self.engine.redis_commands,
            end,
        }
    }

    /// The proxy an event happens at (None: the engine's or the world's).
    fn proxy_of(&self, ev: &Ev) -> Option<usize> {
        match ev {
            Ev::Arrive(i) => self.sc.loads.get(*i).map(|l| l.proxy),
            Ev::Tick { p, .. }
            | Ev::Upstream { p, .. }
            | Ev::Gone { p, .. }
            | Ev::Answer { p, .. }
            | Ev::Fail { p, .. } => Some(*p),
            Ev::Held(i) => self.sc.loads.get(*i).map(|l| l.proxy),
            Ev::Late { ev, .. } => self.proxy_of(ev),
            Ev::Serve { .. } | Ev::LoseCounters | Ev::Step { .. } => None,
        }
    }

    /// When a stall of proxy `p` that covers `t` ends.
    fn stalled_until(&self, p: usize, t: u64) -> Option<u64> {
        let spec = self.sc.proxies.get(p)?;
        spec.stalls.iter().find_map(|&(at, len)| {
            let (a, b) = (self.sc.at(at), self.sc.at(at + len));
            (t >= a && t < b).then_some(b)
        })
    }

    fn deliver(&mut self, t: u64, ev: Ev) {
        // A stalled process sees nothing until its stall ends; an arrival
        // keeps its load's own timing (the next request is drawn from when
        // the client sent this one).
        let (t, ev, sent) = match ev {
            Ev::Late { at, ev } => (t, *ev, at),
            ev => (t, ev, t),
        };
        if let Some(end) = self.proxy_of(&ev).and_then(|p| self.stalled_until(p, t)) {
            if let Ev::Tick { p, vm } = ev {
                // The tick comes when the stall ends.
                if let Some(n) = self.next_tick.get_mut(p).and_then(|v| v.get_mut(vm)) {
                    if *n == t {
                        *n = end;
                        self.push(end, Ev::Tick { p, vm });
                    }
                }
            } else if let Ev::Arrive(i) = ev {
                // The load goes on sending meanwhile.
                if let Some(n) = self.load_sent.get_mut(i) {
                    *n += 1;
                }
                if let Some(next) = self.next_arrival(i, Some(sent)) {
                    self.push(next, Ev::Arrive(i));
                }
                self.push(
                    end,
                    Ev::Late {
                        at: sent,
                        ev: Box::new(Ev::Held(i)),
                    },
                );
            } else {
                self.push(
                    end,
                    Ev::Late {
                        at: sent,
                        ev: Box::new(ev),
                    },
                );
            }
            return;
        }
        let mut out = Out::default();
        let mut origin: Option<usize> = None;
        match ev {
            Ev::Arrive(i) | Ev::Held(i) => {
                let Some(l) = self.sc.loads.get(i).cloned() else {
                    return;
                };
                if matches!(ev, Ev::Arrive(_)) {
                    if let Some(n) = self.load_sent.get_mut(i) {
                        *n += 1;
                    }
                    if let Some(next) = self.next_arrival(i, Some(t)) {
                        self.push(next, Ev::Arrive(i));
                    }
                }
                let p = l.proxy;
                let Some(spec) = self.sc.proxies.get(p) else {
                    return;
                };
                if t < self.sc.at(spec.start_ms) || spec.stop_ms.is_some_and(|s| t >= self.sc.at(s))
                {
                    return;
                }
                let vms = spec.vms.max(1);
                // Drawn from the load's own generator: a load's requests are
                // the same whatever the other loads of the run.
                let Some(lr) = self.load_rng.get_mut(i) else {
                    return;
                };
                let vm = 1 + lr.range(0, vms as u64 - 1) as usize;
                let key = l.keys.map(|n| {
                    // Log-uniform over 1..=n: a few hot keys, a long tail.
                    let x = (n.max(1) as f64).powf(lr.unit());
                    (x as u32).saturating_sub(1).min(n.saturating_sub(1))
                });
                let class_name = l.class.and_then(|c| {
                    self.sc
                        .rules
                        .get(l.rule)
                        .and_then(|r| r.classes.get(c))
                        .map(|c| c.0.clone())
                });
                let record = self.records.len();
                self.records.push(Record {
                    proxy: p,
                    vm,
                    rule: l.rule,
                    key,
                    class: l.class,
                    arrived: t,
                    end: End::Pending,
                });
                let req = SimRequest {
                    rule: l.rule,
                    key,
                    class: class_name,
                };
                let Some(proc_) = self.processes.get_mut(p) else {
                    return;
                };
                let id = proc_.arrive(t, vm, req, record, &mut out);
                let held = proc_.needs_ticks(vm);
                origin = Some(p);
                if let (Some(id), Some(ms)) = (id, l.client_timeout_ms) {
                    self.push(t + ms * NS_PER_MS, Ev::Gone { p, id });
                }
                if held {
                    // The glue asks for its fast tick at once.
                    let soon = t + self.tick_gap(p, vm);
                    if self
                        .next_tick
                        .get(p)
                        .and_then(|v| v.get(vm))
                        .is_some_and(|&n| n > soon)
                    {
                        if let Some(n) = self.next_tick.get_mut(p).and_then(|v| v.get_mut(vm)) {
                            *n = soon;
                        }
                        self.push(soon, Ev::Tick { p, vm });
                    }
                }
            }
            Ev::Tick { p, vm } => {
                if self.next_tick.get(p).and_then(|v| v.get(vm)) != Some(&t) {
                    return; // superseded by an earlier tick
                }
                if self
                    .sc
                    .proxies
                    .get(p)
                    .and_then(|s| s.stop_ms)
                    .is_some_and(|s| t >= self.sc.at(s))
                {
                    return;
                }
                let Some(proc_) = self.processes.get_mut(p) else {
                    return;
                };
                proc_.tick(t, vm, &mut out);
                let next = if proc_.needs_ticks(vm) {
                    t + self.tick_gap(p, vm)
                } else if proc_.calls(vm).is_some() {
                    // Envoy's timer fires a little late.
                    t + CALLER_TICK_NS + self.draw(p, vm, 0, 4) * NS_PER_MS
                } else {
                    t + IDLE_TICK_NS
                };
                if let Some(n) = self.next_tick.get_mut(p).and_then(|v| v.get_mut(vm)) {
                    *n = next;
                }
                self.push(next, Ev::Tick { p, vm });
                origin = Some(p);
            }
            Ev::Upstream { p, id } => {
                if let Some(proc_) = self.processes.get_mut(p) {
                    proc_.answered(t, id, &mut out);
                    origin = Some(p);
                }
            }
            Ev::Gone { p, id } => {
                if let Some(proc_) = self.processes.get_mut(p) {
                    proc_.client_gone(t, id, &mut out);
                    origin = Some(p);
                }
            }
            Ev::Serve {
                p,
                vm,
                body,
                back_ns,
                late,
            } => {
                let (status, answer) = if self.redis_down(t) {
                    (400, b"Bad Request\n".to_vec())
                } else {
                    self.engine.handle(&body, t)
                };
                if !late {
                    self.push(
                        t + back_ns,
                        Ev::Answer {
                            p,
                            vm,
                            status,
                            body: answer,
                        },
                    );
                }
            }
            Ev::Answer {
                p,
                vm,
                status,
                body,
            } => {
                if let Some(proc_) = self.processes.get_mut(p) {
                    proc_.answer(t, vm, Ok((status, &body)), &mut out);
                    origin = Some(p);
                }
            }
            Ev::Fail { p, vm, timeout } => {
                if let Some(proc_) = self.processes.get_mut(p) {
                    let f = if timeout {
                        Failure::Timeout
                    } else {
                        Failure::Transport
                    };
                    proc_.answer(t, vm, Err(f), &mut out);
                    origin = Some(p);
                }
            }
            // Unwrapped above; never nested.
            Ev::Late { .. } => {}
            Ev::LoseCounters => self.engine.lose_counters(),
            Ev::Step { p, by_ms } => {
                if let Some(proc_) = self.processes.get_mut(p) {
                    proc_.skew_ns = proc_
                        .skew_ns
                        .saturating_add(by_ms.saturating_mul(NS_PER_MS as i64));
                }
            }
        }
        if let Some(p) = origin {
            self.carry(t, p, out);
        }
    }

    /// A VM's fast tick gap, drawn.
    fn tick_gap(&mut self, p: usize, vm: usize) -> u64 {
        let (lo, hi) = self.sc.tick_ms;
        // In 0.5 ms steps within [lo, hi].
        let half = self.draw(p, vm, lo * 2, hi.max(lo) * 2);
        half.max(1) * NS_PER_MS / 2
    }

    /// A draw in `[lo, hi]` from VM `vm` of process `p`'s own stream.
    fn draw(&mut self, p: usize, vm: usize, lo: u64, hi: u64) -> u64 {
        match self.vm_rng.get_mut(p).and_then(|v| v.get_mut(vm)) {
            Some(r) => r.range(lo, hi),
            None => self.rng.range(lo, hi),
        }
    }

    fn in_fault(&self, t: u64, pick: impl Fn(&Fault) -> bool) -> Option<Fault> {
        self.sc.faults.iter().copied().find(|f| {
            let (a, b) = f.span_ms();
            pick(f) && t >= self.sc.at(a) && t < self.sc.at(b)
        })
    }

    fn redis_down(&self, t: u64) -> bool {
        self.in_fault(t, |f| matches!(f, Fault::RedisRestart { .. }))
            .is_some()
    }

    /// Carries out what a process asked for: its records' ends, calls to the
    /// engine, requests upstream.
    fn carry(&mut self, t: u64, p: usize, out: Out) {
        for (record, end) in out.ended {
            if let Some(r) = self.records.get_mut(record) {
                r.end = end;
            }
        }
        let service = self.sc.service_ms * NS_PER_MS;
        for id in out.upstream {
            self.push(t + service, Ev::Upstream { p, id });
        }
        let timeout = self.sc.timeout_ms * NS_PER_MS;
        for (vm, call) in out.calls {
            let body = call.request.body;
            if self
                .in_fault(t, |f| matches!(f, Fault::EngineDown { .. }))
                .is_some()
            {
                self.push(
                    t + NS_PER_MS,
                    Ev::Fail {
                        p,
                        vm,
                        timeout: false,
                    },
                );
                continue;
            }
            if self
                .in_fault(t, |f| matches!(f, Fault::Nonsense { .. }))
                .is_some()
            {
                self.push(
                    t + NS_PER_MS,
                    Ev::Answer {
                        p,
                        vm,
                        status: 200,
                        body: b"{\"overallCode\": \"OK\", \"statuses\": [{}]}".to_vec(),
                    },
                );
                continue;
            }
            let latency = match self.in_fault(t, |f| matches!(f, Fault::Slow { .. })) {
                Some(Fault::Slow { latency_ms, .. }) => latency_ms * NS_PER_MS,
                _ => {
                    let (lo, hi) = self.sc.latency_ms;
                    let r = self.call_rng.get_mut(p).unwrap_or(&mut self.rng);
                    r.range(lo * 1000, hi.max(lo) * 1000) * NS_PER_MS / 1000
                }
            };
            let late = latency > timeout;
            self.push(
                t + latency / 2,
                Ev::Serve {
                    p,
                    vm,
                    body,
                    back_ns: latency - latency / 2,
                    late,
                },
            );
            if late {
                self.push(
                    t + timeout,
                    Ev::Fail {
                        p,
                        vm,
                        timeout: true,
                    },
                );
            }
        }
    }
}

/// Runs a scenario (Err: its configuration is refused).
pub fn run(sc: &Scenario) -> Result<Trace, String> {
    Ok(Fleet::new(sc)?.run())
}
