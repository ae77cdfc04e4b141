//! ragstream: keeps a retrieval index fresh from a stream of documents.
//!
//! `ragstream run --config topologies/presets/local.toml` indexes a directory into the embedded index;
//! `ragstream validate --config …` checks a configuration without starting anything.

mod api;
mod bench;
mod bench_edits;
mod bench_embed;
mod bench_load;
mod bench_neighbours;
mod bench_pathological;
mod bench_query;
mod bench_scale;
mod bench_standing;
mod bench_volume;
mod client;
mod config_reference;
mod documents;
mod eval;
mod http;
mod ingest_cli;
mod mcp;
mod openapi;
mod runtime;
mod standing;

/// mimalloc: the query steps allocate and free many small strings per query (BENCHMARKS.md has its
/// effect on them, measured against the system allocator).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    /// when the client closes stdin.
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
        /// Send to the documents topic of these Kafka brokers instead of a running job.
        #[arg(long)]
        brokers: Option<String>,
        /// The documents topic (with `--brokers`).
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
    Query(QueryArgs),
    /// Retrieval and packing quality on a BEIR-layout dataset, through the real job, against a naive
    /// baseline measured in the same run.
    Eval(EvalCli),
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

/// `ragstream query`.
#[derive(Args, Debug)]
struct QueryArgs {
    /// The question (the chunk id for `--mode read_chunk`).
    text: Option<String>,
    /// The job's HTTP address.
    #[arg(long, default_value = "http://127.0.0.1:9464", env = "RAGSTREAM_URL")]
    url: String,
    /// Tenant.
    #[arg(long, default_value = "local")]
    tenant: String,
    /// bounded, deep, read_chunk, list_sources, files, sql_compact, sql_full.
    #[arg(long, default_value = "bounded")]
    mode: String,
    /// Token budget.
    #[arg(long)]
    budget: Option<usize>,
    /// Results.
    #[arg(long, short)]
    k: Option<usize>,
    /// Only sources under this path prefix.
    #[arg(long)]
    source_prefix: Option<String>,
    /// Only sources matching this glob (`docs/**/*.md`).
    #[arg(long)]
    source_pattern: Option<String>,
    /// Retrieval preset: `default`, `fast`, `conservative` or one the job defines.
    #[arg(long)]
    preset: Option<String>,
    /// Wait until every document event written before the query is indexed.
    #[arg(long)]
    read_your_writes: bool,
    /// Include the trace of every decision.
    #[arg(long)]
    trace: bool,
    /// Print the context JSON instead of the readable form.
    #[arg(long)]
    json: bool,
}

/// `ragstream eval`.
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

#[derive(Subcommand)]
enum BenchCommand {
    /// Query latency through Kafka at a steady offered rate, with and without query embedding.
    Query(bench_query::QueryBench),
    /// Ingest and query throughput at several worker counts, the model taken out (instant embedder).
    Scale(bench_scale::ScaleBench),
    /// The job at a million chunks, the model taken out (instant embedder): ingest rate, RSS, disk,
    /// query round trips while growing, at full size idle and under ingest, stalls during optimization.
    Volume(bench_volume::VolumeBench),
    /// Chunks embedded, rewritten and deleted when one paragraph of a 100-chunk prose, markdown or
    /// code document is inserted, deleted or changed at its head, middle or tail (no model needed).
    Edits(bench_edits::EditsBench),
    /// The local embedder's word pieces/s on a corpus's chunks and its single-query latency.
    Embed(bench_embed::EmbedBench),
    /// Chunking time of pathological documents (one 8 MiB line, an 8 MiB table, one 8 MiB function)
    /// against 1 MiB ones, and `POST /v1/query` round trips while two of them are ingested against idle.
    Pathological(bench_pathological::PathologicalBench),
    /// One tenant posting large documents without pause beside another posting small ones: how soon
    /// the small ones are searchable and the other tenant's round trips, against idle.
    Neighbours(bench_neighbours::NeighboursBench),
    /// `POST /v1/query` round trips while documents stream in at full embedding speed, and with ingest idle.
    Load(bench_load::LoadBench),
    /// Standing queries while a corpus streams in (ingest throughput against none, change → version
    /// latency, re-evaluations per changed context), and many held idle.
    Standing(bench_standing::StandingBench),
    /// Token counting, embedding-only and end-to-end Kafka ingest throughput, freshness, peak RSS.
    Ingest(bench::IngestBench),
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

fn main() -> anyhow::Result<()> {
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
                config.runtime.exit_when_idle_secs = idle;
            }
            config.validate()?;
            runtime::run(config)
        }
        Command::Mcp { config, tenant } => {
            let config =
                Config::load(&config).with_context(|| format!("loading {}", config.display()))?;
            config.validate()?;
            let running = runtime::start(config)?;
            let grant = mcp::Grant(
                tenant.map(|tenant| std::sync::Arc::new(std::iter::once(tenant).collect())),
                None,
                std::sync::Arc::from(mcp::STDIO_CREDENTIAL),
            );
            let served = mcp::serve_stdio(running.ingress.clone(), running.standing.clone(), grant);
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
            brokers,
            topic,
            batch,
        } => {
            let target = match brokers {
                Some(brokers) => ingest_cli::Target::Kafka { brokers, topic },
                None => ingest_cli::Target::Job(url),
            };
            let status = ingest_cli::run(ingest_cli::Ingest {
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
        Command::Bench(command) => bench(command),
        Command::Openapi => {
            print!("{}", openapi::pretty(&openapi::document()));
            Ok(())
        }
        Command::ConfigReference => {
            print!("{}", config_reference::reference());
            Ok(())
        }
        Command::Schemas { dir } => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            for (name, schema) in openapi::topic_schemas() {
                let path = dir.join(name);
                std::fs::write(&path, openapi::pretty(&schema))
                    .with_context(|| format!("writing {}", path.display()))?;
                println!("{}", path.display());
            }
            Ok(())
        }
        Command::Query(args) => query(args),
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

/// Runs one of the benches and prints its report.
fn bench(command: BenchCommand) -> anyhow::Result<()> {
    let report = match command {
        BenchCommand::Pathological(args) => bench_pathological::pathological(args)?,
        BenchCommand::Neighbours(args) => bench_neighbours::neighbours(args)?,
        BenchCommand::Load(args) => bench_load::load(args)?,
        BenchCommand::Standing(args) => bench_standing::standing(args)?,
        BenchCommand::Embed(args) => {
            // One line per report: the embed bench script collects them as JSON lines.
            println!("{}", bench_embed::embed(args)?);
            return Ok(());
        }
        BenchCommand::Ingest(args) => bench::ingest(args)?,
        BenchCommand::Query(args) => bench_query::query(args)?,
        BenchCommand::Scale(args) => bench_scale::scale(args)?,
        BenchCommand::Edits(args) => bench_edits::edits(args)?,
        BenchCommand::Volume(args) => bench_volume::volume(args)?,
    };
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

/// `ragstream query`: sends the query and prints its context (exit status 1 when it is an error).
fn query(args: QueryArgs) -> anyhow::Result<()> {
    let QueryArgs {
        text,
        url,
        tenant,
        mode,
        budget,
        k,
        source_prefix,
        source_pattern,
        preset,
        read_your_writes,
        trace,
        json,
    } = args;
    let mut query = serde_json::json!({
        "query_id": format!("cli-{}-{}", std::process::id(), ragstream_operators::now_millis()),
        "tenant": tenant,
        "text": text.unwrap_or_default(),
        "mode": mode,
        "trace": trace,
    });
    if let Some(budget) = budget {
        query["token_budget"] = budget.into();
    }
    if let Some(k) = k {
        query["k"] = k.into();
    }
    if let Some(preset) = preset {
        query["preset"] = preset.into();
    }
    query["filters"] = serde_json::json!({
        "source_prefix": source_prefix,
        "source_pattern": source_pattern,
    });
    if read_your_writes {
        query["consistency"] = "read_your_writes".into();
    }
    let context = client::query(&url, &query)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&context)?);
    } else {
        print!("{}", client::readable(&context));
    }
    if context.error.is_some() {
        std::process::exit(1);
    }
    Ok(())
}

/// `ragstream eval`: prints the report (and writes it to `--out`).
fn eval(args: EvalCli) -> anyhow::Result<()> {
    let out = args.out.clone();
    let report = eval::eval(eval::EvalArgs {
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
