//! The document routes: `POST /v1/documents` (a batch, checked whole, then written) and
//! `DELETE /v1/documents/{doc_id}`, answered once the batch is durable where the job takes documents.

use super::*;

/// `POST /v1/documents`: a batch of document events, checked whole, then written.
pub(super) async fn post_documents(
    shared: Arc<Shared>,
    request: Request<Incoming>,
    access: Access,
) -> Reply {
    let Some(owned) = shared.documents.takes_documents() else {
        return problem("no_document_input", NO_DOCUMENT_INPUT);
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
    // Extracting files (HTML, PDF, DOCX) is CPU work: done off the server's threads.
    let checked = {
        let shared = shared.clone();
        let owned = owned.map(str::to_string);
        tokio::task::spawn_blocking(move || {
            documents::admit(
                &body,
                access.tenants.as_deref(),
                owned.as_deref(),
                &shared.decode,
            )
        })
        .await
    };
    let Ok(admitted) = checked else {
        return problem("internal", "checking the documents failed");
    };
    match admitted {
        Ok(admitted) => write_documents(&shared, admitted, slot).await,
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
        Ok(admitted) => write_documents(&shared, admitted, slot).await,
        Err(refused) => problem_reply(refused.as_ref()),
    }
}

const NO_DOCUMENT_INPUT: &str =
    "this job reads one JSONL file and stops; it takes no documents over HTTP (runtime.serve = false)";

/// Writes an admitted batch where the job takes documents, and answers once it is durable there.
/// `slot` (one of `document_slots`) is held until the batch is written, whether or not its caller
/// still waits: a caller that goes away or times out does not free room for more batches than the
/// job is writing.
pub(super) async fn write_documents(
    shared: &Arc<Shared>,
    admitted: documents::Admitted,
    slot: tokio::sync::OwnedSemaphorePermit,
) -> Reply {
    let accepted = admitted.events.len();
    match &shared.documents {
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
                    });
                    *answer.status_mut() = StatusCode::ACCEPTED;
                    answer
                }
                Ok(Err(outage)) => {
                    tracing::warn!(error = %outage, "POST /v1/documents: the broker did not take the batch");
                    problem("broker_unavailable", &outage)
                }
                Err(_) => problem("internal", "the batch's write failed"),
            }
        }
        DocumentsTarget::Local { ingress, .. } => {
            let receiver = ingress.submit_holding(
                admitted.ops.into_iter().map(Ok).collect(),
                Some(Box::new(slot)),
            );
            let waited =
                tokio::task::spawn_blocking(move || receiver.recv_timeout(QUERY_TIMEOUT)).await;
            match waited {
                Ok(Ok(())) => json_reply(&documents::DocumentsAccepted {
                    accepted,
                    indexed: true,
                }),
                Ok(Err(mpsc::RecvTimeoutError::Disconnected)) => problem(
                    "stopping",
                    "the job is stopping and takes no more documents",
                ),
                Ok(Err(mpsc::RecvTimeoutError::Timeout)) => problem(
                    "timeout",
                    "the documents were not indexed within 120 s; they are still queued",
                ),
                Err(_) => problem("internal", "the batch's wait failed"),
            }
        }
        DocumentsTarget::None => problem("no_document_input", NO_DOCUMENT_INPUT),
    }
}
