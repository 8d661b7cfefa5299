//! An upstream's `Retry-After` (RFC 9110 §10.2.3): delay-seconds, or an
//! HTTP date (IMF-fixdate, `Sun, 06 Nov 1994 08:49:37 GMT`), in whole
//! seconds from now. Anything else counts as none.

/// Seconds to wait from `now_unix_s` (None: malformed; a date in the past: 0).
pub fn retry_after_s(value: &[u8], now_unix_s: u64) -> Option<u64> {
    let s = std::str::from_utf8(value).ok()?.trim();
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return Some(s.parse().unwrap_or(u64::MAX));
    }
    let at = imf_fixdate(s)?;
    Some(at.saturating_sub(now_unix_s))
}

/// `Sun, 06 Nov 1994 08:49:37 GMT` as Unix seconds.
fn imf_fixdate(s: &str) -> Option<u64> {
    let mut parts = s.split_ascii_whitespace();
    let _weekday = parts.next()?.strip_suffix(',')?;
    let day: u64 = parts.next()?.parse().ok()?;
    let month = match parts.next()? {
        "Jan" => 1,
        "Feb" => 2,
        "Mar" => 3,
        "Apr" => 4,
        "May" => 5,
        "Jun" => 6,
        "Jul" => 7,
        "Aug" => 8,
        "Sep" => 9,
        "Oct" => 10,
        "Nov" => 11,
        "Dec" => 12,
        _ => return None,
    };
    let year: i64 = parts.next()?.parse().ok()?;
    let mut hms = parts.next()?.split(':').map(|x| x.parse::<u64>().ok());
    let (h, m, sec) = (hms.next()??, hms.next()??, hms.next()??);
    if parts.next()? != "GMT"
        || parts.next().is_some()
        || !(1..=31).contains(&day)
        || h > 23
        || m > 59
        || sec > 60
    {
        return None;
    }
    let days = days_from_civil(year, month, i64::try_from(day).ok()?);
    let secs = days
        .checked_mul(86_400)?
        .checked_add(i64::try_from(h * 3600 + m * 60 + sec).ok()?)?;
    u64::try_from(secs).ok()
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_or_a_date() {
        let now = 784_111_777; // Sun, 06 Nov 1994 08:49:37 GMT
        let cases: &[(&str, Option<u64>)] = &[
            ("1", Some(1)),
            (" 120 ", Some(120)),
            ("Sun, 06 Nov 1994 08:49:37 GMT", Some(0)),
            ("Sun, 06 Nov 1994 08:50:07 GMT", Some(30)),
            ("Sat, 05 Nov 1994 08:49:37 GMT", Some(0)),
            ("Thu, 01 Jan 1970 00:00:00 GMT", Some(0)),
            ("-1", None),
            ("1.5", None),
            ("soon", None),
            ("Sun, 06 Nov 1994 08:49:37 UTC", None),
            ("Sun, 32 Nov 1994 08:49:37 GMT", None),
            ("", None),
        ];
        for (v, want) in cases {
            assert_eq!(retry_after_s(v.as_bytes(), now), *want, "{v}");
        }
        assert_eq!(imf_fixdate("Sun, 06 Nov 1994 08:49:37 GMT"), Some(now));
        assert_eq!(
            imf_fixdate("Wed, 25 Nov 2026 00:00:00 GMT"),
            Some(1_795_564_800)
        );
    }
}
