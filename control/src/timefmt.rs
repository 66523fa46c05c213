//! Times as status documents show them.

use std::time::SystemTime;

/// Formats a time as RFC 3339 (UTC, whole seconds).
pub fn rfc3339(t: SystemTime) -> String {
    let dt = time::OffsetDateTime::from(t);
    dt.replace_nanosecond(0)
        .unwrap_or(dt)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| format!("{dt}"))
}

/// Seconds from `now` until `t` (negative once past).
pub fn seconds_until(t: SystemTime, now: SystemTime) -> i64 {
    match t.duration_since(now) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn formats_utc_seconds_and_signed_distances() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_800_000_000_500);
        assert_eq!(rfc3339(t), "2027-01-15T08:00:00Z");
        let later = t + Duration::from_secs(90);
        assert_eq!(seconds_until(later, t), 90);
        assert_eq!(seconds_until(t, later), -90);
    }
}
