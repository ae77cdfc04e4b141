//! An OpenAI-compatible `/v1/embeddings` client (GPU or production embedding servers).
//!
//! The API key is read from the environment variable named in the config, never from a config file,
//! and never printed. Outages (connection errors, 5xx, 429, 408, and 401/403/404: a rotated key or an
//! endpoint being redeployed) are [`EmbedError::Unavailable`] so the dataflow retries with backoff; a wrong vector dimension is [`EmbedError::Dimension`] and dead-letters
//! the batch's records.

use std::time::Duration;

use serde_json::{json, Value};

use super::{l2_normalize, EmbedError, Embedder};

/// Connection settings of an HTTP embedder.
#[derive(Clone)]
pub struct HttpEmbedderConfig {
    /// Base URL, e.g. `http://127.0.0.1:8080` (the path `/v1/embeddings` is appended).
    pub url: String,
    /// Model name sent in each request.
    pub model: String,
    /// Expected vector dimension.
    pub dimension: usize,
    /// Bearer token, if the server wants one (from the environment).
    pub api_key: Option<String>,
    /// Per-request timeout.
    pub timeout: Duration,
    /// Texts per request.
    pub batch_size: usize,
}

impl std::fmt::Debug for HttpEmbedderConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpEmbedderConfig")
            .field("url", &self.url)
            .field("model", &self.model)
            .field("dimension", &self.dimension)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("timeout", &self.timeout)
            .field("batch_size", &self.batch_size)
            .finish()
    }
}

/// The HTTP embedder.
#[derive(Debug)]
pub struct HttpEmbedder {
    config: HttpEmbedderConfig,
    agent: ureq::Agent,
    version: String,
    last_tokens: usize,
}

impl HttpEmbedder {
    /// Builds a client; no request is made until the first `embed`.
    pub fn new(config: HttpEmbedderConfig) -> Self {
        let agent = ureq::Agent::new_with_config(
            ureq::Agent::config_builder()
                .timeout_global(Some(config.timeout))
                .http_status_as_error(false)
                .build(),
        );
        let version = format!("http:{}", config.model);
        Self {
            config,
            agent,
            version,
            last_tokens: 0,
        }
    }

    fn request(&self, texts: &[&str]) -> Result<(Vec<Vec<f32>>, usize), EmbedError> {
        let url = format!("{}/v1/embeddings", self.config.url.trim_end_matches('/'));
        let body = json!({ "model": self.config.model, "input": texts }).to_string();
        let mut request = self
            .agent
            .post(&url)
            .header("Content-Type", "application/json");
        if let Some(key) = &self.config.api_key {
            request = request.header("Authorization", &format!("Bearer {key}"));
        }
        let mut response = request
            .send(body.as_bytes())
            .map_err(|e| EmbedError::Unavailable(e.to_string()))?;
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .read_to_string()
            .map_err(|e| EmbedError::Unavailable(e.to_string()))?;
        // Outages: the server cannot serve now (5xx, 429, 408), or the job's key or the endpoint is not
        // right now (401, 403, 404: a rotated key, a model being redeployed). Nothing about the texts:
        // retried, never dead-lettered. What is left (400, 413, 422, …) refuses these texts.
        if matches!(status, 401 | 403 | 404 | 408 | 429) || status >= 500 {
            return Err(EmbedError::Unavailable(format!("status {status}")));
        }
        if status >= 400 {
            return Err(EmbedError::Refused(format!(
                "status {status}: {}",
                text.chars().take(200).collect::<String>()
            )));
        }
        parse_response(&text, texts.len(), self.config.dimension)
    }
}

/// Parses an OpenAI-style embeddings response: `{"data": [{"index", "embedding"}], "usage"?}`.
fn parse_response(
    text: &str,
    expected: usize,
    dimension: usize,
) -> Result<(Vec<Vec<f32>>, usize), EmbedError> {
    let value: Value = serde_json::from_str(text)
        .map_err(|e| EmbedError::Refused(format!("invalid JSON: {e}")))?;
    let data = value
        .get("data")
        .and_then(Value::as_array)
        .ok_or_else(|| EmbedError::Refused("no `data` array".into()))?;
    if data.len() != expected {
        return Err(EmbedError::Refused(format!(
            "{} vectors for {expected} inputs",
            data.len()
        )));
    }
    let mut out = vec![Vec::new(); expected];
    for (position, item) in data.iter().enumerate() {
        let index = item
            .get("index")
            .and_then(Value::as_u64)
            .map(|i| i as usize)
            .unwrap_or(position);
        let vector: Vec<f32> = item
            .get("embedding")
            .and_then(Value::as_array)
            .ok_or_else(|| EmbedError::Refused("item without `embedding`".into()))?
            .iter()
            .map(|v| v.as_f64().map(|f| f as f32))
            .collect::<Option<_>>()
            .ok_or_else(|| EmbedError::Refused("non-numeric embedding".into()))?;
        if vector.len() != dimension {
            return Err(EmbedError::Dimension {
                expected: dimension,
                got: vector.len(),
            });
        }
        let slot = out
            .get_mut(index)
            .ok_or_else(|| EmbedError::Refused(format!("index {index} out of range")))?;
        *slot = vector;
    }
    out.iter_mut().for_each(|v| l2_normalize(v));
    let tokens = value
        .pointer("/usage/prompt_tokens")
        .and_then(Value::as_u64)
        .unwrap_or(0) as usize;
    Ok((out, tokens))
}

impl Embedder for HttpEmbedder {
    fn version(&self) -> &str {
        &self.version
    }

    fn dimension(&self) -> usize {
        self.config.dimension
    }

    fn embed(&mut self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut out = Vec::with_capacity(texts.len());
        let mut tokens = 0;
        for batch in texts.chunks(self.config.batch_size.max(1)) {
            let (vectors, batch_tokens) = self.request(batch)?;
            out.extend(vectors);
            tokens += batch_tokens;
        }
        self.last_tokens = tokens;
        Ok(out)
    }

    fn last_token_count(&self) -> usize {
        self.last_tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_out_of_order_items_and_normalises() {
        let text = r#"{"data":[{"index":1,"embedding":[0,2]},{"index":0,"embedding":[3,4]}],"usage":{"prompt_tokens":7}}"#;
        let (vectors, tokens) = parse_response(text, 2, 2).expect("valid");
        assert_eq!(tokens, 7);
        assert_eq!(vectors[0], vec![0.6, 0.8]);
        assert_eq!(vectors[1], vec![0.0, 1.0]);
    }

    #[test]
    fn wrong_dimension_is_not_retryable() {
        let err =
            parse_response(r#"{"data":[{"index":0,"embedding":[1,2,3]}]}"#, 1, 2).unwrap_err();
        assert!(matches!(
            err,
            EmbedError::Dimension {
                expected: 2,
                got: 3
            }
        ));
        assert!(!err.is_retryable());
        assert!(parse_response(r#"{"data":[]}"#, 1, 2).is_err());
    }

    #[test]
    fn debug_redacts_the_key() {
        let config = HttpEmbedderConfig {
            url: "http://127.0.0.1:1".into(),
            model: "m".into(),
            dimension: 2,
            api_key: Some("s3cret-value".into()),
            timeout: Duration::from_secs(1),
            batch_size: 8,
        };
        assert!(!format!("{config:?}").contains("s3cret-value"));
    }

    #[test]
    fn unreachable_server_is_retryable() {
        let mut embedder = HttpEmbedder::new(HttpEmbedderConfig {
            url: "http://127.0.0.1:9".into(),
            model: "m".into(),
            dimension: 2,
            api_key: None,
            timeout: Duration::from_millis(500),
            batch_size: 8,
        });
        let err = embedder.embed(&["x"]).unwrap_err();
        assert!(err.is_retryable(), "{err}");
    }
}
