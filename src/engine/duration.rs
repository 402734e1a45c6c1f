//! Durations as people write them in a request: `"250ms"`, `"30s"`, `"5m"`, `"1h30m"`.
//!
//! Strict on purpose: a unit is required on every number (a bare `"5"` is ambiguous),
//! fractions are not accepted (write `"1500ms"`, not `"1.5s"`), and the formatter
//! writes the shortest form the parser reads back to the same value.

use std::time::Duration;

/// Parses `"1h30m"`, `"250ms"`, `"0s"`. Units: `ms`, `s`, `m`, `h`, `d`.
pub fn parse(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    if s.is_empty() {
        return Err("is empty; write a duration such as \"30s\", \"5m\" or \"1h30m\"".into());
    }
    let mut total: u128 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(format!(
                "\"{}\" is not a duration; write a whole number with a unit, such as \"30s\", \"5m\" or \"1h30m\"",
                truncate(text)
            ));
        }
        let number: u128 = rest[..digits]
            .parse()
            .map_err(|_| format!("\"{}\" is too long a duration", truncate(text)))?;
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
                return Err(format!(
                    "\"{}\" has a number without a unit; add one of ms, s, m, h, d (e.g. \"30s\")",
                    truncate(text)
                ));
            }
            other => {
                return Err(format!(
                    "\"{}\" has an unknown unit \"{}\"; use ms, s, m, h or d",
                    truncate(text),
                    truncate(other)
                ));
            }
        };
        total = number
            .checked_mul(millis_per)
            .and_then(|v| total.checked_add(v))
            .filter(|v| *v <= u128::from(u64::MAX))
            .ok_or_else(|| format!("\"{}\" is too long a duration", truncate(text)))?;
    }
    Ok(Duration::from_millis(total as u64))
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

#[cfg(test)]
mod tests {
    use super::*;

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
            let err = parse(bad).unwrap_err();
            assert!(!err.is_empty(), "{bad}");
        }
        assert!(parse("5").unwrap_err().contains("unit"));
        assert!(parse("1x").unwrap_err().contains("unknown unit"));
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
