//! Durations in Kuma's grammar (`10y`, `1d`, `30s`) and Go's (`1h30m`, `1.5h`, `24h0m`).

use std::fmt;
use std::str::FromStr;

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// Every unit the parser accepts, with its length in nanoseconds.
const UNITS: [(&str, u128); 10] = [
    ("ms", 1_000_000),
    ("us", 1_000),
    ("µs", 1_000),
    ("ns", 1),
    ("y", 365 * 24 * 3600 * NANOS_PER_SEC),
    ("w", 7 * 24 * 3600 * NANOS_PER_SEC),
    ("d", 24 * 3600 * NANOS_PER_SEC),
    ("h", 3600 * NANOS_PER_SEC),
    ("m", 60 * NANOS_PER_SEC),
    ("s", NANOS_PER_SEC),
];

/// The largest number of fraction digits that still fits the arithmetic below; later digits are
/// below a nanosecond for every unit and are ignored.
const MAX_FRACTION_DIGITS: u32 = 18;

/// A non-negative length of time, parsed from Kuma's duration grammar (`^(\d+)(y|w|d|h|m|s|ms)$`,
/// `y` = 365 days, `w` = 7 days) or a Go-style sequence (`24h0m`, `1h30m`, `1.5h`, `2h45m30.5s`,
/// `500ms`; `us`, `µs` and `ns` are accepted too).
///
/// [`Display`](fmt::Display) writes a form this parser reads back to the same value (e.g. `1d2h3m4s`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Duration(pub std::time::Duration);

impl Duration {
    /// A duration of `secs` seconds.
    pub const fn from_secs(secs: u64) -> Self {
        Duration(std::time::Duration::from_secs(secs))
    }

    /// The standard-library value.
    pub const fn as_std(self) -> std::time::Duration {
        self.0
    }
}

impl From<std::time::Duration> for Duration {
    fn from(d: std::time::Duration) -> Self {
        Duration(d)
    }
}

impl From<Duration> for std::time::Duration {
    fn from(d: Duration) -> Self {
        d.0
    }
}

/// Why a duration string was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DurationError {
    /// The string was empty.
    #[error("empty duration; expected a number and a unit such as 30s, 1h30m or 10y")]
    Empty,
    /// The string started with a minus sign.
    #[error("invalid duration {0:?}: durations cannot be negative")]
    Negative(String),
    /// A number was followed by a unit meshca does not know.
    #[error("invalid duration {input:?}: unknown unit {unit:?}; expected one of y, w, d, h, m, s, ms, us, ns")]
    UnknownUnit {
        /// The whole input.
        input: String,
        /// The unknown unit as written.
        unit: String,
    },
    /// A number had no unit after it.
    #[error(
        "invalid duration {0:?}: missing unit after a number; expected e.g. 30s, 1h30m or 10y"
    )]
    MissingUnit(String),
    /// The text is not a sequence of numbers and units.
    #[error("invalid duration {0:?}: expected numbers with units such as 30s, 1h30m, 1.5h or 10y")]
    Syntax(String),
    /// The value does not fit in a duration.
    #[error("invalid duration {0:?}: too large")]
    Overflow(String),
}

impl FromStr for Duration {
    type Err = DurationError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        if input.is_empty() {
            return Err(DurationError::Empty);
        }
        if input.starts_with('-') {
            return Err(DurationError::Negative(input.to_owned()));
        }
        // Go accepts a bare zero.
        if input == "0" {
            return Ok(Duration::default());
        }
        let overflow = || DurationError::Overflow(input.to_owned());
        let mut rest = input;
        let mut total: u128 = 0;
        while !rest.is_empty() {
            let (whole, fraction, after) = split_number(rest);
            if whole.is_empty() && fraction.is_none_or(str::is_empty) {
                return Err(DurationError::Syntax(input.to_owned()));
            }
            let (unit_nanos, after_unit) = split_unit(input, after)?;
            total = whole_nanos(whole, unit_nanos)
                .and_then(|n| n.checked_add(fraction_nanos(fraction.unwrap_or(""), unit_nanos)))
                .and_then(|n| total.checked_add(n))
                .ok_or_else(overflow)?;
            rest = after_unit;
        }
        let secs = u64::try_from(total / NANOS_PER_SEC).map_err(|_| overflow())?;
        let nanos = u32::try_from(total % NANOS_PER_SEC)
            .expect("a remainder of division by 10^9 fits in u32");
        Ok(Duration(std::time::Duration::new(secs, nanos)))
    }
}

/// Splits `12.5h...` into (`12`, Some(`5`), `h...`).
fn split_number(s: &str) -> (&str, Option<&str>, &str) {
    let whole_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (whole, rest) = s.split_at(whole_end);
    match rest.strip_prefix('.') {
        Some(after_dot) => {
            let frac_end = after_dot
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(after_dot.len());
            let (fraction, rest) = after_dot.split_at(frac_end);
            (whole, Some(fraction), rest)
        }
        None => (whole, None, rest),
    }
}

/// Splits the unit off the front of `s`, returning its length in nanoseconds.
fn split_unit<'a>(input: &str, s: &'a str) -> Result<(u128, &'a str), DurationError> {
    let unit_end = s
        .find(|c: char| c.is_ascii_digit() || c == '.')
        .unwrap_or(s.len());
    let unit = &s[..unit_end];
    if unit.is_empty() {
        return Err(DurationError::MissingUnit(input.to_owned()));
    }
    UNITS
        .iter()
        .find(|(name, _)| *name == unit)
        .map(|(_, nanos)| (*nanos, &s[unit_end..]))
        .ok_or_else(|| DurationError::UnknownUnit {
            input: input.to_owned(),
            unit: unit.to_owned(),
        })
}

fn whole_nanos(digits: &str, unit_nanos: u128) -> Option<u128> {
    let mut value: u128 = 0;
    for d in digits.bytes() {
        value = value.checked_mul(10)?.checked_add(u128::from(d - b'0'))?;
    }
    value.checked_mul(unit_nanos)
}

fn fraction_nanos(digits: &str, unit_nanos: u128) -> u128 {
    let mut numerator: u128 = 0;
    let mut denominator: u128 = 1;
    for d in digits.bytes().take(MAX_FRACTION_DIGITS as usize) {
        numerator = numerator * 10 + u128::from(d - b'0');
        denominator *= 10;
    }
    // numerator < 10^18 and unit_nanos < 10^17, so the product fits in u128.
    numerator * unit_nanos / denominator
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const PARTS: [(&str, u128); 7] = [
            ("d", 24 * 3600 * NANOS_PER_SEC),
            ("h", 3600 * NANOS_PER_SEC),
            ("m", 60 * NANOS_PER_SEC),
            ("s", NANOS_PER_SEC),
            ("ms", 1_000_000),
            ("us", 1_000),
            ("ns", 1),
        ];
        let mut rest = self.0.as_nanos();
        if rest == 0 {
            return f.write_str("0s");
        }
        for (unit, nanos) in PARTS {
            let count = rest / nanos;
            if count > 0 {
                write!(f, "{count}{unit}")?;
                rest %= nanos;
            }
        }
        Ok(())
    }
}

impl serde::Serialize for Duration {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Duration {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Duration;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration string such as 30s, 1h30m or 10y")
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Duration, E> {
                v.parse().map_err(E::custom)
            }
        }
        deserializer.deserialize_str(Visitor)
    }
}

#[cfg(test)]
mod tests;
