//! Column types that read the same from either backend, so a row is declared once:
//! an instant ([`Time`]: `timestamptz` on Postgres, integer milliseconds on SQLite)
//! and a JSON value ([`Json`]: `jsonb` on Postgres, text on SQLite).

use chrono::{DateTime, TimeZone, Utc};
use serde_json::Value;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgTypeInfo, PgValueRef};
use sqlx::sqlite::{SqliteTypeInfo, SqliteValueRef};
use sqlx::{Decode, Postgres, Sqlite, Type};

/// An instant as a backend stores it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Time(pub DateTime<Utc>);

/// A JSON value as a backend stores it.
#[derive(Clone, Debug)]
pub(crate) struct Json(pub Value);

impl Type<Postgres> for Time {
    fn type_info() -> PgTypeInfo {
        <DateTime<Utc> as Type<Postgres>>::type_info()
    }
}

impl<'r> Decode<'r, Postgres> for Time {
    fn decode(value: PgValueRef<'r>) -> Result<Self, BoxDynError> {
        Ok(Time(<DateTime<Utc> as Decode<Postgres>>::decode(value)?))
    }
}

impl Type<Sqlite> for Time {
    fn type_info() -> SqliteTypeInfo {
        <i64 as Type<Sqlite>>::type_info()
    }
}

impl<'r> Decode<'r, Sqlite> for Time {
    fn decode(value: SqliteValueRef<'r>) -> Result<Self, BoxDynError> {
        let ms = <i64 as Decode<Sqlite>>::decode(value)?;
        Utc.timestamp_millis_opt(ms)
            .single()
            .map(Time)
            .ok_or_else(|| format!("{ms} ms is not an instant").into())
    }
}

impl Type<Postgres> for Json {
    fn type_info() -> PgTypeInfo {
        <Value as Type<Postgres>>::type_info()
    }

    fn compatible(ty: &PgTypeInfo) -> bool {
        <Value as Type<Postgres>>::compatible(ty)
    }
}

impl<'r> Decode<'r, Postgres> for Json {
    fn decode(value: PgValueRef<'r>) -> Result<Self, BoxDynError> {
        Ok(Json(<Value as Decode<Postgres>>::decode(value)?))
    }
}

impl Type<Sqlite> for Json {
    fn type_info() -> SqliteTypeInfo {
        <String as Type<Sqlite>>::type_info()
    }
}

impl<'r> Decode<'r, Sqlite> for Json {
    fn decode(value: SqliteValueRef<'r>) -> Result<Self, BoxDynError> {
        let text = <&str as Decode<Sqlite>>::decode(value)?;
        Ok(Json(serde_json::from_str(text)?))
    }
}
