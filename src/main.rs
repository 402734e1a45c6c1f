//! The `waitd` command: `serve` (the default), `migrate`, `openapi`, `healthcheck`,
//! the client (`create`, `get`, `list`, `cancel`, `follow`) and `wait`, which runs
//! one wait in this process.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use tracing_subscriber::EnvFilter;
use waitd::Config;
use waitd::config::LogFormat;

/// mimalloc rather than the system allocator: with glibc's, a fifth of a replica's
/// CPU went to malloc and free (perf, the scale benchmark), and its arenas grow
/// apart under many threads' short-lived buffers.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "waitd",
    version,
    about = "An HTTP service that waits for things so that you don't have to."
)]
struct Cli {
    /// The waitd server the client commands and `healthcheck` talk to (the API
    /// token comes from WAITD_TOKEN); before or after the command.
    #[arg(long, global = true, env = "WAITD_URL", default_value = waitd::client::DEFAULT_SERVER)]
    server: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the service (the default command).
    Serve(Box<Config>),
    /// Apply the database migrations and exit.
    Migrate {
        #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
        database_url: String,
    },
    /// Print the OpenAPI document.
    Openapi,
    /// Exit 0 when a waitd answers /healthz (for container health checks).
    Healthcheck,
    #[command(flatten)]
    Client(Box<waitd::client::Command>),
}

/// The arguments, with `serve` put first when they name no command: `waitd`
/// alone, or `waitd --flag …`, means `waitd serve …`, while `waitd --server URL
/// get ID` is the client's `get`.
fn arguments() -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let commands: Vec<String> = Cli::command()
        .get_subcommands()
        .map(|c| c.get_name().to_string())
        .collect();
    let names_a_command = args
        .iter()
        .skip(1)
        .any(|a| a.to_str().is_some_and(|a| commands.iter().any(|c| c == a)));
    let first = args.get(1).and_then(|a| a.to_str()).unwrap_or("");
    if args.len() == 1
        || (first.starts_with('-')
            && !matches!(first, "-h" | "--help" | "-V" | "--version")
            && !names_a_command)
    {
        args.insert(1, "serve".into());
    }
    args
}

/// The command line, parsed; `--server` given to a command that does not use it
/// is a usage mistake rather than a setting silently ignored.
fn parse() -> Result<Cli, clap::Error> {
    let mut command = Cli::command();
    let matches = command.try_get_matches_from_mut(arguments())?;
    let cli = Cli::from_arg_matches(&matches)?;
    let explicit = matches
        .subcommand()
        .and_then(|(_, m)| m.value_source("server"))
        .or_else(|| matches.value_source("server"))
        == Some(clap::parser::ValueSource::CommandLine);
    let serverless = match &cli.command {
        Command::Serve(_) | Command::Migrate { .. } | Command::Openapi => Some(
            "--server names the server the client commands talk to; `waitd serve` listens on --listen",
        ),
        Command::Client(c) if matches!(**c, waitd::client::Command::Wait(_)) => Some(
            "--server names a server, but `waitd wait` runs the wait in this process; `waitd create --wait` runs it on a server",
        ),
        _ => None,
    };
    if let Some(why) = serverless.filter(|_| explicit) {
        return Err(command.error(clap::error::ErrorKind::ArgumentConflict, why));
    }
    Ok(cli)
}

fn main() -> ExitCode {
    let cli = match parse() {
        Ok(c) => c,
        // Usage mistakes exit 5, whatever the command: the client's exit codes 1–4
        // tell how a wait ended (2 is "timed out"), so clap's own 2 would lie.
        Err(e) if e.use_stderr() => {
            let _ = e.print();
            return ExitCode::from(waitd::client::EXIT_PROBLEM);
        }
        // --help and --version.
        Err(e) => e.exit(),
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("waitd: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let command = match cli.command {
        Command::Client(c) => return runtime.block_on(waitd::client::run(*c, &cli.server)),
        other => other,
    };
    let result = runtime.block_on(async {
        match command {
            Command::Serve(config) => {
                init_logging(config.process.log_format);
                let listener = tokio::net::TcpListener::bind(config.server.listen)
                    .await
                    .map_err(|e| format!("cannot listen on {}: {e}", config.server.listen))?;
                waitd::serve(listener, *config, shutdown_signal())
                    .await
                    .map_err(|e| e.to_string())
            }
            Command::Migrate { database_url } => {
                init_logging(LogFormat::Text);
                let store = waitd::store::Store::open(&database_url, 1, waitd::bus::Bus::new())
                    .map_err(|e| e.to_string())?;
                store
                    .migrate()
                    .await
                    .map_err(|e| format!("cannot migrate: {e}"))
            }
            Command::Openapi => {
                print!("{}", waitd::api::openapi::document());
                Ok(())
            }
            Command::Healthcheck => healthcheck(&cli.server).await,
            Command::Client(_) => unreachable!("client commands returned above"),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("waitd: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn healthcheck(server: &str) -> Result<(), String> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(3))
        .build()
        .map_err(|e| e.to_string())?;
    let url = format!("{}/healthz", server.trim_end_matches('/'));
    match client.get(&url).send().await {
        Ok(r) if r.status().is_success() => Ok(()),
        Ok(r) => Err(format!("{url} answered {}", r.status())),
        Err(e) => Err(format!("{url} did not answer: {e}")),
    }
}

fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn,tower_http=warn"));
    // Colours only on a terminal: a log file or a collector gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutting down");
}
