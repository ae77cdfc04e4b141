//! Criterion: fuse + rerank + dedup + MMR + pack on 100 candidates (the per-query CPU work after
//! retrieval), together and step by step. Candidates are ~180-token prose chunks with 384-dim vectors,
//! the shape all-MiniLM-L6-v2 and the default chunker produce.

use std::hint::black_box;

/// The job's allocator (as in `src/main.rs`); `--features bench-system-allocator` measures the steps
/// on the system allocator instead (the baseline BENCHMARKS.md compares with).
#[cfg(not(feature = "bench-system-allocator"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use ragstream_core::query::dedup::dedup;
use ragstream_core::query::fuse::{attach_vectors, fuse};
use ragstream_core::query::intent::analyze;
use ragstream_core::query::mmr::{mmr, MmrConfig};
use ragstream_core::query::pack::{pack, AnswerCue, PackConfig, PackRequest};
use ragstream_core::query::rerank::{rerank, RerankConfig};
use ragstream_core::query::{Candidate, Weights};
use ragstream_operators::model::{Chunk, DocKey, DocKind};
use ragstream_operators::store::{Bm25Encoder, Hit, StoredChunk};
use ragstream_operators::tokens::{Encoding, TokenCounter};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn unit(&mut self) -> f32 {
        (self.next() % 10_000) as f32 / 10_000.0 - 0.5
    }
}

const WORDS: &[&str] = &[
    "the",
    "river",
    "system",
    "index",
    "stream",
    "token",
    "budget",
    "city",
    "football",
    "league",
    "champion",
    "season",
    "game",
    "team",
    "protein",
    "cell",
    "signal",
    "pathway",
    "patients",
    "study",
    "increase",
    "reduced",
    "expression",
    "model",
    "language",
    "window",
    "context",
    "retrieval",
    "query",
    "answer",
    "during",
    "between",
    "after",
    "within",
    "across",
    "several",
    "important",
    "early",
    "later",
    "Denver",
    "Broncos",
    "Carolina",
    "Panthers",
    "Warsaw",
    "Poland",
    "Vistula",
    "1889",
    "2015",
    "engine",
];

fn sentence(rng: &mut Rng) -> String {
    let length = 8 + rng.next() as usize % 12;
    let words: Vec<&str> = (0..length)
        .map(|_| WORDS[rng.next() as usize % WORDS.len()])
        .collect();
    let mut text = words.join(" ");
    text[..1].make_ascii_uppercase();
    text.push('.');
    text
}

fn chunk(rng: &mut Rng, doc: usize, order: u32, counter: TokenCounter) -> StoredChunk {
    let text: Vec<String> = (0..9).map(|_| sentence(rng)).collect();
    let text = text.join(" ");
    let start = order * 2000;
    StoredChunk {
        id: uuid::Uuid::new_v5(
            &uuid::Uuid::NAMESPACE_OID,
            format!("{doc}/{order}").as_bytes(),
        ),
        key: DocKey::new("bench", format!("doc{doc}")),
        version: 1,
        embedder_version: "bench".into(),
        chunk: Chunk {
            order_index: order,
            section_path: vec![format!("Section {}", order % 3)],
            header: format!("Section {}", order % 3),
            doc_title: format!("Document {doc}"),
            source: format!("corpus/doc{doc}.md"),
            kind: DocKind::Prose,
            lines: (order * 10 + 1, order * 10 + 9),
            page: None,
            char_range: (start, start + text.len() as u32),
            tokens: counter.count(&text) as u32,
            content_hash: blake3::hash(text.as_bytes()).to_hex().to_string(),
            occurrence: 0,
            acl: vec![],
            updated_ms: 0,
            metadata: Default::default(),
            lang: String::new(),
            text,
            last: false,
        },
    }
}

struct Fixture {
    dense: Vec<Hit>,
    bm25: Vec<Hit>,
    vectors: std::collections::HashMap<uuid::Uuid, Vec<f32>>,
    neighbours: Vec<StoredChunk>,
}

fn fixture(counter: TokenCounter) -> Fixture {
    let mut rng = Rng(7);
    // 100 distinct chunks over 40 documents; the lanes share 20 of them.
    let chunks: Vec<StoredChunk> = (0..100)
        .map(|i| chunk(&mut rng, i % 40, (i / 40) as u32, counter))
        .collect();
    let mut vectors: std::collections::HashMap<uuid::Uuid, Vec<f32>> =
        std::collections::HashMap::new();
    for (i, stored) in chunks.iter().enumerate() {
        let mut v: Vec<f32> = (0..384).map(|_| rng.unit()).collect();
        if i % 10 == 1 {
            // Every tenth chunk nearly duplicates its predecessor.
            v = vectors[&chunks[i - 1].id].clone();
            v[0] += 0.01;
        }
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        vectors.insert(stored.id, v.iter().map(|x| x / norm).collect());
    }
    let dense = chunks[..60]
        .iter()
        .enumerate()
        .map(|(rank, stored)| Hit {
            stored: stored.clone(),
            score: 0.9 - rank as f32 * 0.005,
        })
        .collect();
    let bm25 = chunks[40..]
        .iter()
        .enumerate()
        .map(|(rank, stored)| Hit {
            stored: stored.clone(),
            score: 20.0 - rank as f32 * 0.2,
        })
        .collect();
    let neighbours = chunks
        .iter()
        .filter(|c| c.key.doc_id == "doc0")
        .cloned()
        .collect();
    Fixture {
        dense,
        bm25,
        vectors,
        neighbours,
    }
}

/// Both lanes' hits and the stored vectors, as retrieval hands them over.
type Lanes = (Vec<Hit>, Vec<Hit>, Vec<(uuid::Uuid, Vec<f32>)>);

const QUESTION: &str = "Which team won the football league champion season in 2015?";

fn steps(c: &mut Criterion) {
    let counter = TokenCounter::new(Encoding::O200kBase);
    let bm25 = Bm25Encoder::default();
    let data = fixture(counter);
    let plan = analyze(QUESTION, &bm25, &Default::default());
    let rerank_config = RerankConfig::default();
    let mmr_config = MmrConfig {
        lambda: 0.6,
        per_document: 2,
        per_section: 1,
        near_duplicate: 0.95,
        file_penalty: 0.0,
    };
    let pack_config = PackConfig::default();
    let weights = Weights {
        dense: 0.5,
        bm25: 0.5,
    };

    // What retrieval hands over: both lanes' hits and the stored vectors, owned (cloned outside the
    // timed part by `iter_batched`).
    let lanes = || {
        let vectors: Vec<(uuid::Uuid, Vec<f32>)> = data
            .vectors
            .iter()
            .map(|(id, v)| (*id, v.clone()))
            .collect();
        (data.dense.clone(), data.bm25.clone(), vectors)
    };
    let fused = |(dense, bm25, vectors): Lanes| {
        let (mut candidates, _) = fuse(dense, bm25, weights, 60.0);
        attach_vectors(&mut candidates, vectors);
        candidates
    };
    assert_eq!(fused(lanes()).len(), 100);
    let run_all = |budget: usize, input| {
        let mut candidates: Vec<Candidate> = fused(input);
        rerank(&mut candidates, &plan, &rerank_config, &bm25);
        let (kept, _) = dedup(candidates);
        let selection = mmr(kept, 10, mmr_config);
        pack(PackRequest {
            picked: &selection.picked,
            deferred: &selection.deferred,
            neighbours: &data.neighbours,
            budget,
            counter,
            terms: &plan.terms,
            cue: AnswerCue::of_question(QUESTION),
            config: &pack_config,
            fill: true,
            whole: false,
            floor: 0.0,
            tiers: &[],
        })
    };
    let packed = run_all(3000, lanes());
    assert!(packed.tokens_used <= 3000 && packed.items.len() > 3);

    let mut group = c.benchmark_group("query_steps_100_candidates");
    group.bench_function("all_budget_3000", |b| {
        b.iter_batched(lanes, |input| run_all(3000, input), BatchSize::SmallInput)
    });
    group.bench_function("all_budget_500", |b| {
        b.iter_batched(lanes, |input| run_all(500, input), BatchSize::SmallInput)
    });
    group.bench_function("fuse", |b| {
        b.iter_batched(lanes, fused, BatchSize::SmallInput)
    });
    let base = fused(lanes());
    let copy = || base.clone();
    group.bench_function("rerank", |b| {
        b.iter_batched_ref(
            copy,
            |candidates| rerank(candidates, &plan, &rerank_config, &bm25),
            BatchSize::SmallInput,
        )
    });
    let mut warm = base.clone();
    group.bench_function("rerank_warm", |b| {
        b.iter(|| rerank(&mut warm, &plan, &rerank_config, &bm25))
    });
    group.bench_function("dedup", |b| {
        b.iter_batched(copy, dedup, BatchSize::SmallInput)
    });
    group.bench_function("mmr", |b| {
        b.iter_batched(
            copy,
            |candidates| mmr(candidates, 10, mmr_config),
            BatchSize::SmallInput,
        )
    });
    let selection = mmr(dedup(base.clone()).0, 10, mmr_config);
    group.bench_function("pack_budget_3000", |b| {
        b.iter(|| {
            black_box(pack(PackRequest {
                picked: &selection.picked,
                deferred: &selection.deferred,
                neighbours: &data.neighbours,
                budget: 3000,
                counter,
                terms: &plan.terms,
                cue: AnswerCue::of_question(QUESTION),
                config: &pack_config,
                fill: true,
                whole: false,
                floor: 0.0,
                tiers: &[],
            }))
        })
    });
    // The floor the packer cannot go below: counting the assembled string once.
    group.bench_function("count_context_3000", |b| {
        b.iter(|| black_box(counter.count(black_box(&packed.context))))
    });
    // Baseline in the same run: tiktoken encoding the whole string in one call.
    group.bench_function("count_context_3000_tiktoken", |b| {
        b.iter(|| black_box(counter.count_whole(black_box(&packed.context))))
    });
    group.finish();
}

criterion_group!(benches, steps);
criterion_main!(benches);
