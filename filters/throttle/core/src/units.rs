//! Parsing of rates (`"500/s"`, `"30/m"`, `"2/h"`, or a number per second) and
//! durations (`"250ms"`, `"2s"`, `"1m"`).

use crate::clock::NS_PER_S;

/// Highest accepted rate, per second. The interval is kept in whole nanoseconds,
/// rounded up, so at this rate the setting is honoured within 0.1%.
pub const MAX_RATE_PER_S: f64 = 1_000_000.0;
/// Lowest accepted rate: one request per hour.
pub const MIN_RATE_PER_S: f64 = 1.0 / 3600.0;

/// A rate as a quota per window, for the `RateLimit-Policy` header: exactly
/// `quota` requests per `window_s` seconds, in the unit the user wrote
/// (`"30/m"` → 30 per 60 s) with the window stretched just enough to make a
/// fractional count whole (`"0.5/s"` → 1 per 2 s, `"2.5/m"` → 5 per 120 s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateWindow {
    /// Requests per window (at least 1).
    pub count: u64,
    /// Window in seconds.
    pub window_s: u64,
}

impl RateWindow {
    /// `count`/`window_s` as written, e.g. `1/2s`.
    pub fn describe(&self) -> String {
        format!("{}/{}s", self.count, self.window_s)
    }
}

/// A rate given by its interval, for people: per second when it is at least
/// 1/s, else per minute, else per hour, with at most two decimals
/// (`10000000` ns → `100/s`, 3600 s → `1/h`, 1.5 s → `40/m`).
pub fn rate_for_people(interval_ns: u64) -> String {
    let per_s = NS_PER_S as f64 / interval_ns.max(1) as f64;
    let (n, unit) = if per_s >= 0.995 {
        (per_s, "s")
    } else if per_s * 60.0 >= 0.995 {
        (per_s * 60.0, "m")
    } else {
        (per_s * 3600.0, "h")
    };
    let text = format!("{n:.2}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text}/{unit}")
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The exact quota per window of a plain decimal `count` per `unit_s`
/// seconds. Falls back to the count rounded down (at least 1) per unit when
/// the window would exceed a day.
fn rate_window(count: &str, per_second: f64, unit_s: u64) -> RateWindow {
    exact_window(count, unit_s).unwrap_or(RateWindow {
        count: (per_second * unit_s as f64).floor().max(1.0) as u64,
        window_s: unit_s,
    })
}

fn exact_window(count: &str, unit_s: u64) -> Option<RateWindow> {
    let count = count.trim();
    let (int, frac) = count.split_once('.').unwrap_or((count, ""));
    let frac = frac.trim_end_matches('0');
    if frac.len() > 9 || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    let m: u64 = format!("{int}{frac}")
        .trim_start_matches('0')
        .parse()
        .ok()?;
    let scale = 10u64.pow(frac.len() as u32);
    let g = gcd(m, scale).max(1);
    let window_s = (scale / g).checked_mul(unit_s)?;
    (window_s <= 86_400).then_some(RateWindow {
        count: m / g,
        window_s,
    })
}

/// Parses a rate. Returns the interval between two requests in nanoseconds,
/// rounded up (so the effective rate never exceeds the setting), and the rate
/// as a quota per window.
pub fn parse_rate(value: &serde_json::Value) -> Result<(u64, RateWindow), String> {
    let (per_second, count, unit_s) = match value {
        serde_json::Value::Number(n) => {
            let v = n
                .as_f64()
                .ok_or_else(|| format!("expected a positive number, got {n}"))?;
            (v, n.to_string(), 1)
        }
        serde_json::Value::String(s) => parse_rate_str(s)?,
        other => {
            return Err(format!(
                "expected \"<n>/s\", \"<n>/m\", \"<n>/h\" or a number per second, got {}",
                describe(other)
            ))
        }
    };
    if !per_second.is_finite() || per_second <= 0.0 {
        return Err(format!("must be greater than 0, got {per_second}"));
    }
    if per_second > MAX_RATE_PER_S {
        return Err(format!(
            "must be at most {MAX_RATE_PER_S}/s, got {per_second}/s"
        ));
    }
    if per_second < MIN_RATE_PER_S {
        return Err(format!("must be at least 1/h, got {per_second}/s"));
    }
    let interval = (NS_PER_S as f64 / per_second).ceil();
    // Bounded by the checks above: between 1_000 ns and 3_600 s.
    Ok((interval as u64, rate_window(&count, per_second, unit_s)))
}

fn parse_rate_str(s: &str) -> Result<(f64, String, u64), String> {
    let bad =
        || format!("expected \"<n>/s\", \"<n>/m\", \"<n>/h\" or a number per second, got \"{s}\"");
    let (count, unit) = s.trim().split_once('/').ok_or_else(bad)?;
    let n: f64 = parse_plain_number(count).ok_or_else(bad)?;
    let seconds = match unit.trim() {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        _ => return Err(bad()),
    };
    Ok((n / seconds as f64, count.to_string(), seconds))
}

/// Parses a duration string with a unit (`ms`, `s`, `m`, `h`) into nanoseconds,
/// from 0 to [`MAX_DURATION_NS`].
pub fn parse_duration(value: &serde_json::Value) -> Result<u64, String> {
    let s = match value {
        serde_json::Value::String(s) => s.trim(),
        other => {
            return Err(format!(
                "expected a string with a unit such as \"250ms\", \"2s\", \"1m\" or \"1h\", got {}",
                describe(other)
            ))
        }
    };
    let bad =
        || format!("expected a duration such as \"250ms\", \"2s\", \"1m\" or \"1h\", got \"{s}\"");
    let (number, unit_ns) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1_000_000.0)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, NS_PER_S as f64)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0 * NS_PER_S as f64)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3600.0 * NS_PER_S as f64)
    } else {
        return Err(bad());
    };
    let number = parse_plain_number(number).ok_or_else(bad)?;
    let ns = (number * unit_ns).round();
    if ns > MAX_DURATION_NS as f64 {
        return Err(format!("must be from 0 to 1h, got \"{s}\""));
    }
    Ok(ns as u64)
}

/// Longest accepted duration (one hour).
pub const MAX_DURATION_NS: u64 = 3600 * NS_PER_S;

/// A non-negative decimal number without sign, exponent, or the words Rust's
/// float parser also accepts ("inf", "NaN").
fn parse_plain_number(s: &str) -> Option<f64> {
    let s = s.trim();
    let ok = !s.is_empty()
        && s.chars().all(|c| c.is_ascii_digit() || c == '.')
        && s.chars().filter(|&c| c == '.').count() <= 1
        && s.chars().any(|c| c.is_ascii_digit());
    if ok {
        s.parse().ok()
    } else {
        None
    }
}

/// A short description of a JSON value for error messages.
pub fn describe(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::Null => "null".into(),
        serde_json::Value::Bool(b) => b.to_string(),
        serde_json::Value::Number(n) => n.to_string(),
        serde_json::Value::String(s) => format!("\"{s}\""),
        serde_json::Value::Array(_) => "an array".into(),
        serde_json::Value::Object(_) => "an object".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rates_for_people() {
        assert_eq!(rate_for_people(10_000_000), "100/s");
        assert_eq!(rate_for_people(3_000_000), "333.33/s");
        assert_eq!(rate_for_people(2 * NS_PER_S), "30/m");
        assert_eq!(rate_for_people(3_600 * NS_PER_S), "1/h");
        assert_eq!(rate_for_people(1_800 * NS_PER_S), "2/h");
        assert_eq!(rate_for_people(1_000), "1000000/s");
        assert_eq!(rate_for_people(0), "1000000000/s");
    }

    #[test]
    fn rates() {
        let w = |count, window_s| RateWindow { count, window_s };
        assert_eq!(parse_rate(&json!("500/s")), Ok((2_000_000, w(500, 1))));
        assert_eq!(parse_rate(&json!(500)), Ok((2_000_000, w(500, 1))));
        assert_eq!(parse_rate(&json!(200.0)), Ok((5_000_000, w(200, 1))));
        assert_eq!(parse_rate(&json!("30/m")), Ok((2 * NS_PER_S, w(30, 60))));
        assert_eq!(parse_rate(&json!("2/h")), Ok((1800 * NS_PER_S, w(2, 3600))));
        // Fractional counts: the window stretches until the count is whole.
        assert_eq!(parse_rate(&json!("0.5/s")), Ok((2 * NS_PER_S, w(1, 2))));
        assert_eq!(parse_rate(&json!(0.5)), Ok((2 * NS_PER_S, w(1, 2))));
        assert_eq!(parse_rate(&json!("2.5/m")), Ok((24 * NS_PER_S, w(5, 120))));
        assert_eq!(parse_rate(&json!("1.25/s")), Ok((800_000_000, w(5, 4))));
        assert_eq!(parse_rate(&json!("10.0/s")), Ok((100_000_000, w(10, 1))));
        // 1/3 s is rounded up to the next whole nanosecond: never faster than set.
        assert_eq!(parse_rate(&json!("3/s")), Ok((333_333_334, w(3, 1))));
        assert_eq!(parse_rate(&json!(" 10 / s ")), Ok((100_000_000, w(10, 1))));
        // A window beyond a day is not useful to a client: the count is rounded down.
        assert_eq!(
            parse_rate(&json!("0.0001234/s")).map(|r| r.1),
            Err("must be at least 1/h, got 0.0001234/s".into())
        );
        assert_eq!(parse_rate(&json!("1.000001/s")).map(|r| r.1), Ok(w(1, 1)));
        assert_eq!(w(1, 2).describe(), "1/2s");
    }

    #[test]
    fn bad_rates() {
        for bad in [
            json!("fast"),
            json!("10/d"),
            json!("/s"),
            json!("-5/s"),
            json!("1e3/s"),
            json!("inf/s"),
            json!(true),
            json!(null),
            json!([1]),
        ] {
            assert!(parse_rate(&bad).is_err(), "{bad} accepted");
        }
        assert_eq!(
            parse_rate(&json!(0)),
            Err("must be greater than 0, got 0".into())
        );
        assert_eq!(
            parse_rate(&json!(-1)),
            Err("must be greater than 0, got -1".into())
        );
        assert_eq!(
            parse_rate(&json!("fast")),
            Err(
                "expected \"<n>/s\", \"<n>/m\", \"<n>/h\" or a number per second, got \"fast\""
                    .into()
            )
        );
        assert!(parse_rate(&json!(2_000_000)).is_err());
        assert!(parse_rate(&json!("1/d")).is_err());
        assert!(parse_rate(&json!("0.5/h")).is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration(&json!("250ms")), Ok(250_000_000));
        assert_eq!(parse_duration(&json!("2s")), Ok(2 * NS_PER_S));
        assert_eq!(parse_duration(&json!("1.5s")), Ok(1_500_000_000));
        assert_eq!(parse_duration(&json!("1m")), Ok(60 * NS_PER_S));
        assert_eq!(parse_duration(&json!("0s")), Ok(0));
        assert_eq!(parse_duration(&json!("60m")), Ok(3600 * NS_PER_S));
        assert_eq!(parse_duration(&json!("1h")), Ok(3600 * NS_PER_S));
    }

    #[test]
    fn bad_durations() {
        for bad in [
            json!("1"),
            json!(1),
            json!("-1s"),
            json!("s"),
            json!("1 sec"),
            json!("61m"),
            json!("NaNs"),
        ] {
            assert!(parse_duration(&bad).is_err(), "{bad} accepted");
        }
        assert_eq!(
            parse_duration(&json!(5)),
            Err(
                "expected a string with a unit such as \"250ms\", \"2s\", \"1m\" or \"1h\", got 5"
                    .into()
            )
        );
        assert_eq!(
            parse_duration(&json!("2h")),
            Err("must be from 0 to 1h, got \"2h\"".into())
        );
    }
}
