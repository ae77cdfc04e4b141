//! The token counter's hand-written o200k pre-tokenizer agrees with tiktoken on every document of the
//! evaluation corpora (SQuAD paragraphs and SciFact abstracts, with their titles), and on the contexts
//! the packer assembles from them (headers, separators, delimiters).

use std::io::BufRead;

use ragstream_operators::tokens::{Encoding, TokenCounter};

fn documents(corpus: &str) -> Vec<String> {
    let path = crate::common::data_dir().join(corpus);
    let file = std::fs::File::open(&path).expect("corpus opens");
    std::io::BufReader::new(file)
        .lines()
        .map(|line| {
            let doc: serde_json::Value =
                serde_json::from_str(&line.expect("line")).expect("corpus line is JSON");
            format!(
                "{}\n{}",
                doc["title"].as_str().unwrap_or_default(),
                doc["text"].as_str().unwrap_or_default()
            )
        })
        .collect()
}

#[test]
fn counts_equal_tiktoken_on_the_evaluation_corpora() {
    let counter = TokenCounter::new(Encoding::O200kBase);
    for corpus in ["squad-v1.1/corpus.jsonl", "scifact/corpus.jsonl"] {
        let docs = documents(corpus);
        assert!(docs.len() > 1000, "{corpus}: {} documents", docs.len());
        let mut tokens = 0;
        for doc in &docs {
            let expected = counter.count_whole(doc);
            assert_eq!(counter.count(doc), expected, "{corpus}: {doc:?}");
            tokens += expected;
        }
        // Contexts as the packer builds them: items with headers, joined and wrapped.
        for group in docs.chunks(7) {
            let items: Vec<String> = group
                .iter()
                .enumerate()
                .map(|(i, doc)| {
                    format!(
                        "Source: corpus/doc{i}.md (lines {}–{})\n{doc}",
                        i + 1,
                        i * 9
                    )
                })
                .collect();
            let context = format!(
                "<retrieved-context trust=\"untrusted\">\n{}\n</retrieved-context>",
                items.join("\n\n")
            );
            assert_eq!(counter.count(&context), counter.count_whole(&context));
        }
        println!(
            "{corpus}: {} documents, {tokens} tokens, counts equal",
            docs.len()
        );
    }
}
