//! `ragstream ingest PATH|-`: files, a directory or JSONL document events, sent to a running job
//! (`POST /v1/documents`, in batches) or straight to the documents topic, with a progress bar.
//!
//! A directory is read as the directory source reads it (`.gitignore` honoured, binary files
//! skipped): document id and source = the path relative to it, version = the file's modification
//! time in milliseconds (so an edited file replaces the indexed one, an unchanged one is ignored).
//! A `.jsonl` file or `-` (standard input) holds document events, one per line.
//!
//! Exit status: 0 when every document was accepted, 1 when some were refused (each is printed), 2 when
//! the job or the broker could not take them.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use indicatif::{ProgressBar, ProgressStyle};
use ragstream_operators::ingest::decode::DocumentEvent;
#[cfg(feature = "kafka")]
use ragstream_operators::ingest::decode::{decode_event, DecodeConfig};
use ragstream_operators::ingest::sandbox::{Sandbox, SandboxLimits};
use ragstream_operators::io::dir_source::DirSource;
use ragstream_operators::model::DocOp;
use ragstream_operators::outage::Backoff;
use serde_json::{json, Value};

#[cfg(feature = "kafka")]
use crate::http::documents::{KafkaDocuments, SendError};

/// Largest body of one request (the job takes four times `ingest.max_document_bytes`, 32 MiB by
/// default).
const MAX_REQUEST_BYTES: usize = 16 << 20;
/// Tries of a batch the job could not take for the moment (busy, an outage, a timeout).
const TRIES: u32 = 6;

/// Where the documents go.
pub enum Target {
    /// A running job's HTTP API; the bearer token from `RAGSTREAM_QUERY_TOKEN`.
    Job(String),
    /// The documents topic, directly (the `kafka` feature).
    #[cfg(feature = "kafka")]
    Kafka {
        /// Bootstrap servers.
        brokers: String,
        /// The documents topic.
        topic: String,
    },
}

/// What `ragstream ingest` was asked.
pub struct Ingest {
    /// A file, a directory, a `.jsonl` file or `-`.
    pub path: String,
    /// The tenant of files and of events that name none.
    pub tenant: Option<String>,
    /// Where to send.
    pub target: Target,
    /// Documents per request.
    pub batch: usize,
}

/// A document to send, and where it came from (for messages).
struct Outgoing {
    origin: String,
    event: Value,
    bytes: usize,
}

/// Reads the input, sends it, prints a summary; returns the exit status.
pub fn run(ingest: Ingest) -> anyhow::Result<i32> {
    let (documents, mut refused) = read_input(&ingest)?;
    let total = documents.len();
    // Every input: the documents read and the lines or files refused while reading.
    let inputs = total + refused.len();
    let bar = ProgressBar::new(total as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} sent {pos}/{len} documents [{elapsed_precise}] {per_sec} eta {eta}",
        )
        .expect("valid template"),
    );
    let started = Instant::now();
    let mut accepted = 0usize;
    let outcome = match &ingest.target {
        Target::Job(url) => send_to_job(
            url,
            &documents,
            ingest.batch,
            &bar,
            &mut accepted,
            &mut refused,
        ),
        #[cfg(feature = "kafka")]
        Target::Kafka { brokers, topic } => send_to_kafka(
            brokers,
            topic,
            &documents,
            ingest.batch,
            &bar,
            &mut accepted,
            &mut refused,
        ),
    };
    bar.finish_and_clear();
    let seconds = started.elapsed().as_secs_f64();
    for (origin, reason) in &refused {
        eprintln!("refused {origin}: {reason}");
    }
    println!(
        "{accepted} of {inputs} documents accepted, {} refused, in {seconds:.1} s ({:.1} documents/s)",
        refused.len(),
        accepted as f64 / seconds.max(1e-9)
    );
    if let Err(error) = outcome {
        eprintln!("stopped: {error:#}");
        return Ok(2);
    }
    Ok(if refused.is_empty() { 0 } else { 1 })
}

/// The documents of the input, and the files refused while reading it (origin, reason).
#[allow(clippy::type_complexity)]
fn read_input(ingest: &Ingest) -> anyhow::Result<(Vec<Outgoing>, Vec<(String, String)>)> {
    let mut refused = Vec::new();
    let mut documents = Vec::new();
    let with_tenant = |mut event: Value| {
        if let (Some(tenant), Value::Object(object)) = (&ingest.tenant, &mut event) {
            object
                .entry("tenant")
                .or_insert_with(|| Value::String(tenant.clone()));
        }
        event
    };
    let mut push = |origin: String, event: Value| {
        let bytes = event.to_string().len();
        documents.push(Outgoing {
            origin,
            event: with_tenant(event),
            bytes,
        });
    };
    let path = PathBuf::from(&ingest.path);
    if ingest.path == "-" || path.extension().is_some_and(|e| e == "jsonl") {
        let reader: Box<dyn BufRead> = if ingest.path == "-" {
            Box::new(std::io::stdin().lock())
        } else {
            Box::new(std::io::BufReader::new(
                std::fs::File::open(&path)
                    .with_context(|| format!("opening {}", path.display()))?,
            ))
        };
        for (number, line) in reader.lines().enumerate() {
            let line = line.context("reading the input")?;
            if line.trim().is_empty() {
                continue;
            }
            let origin = format!("{}:{}", ingest.path, number + 1);
            match serde_json::from_str::<Value>(&line) {
                Ok(event) => push(origin, event),
                Err(error) => refused.push((origin, format!("malformed_json: {error}"))),
            }
        }
        return Ok((documents, refused));
    }
    let metadata =
        std::fs::metadata(&path).with_context(|| format!("reading {}", path.display()))?;
    let (root, only) = if metadata.is_dir() {
        (path.clone(), None)
    } else {
        let parent = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        (parent.to_path_buf(), name)
    };
    let root = root
        .canonicalize()
        .with_context(|| format!("reading {}", root.display()))?;
    let tenant = ingest.tenant.clone().unwrap_or_default();
    // Files are read as the job reads them: each in a child process under the default limits.
    let sandbox = Sandbox::of_this_binary(SandboxLimits::default())
        .context("locating this binary for the file sandbox")?;
    let mut scanner = DirSource::new(root, tenant, usize::MAX >> 1, BTreeMap::new())
        .with_files(std::sync::Arc::new(sandbox));
    for found in scanner.scan() {
        match found {
            Ok(DocOp::Upsert(mut document)) => {
                if only
                    .as_ref()
                    .is_some_and(|name| *name != document.key.doc_id)
                {
                    continue;
                }
                document.version = document.updated_ms.max(1);
                let mut event = serde_json::to_value(DocumentEvent::upsert(&document))
                    .context("encoding a document")?;
                if ingest.tenant.is_none() {
                    // Filled in by the job from a token bound to one tenant.
                    if let Value::Object(object) = &mut event {
                        object.remove("tenant");
                    }
                }
                push(document.key.doc_id.clone(), event);
            }
            Ok(DocOp::Delete { .. }) => {}
            Err(record) => refused.push((
                record.origin.to_string(),
                format!("{}: {}", record.reason, record.message),
            )),
        }
    }
    Ok((documents, refused))
}

/// Batches of at most `batch` documents and [`MAX_REQUEST_BYTES`].
fn batches(documents: &[Outgoing], batch: usize) -> Vec<&[Outgoing]> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut bytes = 0;
    for (index, document) in documents.iter().enumerate() {
        let full = index - start >= batch.max(1)
            || (bytes + document.bytes > MAX_REQUEST_BYTES && index > start);
        if full {
            out.push(&documents[start..index]);
            start = index;
            bytes = 0;
        }
        bytes += document.bytes;
    }
    if start < documents.len() {
        out.push(&documents[start..]);
    }
    out
}

fn send_to_job(
    url: &str,
    documents: &[Outgoing],
    batch: usize,
    bar: &ProgressBar,
    accepted: &mut usize,
    refused: &mut Vec<(String, String)>,
) -> anyhow::Result<()> {
    let endpoint = format!("{}/v1/documents", url.trim_end_matches('/'));
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(180)))
        .build()
        .into();
    let token = std::env::var("RAGSTREAM_QUERY_TOKEN")
        .ok()
        .filter(|t| !t.is_empty());
    // Batches answered 202 in local mode (not indexed within the job's wait): followed at the end.
    let mut queued: Vec<String> = Vec::new();
    for chunk in batches(documents, batch) {
        let mut pending: Vec<&Outgoing> = chunk.iter().collect();
        let (mut tries, mut backoff) = (0, retry_backoff());
        while !pending.is_empty() {
            tries += 1;
            let body = json!({ "documents": pending.iter().map(|d| &d.event).collect::<Vec<_>>() });
            let mut request = agent
                .post(&endpoint)
                .header("Content-Type", "application/json");
            if let Some(token) = &token {
                request = request.header("Authorization", &format!("Bearer {token}"));
            }
            let (status, answer) = match request.send(body.to_string()) {
                Ok(mut response) => {
                    let status = response.status().as_u16();
                    (
                        status,
                        response.body_mut().read_to_string().unwrap_or_default(),
                    )
                }
                Err(error) if tries < TRIES => {
                    std::thread::sleep(backoff.next_delay());
                    tracing::debug!(%error, "POST /v1/documents failed; retrying");
                    continue;
                }
                Err(error) => anyhow::bail!("is the job running? POST {endpoint}: {error}"),
            };
            let problem: Value = serde_json::from_str(&answer).unwrap_or(Value::Null);
            match status {
                200 | 202 => {
                    if let Some(link) = problem["status"].as_str() {
                        queued.push(link.to_string());
                    }
                    *accepted += pending.len();
                    bar.inc(pending.len() as u64);
                    pending.clear();
                }
                400 if problem["errors"].is_array() => {
                    // Nothing of the batch was written: drop the refused ones, send the rest again.
                    let mut out: Vec<usize> = Vec::new();
                    for error in problem["errors"].as_array().into_iter().flatten() {
                        let Some(index) = error["index"].as_u64().map(|i| i as usize) else {
                            continue;
                        };
                        if let Some(document) = pending.get(index) {
                            let reason = format!(
                                "{}: {}",
                                error["reason"].as_str().unwrap_or(""),
                                error["detail"].as_str().unwrap_or("")
                            );
                            refused.push((document.origin.clone(), reason));
                            out.push(index);
                        }
                    }
                    anyhow::ensure!(!out.is_empty(), "the job refused the batch: {answer}");
                    bar.inc(out.len() as u64);
                    pending = pending
                        .into_iter()
                        .enumerate()
                        .filter(|(index, _)| !out.contains(index))
                        .map(|(_, document)| document)
                        .collect();
                }
                408 | 429 | 503 | 504 if tries < TRIES => std::thread::sleep(backoff.next_delay()),
                401 => anyhow::bail!("the job requires a bearer token: set RAGSTREAM_QUERY_TOKEN"),
                _ => anyhow::bail!(
                    "the job answered {status}: {}",
                    problem["detail"].as_str().unwrap_or(&answer)
                ),
            }
        }
    }
    let base = url.trim_end_matches('/');
    for link in queued {
        follow_batch(&agent, &format!("{base}{link}"), token.as_deref())?;
    }
    Ok(())
}

/// Polls a batch's status link (`GET /v1/batches/{id}`) until the index holds it.
fn follow_batch(agent: &ureq::Agent, link: &str, token: Option<&str>) -> anyhow::Result<()> {
    let mut backoff = retry_backoff();
    loop {
        let mut request = agent.get(link);
        if let Some(token) = token {
            request = request.header("Authorization", &format!("Bearer {token}"));
        }
        let answer: Value = match request.call() {
            Ok(mut response) => {
                serde_json::from_str(&response.body_mut().read_to_string().unwrap_or_default())
                    .unwrap_or(Value::Null)
            }
            Err(error) => anyhow::bail!("is the job running? GET {link}: {error}"),
        };
        match answer["state"].as_str() {
            Some("indexed") => return Ok(()),
            Some("queued") => std::thread::sleep(backoff.next_delay()),
            _ => anyhow::bail!("batch {link} was not indexed: {answer}"),
        }
    }
}

/// The waits between a batch's tries: 0.5 s doubling to 16 s.
fn retry_backoff() -> Backoff {
    Backoff::new(Duration::from_millis(500), Duration::from_secs(16))
}

#[cfg(feature = "kafka")]
fn send_to_kafka(
    brokers: &str,
    topic: &str,
    documents: &[Outgoing],
    batch: usize,
    bar: &ProgressBar,
    accepted: &mut usize,
    refused: &mut Vec<(String, String)>,
) -> anyhow::Result<()> {
    let mut client = rdkafka::ClientConfig::new();
    client.set("bootstrap.servers", brokers);
    // Checked here as the job's decoder will, so a refusal is told now rather than dead-lettered.
    let decode = DecodeConfig::default();
    let producer = KafkaDocuments::new(&client, topic, decode.max_document_bytes)?;
    for chunk in batches(documents, batch) {
        let mut events = Vec::new();
        let mut origins = Vec::new();
        for document in chunk {
            let bytes = document.event.to_string().into_bytes();
            match decode_event(None, Some(&bytes), &decode) {
                Ok(op) => {
                    events.push((op.key().to_string(), bytes));
                    origins.push(&document.origin);
                }
                Err(error) => {
                    refused.push((document.origin.clone(), error.to_string()));
                    bar.inc(1);
                }
            }
        }
        let (mut tries, mut backoff) = (1, retry_backoff());
        loop {
            match producer.send(&events) {
                Ok(()) => break,
                // Refused by its size: told with the other refusals, and the rest sent again.
                Err(SendError::TooLarge { index, error }) => {
                    events.remove(index);
                    refused.push((origins.remove(index).clone(), error.to_string()));
                    bar.inc(1);
                }
                Err(error) if error.is_retryable() && tries < TRIES => {
                    tries += 1;
                    tracing::debug!(%error, "retrying the batch");
                    std::thread::sleep(backoff.next_delay());
                }
                Err(error) => {
                    anyhow::bail!("the broker at {brokers} did not take the batch: {error}")
                }
            }
        }
        *accepted += events.len();
        bar.inc(events.len() as u64);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outgoing(bytes: usize) -> Outgoing {
        Outgoing {
            origin: String::new(),
            event: Value::Null,
            bytes,
        }
    }

    #[test]
    fn batches_hold_a_count_and_a_size() {
        let documents: Vec<Outgoing> = (0..7).map(|_| outgoing(10)).collect();
        let sizes: Vec<usize> = batches(&documents, 3).iter().map(|b| b.len()).collect();
        assert_eq!(sizes, [3, 3, 1]);
        let big: Vec<Outgoing> = (0..3)
            .map(|_| outgoing(MAX_REQUEST_BYTES / 2 + 1))
            .collect();
        let sizes: Vec<usize> = batches(&big, 100).iter().map(|b| b.len()).collect();
        assert_eq!(sizes, [1, 1, 1], "each over half the limit goes alone");
        assert!(batches(&[], 10).is_empty());
    }
}
