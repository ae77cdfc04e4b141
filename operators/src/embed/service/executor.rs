//! The executors: threads that take work from the queues, embed it and settle its tickets.

use super::*;

pub(super) fn run_executor(shared: &Shared, mut embedder: Box<dyn Embedder>, role: Role) {
    if role == Role::Ingest {
        crate::offload::lower_priority();
    }
    while let Some(work) = next_work(shared, role) {
        match work {
            Work::Queries(requests) => run_queries(embedder.as_mut(), requests),
            Work::Slice {
                id,
                texts,
                spans,
                positions,
            } => {
                let inputs: Vec<&str> = positions.iter().map(|&p| texts[p].as_str()).collect();
                let spans: Vec<Spans> = positions
                    .iter()
                    .map(|&p| spans.get(p).cloned().unwrap_or_default())
                    .collect();
                let result = timed_embed(embedder.as_mut(), &inputs, &spans);
                finish_slice(shared, id, positions, &spans, result);
            }
        }
    }
}

/// Embeds `texts` (with their `spans`, [`Embedder::embed_spans`]) and records the model's time and
/// word pieces.
pub(super) fn timed_embed(
    embedder: &mut dyn Embedder,
    texts: &[&str],
    spans: &[Spans],
) -> Result<(Vec<Vec<f32>>, usize), EmbedError> {
    let started = Instant::now();
    let expected = texts.len() + spans.iter().map(Vec::len).sum::<usize>();
    let vectors = match expected > texts.len() {
        true => embedder.embed_spans(texts, spans)?,
        false => embedder.embed(texts)?,
    };
    if vectors.len() != expected {
        return Err(EmbedError::Model(format!(
            "{} vectors for {expected} texts and spans",
            vectors.len(),
        )));
    }
    let tokens = embedder.last_token_count();
    let metrics = metrics();
    metrics
        .embed_seconds
        .observe(started.elapsed().as_secs_f64());
    metrics.embed_tokens.inc_by(tokens as u64);
    metrics.embed_batch_tokens.observe(tokens as f64);
    metrics.embed_texts.inc_by(texts.len() as u64);
    Ok((vectors, tokens))
}

/// Query requests in one call; each completes (with its vectors or the error) at once.
pub(super) fn run_queries(embedder: &mut dyn Embedder, requests: Vec<Request>) {
    let inputs: Vec<&str> = requests
        .iter()
        .flat_map(|r| r.texts.iter().map(String::as_str))
        .collect();
    match timed_embed(embedder, &inputs, &[]) {
        Ok((vectors, word_pieces)) => {
            let mut vectors = vectors.into_iter();
            for request in requests {
                let vectors: Vec<Vec<f32>> = vectors.by_ref().take(request.texts.len()).collect();
                request.promise.keep(Ok(Embedded {
                    vectors,
                    word_pieces,
                }));
            }
        }
        Err(error) => {
            tracing::warn!(%error, requests = requests.len(), "query embedding failed");
            let message = error.to_string();
            for request in requests {
                let error = if error.is_retryable() {
                    EmbedError::Unavailable(message.clone())
                } else {
                    EmbedError::Model(message.clone())
                };
                request.promise.keep(Err(error));
            }
        }
    }
}

/// Files a slice's vectors under its request (completing it when it was the last), or hands the slice
/// back after an outage, or fails the request.
pub(super) fn finish_slice(
    shared: &Shared,
    id: u64,
    positions: Vec<usize>,
    spans: &[Spans],
    result: Result<(Vec<Vec<f32>>, usize), EmbedError>,
) {
    let mut queues = lock(&shared.queues);
    queues.slices_running = queues.slices_running.saturating_sub(1);
    if shared.config.query_headroom.is_some() {
        // An executor sitting out may take the next slice.
        shared.work.notify_one();
    }
    let Some(index) = queues.ingest.iter().position(|r| r.id == id) else {
        return; // The request failed on another slice meanwhile.
    };
    match result {
        Ok((vectors, word_pieces)) => {
            queues.backoff.reset();
            queues.backoff_until = None;
            queues.outage = None;
            let request = &mut queues.ingest[index];
            let mut vectors = vectors.into_iter();
            for (slot, &position) in positions.iter().enumerate() {
                let count = 1 + spans.get(slot).map_or(0, Vec::len);
                request.vectors[position] = vectors.by_ref().take(count).collect();
                request.done += 1;
            }
            request.word_pieces += word_pieces;
            if request.done == request.texts.len() {
                let request = queues.ingest.remove(index).expect("request exists");
                drop(queues);
                request.promise.keep(Ok(Embedded {
                    vectors: request.vectors.into_iter().flatten().collect(),
                    word_pieces: request.word_pieces,
                }));
            }
        }
        Err(error) if error.is_retryable() => {
            let delay = queues.backoff.next_delay();
            queues.backoff_until = Some(Instant::now() + delay);
            match &queues.outage {
                Some(outage) => outage.failed_again(&error),
                None => {
                    queues.outage = Some(crate::outage::Retrying::begin(
                        crate::outage::Dependency::Embedder,
                        &error,
                    ))
                }
            }
            queues.ingest[index].retry.push(positions);
            drop(queues);
            // Ingest pauses; queries are still served (and fail over to BM25 while it lasts).
            Retrying {
                component: crate::outage::Dependency::Embedder.as_str(),
                error: &error,
                delay,
            }
            .emit();
            shared.work.notify_all();
        }
        Err(error) => {
            let request = queues.ingest.remove(index).expect("request exists");
            drop(queues);
            request.promise.keep(Err(error));
        }
    }
}
