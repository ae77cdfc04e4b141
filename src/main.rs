//! ragstream: keeps a retrieval index fresh from a stream of documents.
//!
//! `ragstream run --config topologies/presets/local.toml` indexes a directory into the embedded index;
//! `ragstream validate --config …` checks a configuration without starting anything.

mod bench;
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
    /// Benchmarks (figures measured in one run on this machine).
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Loads and checks a configuration, prints it (secrets redacted) and exits.
    Validate {
        /// Configuration file (TOML).
        #[arg(long, short)]
        config: PathBuf,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Token counting, embedding-only and end-to-end Kafka ingest throughput, freshness, peak RSS.
    Ingest {
        /// BEIR-layout corpus.jsonl.
        #[arg(long)]
        corpus: PathBuf,
        /// Kafka bootstrap servers (a fresh topic is created by producing to it).
        #[arg(long)]
        brokers: String,
        /// Use only the first N documents.
        #[arg(long)]
        limit: Option<usize>,
        /// Single-document freshness probes.
        #[arg(long, default_value_t = 20)]
        probes: usize,
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
        Command::Bench(BenchCommand::Ingest {
            corpus,
            brokers,
            limit,
            probes,
        }) => {
            let report = bench::ingest(bench::IngestBench {
                corpus,
                brokers,
                limit,
                probes,
            })?;
            println!("{}", serde_json::to_string_pretty(&report)?);
            Ok(())
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
