//! Fuzzing from seed corpora (`operators/core/fuzz/seeds/`): each target runs on every seed and on
//! mutations of it (bit flips, byte insertions and deletions, truncations, splices with other seeds,
//! a span repeated to grow the input), deterministic and bounded (`RAGSTREAM_FUZZ_MUTATIONS` per
//! seed, 1000 by default). A target must never panic; the decoders refuse with a reason, and the
//! chunker's chunks are byte ranges of their document within the budget.
//!
//! Targets: the query decoder (`seeds/query`), the document decoder (`seeds/document`), the chunker
//! (`seeds/chunker`, the kind read from the file name as the directory source does), and the file
//! formats with the chunker behind them (`seeds/html`, `seeds/pdf`, `seeds/docx`: real files written
//! by pandoc, groff and Ghostscript and crafted ones, `fuzz/README.md`): each mutation is extracted
//! under small bounds and refused with a reason, or its text is within the bound and chunked within
//! the budget. The packer is fuzzed by the property tests in `query/pack/tests.rs` over generated
//! candidate sets.
//!
//! A new seed is a file in the target's folder: an input worth keeping (one that once failed, or one
//! that reaches code the others do not).

use std::path::PathBuf;

use ragstream_core::ingest::chunk::{Chunker, ChunkerConfig};
use ragstream_core::ingest::decode::{decode_event, DecodeConfig};
use ragstream_core::ingest::extract::{extract, ExtractLimits};
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
    // HTML
    b"<div>",
    b"</h2>",
    b"<table><tr><td>",
    b"<!--",
    b"&#x10FFFF;",
    // PDF
    b"<<",
    b">>",
    b" 0 R",
    b"/Length 999999999",
    b"stream\n",
    b"endobj",
    b"BT (x) Tj ET",
    // DOCX (ZIP records, XML)
    b"PK\x03\x04",
    b"<w:p>",
    b"<!ENTITY",
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

/// A file target: every seed is read; every mutation is read within the bounds, its text chunked within
/// the budget as a byte range of it, or refused naming why. Mutations per seed: half the decoders' (a
/// file costs more to read).
fn fuzz_format(kind: DocKind) {
    let limits = ExtractLimits {
        max_text_bytes: 256 << 10,
        max_inflated_bytes: 4 << 20,
        max_pages: 200,
    };
    let budget = 64;
    let chunker = Chunker::new(ChunkerConfig {
        prose_tokens: budget,
        ..ChunkerConfig::default()
    });
    // Err: the property failed, and how.
    let read = |name: &str, input: &[u8]| -> Result<_, String> {
        let file = extract(kind, input, &limits);
        if let Ok(file) = &file {
            if file.text.len() > limits.max_text_bytes {
                return Err(format!("{name}: text of {} bytes", file.text.len()));
            }
            let document = Document {
                key: DocKey::new("t", name),
                version: 1,
                source: name.to_string(),
                kind,
                title: file.title.clone(),
                text: file.text.clone(),
                acl: Vec::new(),
                updated_ms: 0,
                metadata: Default::default(),
            };
            for chunk in chunker.chunk(&document) {
                let (from, to) = (chunk.char_range.0 as usize, chunk.char_range.1 as usize);
                if document.text.get(from..to) != Some(chunk.text.as_str()) {
                    return Err(format!("{name}: a chunk is not its range of the text"));
                }
                if chunk.tokens as usize > budget {
                    return Err(format!("{name}: a chunk of {} tokens", chunk.tokens));
                }
            }
        }
        Ok(file)
    };
    // A failing input is kept to become a seed or a regression test.
    let failed = |input: &[u8], why: String| -> ! {
        let path = std::env::temp_dir().join(format!("fuzz-failure.{}", kind.as_str()));
        let _ = std::fs::write(&path, input);
        panic!("{why} (input written to {})", path.display());
    };
    let seeds = seeds(kind.as_str());
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let refusal = |name: &str, refused: ragstream_core::ingest::extract::ExtractError| {
        assert_eq!(refused.format, kind.as_str());
        assert!(!refused.message.trim().is_empty(), "{name}");
    };
    for (name, seed) in &seeds {
        // A real file is read; a crafted one may be refused.
        match read(name, seed).unwrap_or_else(|why| failed(seed, why)) {
            Err(refused) if name.starts_with("crafted-") => refusal(name, refused),
            Err(refused) => panic!("seed {name}: {refused}"),
            Ok(_) => {}
        }
        for _ in 0..mutations_per_seed() / 2 {
            let input = mutate(seed, &seeds, &mut rng);
            if let Err(refused) = read(name, &input).unwrap_or_else(|why| failed(&input, why)) {
                refusal(name, refused);
            }
        }
    }
}

#[test]
fn every_mutated_html_page_is_read_within_its_bounds_or_refused() {
    fuzz_format(DocKind::Html);
}

#[test]
fn every_mutated_pdf_is_read_within_its_bounds_or_refused() {
    fuzz_format(DocKind::Pdf);
}

#[test]
fn every_mutated_docx_is_read_within_its_bounds_or_refused() {
    fuzz_format(DocKind::Docx);
}
