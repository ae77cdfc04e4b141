//! A real Kafka-protocol broker (Tansu, SQLite storage) on a free loopback port, plus admin helpers.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// How long a test's own read of the broker (watermarks, committed offsets) may take: the fault suite
/// runs beside the other tests, and on a busy machine the broker answers its metadata requests in
/// seconds, not milliseconds. A bound on the test helper's patience, not a check of the job.
const BROKER_PATIENCE: Duration = Duration::from_secs(30);

/// A message read back: key, value, headers.
pub type ReadMessage = (Option<Vec<u8>>, Option<Vec<u8>>, Vec<(String, Vec<u8>)>);

/// The Tansu binary: `$RAGSTREAM_TANSU`, else the cache the test command installs into.
pub fn tansu_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("RAGSTREAM_TANSU") {
        return PathBuf::from(path);
    }
    let cache = std::env::var_os("RAGSTREAM_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/ragstream")
        });
    let path = cache.join("tansu-0.6.0/bin/tansu");
    assert!(
        path.is_file(),
        "Tansu missing at {}: run deploy/scripts/test.sh (it installs it)",
        path.display()
    );
    path
}

/// A free TCP port on loopback for a process the test starts (a job's HTTP endpoints, a broker).
///
/// Not one the kernel hands out for port 0: those come from the ephemeral range, where outgoing
/// connections take their source ports, so between this check and the process's own bind a client
/// running beside it (a Kafka connection of another job) could take the port, and the process would
/// exit with "address in use". Ports below that range are tried in turn from a per-process starting
/// point, so one test process never hands out the same port twice either.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOWEST: u32 = 10_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // The start of the ephemeral range (Linux's default where it cannot be read).
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    let span = ephemeral.saturating_sub(LOWEST);
    if span >= 1_000 {
        let start = std::process::id().wrapping_mul(2_654_435_761) % span;
        for _ in 0..span {
            let port = LOWEST + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
            if TcpListener::bind(("127.0.0.1", port as u16)).is_ok() {
                return port as u16;
            }
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// A Tansu broker process with its SQLite database in a temporary directory.
pub struct Broker {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
}

impl Broker {
    /// Starts a broker and waits until it answers metadata requests.
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut broker = Self {
            child: None,
            port: free_port(),
            dir,
        };
        broker.spawn();
        broker
    }

    fn spawn(&mut self) {
        let url = format!("tcp://127.0.0.1:{}", self.port);
        let log = std::fs::File::create(self.dir.path().join("tansu.log")).expect("log file");
        let child = Command::new(tansu_binary())
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
                "--storage-engine",
                "sqlite://tansu.db",
            ])
            .current_dir(self.dir.path())
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("tansu starts");
        self.child = Some(child);
        self.wait_ready();
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let producer: BaseProducer = self.client().create().expect("producer");
        while Instant::now() < deadline {
            if producer
                .client()
                .fetch_metadata(None, Duration::from_secs(1))
                .is_ok()
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "broker on port {} not ready; log: {}",
            self.port,
            std::fs::read_to_string(self.dir.path().join("tansu.log")).unwrap_or_default()
        );
    }

    /// `host:port` of the broker.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// A client config pointed at the broker.
    pub fn client(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", self.bootstrap());
        config
    }

    /// Kills the broker (SIGKILL).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Restarts a killed broker on the same port and storage.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Creates a topic (idempotent).
    pub fn create_topic(&self, name: &str, partitions: i32) {
        let admin: AdminClient<DefaultClientContext> = self.client().create().expect("admin");
        let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        let results = futures_lite::future::block_on(admin.create_topics([&topic], &options))
            .expect("create topics");
        for result in results {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((topic, code)) => panic!("creating {topic}: {code}"),
            }
        }
    }

    /// An idempotent producer.
    pub fn producer(&self) -> BaseProducer {
        self.client()
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            .create()
            .expect("producer")
    }

    /// Produces `(key, value)` records (value `None` = tombstone) and flushes.
    pub fn produce(&self, topic: &str, records: &[(String, Option<Vec<u8>>)]) {
        Self::produce_with(&self.producer(), topic, records);
    }

    /// Like [`Broker::produce`], on a producer the caller keeps (no connection set up per call).
    pub fn produce_with(
        producer: &BaseProducer,
        topic: &str,
        records: &[(String, Option<Vec<u8>>)],
    ) {
        for (key, value) in records {
            let mut record = BaseRecord::<str, [u8]>::to(topic).key(key.as_str());
            if let Some(value) = value {
                record = record.payload(value.as_slice());
            }
            let mut pending = record;
            loop {
                match producer.send(pending) {
                    Ok(()) => break,
                    Err((_, back)) => {
                        producer.poll(Duration::from_millis(20));
                        pending = back;
                    }
                }
            }
            producer.poll(Duration::ZERO);
        }
        producer.flush(Duration::from_secs(30)).expect("flush");
    }

    /// High watermark (next offset) of each partition.
    pub fn high_watermarks(&self, topic: &str, partitions: i32) -> Vec<i64> {
        let consumer: BaseConsumer = self
            .client()
            .set("group.id", "ragstream-test-watermarks")
            .create()
            .expect("consumer");
        (0..partitions)
            .map(|p| {
                consumer
                    .fetch_watermarks(topic, p, BROKER_PATIENCE)
                    .expect("watermarks")
                    .1
            })
            .collect()
    }

    /// Committed offsets of `group` per partition (`-1` when none).
    pub fn committed(&self, group: &str, topic: &str, partitions: i32) -> Vec<i64> {
        let consumer: BaseConsumer = self
            .client()
            .set("group.id", group)
            .create()
            .expect("consumer");
        let mut list = TopicPartitionList::new();
        for p in 0..partitions {
            list.add_partition(topic, p);
        }
        let committed = consumer
            .committed_offsets(list, BROKER_PATIENCE)
            .expect("committed offsets");
        (0..partitions)
            .map(
                |p| match committed.find_partition(topic, p).map(|e| e.offset()) {
                    Some(Offset::Offset(offset)) => offset,
                    _ => -1,
                },
            )
            .collect()
    }

    /// Every message of a topic (from the beginning), as (key, value, headers).
    pub fn read_all(&self, topic: &str, expected: usize) -> Vec<ReadMessage> {
        use rdkafka::message::{Headers, Message};
        let consumer: BaseConsumer = self
            .client()
            .set("group.id", format!("ragstream-test-reader-{}", free_port()))
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            // Events up to the job's document limit (8 MiB), whole.
            .set("fetch.max.bytes", "16777216")
            .set("max.partition.fetch.bytes", "16777216")
            .set("receive.message.max.bytes", "17825792")
            .create()
            .expect("consumer");
        consumer.subscribe(&[topic]).expect("subscribe");
        let mut out = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while out.len() < expected && Instant::now() < deadline {
            if let Some(Ok(message)) = consumer.poll(Duration::from_millis(200)) {
                let headers = message
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec()))
                            .collect()
                    })
                    .unwrap_or_default();
                out.push((
                    message.key().map(<[u8]>::to_vec),
                    message.payload().map(<[u8]>::to_vec),
                    headers,
                ));
            }
        }
        out
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.kill();
    }
}
