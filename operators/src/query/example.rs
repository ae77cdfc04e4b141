//! Records for the query operators' `# Examples`: a query job and the lanes a shard would answer,
//! built from a few words. For documentation only (hidden from the API docs).

use std::collections::BTreeMap;

use super::job::{QueryJob, Reply, Working};
use super::search::ShardAnswer;
use crate::model::{Chunk, DocKey, DocKind};
use crate::store::{Bm25Encoder, Hit, StoredChunk};
use ragstream_core::query::decode::decode_query;
use ragstream_core::query::intent::{analyze, IntentPresets};
use ragstream_core::query::Trace;

/// A job for the query `body` (JSON, as a client sends it; at most 8 KiB), analysed as the Intent
/// operator would with the default presets.
pub fn job(body: &str) -> QueryJob {
    let query = decode_query(body.as_bytes(), 8192).expect("a valid example query");
    let mut job = QueryJob::new(query, 0, 0, 0, Reply::Http(0), BTreeMap::new());
    job.plan = Some(analyze(
        &job.query.text,
        &Bm25Encoder::default(),
        &IntentPresets::default(),
    ));
    job
}

/// A hit on the first chunk of document `doc` (tenant `t`), whose text is `text`, with the lane
/// score `score` and the stored vector `vector`.
pub fn hit(doc: &str, text: &str, score: f32, vector: &[f32]) -> (Hit, Vec<f32>) {
    let key = DocKey::new("t", doc);
    let lines = text.lines().count().max(1) as u32;
    let mut chunk = Chunk {
        order_index: 0,
        section_path: Vec::new(),
        header: String::new(),
        doc_title: doc.to_string(),
        source: format!("{doc}.txt"),
        kind: DocKind::Prose,
        lines: (1, lines),
        page: None,
        char_range: (0, u32::try_from(text.len()).unwrap_or(u32::MAX)),
        tokens: text.split_whitespace().count() as u32,
        content_hash: String::new(),
        occurrence: 0,
        acl: Vec::new(),
        lang: "eng".into(),
        updated_ms: 0,
        metadata: Default::default(),
        text: text.to_string(),
        last: false,
    };
    chunk.content_hash = crate::ingest::chunk::content_hash(&chunk);
    let stored = StoredChunk {
        id: chunk.point_id(&key),
        key,
        version: 1,
        embedder_version: "example".into(),
        chunk,
    };
    (Hit { stored, score }, vector.to_vec())
}

/// `job` once its shards answered with the `dense` and `bm25` lanes (best first), answered with the
/// default settings.
pub fn gathered(job: QueryJob, dense: Vec<(Hit, Vec<f32>)>, bm25: Vec<(Hit, Vec<f32>)>) -> Working {
    let mut answer = ShardAnswer::default();
    for (hits, lane) in [(dense, &mut answer.dense), (bm25, &mut answer.bm25)] {
        for (hit, vector) in hits {
            answer.vectors.push((hit.stored.id, vector));
            lane.push(hit);
        }
    }
    answer.vectors.sort_by_key(|(id, _)| *id);
    answer.vectors.dedup_by_key(|(id, _)| *id);
    Working {
        job,
        settings: std::sync::Arc::new(ragstream_core::query::QueryConfig::default()),
        answer,
        candidates: Vec::new(),
        deferred: Vec::new(),
        score_floor: 0.0,
        trace: Trace::default(),
        available: 0,
        neighbours: Vec::new(),
    }
}

/// The documents of the candidates, in their current order.
pub fn documents(working: &Working) -> Vec<String> {
    working
        .candidates
        .iter()
        .map(|candidate| candidate.stored.key.doc_id.clone())
        .collect()
}

/// An embedder for examples whose queries come with their vectors: every text embeds to zeros.
struct Zeros;

impl crate::embed::Embedder for Zeros {
    fn version(&self) -> &str {
        "example"
    }
    fn dimension(&self) -> usize {
        2
    }
    fn embed(&mut self, texts: &[&str]) -> Result<Vec<Vec<f32>>, crate::embed::EmbedError> {
        Ok(vec![vec![0.0; 2]; texts.len()])
    }
    fn last_token_count(&self) -> usize {
        0
    }
}

/// What the query operators share, for an example: no shards, the default query configuration,
/// the o200k tokenizer, and an inference service that embeds every text to zeros.
pub fn services() -> super::job::QueryServices {
    use crate::embed::service::{InferenceService, ServiceConfig};
    use std::sync::{Arc, Mutex};
    super::job::QueryServices {
        shards: Arc::new(Vec::new()),
        first_worker: 0,
        peers: 1,
        shared_index: false,
        embedder: InferenceService::start(vec![Box::new(Zeros)], ServiceConfig::default())
            .expect("an inference service"),
        config: Arc::new(ragstream_core::query::QueryConfig::default()),
        encoding: crate::tokens::Encoding::O200kBase,
        progress: Arc::default(),
        acks: timely::dataflow::ProbeHandle::new(),
        stats: Arc::new(crate::store::stats::CorpusStats::default()),
        reranker: None,
        writer: None,
        access: Arc::new(Mutex::new(
            ragstream_core::query::surrogate::AccessCounts::new(16),
        )),
    }
}
