//! A stand-in model server for the endpoint tests (no cross-encoder or chat model runs here;
//! docs/query.md, "Rerank and HyDE endpoints", names this stand-in). It speaks the APIs the job calls
//! and computes its answers by documented rules:
//! - `POST /rerank` (text-embeddings-inference): each text's score is the share of the query's words
//!   (lowercase, 3+ letters) that the text holds, divided by 1 + the text's word count / 100 (shorter
//!   exact passages first); the reply lists `{index, score}` best first, as TEI does;
//! - `POST /v1/rerank` (the Cohere/Jina shape): the same scores as `results[{index, relevance_score}]`,
//!   best first, cut to `top_n`;
//! - `POST /v1/chat/completions`: a grading prompt (system message mentioning "grade") is answered
//!   with a JSON array holding, per `Passage i:` block, 10 × the same share, rounded; any other prompt
//!   (HyDE) with the passage the test registered for that query text, else "A passage about …".
//!
//! A query or prompt containing `slowly` is answered after 2 s (past the tests' timeouts); one
//! containing `refuse` gets a chat reply without grades. Requests are counted per path.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

/// The running stand-in.
pub struct StandIn {
    /// Its base URL.
    pub url: String,
    counts: Arc<Mutex<HashMap<String, usize>>>,
    passages: Arc<Mutex<HashMap<String, String>>>,
    stop: Arc<AtomicUsize>,
}

fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.chars().count() >= 3)
        .map(str::to_lowercase)
        .collect()
}

/// The stand-in's relevance rule (see the module comment).
pub fn share(query: &str, text: &str) -> f32 {
    let query: Vec<String> = words(query);
    if query.is_empty() {
        return 0.0;
    }
    let held: std::collections::HashSet<String> = words(text).into_iter().collect();
    let found = query.iter().filter(|w| held.contains(*w)).count() as f32;
    found / query.len() as f32 / (1.0 + held.len() as f32 / 100.0)
}

/// The texts of `body[texts]` scored against `body.query` by [`share`], best first, each as
/// `{index, <field>: score}`.
fn ranked(body: &Value, texts: &str, field: &str) -> Vec<Value> {
    let query = body["query"].as_str().unwrap_or_default();
    let mut scored: Vec<(usize, f32)> = body[texts]
        .as_array()
        .map(|texts| {
            texts
                .iter()
                .enumerate()
                .map(|(i, t)| (i, share(query, t.as_str().unwrap_or_default())))
                .collect()
        })
        .unwrap_or_default();
    scored.sort_by(|a, b| b.1.total_cmp(&a.1));
    scored
        .into_iter()
        .map(|(index, score)| json!({"index": index, field: score}))
        .collect()
}

fn chat(body: &Value, passages: &HashMap<String, String>) -> String {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let system = messages
        .iter()
        .find(|m| m["role"] == "system")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default();
    let user = messages
        .iter()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default();
    if !system.contains("grade") {
        return passages
            .get(user)
            .cloned()
            .unwrap_or_else(|| format!("A passage about {user}."));
    }
    if user.contains("refuse") {
        return "I would rather not grade these.".into();
    }
    let query = user
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("Query: "))
        .unwrap_or_default();
    let mut grades = Vec::new();
    let mut blocks = user.split("\nPassage ").skip(1);
    for block in &mut blocks {
        let text = block.split_once(":\n").map(|(_, t)| t).unwrap_or(block);
        grades.push((10.0 * share(query, text)).round());
    }
    json!(grades).to_string()
}

impl StandIn {
    /// Starts the server on a free loopback port.
    pub fn start() -> Self {
        let server = tiny_http::Server::http("127.0.0.1:0").expect("stand-in binds");
        let port = server.server_addr().to_ip().expect("ip").port();
        let counts: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let passages: Arc<Mutex<HashMap<String, String>>> = Arc::default();
        let stop = Arc::new(AtomicUsize::new(0));
        let server = Arc::new(server);
        for _ in 0..4 {
            let (server, counts, passages, stop) = (
                server.clone(),
                counts.clone(),
                passages.clone(),
                stop.clone(),
            );
            std::thread::spawn(move || {
                while stop.load(Ordering::SeqCst) == 0 {
                    let Ok(Some(mut request)) = server.recv_timeout(Duration::from_millis(100))
                    else {
                        continue;
                    };
                    let path = request.url().to_string();
                    *counts.lock().unwrap().entry(path.clone()).or_default() += 1;
                    let mut body = String::new();
                    let _ = request.as_reader().read_to_string(&mut body);
                    if body.contains("slowly") {
                        std::thread::sleep(Duration::from_secs(2));
                    }
                    let body: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
                    let reply = match path.as_str() {
                        "/rerank" => Value::Array(ranked(&body, "texts", "score")),
                        "/v1/rerank" => {
                            // The Cohere/Jina shape: `documents` in, the best `top_n` out.
                            let mut results = ranked(&body, "documents", "relevance_score");
                            let top_n =
                                body["top_n"].as_u64().map_or(results.len(), |n| n as usize);
                            results.truncate(top_n);
                            json!({"id": "stand-in", "results": results})
                        }
                        "/v1/chat/completions" => {
                            let content = chat(&body, &passages.lock().unwrap());
                            json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]})
                        }
                        _ => {
                            let _ = request.respond(
                                tiny_http::Response::from_string("not found").with_status_code(404),
                            );
                            continue;
                        }
                    };
                    let _ = request.respond(tiny_http::Response::from_string(reply.to_string()));
                }
            });
        }
        Self {
            url: format!("http://127.0.0.1:{port}"),
            counts,
            passages,
            stop,
        }
    }

    /// Registers the passage the chat endpoint writes for a HyDE prompt of `query`.
    pub fn passage(&self, query: &str, passage: &str) {
        self.passages
            .lock()
            .unwrap()
            .insert(query.to_string(), passage.to_string());
    }

    /// Requests received at `path` so far.
    pub fn count(&self, path: &str) -> usize {
        self.counts.lock().unwrap().get(path).copied().unwrap_or(0)
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.stop.store(1, Ordering::SeqCst);
    }
}
