//! A throw-away Qdrant server on loopback for the server backend's tests: free ports, storage in a
//! temp directory, killed when dropped. The binary comes from `RAGSTREAM_QDRANT` (the test command
//! sets it from `deploy/scripts/install/qdrant.sh`).

use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ragstream_operators::store::server::ServerStore;
use ragstream_operators::store::IndexTuning;

use super::broker::free_port;
use super::job::http_get;
use super::oracle::{store_contents, ChunkId};

/// A running Qdrant server.
pub struct QdrantServer {
    child: Child,
    binary: std::ffi::OsString,
    http_port: u16,
    grpc_port: u16,
    dir: tempfile::TempDir,
    /// The API key it requires (`None`: none).
    api_key: Option<String>,
}

impl QdrantServer {
    /// Starts a server and waits until `/readyz` answers; `None` (with a `SKIPPED` line) when no
    /// binary is configured, as where the test command found no Qdrant server to install.
    pub fn start() -> Option<Self> {
        let Some(binary) = std::env::var_os("RAGSTREAM_QDRANT") else {
            println!("SKIPPED: RAGSTREAM_QDRANT is not set (the test command sets it where a Qdrant server can be installed)");
            return None;
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let (http_port, grpc_port) = (free_port(), free_port());
        let child = spawn(&binary, dir.path(), http_port, grpc_port, None);
        let server = Self {
            child,
            binary,
            http_port,
            grpc_port,
            dir,
            api_key: None,
        };
        server.wait_ready();
        Some(server)
    }

    /// Kills the server (SIGKILL: no shutdown of its own) and starts it again on the same storage and
    /// ports.
    pub fn kill_and_restart(&mut self) {
        self.kill();
        self.restart();
    }

    /// Kills the server (SIGKILL).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the killed server again on the same storage and ports; waits until it is ready.
    pub fn restart(&mut self) {
        self.child = spawn(
            &self.binary,
            self.dir.path(),
            self.http_port,
            self.grpc_port,
            self.api_key.as_deref(),
        );
        self.wait_ready();
    }

    /// Restarts the server requiring `api_key` from now on (a key rotated on the server).
    pub fn restart_with_key(&mut self, api_key: Option<&str>) {
        self.kill();
        self.api_key = api_key.map(str::to_string);
        self.restart();
    }

    /// Deletes `collection` (what an operator's mistake or a cleanup script does).
    pub fn delete_collection(&self, collection: &str) {
        self.store(collection)
            .delete_collection()
            .expect("delete collection");
    }

    fn store(&self, collection: &str) -> ServerStore {
        ServerStore::connect(
            &self.url(),
            self.api_key.clone(),
            collection,
            384,
            IndexTuning::default(),
        )
        .expect("connect")
    }

    /// The gRPC port.
    pub fn grpc_port(&self) -> u16 {
        self.grpc_port
    }

    /// Waits until `/readyz` answers 200 and the gRPC port (what the job and the store use) accepts
    /// connections: after a restart the HTTP side can be ready first.
    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let grpc_up = || std::net::TcpStream::connect(("127.0.0.1", self.grpc_port)).is_ok();
        while http_get(self.http_port, "/readyz").map(|(status, _)| status) != Some(200)
            || !grpc_up()
        {
            assert!(
                Instant::now() < deadline,
                "qdrant not ready; log: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The gRPC URL (what qdrant-client and `index.url` take).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc_port)
    }

    /// The server's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("qdrant.log")).unwrap_or_default()
    }

    /// `config` (a job configuration with the `[index]` section [`super::kafka_config`] writes) with
    /// its index on this server, in `collection`.
    pub fn index_config(&self, config: &str, collection: &str) -> String {
        self.index_config_at(config, collection, &self.url())
    }

    /// As [`QdrantServer::index_config`], reaching the server through `url` (a proxy in front of it).
    pub fn index_config_at(&self, config: &str, collection: &str, url: &str) -> String {
        let edge = "[index]\npath = \"{dir}/index\"";
        assert!(config.contains(edge), "an [index] section to replace");
        config.replace(
            edge,
            &format!("[index]\nkind = \"server\"\nurl = \"{url}\"\ncollection = \"{collection}\""),
        )
    }

    /// Every chunk of `collection`, as [`super::oracle::index_contents`] reads an embedded index.
    pub fn contents(&self, collection: &str) -> BTreeSet<ChunkId> {
        let store = self.store(collection);
        let mut out = BTreeSet::new();
        let duplicates = store_contents(&store, &mut out);
        assert_eq!(duplicates, 0, "a chunk is stored twice");
        out
    }
}

/// Starts the server binary with its storage under `dir`, on loopback `http_port` and `grpc_port`.
fn spawn(
    binary: &std::ffi::OsStr,
    dir: &std::path::Path,
    http_port: u16,
    grpc_port: u16,
    api_key: Option<&str>,
) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("qdrant.log"))
        .expect("log file");
    let mut command = Command::new(binary);
    if let Some(key) = api_key {
        command.env("QDRANT__SERVICE__API_KEY", key);
    }
    command
        .arg("--disable-telemetry")
        .current_dir(dir)
        .env("QDRANT__SERVICE__HOST", "127.0.0.1")
        .env("QDRANT__SERVICE__HTTP_PORT", http_port.to_string())
        .env("QDRANT__SERVICE__GRPC_PORT", grpc_port.to_string())
        .env("QDRANT__STORAGE__STORAGE_PATH", dir.join("storage"))
        .env("QDRANT__STORAGE__SNAPSHOTS_PATH", dir.join("snapshots"))
        .env("QDRANT__TELEMETRY_DISABLED", "true")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("qdrant starts")
}

impl Drop for QdrantServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TCP proxy on loopback in front of a server that delays every byte, each way, by a settable
/// latency: a server far away. Like a network link, it delays each chunk of bytes from the moment
/// it arrived, so chunks in flight together arrive together (the latency does not grow with the
/// number of packets, and one request's bytes do not wait behind another's delay).
pub struct DelayProxy {
    /// The proxy's port.
    pub port: u16,
    delay_ms: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl DelayProxy {
    /// Starts forwarding connections on a free port to `127.0.0.1:upstream`, with no delay.
    pub fn start(upstream: u16) -> Self {
        use std::sync::atomic::{AtomicU64, Ordering};
        use std::sync::Arc;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("address").port();
        let delay_ms = Arc::new(AtomicU64::new(0));
        let delay = delay_ms.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                // Small gRPC frames go out at once, as on a direct connection.
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                for (mut from, mut to) in [
                    (
                        client.try_clone().expect("clone"),
                        server.try_clone().expect("clone"),
                    ),
                    (server, client),
                ] {
                    // The reader stamps each chunk with when it is due; the writer passes it on
                    // then.
                    let (send, receive) = std::sync::mpsc::channel::<(Instant, Vec<u8>)>();
                    let delay = delay.clone();
                    std::thread::spawn(move || {
                        use std::io::Read;
                        let mut buffer = vec![0u8; 64 * 1024];
                        loop {
                            let read = match from.read(&mut buffer) {
                                Ok(0) | Err(_) => break,
                                Ok(read) => read,
                            };
                            let due = Instant::now()
                                + Duration::from_millis(delay.load(Ordering::Relaxed));
                            if send.send((due, buffer[..read].to_vec())).is_err() {
                                break;
                            }
                        }
                    });
                    std::thread::spawn(move || {
                        use std::io::Write;
                        for (due, bytes) in receive {
                            std::thread::sleep(due.saturating_duration_since(Instant::now()));
                            if to.write_all(&bytes).is_err() {
                                break;
                            }
                        }
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Self { port, delay_ms }
    }

    /// Delays every chunk arriving from now on by `delay` (each way).
    pub fn set_delay(&self, delay: Duration) {
        self.delay_ms.store(
            delay.as_millis() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// The URL to give the job instead of the server's.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}
