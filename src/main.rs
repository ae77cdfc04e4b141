//! ragstream: keeps a retrieval index fresh from a stream of documents.
//!
//! `ragstream run --config topologies/presets/local.toml` indexes a directory into the embedded index;
//! `ragstream validate --config …` checks a configuration without starting anything.

mod http;
mod runtime;

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use ragstream_topologies::config::Config;

#[derive(Parser)]
#[command(
    name = "ragstream",
    version,
    about = "Keeps a retrieval index fresh and packs token-budgeted contexts"
)]
struct Cli {
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Human, global = true, env = "RAGSTREAM_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Human,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Runs the stream job.
    Run {
        /// Configuration file (TOML).
        #[arg(long, short)]
        config: PathBuf,
        /// Worker threads (overrides runtime.workers).
        #[arg(long, short)]
        workers: Option<usize>,
        /// Exit after this many idle seconds (overrides runtime.exit_when_idle_secs).
        #[arg(long)]
        exit_when_idle: Option<u64>,
    },
    /// Loads and checks a configuration, prints it (secrets redacted) and exits.
    Validate {
        /// Configuration file (TOML).
        #[arg(long, short)]
        config: PathBuf,
    },
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,qdrant_edge=error"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    match cli.command {
        Command::Run {
            config,
            workers,
            exit_when_idle,
        } => {
            let mut config =
                Config::load(&config).with_context(|| format!("loading {}", config.display()))?;
            if let Some(workers) = workers {
                config.runtime.workers = workers;
            }
            if let Some(idle) = exit_when_idle {
                config.runtime.exit_when_idle_secs = idle;
            }
            config.validate()?;
            runtime::run(config)
        }
        Command::Validate { config } => {
            let config =
                Config::load(&config).with_context(|| format!("loading {}", config.display()))?;
            println!("{config:#?}");
            println!("configuration is valid");
            Ok(())
        }
    }
}
