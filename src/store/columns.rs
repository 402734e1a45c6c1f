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

/// Declares a struct read from a row by column name, on both backends: what
/// `#[derive(sqlx::FromRow)]` does, without sqlx's proc-macro crate (see
/// `migrations.rs` for why). Fields after `..` are read as a whole struct from the
/// same row, as `#[sqlx(flatten)]` would.
macro_rules! from_row {
    ($(#[$m:meta])* $vis:vis struct $name:ident {
        $($f:ident: $t:ty,)*
        $(.. $flat:ident: $ft:ty,)*
    }) => {
        $(#[$m])* $vis struct $name { $(pub(super) $f: $t,)* $(pub(super) $flat: $ft,)* }
        from_row!(@impl $name, sqlx::postgres::PgRow, [$($f)*], [$($flat: $ft)*]);
        from_row!(@impl $name, sqlx::sqlite::SqliteRow, [$($f)*], [$($flat: $ft)*]);
    };
    (@impl $name:ident, $row:ty, [$($f:ident)*], [$($flat:ident: $ft:ty)*]) => {
        impl<'r> sqlx::FromRow<'r, $row> for $name {
            fn from_row(row: &'r $row) -> Result<Self, sqlx::Error> {
                use sqlx::Row as _;
                Ok(Self {
                    $($f: row.try_get(stringify!($f))?,)*
                    $($flat: <$ft as sqlx::FromRow<'r, $row>>::from_row(row)?,)*
                })
            }
        }
    };
}
pub(crate) use from_row;
