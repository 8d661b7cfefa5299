//! A host in memory, for native tests of the glue (as Kuadrant's mock host):
//! shared data with compare-and-swap tokens, streams with their headers,
//! properties, replies and resumes, metrics by name, ticks and queues.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use throttle_core::reply::Reply;
use throttle_core::stats::Kind;

use super::{Host, Level};

/// An HTTP call sent: (token, cluster, headers, body, timeout ms).
pub type Sent = (u32, String, Vec<(String, String)>, Vec<u8>, u32);

/// What the fake host holds and records.
#[derive(Debug, Default)]
pub struct State {
    /// The monotonic clock.
    pub now: u64,
    /// How often the clock was read.
    pub clock_reads: usize,
    /// The wall clock.
    pub wall: u64,
    /// HTTP calls sent.
    pub calls: Vec<Sent>,
    /// The cluster names the host knows (others are refused).
    pub clusters: Vec<String>,
    /// The answer being delivered: status and body.
    pub answer: Option<(Option<u16>, Vec<u8>)>,
    /// The effective context.
    pub current: u32,
    pub shared: HashMap<String, (Vec<u8>, u32)>,
    next_cas: u32,
    /// Shared data fails (as a broken host would).
    pub shared_broken: bool,
    /// Request header lines by stream.
    pub request: HashMap<u32, Vec<(String, Vec<u8>)>>,
    /// Other properties by stream (`source.address`, ...), path joined with '.'.
    pub properties: HashMap<(u32, String), Vec<u8>>,
    /// Response headers set, by stream (replacing).
    pub response: HashMap<u32, BTreeMap<String, String>>,
    /// Response headers as the upstream sent them, by stream.
    pub upstream: HashMap<u32, Vec<(String, Vec<u8>)>>,
    /// Local replies sent, by stream.
    pub replies: HashMap<u32, Reply>,
    /// Streams resumed, in order.
    pub resumed: Vec<u32>,
    /// Streams that are gone (resume and effective context fail).
    pub gone: HashSet<u32>,
    /// The tick period last set.
    pub tick_ms: u32,
    /// Metrics: name, kind, value (histograms: the last value recorded).
    pub metrics: Vec<(String, Kind, i64)>,
    /// Every histogram value recorded, by metric name.
    pub recorded: Vec<(String, u64)>,
    pub queues: Vec<(String, VecDeque<Vec<u8>>)>,
    pub logs: Vec<(Level, String)>,
    /// Calls of each host function, by its name in the ABI (`get_shared_data`, ...).
    pub hostcalls: BTreeMap<&'static str, usize>,
}

impl State {
    /// A metric's value (0 if undefined).
    pub fn metric(&self, name: &str) -> i64 {
        self.metrics
            .iter()
            .find(|(n, _, _)| n == name)
            .map_or(0, |(_, _, v)| *v)
    }
}

/// A handle to a fake host (leaked: lives for the test).
#[derive(Debug, Clone, Copy)]
pub struct Fake(pub &'static RefCell<State>);

impl Fake {
    pub fn new() -> Self {
        Fake(Box::leak(Box::default()))
    }

    pub fn state(&self) -> std::cell::RefMut<'_, State> {
        self.0.borrow_mut()
    }

    /// The state, one more call of host function `name` counted.
    fn call(&self, name: &'static str) -> std::cell::RefMut<'_, State> {
        let mut s = self.state();
        *s.hostcalls.entry(name).or_default() += 1;
        s
    }
}

impl Host for Fake {
    fn log(&self, level: Level, msg: &str) {
        self.call("log").logs.push((level, msg.to_string()));
    }

    fn monotonic_ns(&self) -> u64 {
        let mut s = self.call("clock_time_get");
        s.clock_reads += 1;
        s.now
    }

    fn wall_ns(&self) -> u64 {
        self.call("get_current_time_nanoseconds").wall
    }

    /// Deterministic, but different at each call (as two VMs' draws are).
    fn random(&self, buf: &mut [u8]) -> bool {
        let draws = *self
            .call("random_get")
            .hostcalls
            .get("random_get")
            .unwrap_or(&0);
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (i as u8 ^ 0x5a).wrapping_add((draws as u8).wrapping_mul(31));
        }
        true
    }

    fn shared_get(&self, key: &str) -> Result<(Option<Vec<u8>>, u32), u32> {
        let s = self.call("get_shared_data");
        if s.shared_broken {
            return Err(10);
        }
        Ok(match s.shared.get(key) {
            Some((v, cas)) => (Some(v.clone()), *cas),
            None => (None, 0),
        })
    }

    fn shared_set(&self, key: &str, value: &[u8], cas: u32) -> Result<bool, u32> {
        let mut s = self.call("set_shared_data");
        if s.shared_broken {
            return Err(10);
        }
        let current = s.shared.get(key).map(|(_, c)| *c);
        if cas != 0 && current.is_some_and(|c| c != cas) {
            return Ok(false);
        }
        s.next_cas += 1;
        let next = s.next_cas;
        s.shared.insert(key.to_string(), (value.to_vec(), next));
        Ok(true)
    }

    fn request_header(&self, name: &str) -> Option<Vec<u8>> {
        let s = self.call("get_header_map_value");
        s.request
            .get(&s.current)?
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    }

    fn response_header(&self, name: &str) -> Option<Vec<u8>> {
        // The same host call as a request header's (another map).
        let s = self.call("get_header_map_value");
        s.upstream
            .get(&s.current)?
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    }

    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        let s = self.call("get_property");
        if let ["request", "headers", name] = path {
            let lines: Vec<&[u8]> = s
                .request
                .get(&s.current)?
                .iter()
                .filter(|(n, _)| n == name)
                .map(|(_, v)| v.as_slice())
                .collect();
            return (!lines.is_empty()).then(|| lines.join(&b","[..]));
        }
        s.properties.get(&(s.current, path.join("."))).cloned()
    }

    fn set_response_header(&self, name: &str, value: &str) {
        let mut s = self.call("replace_header_map_value");
        let id = s.current;
        s.response
            .entry(id)
            .or_default()
            .insert(name.to_string(), value.to_string());
    }

    fn send_reply(&self, reply: &Reply) -> bool {
        let mut s = self.call("send_local_response");
        let id = s.current;
        if s.gone.contains(&id) {
            return false;
        }
        s.replies.insert(id, reply.clone());
        true
    }

    fn set_effective_context(&self, id: u32) -> bool {
        let mut s = self.call("set_effective_context");
        s.current = id;
        !s.gone.contains(&id)
    }

    fn resume_request(&self, id: u32) -> Result<(), u32> {
        let mut s = self.call("set_effective_context");
        *s.hostcalls.entry("continue_stream").or_default() += 1;
        s.current = id;
        if s.gone.contains(&id) {
            return Err(2);
        }
        s.resumed.push(id);
        Ok(())
    }

    fn set_tick_period_ms(&self, ms: u32) -> bool {
        self.call("set_tick_period_milliseconds").tick_ms = ms;
        true
    }

    fn define_metric(&self, kind: Kind, name: &str) -> Option<u32> {
        let mut s = self.call("define_metric");
        if let Some(i) = s.metrics.iter().position(|(n, _, _)| n == name) {
            return u32::try_from(i).ok();
        }
        s.metrics.push((name.to_string(), kind, 0));
        u32::try_from(s.metrics.len() - 1).ok()
    }

    fn increment_metric(&self, id: u32, delta: i64) {
        if let Some(m) = self.call("increment_metric").metrics.get_mut(id as usize) {
            m.2 += delta;
        }
    }

    fn record_metric(&self, id: u32, value: u64) {
        let mut s = self.call("record_metric");
        let Some(m) = s.metrics.get_mut(id as usize) else {
            return;
        };
        if m.1 == Kind::Gauge {
            m.2 = i64::try_from(value).unwrap_or(i64::MAX);
        } else {
            let name = m.0.clone();
            s.recorded.push((name, value));
        }
    }

    fn metric(&self, id: u32) -> Option<u64> {
        let s = self.call("get_metric");
        s.metrics
            .get(id as usize)
            .and_then(|(_, _, v)| u64::try_from(*v).ok())
    }

    fn http_call(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout_ms: u32,
    ) -> Result<u32, u32> {
        let mut s = self.call("http_call");
        if !s.clusters.iter().any(|c| c == cluster) {
            return Err(2);
        }
        let token = s.calls.len() as u32 + 1;
        let headers = headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        s.calls.push((
            token,
            cluster.to_string(),
            headers,
            body.to_vec(),
            timeout_ms,
        ));
        Ok(token)
    }

    fn http_call_status(&self) -> Option<u16> {
        self.call("get_header_map_value")
            .answer
            .as_ref()
            .and_then(|(status, _)| *status)
    }

    fn http_call_body(&self, size: usize) -> Option<Vec<u8>> {
        let s = self.call("get_buffer_bytes");
        let (_, body) = s.answer.as_ref()?;
        Some(body.iter().take(size).copied().collect())
    }

    fn register_queue(&self, name: &str) -> Option<u32> {
        let mut s = self.call("register_shared_queue");
        s.queues.push((name.to_string(), VecDeque::new()));
        u32::try_from(s.queues.len() - 1).ok()
    }

    fn enqueue(&self, queue: u32, data: &[u8]) -> bool {
        match self
            .call("enqueue_shared_queue")
            .queues
            .get_mut(queue as usize)
        {
            Some((_, q)) => {
                q.push_back(data.to_vec());
                true
            }
            None => false,
        }
    }

    fn dequeue(&self, queue: u32) -> Option<Vec<u8>> {
        self.call("dequeue_shared_queue")
            .queues
            .get_mut(queue as usize)?
            .1
            .pop_front()
    }
}
