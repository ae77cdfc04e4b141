//! `ragstream query`: a small client of the running job's `POST /v1/query`.

use anyhow::Context as _;
use ragstream_core::query::Context;

/// Posts `query` to `<url>/v1/query` and returns its context; a problem answer is an error. The
/// bearer token, when the job requires one, comes from `RAGSTREAM_QUERY_TOKEN`.
pub fn query(url: &str, query: &serde_json::Value) -> anyhow::Result<Context> {
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
        match serde_json::from_str::<crate::api::Problem>(&body) {
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
        context.mode,
        context.intent,
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
