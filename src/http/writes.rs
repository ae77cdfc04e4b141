//! The document routes: `POST /v1/documents` (a batch, checked whole, then written) and
//! `DELETE /v1/documents/{doc_id}`, answered once the batch is durable where the job takes documents.

use super::*;
use ragstream_operators::io::local_source::ReceiptState;

/// Longest a caller may wait for its batch to be indexed (`wait`, in seconds), and the default.
const MAX_WAIT: Duration = Duration::from_secs(120);

/// The `wait` parameter: seconds (a decimal number, 0 to 120), 120 when left out.
fn wait_parameter(params: &str) -> Result<Duration, Box<Reply>> {
    let Some(wait) = parameters(params).remove("wait") else {
        return Ok(MAX_WAIT);
    };
    match wait.parse::<f64>() {
        Ok(seconds) if (0.0..=MAX_WAIT.as_secs_f64()).contains(&seconds) => {
            Ok(Duration::from_secs_f64(seconds))
        }
        _ => Err(Box::new(problem(
            "bad_request",
            "wait must be a number of seconds from 0 to 120",
        ))),
    }
}

/// `POST /v1/documents`: a batch of document events, checked whole, then written.
pub(super) async fn post_documents(
    shared: Arc<Shared>,
    request: Request<Incoming>,
    params: &str,
    access: Access,
) -> Reply {
    let Some(owned) = shared.documents.takes_documents() else {
        return problem("no_document_input", NO_DOCUMENT_INPUT);
    };
    let wait = match wait_parameter(params) {
        Ok(wait) => wait,
        Err(refused) => return *refused,
    };
    // The slot first: a batch may be large, and only a few are read at once.
    let Ok(slot) = shared.document_slots.clone().try_acquire_owned() else {
        return busy("document batches are being written already; retry shortly");
    };
    let limit = shared.limits.max_documents_body_bytes;
    let over = format!("the body is over {limit} bytes (four times ingest.max_document_bytes)");
    let body = match read_body_within(request, limit, shared.limits.read_timeout, &over).await {
        Ok((_, body)) => body,
        Err(refused) => return refused,
    };
    // Parsing the batch and extracting files (HTML, PDF, DOCX) is CPU work: done off the server's
    // threads, at the priority of ingest work, so a large upload does not take the cores from queries.
    let checked = {
        let shared2 = shared.clone();
        let owned = owned.map(str::to_string);
        let (sender, receiver) = tokio::sync::oneshot::channel();
        shared.document_checks.run(Box::new(move || {
            let _ = sender.send(documents::admit(
                &body,
                access.tenants.as_deref(),
                owned.as_deref(),
                &shared2.decode,
            ));
        }));
        receiver.await
    };
    let Ok(admitted) = checked else {
        return problem("internal", "checking the documents failed");
    };
    match admitted {
        Ok(admitted) => write_documents(&shared, admitted, slot, wait).await,
        Err(refused) => problem_reply(refused.as_ref()),
    }
}

/// `DELETE /v1/documents/{doc_id}?tenant=&version=`: one delete, as `POST /v1/documents` takes it.
pub(super) async fn delete_document(
    shared: Arc<Shared>,
    doc_id: &str,
    params: &str,
    access: Access,
) -> Reply {
    let Some(owned) = shared.documents.takes_documents() else {
        return problem("no_document_input", NO_DOCUMENT_INPUT);
    };
    let wait = match wait_parameter(params) {
        Ok(wait) => wait,
        Err(refused) => return *refused,
    };
    let params = parameters(params);
    let mut event = serde_json::json!({
        "op": "delete",
        "doc_id": percent_encoding::percent_decode_str(doc_id).decode_utf8_lossy(),
    });
    if let Some(tenant) = params.get("tenant") {
        event["tenant"] = serde_json::json!(tenant);
    }
    if let Some(version) = params.get("version") {
        match version.parse::<u64>() {
            Ok(version) => event["version"] = serde_json::json!(version),
            Err(_) => return problem("bad_request", "version must be a positive integer"),
        }
    }
    let Ok(slot) = shared.document_slots.clone().try_acquire_owned() else {
        return busy("document batches are being written already; retry shortly");
    };
    let body = serde_json::json!({ "documents": [event] }).to_string();
    let admitted = documents::admit(
        body.as_bytes(),
        access.tenants.as_deref(),
        owned,
        &shared.decode,
    );
    match admitted {
        Ok(admitted) => write_documents(&shared, admitted, slot, wait).await,
        Err(refused) => problem_reply(refused.as_ref()),
    }
}

/// `GET /v1/batches/{id}`: where a batch posted in local mode stands.
pub(super) fn batch_status(shared: &Shared, id: &str, access: &Access) -> Reply {
    let may_read = |tenant: &str| access.tenants.as_ref().is_none_or(|t| t.contains(tenant));
    match id.parse::<u64>().ok().and_then(|id| shared.batches.status(id, may_read)) {
        Some(status) => json_reply(&status),
        None => problem(
            "not_found",
            "no such batch for this token (receipts are kept for the last 4096 batches of this process)",
        ),
    }
}

/// Whether a batch keeps each tenant within its documents and bytes quotas (its chunks are checked
/// once chunked): else the problem `quota_exceeded`, 413 where a document alone passes the quota.
fn within_quotas(
    usage: &ragstream_operators::ingest::quota::Usage,
    ops: &[ragstream_operators::model::DocOp],
) -> Result<(), Box<Problem>> {
    use ragstream_operators::model::DocOp;
    let batch: Vec<_> = ops
        .iter()
        .map(|op| match op {
            DocOp::Upsert(doc) => (doc.key.clone(), Some(doc.text.len() as u64)),
            DocOp::Delete { key, .. } => (key.clone(), None),
        })
        .collect();
    let Err((index, refusal)) = usage.check_batch(&batch) else {
        return Ok(());
    };
    ragstream_operators::metrics::metrics()
        .quota_refusals
        .with_label_values(&[refusal.limit])
        .inc();
    let mut refused = Problem::new(
        "quota_exceeded",
        format!(
            "document {index} ({}): {refusal}; nothing of the batch was written",
            batch[index].0
        ),
    );
    if refusal.never_fits {
        refused.status = 413;
    }
    Err(Box::new(refused))
}

const NO_DOCUMENT_INPUT: &str =
    "this job reads one JSONL file and stops; it takes no documents over HTTP (runtime.serve = false)";

/// Writes an admitted batch where the job takes documents, and answers once it is durable there
/// (Kafka: the broker acknowledged it; local: the index holds it, or `wait` passed: 202 with the
/// batch's status link). `slot` (one of `document_slots`, the batches being read) is held until the
/// batch is handed on; in local mode the batch then holds a room of its tenant's until it is
/// indexed, whether or not its caller still waits.
pub(super) async fn write_documents(
    shared: &Arc<Shared>,
    admitted: documents::Admitted,
    slot: tokio::sync::OwnedSemaphorePermit,
    wait: Duration,
) -> Reply {
    let accepted = admitted.events.len();
    match &shared.documents {
        #[cfg(feature = "kafka")]
        DocumentsTarget::Kafka(sink) => {
            let sink = sink.clone();
            let events = admitted.events;
            let sent = tokio::task::spawn_blocking(move || {
                let sent = sink.send(&events);
                drop(slot);
                sent
            });
            match sent.await {
                Ok(Ok(())) => {
                    let mut answer = json_reply(&documents::DocumentsAccepted {
                        accepted,
                        indexed: false,
                        status: None,
                    });
                    *answer.status_mut() = StatusCode::ACCEPTED;
                    answer
                }
                Ok(Err(documents::SendError::TooLarge { index, error })) => {
                    // Sending it again cannot help: the batch is refused, naming the document.
                    let detail =
                        format!("document {index} is too large for the documents topic: {error}");
                    let mut refused = Problem::new("oversize", detail.clone());
                    refused.errors.push(crate::http::api::DocumentError {
                        index,
                        reason: "oversize".into(),
                        detail,
                    });
                    problem_reply(&refused)
                }
                Ok(Err(outage)) => {
                    tracing::warn!(error = %outage, "POST /v1/documents: the broker did not take the batch");
                    problem("broker_unavailable", &outage.to_string())
                }
                Err(_) => problem("internal", "the batch's write failed"),
            }
        }
        DocumentsTarget::Local { ingress, usage, .. } => {
            if let Err(refused) = within_quotas(usage, &admitted.ops) {
                return problem_reply(&refused);
            }
            let tenants: std::collections::BTreeSet<String> = admitted
                .ops
                .iter()
                .map(|op| op.key().tenant.clone())
                .collect();
            let lane = admitted
                .ops
                .first()
                .map(|op| op.key().tenant.clone())
                .unwrap_or_default();
            let room = match shared.batches.room(&lane) {
                Ok(room) => room,
                Err(full) => return busy(&full),
            };
            drop(slot);
            let receipt = ingress.submit(
                admitted.ops.into_iter().map(Ok).collect(),
                Some(Box::new(room)),
            );
            let id = shared.batches.keep(tenants, accepted, receipt.clone());
            let waited = tokio::task::spawn_blocking(move || receipt.wait(wait)).await;
            match waited {
                Ok(ReceiptState::Indexed) => json_reply(&documents::DocumentsAccepted {
                    accepted,
                    indexed: true,
                    status: None,
                }),
                Ok(ReceiptState::Stopped) => problem(
                    "stopping",
                    "the job is stopping and takes no more documents",
                ),
                Ok(ReceiptState::Queued) => {
                    let link = format!("/v1/batches/{id}");
                    let mut answer = json_reply(&documents::DocumentsAccepted {
                        accepted,
                        indexed: false,
                        status: Some(link.clone()),
                    });
                    *answer.status_mut() = StatusCode::ACCEPTED;
                    if let Ok(location) = HeaderValue::from_str(&link) {
                        answer
                            .headers_mut()
                            .insert(http::header::LOCATION, location);
                    }
                    answer
                }
                Err(_) => problem("internal", "the batch's wait failed"),
            }
        }
        DocumentsTarget::None => problem("no_document_input", NO_DOCUMENT_INPUT),
    }
}
