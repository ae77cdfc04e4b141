//! The job's HTTP endpoints: `/metrics` (Prometheus text), `/healthz` (process up), `/readyz` (index
//! open, model loaded, source connected). Bound to loopback unless configured otherwise.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Readiness flags set by the runtime.
#[derive(Debug, Default)]
pub struct Readiness {
    /// Every worker opened its shard and loaded its embedder.
    pub ready: AtomicBool,
}

/// Serves until the process exits. Returns the bound address.
pub fn serve(listen: &str, readiness: Arc<Readiness>) -> anyhow::Result<std::net::SocketAddr> {
    let server = tiny_http::Server::http(listen)
        .map_err(|e| anyhow::anyhow!("cannot listen on {listen}: {e}"))?;
    let address = server
        .server_addr()
        .to_ip()
        .ok_or_else(|| anyhow::anyhow!("{listen} is not an IP address"))?;
    std::thread::Builder::new()
        .name("http".into())
        .spawn(move || {
            for request in server.incoming_requests() {
                let (status, body, content_type) = match request.url() {
                    "/metrics" => (
                        200,
                        ragstream_operators::metrics::metrics().render(),
                        "text/plain; version=0.0.4",
                    ),
                    "/healthz" => (200, "ok\n".to_string(), "text/plain"),
                    "/readyz" if readiness.ready.load(Ordering::SeqCst) => {
                        (200, "ready\n".to_string(), "text/plain")
                    }
                    "/readyz" => (503, "starting\n".to_string(), "text/plain"),
                    _ => (404, "not found\n".to_string(), "text/plain"),
                };
                let header = tiny_http::Header::from_bytes("Content-Type", content_type)
                    .expect("valid header");
                let response = tiny_http::Response::from_string(body)
                    .with_status_code(status)
                    .with_header(header);
                let _ = request.respond(response);
            }
        })?;
    Ok(address)
}
