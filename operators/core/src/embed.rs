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
    /// Embeds `texts` and, after each text's vector, one vector for each of its `spans` (byte ranges
    /// of that text, on character boundaries; a text without an entry has none): the vectors of the
    /// chunks and of their evidence units in one call. This default embeds each span's text as a text
    /// of its own in the same call; an embedder that sees its model's word pieces may pool a span
    /// from its text's own pass instead ([`Self::pools_spans`]). A range outside its text is an error.
    fn embed_spans(
        &mut self,
        texts: &[&str],
        spans: &[Spans],
    ) -> Result<Vec<Vec<f32>>, EmbedError> {
        let inputs = span_inputs(texts, spans)?;
        self.embed(&inputs)
    }
    /// Whether [`Self::embed_spans`] pools the spans from their texts' passes (they then cost the
    /// model next to nothing).
    fn pools_spans(&self) -> bool {
        false
    }
}

/// Byte ranges of a text whose vectors are wanted beside the text's own ([`Embedder::embed_spans`]).
pub type Spans = Vec<std::ops::Range<usize>>;

/// Each text followed by the texts of its spans: what [`Embedder::embed_spans`] embeds where it does
/// not pool.
pub fn span_inputs<'a>(texts: &[&'a str], spans: &[Spans]) -> Result<Vec<&'a str>, EmbedError> {
    let mut inputs = Vec::with_capacity(texts.len() + spans.iter().map(Vec::len).sum::<usize>());
    for (index, &text) in texts.iter().enumerate() {
        inputs.push(text);
        for range in spans.get(index).map_or(&[][..], Vec::as_slice) {
            inputs.push(text.get(range.clone()).ok_or_else(|| {
                EmbedError::Model(format!(
                    "span {}..{} is not a part of its text of {} bytes",
                    range.start,
                    range.end,
                    text.len()
                ))
            })?);
        }
    }
    Ok(inputs)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn span_inputs_follow_each_text_with_its_spans_and_refuse_ranges_outside_it() {
        let texts = ["Ferries leave. At noon.", "No spans.", "Été. Hiver."];
        let spans = vec![vec![0..14, 15..23], Vec::new(), vec![0..6, 7..13]];
        assert_eq!(
            span_inputs(&texts, &spans).unwrap(),
            vec![
                "Ferries leave. At noon.",
                "Ferries leave.",
                "At noon.",
                "No spans.",
                "Été. Hiver.",
                "Été.",
                "Hiver."
            ]
        );
        // Fewer span lists than texts: the rest have none.
        assert_eq!(span_inputs(&texts, &[]).unwrap(), texts.to_vec());
        // Past the end, or inside a character.
        let past_the_end: Spans = std::iter::once(0..99).collect();
        let inside_a_character: Spans = std::iter::once(0..1).collect();
        assert!(span_inputs(&texts[..1], &[past_the_end]).is_err());
        assert!(span_inputs(&texts[2..], &[inside_a_character]).is_err());
    }
}
