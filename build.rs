// `sqlx::migrate!` embeds the migrations when the crate compiles; without this, an
// incremental build does not notice a migration added to the directory.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
