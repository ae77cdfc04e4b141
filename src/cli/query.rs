//! `ragstream query`: a small client of the running job's `POST /v1/query`.

use anyhow::Context as _;
use clap::Args;
use ragstream_core::query::Context;

/// Posts `query` to `<url>/v1/query` and returns its context; a problem answer is an error. The
/// bearer token, when the job requires one, comes from `RAGSTREAM_QUERY_TOKEN`.
pub fn post(url: &str, query: &serde_json::Value) -> anyhow::Result<Context> {
    let endpoint = format!("{}/v1/query", url.trim_end_matches('/'));
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let mut request = agent
        .post(&endpoint)
        .header("Content-Type", "application/json");
    if let Some(token) = std::env::var("RAGSTREAM_QUERY_TOKEN")
        .ok()
        .filter(|t| !t.is_empty())
    {
        request = request.header("Authorization", &format!("Bearer {token}"));
    }
    let mut response = request
        .send(query.to_string())
        .with_context(|| format!("is the job running? POST {endpoint} failed"))?;
    let body = response
        .body_mut()
        .read_to_string()
        .context("reading the response")?;
    if response.status() == 401 {
        anyhow::bail!("the job requires a bearer token: set RAGSTREAM_QUERY_TOKEN");
    }
    if response.status() != 200 {
        match serde_json::from_str::<crate::http::api::Problem>(&body) {
            Ok(problem) => {
                anyhow::bail!("{}: {} ({})", problem.title, problem.detail, problem.kind)
            }
            Err(_) => anyhow::bail!("HTTP {}: {body}", response.status()),
        }
    }
    serde_json::from_str(&body).with_context(|| format!("unexpected response: {body}"))
}

/// The context for a terminal: a summary line, the packed text, notes.
pub fn readable(context: &Context) -> String {
    let mut out = String::new();
    if let Some(error) = &context.error {
        out.push_str(&format!("error: {error}\n"));
        return out;
    }
    out.push_str(&format!(
        "# {} · intent {} (dense {:.2} / bm25 {:.2}) · {} tokens{} · {} of {} chunks · {:.1} ms\n",
        context.mode_name(),
        context.intent_name(),
        context.weights.dense,
        context.weights.bm25,
        context.tokens_used,
        context
            .token_budget
            .map(|b| format!(" of {b}"))
            .unwrap_or_default(),
        context.chunks_returned,
        context.chunks_available,
        context.latency_ms.get("total").copied().unwrap_or(0.0),
    ));
    if let Some(note) = &context.note {
        out.push_str(&format!("# note: {note}\n"));
    }
    out.push('\n');
    out.push_str(&context.context);
    out.push('\n');
    for item in &context.items {
        out.push_str(&format!(
            "\n- {} {:?} score {:.3} {} tokens (chunk {})",
            item.source, item.tier, item.score, item.tokens, item.chunk_id
        ));
    }
    if !context.items.is_empty() {
        out.push('\n');
    }
    out
}

#[derive(Args, Debug)]
pub struct QueryArgs {
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
/// `ragstream query`: sends the query and prints its context (exit status 1 when it is an error).
pub fn run(args: QueryArgs) -> anyhow::Result<()> {
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
    let context = post(&url, &query)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&context)?);
    } else {
        print!("{}", readable(&context));
    }
    if context.error.is_some() {
        std::process::exit(1);
    }
    Ok(())
}
