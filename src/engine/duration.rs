//! Durations as people write them in a request: `"250ms"`, `"30s"`, `"5m"`, `"1h30m"`.
//!
//! Strict on purpose: a unit is required on every number (a bare `"5"` is ambiguous),
//! fractions are not accepted (write `"1500ms"`, not `"1.5s"`), and the formatter
//! writes the shortest form the parser reads back to the same value.

use std::time::Duration;

/// Parses `"1h30m"`, `"250ms"`, `"0s"`. Units: `ms`, `s`, `m`, `h`, `d`. Nothing
/// else, not even spaces around it: the grammar is exactly
/// [`super::schema::DURATION_PATTERN`], which the OpenAPI document gives.
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    parse_within(text, false)
}

/// Why a text is not a duration; the text shown is cut to 40 characters.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("is empty; write a duration such as \"30s\", \"5m\" or \"1h30m\"")]
    Empty,
    #[error(
        "\"{0}\" is not a duration; write a whole number with a unit, such as \"30s\", \"5m\" or \"1h30m\""
    )]
    NotANumber(String),
    #[error("\"{0}\" is too long a duration")]
    TooLong(String),
    #[error("\"{0}\" has a number without a unit; add one of ms, s, m, h, d (e.g. \"30s\")")]
    NoUnit(String),
    #[error("\"{text}\" has an unknown unit \"{unit}\"; use ms, s, m, h or d")]
    UnknownUnit { text: String, unit: String },
}

/// Like [`parse`], but a duration too long to count (past 584 million years) is
/// [`Duration::MAX`] rather than an error: for "hold at most this long", where any
/// such length means "as long as it takes".
pub fn parse_saturating(text: &str) -> Result<Duration, DurationError> {
    parse_within(text, true)
}

fn parse_within(text: &str, saturate: bool) -> Result<Duration, DurationError> {
    let s = text;
    if s.is_empty() {
        return Err(DurationError::Empty);
    }
    let too_long = || DurationError::TooLong(truncate(text));
    let mut total: u128 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(DurationError::NotANumber(truncate(text)));
        }
        let number: u128 = match rest[..digits].parse() {
            Ok(n) => n,
            Err(_) if saturate => u128::MAX,
            Err(_) => return Err(too_long()),
        };
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let millis_per: u128 = match unit {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "" => {
                return Err(DurationError::NoUnit(truncate(text)));
            }
            other => {
                return Err(DurationError::UnknownUnit {
                    text: truncate(text),
                    unit: truncate(other),
                });
            }
        };
        total = number.saturating_mul(millis_per).saturating_add(total);
    }
    match u64::try_from(total) {
        Ok(ms) => Ok(Duration::from_millis(ms)),
        Err(_) if saturate => Ok(Duration::MAX),
        Err(_) => Err(too_long()),
    }
}

/// Formats a duration the way [`parse`] reads it: `"1h30m"`, `"2s"`, `"1500ms"`.
pub fn format(d: Duration) -> String {
    let mut ms = d.as_millis();
    if ms == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    for (unit, size) in [("h", 3_600_000u128), ("m", 60_000), ("s", 1_000), ("ms", 1)] {
        // Keep sub-second precision in milliseconds only when there is some.
        if unit == "s" && !ms.is_multiple_of(1_000) && ms < 1_000 {
            continue;
        }
        if unit == "s" && !ms.is_multiple_of(1_000) {
            // e.g. 1500ms: clearer as milliseconds than "1s500ms".
            out.push_str(&format!("{ms}ms"));
            return out;
        }
        if ms >= size {
            out.push_str(&format!("{}{}", ms / size, unit));
            ms %= size;
        }
    }
    out
}

fn truncate(s: &str) -> String {
    s.chars().take(40).collect()
}

/// Serde adapter: a `Duration` as its text form.
pub mod serde_text {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::format(*d))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        super::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// Serde adapter: an optional `Duration` as its text form.
pub mod serde_opt_text {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_str(&super::format(*d)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|text| super::parse(&text).map_err(serde::de::Error::custom))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duration_past_what_can_be_counted_saturates_only_when_asked() {
        let huge = "99999999999999999999999999999999999999999d";
        assert!(parse(huge).unwrap_err().to_string().contains("too long"));
        assert_eq!(parse_saturating(huge), Ok(Duration::MAX));
        assert!(
            parse_saturating("5y").is_err(),
            "an unknown unit is still an error"
        );
        assert_eq!(parse_saturating("1h30m"), Ok(Duration::from_secs(5400)));
        assert!(
            parse(" 30s").is_err(),
            "no spaces: the grammar is the schema's"
        );
    }

    #[test]
    fn the_usual_forms_parse() {
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("1d"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn malformed_durations_say_what_to_write() {
        for bad in [
            "",
            "5",
            "1.5s",
            "-1s",
            "5 years",
            "s",
            "1x",
            "99999999999999999999999h",
        ] {
            let err = parse(bad).unwrap_err().to_string();
            assert!(!err.is_empty(), "{bad}");
        }
        assert!(parse("5").unwrap_err().to_string().contains("unit"));
        assert!(
            parse("1x")
                .unwrap_err()
                .to_string()
                .contains("unknown unit")
        );
    }

    #[test]
    fn formatting_reads_back_to_the_same_value() {
        for ms in [
            0u64, 1, 250, 999, 1_000, 1_500, 60_000, 5_400_000, 90_061_001,
        ] {
            let d = Duration::from_millis(ms);
            assert_eq!(parse(&format(d)), Ok(d), "{}", format(d));
        }
        assert_eq!(format(Duration::from_secs(5400)), "1h30m");
        assert_eq!(format(Duration::from_millis(1500)), "1500ms");
    }
}
