//! HTTP clients of the optional query-flow endpoints: the text-embeddings-inference rerank API
//! (`POST /rerank`), the Cohere/Jina rerank API (`POST /v1/rerank`), and an OpenAI-compatible chat endpoint (`POST /v1/chat/completions`) that grades
//! passages or writes a HyDE passage. Each call is bounded by the endpoint's timeout as a whole; the
//! bearer token comes from the environment variable the config names and is never printed.

use std::time::Duration;

use serde_json::{json, Value};

use ragstream_core::query::endpoints::{
    grading_prompt, hyde_prompt, parse_grades, EndpointConfig, EndpointError, PassageWriter,
    RerankKind, Reranker,
};

/// A JSON POST client of one endpoint.
struct Client {
    base: String,
    model: String,
    api_key: Option<String>,
    agent: ureq::Agent,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.base)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl Client {
    fn new(config: &EndpointConfig) -> Self {
        let api_key = (!config.api_key_env.is_empty())
            .then(|| std::env::var(&config.api_key_env).ok())
            .flatten()
            .filter(|key| !key.is_empty());
        let agent = ureq::Agent::new_with_config(
            ureq::Agent::config_builder()
                .timeout_global(Some(config.timeout_ms.max(Duration::from_millis(1))))
                .http_status_as_error(false)
                .build(),
        );
        Self {
            base: config.url.trim_end_matches('/').to_string(),
            model: config.model.clone(),
            api_key,
            agent,
        }
    }

    fn post(&self, path: &str, body: &Value) -> Result<Value, EndpointError> {
        let unreachable = |error: ureq::Error| EndpointError::Unreachable {
            path: path.to_string(),
            message: error.to_string(),
        };
        let url = format!("{}{path}", self.base);
        let mut request = self
            .agent
            .post(&url)
            .header("Content-Type", "application/json");
        if let Some(key) = &self.api_key {
            request = request.header("Authorization", &format!("Bearer {key}"));
        }
        let mut response = request
            .send(body.to_string().as_bytes())
            .map_err(unreachable)?;
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().map_err(unreachable)?;
        if status >= 400 {
            return Err(EndpointError::Status {
                path: path.to_string(),
                status,
                body: text.chars().take(200).collect(),
            });
        }
        serde_json::from_str(&text)
            .map_err(|e| EndpointError::Reply(format!("{path}: invalid JSON: {e}")))
    }

    /// One chat completion's text.
    fn chat(&self, system: &str, user: &str, max_tokens: usize) -> Result<String, EndpointError> {
        self.chat_n(system, user, max_tokens, 1, 0.0)?
            .into_iter()
            .next()
            .ok_or_else(|| {
                EndpointError::Reply("chat reply without choices[0].message.content".into())
            })
    }

    /// Up to `n` chat completions of one request (`n` choices at `temperature`; a server that
    /// ignores `n` returns one). At least one, or an error.
    fn chat_n(
        &self,
        system: &str,
        user: &str,
        max_tokens: usize,
        n: usize,
        temperature: f32,
    ) -> Result<Vec<String>, EndpointError> {
        let mut body = json!({
            "model": self.model,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
            "max_tokens": max_tokens,
            "temperature": temperature,
        });
        if n > 1 {
            body["n"] = json!(n);
        }
        let reply = self.post("/v1/chat/completions", &body)?;
        let texts: Vec<String> = reply["choices"]
            .as_array()
            .map(|choices| {
                choices
                    .iter()
                    .take(n)
                    .filter_map(|c| c["message"]["content"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        if texts.is_empty() {
            return Err(EndpointError::Reply(
                "chat reply without choices[0].message.content".into(),
            ));
        }
        Ok(texts)
    }
}

/// A cross-encoder behind the text-embeddings-inference rerank API.
#[derive(Debug)]
pub struct TeiReranker(Client);

impl TeiReranker {
    /// A client of `config.url` (`/rerank` is appended).
    pub fn new(config: &EndpointConfig) -> Self {
        Self(Client::new(config))
    }
}

impl Reranker for TeiReranker {
    fn kind(&self) -> RerankKind {
        RerankKind::Http
    }

    fn score(&self, query: &str, texts: &[String]) -> Result<Vec<f32>, EndpointError> {
        let reply = self.0.post(
            "/rerank",
            &json!({"query": query, "texts": texts, "raw_scores": false, "truncate": true}),
        )?;
        parse_rerank(&reply, texts.len())
    }
}

/// A cross-encoder behind the Cohere/Jina rerank API (Jina, Cohere, vLLM, Infinity and others).
#[derive(Debug)]
pub struct CohereReranker(Client);

impl CohereReranker {
    /// A client of `config.url` (`/v1/rerank` is appended; `model` is sent when set).
    pub fn new(config: &EndpointConfig) -> Self {
        Self(Client::new(config))
    }
}

impl Reranker for CohereReranker {
    fn kind(&self) -> RerankKind {
        RerankKind::Cohere
    }

    fn score(&self, query: &str, texts: &[String]) -> Result<Vec<f32>, EndpointError> {
        let mut body = json!({"query": query, "documents": texts, "top_n": texts.len(),
                              "return_documents": false});
        if !self.0.model.is_empty() {
            body["model"] = json!(self.0.model);
        }
        let reply = self.0.post("/v1/rerank", &body)?;
        parse_scores(&reply["results"], "relevance_score", texts.len())
    }
}

/// The scores of a TEI rerank reply `[{"index": i, "score": s}, …]` (any order), by text index.
fn parse_rerank(reply: &Value, n: usize) -> Result<Vec<f32>, EndpointError> {
    parse_scores(reply, "score", n)
}

/// The scores of `[{"index": i, <field>: s}, …]` (any order), by text index; every text needs one.
fn parse_scores(reply: &Value, field: &str, n: usize) -> Result<Vec<f32>, EndpointError> {
    let bad = EndpointError::Reply;
    let items = reply.as_array().ok_or_else(|| {
        bad(format!(
            "rerank reply is not an array of {{index, {field}}}"
        ))
    })?;
    let mut scores = vec![None; n];
    for item in items {
        let index = item["index"]
            .as_u64()
            .ok_or_else(|| bad("rerank item without index".into()))? as usize;
        let score = item[field]
            .as_f64()
            .ok_or_else(|| bad(format!("rerank item without {field}")))? as f32;
        if !score.is_finite() {
            return Err(bad(format!(
                "rerank score {score} for text {}",
                item["index"]
            )));
        }
        *scores
            .get_mut(index)
            .ok_or_else(|| bad(format!("rerank index {index} for {n} texts")))? = Some(score);
    }
    scores
        .into_iter()
        .enumerate()
        .map(|(i, s)| s.ok_or_else(|| bad(format!("no rerank score for text {i}"))))
        .collect()
}

/// A chat model grading each passage 0–10.
#[derive(Debug)]
pub struct LlmReranker(Client);

impl LlmReranker {
    /// A client of the chat endpoint at `config.url`.
    pub fn new(config: &EndpointConfig) -> Self {
        Self(Client::new(config))
    }
}

impl Reranker for LlmReranker {
    fn kind(&self) -> RerankKind {
        RerankKind::Llm
    }

    fn score(&self, query: &str, texts: &[String]) -> Result<Vec<f32>, EndpointError> {
        let (system, user) = grading_prompt(query, texts);
        let reply = self.0.chat(&system, &user, 8 * texts.len() + 16)?;
        parse_grades(&reply, texts.len())
    }
}

/// A chat model writing HyDE passages.
#[derive(Debug)]
pub struct ChatPassageWriter {
    client: Client,
    max_tokens: usize,
}

impl ChatPassageWriter {
    /// A client of the chat endpoint at `config.url`, asking for at most `max_tokens`.
    pub fn new(config: &EndpointConfig, max_tokens: usize) -> Self {
        Self {
            client: Client::new(config),
            max_tokens,
        }
    }
}

impl PassageWriter for ChatPassageWriter {
    /// One passage at temperature 0; more are sampled at 0.7 (one request for all of them, then one
    /// request per passage the server did not return), at most `n` requests in all.
    fn write(&self, query: &str, n: usize) -> Result<Vec<String>, EndpointError> {
        let (system, user) = hyde_prompt(query);
        let n = n.clamp(1, ragstream_core::query::endpoints::MAX_HYPOTHESES);
        let temperature = if n == 1 { 0.0 } else { 0.7 };
        let mut passages = Vec::with_capacity(n);
        for _ in 0..n {
            let wanted = n - passages.len();
            let texts = self
                .client
                .chat_n(&system, &user, self.max_tokens, wanted, temperature)?;
            passages.extend(
                texts
                    .iter()
                    .map(|t| t.trim())
                    .filter(|t| !t.is_empty())
                    .map(str::to_string),
            );
            if passages.len() >= n {
                break;
            }
        }
        passages.truncate(n);
        if passages.is_empty() {
            return Err(EndpointError::Reply(
                "the model wrote an empty passage".into(),
            ));
        }
        Ok(passages)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rerank_replies_are_read_by_index_and_checked() {
        let reply = json!([{"index": 1, "score": 0.9}, {"index": 0, "score": 0.1}]);
        assert_eq!(parse_rerank(&reply, 2).unwrap(), vec![0.1, 0.9]);
        assert!(parse_rerank(&json!([{"index": 0, "score": 1.0}]), 2)
            .unwrap_err()
            .to_string()
            .contains("no rerank score for text 1"));
        assert!(parse_rerank(&json!([{"index": 5, "score": 1.0}]), 2)
            .unwrap_err()
            .to_string()
            .contains("index 5"));
        assert!(parse_rerank(&json!({"error": "x"}), 1).is_err());
        assert!(parse_rerank(&json!([{"index": 0, "score": 1e300}]), 1)
            .unwrap_err()
            .to_string()
            .contains("rerank score inf"));
    }

    #[test]
    fn cohere_replies_are_read_from_results_by_index() {
        let reply = json!({"results": [{"index": 1, "relevance_score": 0.8},
                                       {"index": 0, "relevance_score": 0.2}]});
        assert_eq!(
            parse_scores(&reply["results"], "relevance_score", 2).unwrap(),
            vec![0.2, 0.8]
        );
        // A TEI-shaped reply is not read as one.
        assert!(
            parse_scores(&json!([{"index": 0, "score": 0.5}]), "relevance_score", 1)
                .unwrap_err()
                .to_string()
                .contains("without relevance_score")
        );
        assert!(parse_scores(&json!({"results": []})["missing"], "relevance_score", 1).is_err());
    }

    #[test]
    fn the_api_key_is_never_printed() {
        std::env::set_var("RAGSTREAM_TEST_ENDPOINT_KEY", "s3cret-value");
        let client = Client::new(&EndpointConfig {
            url: "http://127.0.0.1:1".into(),
            api_key_env: "RAGSTREAM_TEST_ENDPOINT_KEY".into(),
            ..EndpointConfig::default()
        });
        assert_eq!(client.api_key.as_deref(), Some("s3cret-value"));
        assert!(!format!("{client:?}").contains("s3cret"));
        // Nothing listens there: a clear error, not a panic.
        assert!(TeiReranker(client)
            .score("q", &["a".into()])
            .unwrap_err()
            .to_string()
            .contains("/rerank"));
    }
}
