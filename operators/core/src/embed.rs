//! Embedders: text → dense vectors.
//!
//! [`Embedder`] is the one interface of a model. Two implementations, in `ragstream-operators`
//! (`embed::minilm`, `embed::http`):
//! - `MiniLm`: all-MiniLM-L6-v2 in-process with ONNX Runtime, int8 or fp32 (the embedded
//!   default). Mean pooling over the attention mask and L2 normalisation, as sentence-transformers does;
//!   inputs longer than 256 word pieces are truncated *for the vector only* (the chunk text is stored
//!   whole).
//! - `HttpEmbedder`: any OpenAI-compatible `/v1/embeddings` server (GPU or production setups).
//!
//! The dataflow never calls an embedder itself: it submits texts to the process's
//! inference service (`embed::service`), which runs the embedders on threads of their own (queries first,
//! ingest in short slices, outages retried there).
//!
//! Every embedder names a `version` (model + pooling + truncation); the index refuses vectors of another
//! version or dimension in an existing collection unless told to re-embed.

/// Why an embedding call failed.
#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    /// The model files are missing or unreadable.
    #[error("model not loadable from {path}: {message}")]
    Load {
        /// The model directory.
        path: String,
        /// What failed.
        message: String,
    },
    /// The model failed on an input (tokenizer or tensor error).
    #[error("embedding failed: {0}")]
    Model(String),
    /// The embedding server is unreachable or answered 5xx/429: retry with backoff.
    #[error("embedding server unavailable: {0}")]
    Unavailable(String),
    /// The embedding server refused the request (4xx other than 429) or answered nonsense.
    #[error("embedding server refused the request: {0}")]
    Refused(String),
    /// The server returned vectors of the wrong dimension: the batch's records go to the DLQ.
    #[error("embedding dimension {got} differs from the configured {expected}")]
    Dimension {
        /// Configured dimension.
        expected: usize,
        /// Dimension received.
        got: usize,
    },
}

impl EmbedError {
    /// Whether the call should be retried (an outage) rather than the input dead-lettered.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable(_))
    }
}

/// Turns texts into vectors of a fixed dimension.
pub trait Embedder: Send {
    /// Model, pooling and truncation, e.g. `all-MiniLM-L6-v2/mean/256`.
    fn version(&self) -> &str;
    /// Length of every vector.
    fn dimension(&self) -> usize;
    /// Embeds `texts`, one vector per text, in order. Vectors are L2-normalised.
    fn embed(&mut self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError>;
    /// Word pieces the model saw in the last successful `embed` call (for throughput metrics).
    fn last_token_count(&self) -> usize;
}

/// Scales `vector` to unit L2 norm (a zero vector stays zero).
pub fn l2_normalize(vector: &mut [f32]) {
    let norm = dot(vector, vector).sqrt();
    if norm > 0.0 {
        vector.iter_mut().for_each(|v| *v /= norm);
    }
}

/// Dot product in sixteen independent lanes: the compiler vectorises it, and four independent
/// accumulators of four lanes hide the latency of each addition (with eight lanes the loop waited on
/// two dependent chains).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let length = a.len().min(b.len());
    let (a, b) = (&a[..length], &b[..length]);
    let mut lanes = [0f32; DOT_LANES];
    let (blocks_a, rest_a) = a.as_chunks::<DOT_LANES>();
    let (blocks_b, rest_b) = b.as_chunks::<DOT_LANES>();
    for (x, y) in blocks_a.iter().zip(blocks_b) {
        for lane in 0..DOT_LANES {
            lanes[lane] += x[lane] * y[lane];
        }
    }
    let tail: f32 = rest_a.iter().zip(rest_b).map(|(x, y)| x * y).sum();
    lanes.iter().sum::<f32>() + tail
}

/// Independent accumulators of [`dot`].
const DOT_LANES: usize = 16;

/// A unit-length copy of `vector` (cosine of unit vectors is their dot product).
pub fn unit(vector: &[f32]) -> Vec<f32> {
    let mut copy = vector.to_vec();
    l2_normalize(&mut copy);
    copy
}

/// Cosine similarity of two vectors.
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    cosine_with_norms(a, b, dot(a, a), dot(b, b))
}

/// [`cosine`] given each vector's dot product with itself (`na`, `nb`), for vectors compared many
/// times.
pub fn cosine_with_norms(a: &[f32], b: &[f32], na: f32, nb: f32) -> f32 {
    if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        dot(a, b) / (na.sqrt() * nb.sqrt())
    }
}
