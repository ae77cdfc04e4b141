//! The command line: `ragstream run | validate | mcp | ingest | query | eval | bench | openapi |
//! config-reference | schemas`, parsed with clap and dispatched to the part of the binary that does
//! the work (the runtime, the HTTP client, eval, the benches).

pub mod config_reference;
pub mod ingest;
pub mod query;

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};
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
        /// Processes of a timely cluster (overrides runtime.processes).
        #[arg(long, short = 'n')]
        processes: Option<usize>,
        /// This process's index in the cluster (overrides runtime.process).
        #[arg(long, short = 'p')]
        process: Option<usize>,
        /// Hostfile of the cluster: one `host:port` per process (overrides runtime.hostfile).
        #[arg(long)]
        hostfile: Option<PathBuf>,
    },
    /// Runs the job and serves its agent tools over MCP on stdin/stdout (for an MCP client that
    /// launches its servers; the tools are listed in docs/mcp.md). Logs go to stderr; the job stops
    /// when the client closes stdin. (The `mcp` feature.)
    #[cfg(feature = "mcp")]
    Mcp {
        /// Configuration file (TOML).
        #[arg(long, short)]
        config: PathBuf,
        /// The tenant the tools search. Without it, every call names its tenant.
        #[arg(long, env = "RAGSTREAM_MCP_TENANT")]
        tenant: Option<String>,
    },
    /// Sends files, a directory or JSONL document events to a running job (`POST /v1/documents`), or
    /// straight to the documents topic. Exit status: 0 all accepted, 1 some refused, 2 not taken.
    Ingest {
        /// A file, a directory, a `.jsonl` file of document events, or `-` for events on standard input.
        path: String,
        /// The job's HTTP address (its token from `RAGSTREAM_QUERY_TOKEN`).
        #[arg(long, default_value = "http://127.0.0.1:9464", env = "RAGSTREAM_URL")]
        url: String,
        /// Tenant of the files, and of events that name none (a token bound to one tenant needs none).
        #[arg(long)]
        tenant: Option<String>,
        /// Send to the documents topic of these Kafka brokers instead of a running job (the `kafka`
        /// feature).
        #[cfg(feature = "kafka")]
        #[arg(long)]
        brokers: Option<String>,
        /// The documents topic (with `--brokers`).
        #[cfg(feature = "kafka")]
        #[arg(long, default_value = "ragstream.documents")]
        topic: String,
        /// Documents per request.
        #[arg(long, default_value_t = 100)]
        batch: usize,
    },
    /// Reads one file (a JSON line of its format and limits, then its bytes, on standard input) and
    /// writes its text: the job's file sandbox runs this in a child process under limits.
    #[command(hide = true)]
    Parse,
    /// Prints the HTTP API's OpenAPI 3.1 document (what `/v1/openapi.json` serves).
    Openapi,
    /// Prints the configuration reference (every key, its default and its meaning) in Markdown.
    ConfigReference,
    /// Writes the JSON Schemas of the topics' messages into DIR (one `<name>.schema.json` each).
    Schemas {
        /// The folder to write to (created if missing).
        dir: PathBuf,
    },
    /// Sends a query to the running job (`POST /v1/query`) and prints its context.
    Query(query::QueryArgs),
    /// Retrieval and packing quality on a BEIR-layout dataset, through the real job, against a naive
    /// baseline measured in the same run.
    Eval(EvalCli),
    /// Benchmarks (figures measured in one run on this machine).
    #[command(subcommand)]
    #[cfg(feature = "bench")]
    Bench(crate::bench::Command),
    /// Loads and checks a configuration, prints it (secrets redacted) and exits.
    Validate {
        /// Configuration file (TOML).
        #[arg(long, short)]
        config: PathBuf,
    },
}

/// `ragstream query`.
#[derive(Args, Debug)]
struct EvalCli {
    /// `squad` (Answer Recall@Budget), `scifact` (nDCG@10 with train qrels) or `cosqa` (nDCG@10
    /// on code search, dev qrels).
    #[arg(long)]
    dataset: String,
    /// Index the corpus as this document kind (`prose`, `code`, …) instead of the dataset's own
    /// (`code` for CoSQA, `prose` for the others), to compare.
    #[arg(long)]
    kind: Option<String>,
    /// BEIR data root.
    #[arg(long, default_value = "../shared/data", env = "RAGSTREAM_DATA")]
    data: PathBuf,
    /// Index directory, reused across runs.
    #[arg(long, default_value = ".ragstream/eval/index")]
    index: PathBuf,
    /// Index into a Qdrant server at this gRPC URL instead (collection `eval_<dataset>`, reused
    /// across runs like the directory): the same figures from the production backend.
    #[arg(long)]
    index_url: Option<String>,
    /// Use only the first N queries.
    #[arg(long)]
    limit: Option<usize>,
    /// Index only the first N documents of the corpus and those judged relevant to the questions
    /// asked (a quick run: its figures are not the whole corpus's).
    #[arg(long)]
    corpus_limit: Option<usize>,
    /// Budgets for Answer Recall@Budget.
    #[arg(long, value_delimiter = ',', default_value = "500,1000,2000,4000,8000")]
    budgets: Vec<usize>,
    /// Queries in flight.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Also write the report here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Write one line per question and budget here (JSONL): answered or not, the ranked
    /// candidates with lane ranks and rerank factors, what was packed and why.
    #[arg(long)]
    details: Option<PathBuf>,
    /// Extra config (TOML) for the job, e.g. "[query]\nadapt_fusion = false" to compare.
    #[arg(long, default_value = "")]
    config_extra: String,
    /// Ask every question with this retrieval preset (`fast`, `conservative`, or one the config
    /// defines); none: the job's `[query]` section.
    #[arg(long)]
    preset: Option<String>,
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,qdrant_edge=error"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours only on a terminal: log files and collectors get plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Parses the command line and runs its subcommand.
pub fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    match cli.command {
        Command::Parse => std::process::exit(ragstream_operators::ingest::sandbox::serve()),
        Command::Run {
            config,
            workers,
            exit_when_idle,
            processes,
            process,
            hostfile,
        } => {
            let mut config =
                Config::load(&config).with_context(|| format!("loading {}", config.display()))?;
            if let Some(workers) = workers {
                config.runtime.workers = workers;
            }
            if let Some(processes) = processes {
                config.runtime.processes = processes;
            }
            if let Some(process) = process {
                config.runtime.process = process;
            }
            if hostfile.is_some() {
                config.runtime.hostfile = hostfile;
            }
            if let Some(idle) = exit_when_idle {
                config.runtime.exit_when_idle_secs = std::time::Duration::from_secs(idle);
            }
            config.validate()?;
            crate::runtime::run(config)
        }
        #[cfg(feature = "mcp")]
        Command::Mcp { config, tenant } => {
            let config =
                Config::load(&config).with_context(|| format!("loading {}", config.display()))?;
            config.validate()?;
            let running = crate::runtime::start(config)?;
            let grant = crate::mcp::Grant(
                tenant.map(|tenant| std::sync::Arc::new(std::iter::once(tenant).collect())),
                None,
                std::sync::Arc::from(crate::mcp::STDIO_CREDENTIAL),
            );
            let served =
                crate::mcp::serve_stdio(running.ingress.clone(), running.standing.clone(), grant);
            running
                .shutdown
                .store(true, std::sync::atomic::Ordering::SeqCst);
            running.join()?;
            served
        }
        Command::Ingest {
            path,
            url,
            tenant,
            #[cfg(feature = "kafka")]
            brokers,
            #[cfg(feature = "kafka")]
            topic,
            batch,
        } => {
            #[cfg(feature = "kafka")]
            let target = match brokers {
                Some(brokers) => ingest::Target::Kafka { brokers, topic },
                None => ingest::Target::Job(url),
            };
            #[cfg(not(feature = "kafka"))]
            let target = ingest::Target::Job(url);
            let status = ingest::run(ingest::Ingest {
                path,
                tenant,
                target,
                batch,
            })?;
            if status != 0 {
                std::process::exit(status);
            }
            Ok(())
        }
        #[cfg(feature = "bench")]
        Command::Bench(command) => crate::bench::run(command),
        Command::Openapi => {
            print!(
                "{}",
                crate::http::openapi::pretty(&crate::http::openapi::document())
            );
            Ok(())
        }
        Command::ConfigReference => {
            print!("{}", config_reference::reference());
            Ok(())
        }
        Command::Schemas { dir } => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            for (name, schema) in crate::http::openapi::topic_schemas() {
                let path = dir.join(name);
                std::fs::write(&path, crate::http::openapi::pretty(&schema))
                    .with_context(|| format!("writing {}", path.display()))?;
                println!("{}", path.display());
            }
            Ok(())
        }
        Command::Query(args) => query::run(args),
        Command::Eval(args) => eval(args),
        Command::Validate { config } => {
            let config =
                Config::load(&config).with_context(|| format!("loading {}", config.display()))?;
            println!("{config:#?}");
            println!("configuration is valid");
            Ok(())
        }
    }
}

/// `ragstream eval`: prints the report (and writes it to `--out`).
fn eval(args: EvalCli) -> anyhow::Result<()> {
    let out = args.out.clone();
    let report = crate::eval::eval(crate::eval::EvalArgs {
        dataset: args.dataset,
        kind: args.kind,
        data: args.data,
        index: args.index,
        index_url: args.index_url,
        limit: args.limit,
        corpus_limit: args.corpus_limit,
        budgets: args.budgets,
        concurrency: args.concurrency,
        details: args.details,
        config_extra: args.config_extra.replace("\\n", "\n"),
        preset: args.preset,
    })?;
    let text = serde_json::to_string_pretty(&report)?;
    if let Some(out) = out {
        std::fs::write(&out, &text).with_context(|| format!("writing {}", out.display()))?;
    }
    println!("{text}");
    Ok(())
}
