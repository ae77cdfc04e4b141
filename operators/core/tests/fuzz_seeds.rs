//! Fuzzing from seed corpora (`operators/core/fuzz/seeds/`): each target runs on every seed and on
//! mutations of it (bit flips, byte insertions and deletions, truncations, splices with other seeds,
//! a span repeated to grow the input), deterministic and bounded (`RAGSTREAM_FUZZ_MUTATIONS` per
//! seed, 1000 by default). A target must never panic; the decoders refuse with a reason, and the
//! chunker's chunks are byte ranges of their document within the budget.
//!
//! Targets: the query decoder (`seeds/query`), the document decoder (`seeds/document`), the chunker
//! (`seeds/chunker`, the kind read from the file name as the directory source does). The packer is
//! fuzzed by the property tests in `query/pack/tests.rs` over generated candidate sets.
//!
//! A new seed is a file in the target's folder: an input worth keeping (one that once failed, or one
//! that reaches code the others do not).

use std::path::PathBuf;

use ragstream_core::ingest::chunk::{Chunker, ChunkerConfig};
use ragstream_core::ingest::decode::{decode_event, DecodeConfig};
use ragstream_core::model::{DocKey, DocKind, Document};
use ragstream_core::query::decode::decode_query;
use ragstream_core::tokens::{Encoding, TokenCounter};

fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/seeds")
        .join(target);
    let mut seeds: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.expect("entry").path();
            let name = path
                .file_name()
                .expect("name")
                .to_string_lossy()
                .into_owned();
            (name, std::fs::read(&path).expect("seed"))
        })
        .collect();
    seeds.sort();
    assert!(!seeds.is_empty(), "no seeds in {}", dir.display());
    seeds
}

fn mutations_per_seed() -> usize {
    std::env::var("RAGSTREAM_FUZZ_MUTATIONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1000)
}

/// A deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Bytes that matter to the inputs' grammars, inserted more often than chance would.
const INTERESTING: &[&[u8]] = &[
    b"\"",
    b"\\",
    b"{",
    b"}",
    b"[",
    b"]",
    b":",
    b",",
    b"-1",
    b"18446744073709551616",
    b"1e308",
    b"null",
    b"\n",
    b"\n\n# ",
    b"```",
    b"|---|",
    b"def ",
    b"fn ",
    b"\xe6\x9d\xb1",
    b"\xff",
    b"\0",
];

fn mutate(seed: &[u8], others: &[(String, Vec<u8>)], rng: &mut Rng) -> Vec<u8> {
    let mut out = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(out.len() + 1);
        match rng.below(7) {
            0 if !out.is_empty() => {
                let at = at.min(out.len() - 1);
                out[at] ^= 1 << rng.below(8);
            }
            1 => {
                let piece = INTERESTING[rng.below(INTERESTING.len())];
                out.splice(at..at, piece.iter().copied());
            }
            2 if !out.is_empty() => {
                let end = (at + 1 + rng.below(16)).min(out.len());
                out.drain(at.min(end)..end);
            }
            3 => out.truncate(at),
            4 => {
                let (_, other) = &others[rng.below(others.len())];
                let from = rng.below(other.len());
                let to = (from + rng.below(64)).min(other.len());
                out.splice(at..at, other[from..to].iter().copied());
            }
            5 if !out.is_empty() => {
                // A span repeated: long lines, deep nesting, big tables.
                let from = rng.below(out.len());
                let to = (from + 1 + rng.below(32)).min(out.len());
                let span = out[from..to].to_vec();
                for _ in 0..rng.below(200) {
                    out.splice(to..to, span.iter().copied());
                }
            }
            _ => out.push(rng.next() as u8),
        }
    }
    out
}

/// Runs `target` on every seed of `folder` (each must pass `accepts`) and on its mutations.
fn fuzz(folder: &str, accepts: impl Fn(&str, &[u8]), target: impl Fn(&str, &[u8])) {
    let seeds = seeds(folder);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for (name, seed) in &seeds {
        accepts(name, seed);
        for _ in 0..mutations_per_seed() {
            target(name, &mutate(seed, &seeds, &mut rng));
        }
    }
}

#[test]
fn the_query_decoder_refuses_or_accepts_every_mutation() {
    fuzz(
        "query",
        |name, seed| {
            decode_query(seed, 8192).unwrap_or_else(|e| panic!("seed {name}: {e}"));
        },
        |_, input| {
            if let Err(error) = decode_query(input, 8192) {
                assert!(!error.reason.as_str().is_empty());
            }
        },
    );
}

#[test]
fn the_document_decoder_refuses_or_accepts_every_mutation() {
    let config = DecodeConfig::default();
    fuzz(
        "document",
        |name, seed| {
            decode_event(None, Some(seed), &config).unwrap_or_else(|e| panic!("seed {name}: {e}"));
        },
        |_, input| {
            if let Err(error) = decode_event(Some(b"acme/runbook"), Some(input), &config) {
                assert!(!error.message.is_empty());
            }
            let _ = decode_event(Some(input), None, &config);
        },
    );
}

#[test]
fn the_chunker_cuts_every_mutation_within_its_budget() {
    let budget = 64;
    let chunker = Chunker::new(ChunkerConfig {
        prose_tokens: budget,
        code_tokens: budget,
        schema_tokens: budget,
        ..ChunkerConfig::default()
    });
    let counter = TokenCounter::new(Encoding::O200kBase);
    let chunk = |name: &str, input: &[u8]| {
        let text = String::from_utf8_lossy(input).into_owned();
        let document = Document {
            key: DocKey::new("t", name),
            version: 1,
            source: name.to_string(),
            kind: DocKind::Auto,
            title: None,
            text,
            acl: Vec::new(),
            updated_ms: 0,
            metadata: Default::default(),
        };
        let chunks = chunker.chunk(&document);
        for chunk in &chunks {
            let (from, to) = (chunk.char_range.0 as usize, chunk.char_range.1 as usize);
            if chunk.kind != DocKind::SqlSchema {
                assert_eq!(&document.text[from..to], chunk.text, "{name}");
                assert!(counter.count(&chunk.text) <= budget, "{name}: over budget");
            }
        }
        chunks
    };
    fuzz(
        "chunker",
        |name, seed| assert!(!chunk(name, seed).is_empty(), "seed {name}"),
        |name, input| {
            chunk(name, input);
        },
    );
}
