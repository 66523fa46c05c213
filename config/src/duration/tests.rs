use super::*;
use proptest::prelude::*;
use std::time::Duration as Std;

fn parse(s: &str) -> Result<Std, DurationError> {
    s.parse::<Duration>().map(|d| d.0)
}

#[test]
fn kuma_grammar() {
    assert_eq!(parse("10y"), Ok(Std::from_secs(10 * 365 * 86_400)));
    assert_eq!(parse("2w"), Ok(Std::from_secs(14 * 86_400)));
    assert_eq!(parse("1d"), Ok(Std::from_secs(86_400)));
    assert_eq!(parse("24h"), Ok(Std::from_secs(86_400)));
    assert_eq!(parse("5m"), Ok(Std::from_secs(300)));
    assert_eq!(parse("30s"), Ok(Std::from_secs(30)));
    assert_eq!(parse("500ms"), Ok(Std::from_millis(500)));
}

#[test]
fn go_grammar() {
    assert_eq!(parse("24h0m"), Ok(Std::from_secs(86_400)));
    assert_eq!(parse("1h30m"), Ok(Std::from_secs(5_400)));
    assert_eq!(parse("90s"), Ok(Std::from_secs(90)));
    assert_eq!(parse("1.5h"), Ok(Std::from_secs(5_400)));
    assert_eq!(parse("2h45m30.5s"), Ok(Std::from_millis(9_930_500)));
    assert_eq!(parse(".5s"), Ok(Std::from_millis(500)));
    assert_eq!(parse("1us"), Ok(Std::from_micros(1)));
    assert_eq!(parse("1µs"), Ok(Std::from_micros(1)));
    assert_eq!(parse("7ns"), Ok(Std::from_nanos(7)));
    assert_eq!(parse("0"), Ok(Std::ZERO));
    assert_eq!(parse("0s"), Ok(Std::ZERO));
}

#[test]
fn rejects_bad_input_with_clear_messages() {
    assert_eq!(parse(""), Err(DurationError::Empty));
    assert_eq!(parse("-1h"), Err(DurationError::Negative("-1h".into())));
    assert_eq!(
        parse("3x"),
        Err(DurationError::UnknownUnit {
            input: "3x".into(),
            unit: "x".into()
        })
    );
    assert_eq!(
        parse("1h30"),
        Err(DurationError::MissingUnit("1h30".into()))
    );
    assert_eq!(parse("10"), Err(DurationError::MissingUnit("10".into())));
    assert_eq!(parse("h"), Err(DurationError::Syntax("h".into())));
    assert_eq!(parse("1h.m"), Err(DurationError::Syntax("1h.m".into())));
    assert!(matches!(
        parse("1 h"),
        Err(DurationError::UnknownUnit { .. })
    ));
    assert!(matches!(
        parse("1H"),
        Err(DurationError::UnknownUnit { .. })
    ));
    assert_eq!(
        parse("99999999999999999999999y"),
        Err(DurationError::Overflow("99999999999999999999999y".into()))
    );
    assert_eq!(
        parse("600000000000y"),
        Err(DurationError::Overflow("600000000000y".into()))
    );
    let message = parse("3x").unwrap_err().to_string();
    assert!(message.contains("unknown unit \"x\""), "{message}");
}

#[test]
fn display_is_compact() {
    assert_eq!(Duration::from_secs(0).to_string(), "0s");
    assert_eq!(Duration::from_secs(90).to_string(), "1m30s");
    assert_eq!(Duration::from_secs(86_400).to_string(), "1d");
    assert_eq!(
        Duration(Std::from_millis(9_930_500)).to_string(),
        "2h45m30s500ms"
    );
}

#[test]
fn serde_uses_the_string_form() {
    let d: Duration = yaml_serde::from_str("1h30m").expect("valid duration");
    assert_eq!(d, Duration::from_secs(5_400));
    assert_eq!(
        serde_json::to_string(&d).expect("serializable"),
        "\"1h30m\""
    );
    let err = yaml_serde::from_str::<Duration>("1q")
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown unit"), "{err}");
}

fn unit_nanos() -> impl Strategy<Value = (&'static str, u128)> {
    prop::sample::select(UNITS.to_vec())
}

proptest! {
    #[test]
    fn display_round_trips(secs in any::<u64>(), nanos in 0u32..1_000_000_000) {
        let d = Duration(Std::new(secs, nanos));
        prop_assert_eq!(d.to_string().parse::<Duration>(), Ok(d));
    }

    #[test]
    fn number_and_unit_is_the_product(n in 0u64..1_000_000_000, (unit, nanos) in unit_nanos()) {
        let expected = u128::from(n) * nanos;
        let parsed = format!("{n}{unit}").parse::<Duration>().map(|d| d.0.as_nanos());
        prop_assert_eq!(parsed, Ok(expected));
    }

    #[test]
    fn never_panics(s in "\\PC{0,24}") {
        let _ = s.parse::<Duration>();
    }
}
