//! The ragstream job as a separate process, as users run it.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::broker::free_port;

/// A running `ragstream run` process.
pub struct Job {
    child: Option<Child>,
    /// Port of its HTTP endpoints.
    pub http_port: u16,
    /// Its working directory (index, DLQ file, log).
    pub dir: PathBuf,
    config: PathBuf,
    env: Vec<(String, String)>,
}

/// GET `path` on loopback `port` over HTTP/1.0 (so the body is never chunked); returns (status, body).
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    http_request(
        port,
        &format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n"),
    )
}

/// [`http_get`] with extra request headers.
pub fn http_get_with(port: u16, path: &str, headers: &[(&str, &str)]) -> Option<(u16, String)> {
    let extra = header_lines(headers);
    http_request(
        port,
        &format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n{extra}\r\n"),
    )
}

/// POST a JSON `body` to `path` on loopback `port`; returns (status, body).
pub fn http_post_json(port: u16, path: &str, body: &str) -> Option<(u16, String)> {
    http_post_json_with(port, path, body, &[])
}

/// [`http_post_json`] with extra request headers.
pub fn http_post_json_with(
    port: u16,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> Option<(u16, String)> {
    let extra = header_lines(headers);
    http_request(
        port,
        &format!(
            "POST {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{extra}Content-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    )
}

/// `POST /v1/documents` with `body` and the bearer `token`; (status, body as JSON, `null` when it is
/// not JSON).
pub fn post_documents(
    port: u16,
    token: &str,
    body: &serde_json::Value,
) -> (u16, serde_json::Value) {
    let auth = format!("Bearer {token}");
    let (status, answer) = http_post_json_with(
        port,
        "/v1/documents",
        &body.to_string(),
        &[("Authorization", &auth)],
    )
    .expect("answered");
    (
        status,
        serde_json::from_str(&answer).unwrap_or(serde_json::Value::Null),
    )
}

/// A `/v1/query` answer as a context: 200 is the context itself; any other status must be a problem
/// (RFC 9457), returned as a context carrying its detail as `error`, its type's name as `error_type`
/// and its query id.
pub fn answer_context(status: u16, body: &str) -> ragstream_core::query::Context {
    let parsed: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("JSON answer ({e}): {body}"));
    if status == 200 {
        return serde_json::from_value(parsed)
            .unwrap_or_else(|e| panic!("a context ({e}): {body}"));
    }
    let kind = parsed["type"].as_str().unwrap_or_default();
    let name = kind
        .strip_prefix("urn:ragstream:problem:")
        .unwrap_or_else(|| panic!("a problem type: {body}"));
    assert_eq!(parsed["status"].as_u64(), Some(u64::from(status)), "{body}");
    assert!(
        parsed["title"].is_string() && parsed["detail"].is_string(),
        "{body}"
    );
    ragstream_core::query::Context {
        query_id: parsed["query_id"].as_str().unwrap_or_default().to_string(),
        error: parsed["detail"].as_str().map(str::to_string),
        error_type: Some(name.to_string()),
        ..Default::default()
    }
}

/// `name: value` lines of a request head.
fn header_lines(headers: &[(&str, &str)]) -> String {
    headers
        .iter()
        .map(|(name, value)| format!("{name}: {value}\r\n"))
        .collect()
}

fn http_request(port: u16, request: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .ok()?;
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((status, body))
}

/// Sum of all series of metric `name` in a Prometheus text exposition.
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter(|line| line.split(['{', ' ']).next() == Some(name))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The value of one labelled series, e.g. `metric_labeled(text, "ragstream_dlq_records_total", "reason=\"oversize\"")`.
pub fn metric_labeled(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|line| line.starts_with(&format!("{name}{{")) && line.contains(label))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

impl Job {
    /// Writes `config` (TOML, with `{dir}` and `{http}` placeholders) into `dir` and starts the job there.
    pub fn start(dir: &Path, config: &str, workers: usize) -> Self {
        Self::start_with_env(dir, config, workers, &[])
    }

    /// [`Self::start`] with extra environment variables for the job.
    pub fn start_with_env(dir: &Path, config: &str, workers: usize, env: &[(&str, &str)]) -> Self {
        let http_port = free_port();
        let config_text = config
            .replace("{dir}", &dir.display().to_string())
            .replace("{http}", &format!("127.0.0.1:{http_port}"));
        let config_path = dir.join("ragstream.toml");
        std::fs::write(&config_path, config_text).expect("config");
        let mut job = Self {
            child: None,
            http_port,
            dir: dir.to_path_buf(),
            config: config_path,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        job.spawn(workers);
        job
    }

    fn spawn(&mut self, workers: usize) {
        wait_out_killed_session(&self.dir);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("job.log"))
            .expect("log");
        let child = Command::new(env!("CARGO_BIN_EXE_ragstream"))
            .args(["run", "--config"])
            .arg(&self.config)
            .args(["--workers", &workers.to_string()])
            .env("RAGSTREAM_MODEL_DIR", super::model_dir())
            // `RAGSTREAM_TEST_LOG` widens the job's log when debugging a test (e.g. `info,librdkafka=debug`
            // with `RAGSTREAM_KAFKA_DEBUG=cgrp`).
            .env(
                "RUST_LOG",
                std::env::var("RAGSTREAM_TEST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&self.dir)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("job starts");
        self.child = Some(child);
    }

    /// Restarts the job (after a kill) with the same config.
    pub fn restart(&mut self, workers: usize) {
        self.kill();
        self.spawn(workers);
    }

    /// The job's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("job.log")).unwrap_or_default()
    }

    /// Waits until `/readyz` answers 200.
    pub fn wait_ready(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some((200, _)) = http_get(self.http_port, "/readyz") {
                return;
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("job exited early with {status}; log:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("job not ready after {timeout:?}; log:\n{}", self.log());
    }

    /// The current metrics text.
    pub fn metrics(&self) -> String {
        http_get(self.http_port, "/metrics")
            .map(|(_, body)| body)
            .unwrap_or_default()
    }

    /// Waits (up to 5 minutes) until the job's source has read `events` document events and none is
    /// in flight: readiness only means the index and embedder are open, not that documents are in.
    pub fn wait_indexed(&mut self, events: usize) -> String {
        self.wait_for(Duration::from_secs(300), "documents indexed", |m| {
            metric(m, "ragstream_source_events_total") >= events as f64
                && metric(m, "ragstream_in_flight_messages") == 0.0
        })
    }

    /// Waits until `predicate(metrics)` holds.
    pub fn wait_for(
        &mut self,
        timeout: Duration,
        what: &str,
        predicate: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let text = self.metrics();
            if predicate(&text) {
                return text;
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "job exited with {status} while waiting for {what}; log:\n{}",
                    self.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; log tail:\n{}",
                tail(&self.log())
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The running job's process id.
    pub fn pid(&self) -> Option<u32> {
        Some(self.child.as_ref()?.id())
    }

    /// Peak resident memory of the running job (`VmHWM`), in bytes.
    pub fn peak_rss_bytes(&self) -> Option<u64> {
        let pid = self.child.as_ref()?.id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    }

    /// Current resident memory of the running job (`VmRSS`), in bytes.
    pub fn rss_bytes(&self) -> Option<u64> {
        let pid = self.child.as_ref()?.id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// Kills the job with SIGKILL (no graceful anything).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
            mark_killed(&self.dir);
        }
    }

    /// Waits for the job to exit by itself.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        let child = self.child.as_mut().expect("running");
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                self.child = None;
                // Killed, or stopped on an error without leaving its consumer group.
                if !status.success() {
                    mark_killed(&self.dir);
                }
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "job still running after {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Sends SIGINT without waiting (the processes of a cluster stop together: see `wait_exit`).
    pub fn interrupt(&self) {
        if let Some(child) = &self.child {
            let _ = Command::new("kill")
                .args(["-INT", &child.id().to_string()])
                .status();
        }
    }

    /// Stops the job with SIGINT and waits for a clean exit.
    pub fn stop(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        let _ = Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("job did not stop within 60 s; log:\n{}", tail(&self.log()));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The job's default consumer-group session timeout (`kafka.session_timeout_ms`), ms.
const DEFAULT_SESSION_MS: u64 = 10_000;
/// Added to the session timeout before a killed member counts as expired.
const SESSION_MARGIN: Duration = Duration::from_millis(1_000);

/// The `kafka.session_timeout_ms` a job config sets, or the job's default.
fn session_ms(config: &str) -> u64 {
    config
        .lines()
        .filter_map(|line| line.trim().strip_prefix("session_timeout_ms"))
        .filter_map(|rest| rest.trim().strip_prefix('='))
        .find_map(|value| value.trim().parse().ok())
        .unwrap_or(DEFAULT_SESSION_MS)
}

/// Notes in `dir` when a job there died without leaving its consumer groups, with its session
/// timeout (read from the config it ran with).
fn mark_killed(dir: &Path) {
    let config = std::fs::read_to_string(dir.join("ragstream.toml")).unwrap_or_default();
    let _ = std::fs::write(dir.join("killed-at"), session_ms(&config).to_string());
}

/// A job restarted in the directory of a killed one waits until the dead members' sessions expired.
/// Tansu 0.6 does not rebalance when a member joins next to a dead one that has not yet expired: the
/// newcomer joins the old generation with an empty assignment and stays there (Kafka rebalances once
/// the dead member's session ends). See docs/operations.md, "Tansu 0.6 limits".
pub fn wait_out_killed_session(dir: &Path) {
    let marker = dir.join("killed-at");
    let Ok(killed) = std::fs::metadata(&marker).and_then(|m| m.modified()) else {
        return;
    };
    let session = std::fs::read_to_string(&marker)
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(DEFAULT_SESSION_MS);
    let since = killed.elapsed().unwrap_or_default();
    if let Some(left) = (Duration::from_millis(session) + SESSION_MARGIN).checked_sub(since) {
        std::thread::sleep(left);
    }
    let _ = std::fs::remove_file(marker);
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

impl Drop for Job {
    fn drop(&mut self) {
        self.kill();
    }
}
