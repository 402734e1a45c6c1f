//! The schema migrations, embedded in the binary and run at start-up.
//!
//! `sqlx::migrate!` would embed them as well, but it lives in sqlx's proc-macro
//! crate, which builds the Postgres and SQLite drivers a second time for the
//! compiler (about 170 s of CPU in every clean build). The list is checked against
//! the directories below, and the checksums against what sqlx's own resolver
//! reads from them, so databases migrated by either agree.

use std::borrow::Cow;

use sqlx::SqlSafeStr;
use sqlx::migrate::{Migration, MigrationType, Migrator};

/// `(file name, SQL)` of each migration in `migrations/<dir>`, in version order.
macro_rules! embed {
    ($dir:literal: $($file:literal),* $(,)?) => {
        &[$(($file, include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/", $dir, "/", $file)))),*]
    };
}

pub(crate) const POSTGRES: &[(&str, &str)] = embed!("postgres":
    "0001_waits.sql",
    "0002_active_by_tenant.sql",
    "0003_event_sequencer.sql",
    "0004_replica_leases.sql",
    "0005_claims.sql",
    "0006_webhooks.sql",
    "0007_claim_at.sql",
    "0008_claim_at_on_insert.sql",
    "0009_delivery_turns.sql",
    "0010_delivery_bounds.sql",
    "0011_retention.sql",
    "0012_groups.sql",
    "0013_traces.sql",
    "0014_placement.sql",
    "0015_deliveries_notice.sql",
    "0016_owner_claim_at.sql",
    "0017_slots.sql",
    "0018_callbacks.sql",
    "0019_output.sql",
    "0020_nudges.sql",
    "0021_event_sources.sql",
);

pub(crate) const SQLITE: &[(&str, &str)] = embed!("sqlite":
    "0001_waits.sql",
    "0002_active_by_tenant.sql",
    "0003_claims.sql",
    "0004_webhooks.sql",
    "0005_delivery_turns.sql",
    "0006_delivery_bounds.sql",
    "0007_replica_leases.sql",
    "0008_retention.sql",
    "0009_groups.sql",
    "0010_traces.sql",
    "0011_callbacks.sql",
    "0012_output.sql",
    "0013_nudges.sql",
    "0014_event_sources.sql",
);

/// The migrator for one directory's migrations, as sqlx's resolver would build it
/// from the files: `<version>_<description>.sql`, underscores read as spaces, in a
/// transaction unless the file starts with `-- no-transaction`.
pub(crate) fn migrator(files: &'static [(&'static str, &'static str)]) -> Migrator {
    Migrator::with_migrations(
        files
            .iter()
            .map(|&(name, sql)| {
                let (version, rest) = name.split_once('_').unwrap_or((name, name));
                Migration::new(
                    version.parse().unwrap_or(-1),
                    Cow::Owned(rest.trim_end_matches(".sql").replace('_', " ")),
                    MigrationType::Simple,
                    sql.into_sql_str(),
                    sql.starts_with("-- no-transaction"),
                )
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn dir(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("migrations")
            .join(name)
    }

    /// Every file in the directory is embedded, in order, and each reads back as
    /// sqlx's resolver reads it: the same version, description and checksum.
    #[tokio::test]
    async fn the_embedded_migrations_are_the_directories_as_sqlx_reads_them() {
        for (name, files) in [("postgres", POSTGRES), ("sqlite", SQLITE)] {
            let mut on_disk: Vec<String> = std::fs::read_dir(dir(name))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            on_disk.sort();
            let listed: Vec<&str> = files.iter().map(|(f, _)| *f).collect();
            assert_eq!(
                listed, on_disk,
                "migrations/{name}: list each file in src/store/migrations.rs"
            );
            let resolved = Migrator::new(dir(name).as_path()).await.unwrap();
            let ours = migrator(files);
            let key = |m: &Migration| {
                (
                    m.version,
                    m.description.to_string(),
                    m.checksum.to_vec(),
                    m.no_tx,
                    m.migration_type,
                )
            };
            let want: Vec<_> = resolved.iter().map(key).collect();
            let got: Vec<_> = ours.iter().map(key).collect();
            assert_eq!(got, want, "migrations/{name}");
            assert!(got.iter().all(|m| m.0 > 0), "migrations/{name}: versions");
        }
    }
}
