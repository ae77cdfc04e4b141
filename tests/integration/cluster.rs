//! A timely cluster of 2 processes × 2 workers on loopback against a 4-partition documents topic on
//! Tansu. The union of the processes' shards must equal the oracle, every query must get exactly one
//! context, and every context must equal the one a single process of one worker gives on the same
//! data (same items, same order, same packed text): documents reach the worker owning their shard,
//! queries every shard whichever process consumed them, and BM25 statistics every process. Standing
//! queries held by either process follow writes indexed by the other, equal to one-shot answers.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::common::broker::{free_port, Broker};
use crate::common::contexts::{comparable, items, queries};
use crate::common::job::Job;
use crate::common::oracle::{compare, default_chunker, index_contents, squad, Oracle};
use ragstream_core::query::Context;
use rdkafka::producer::{BaseRecord, Producer};
use serde_json::json;

const DOCS: &str = "docs";
const DLQ: &str = "dlq";
const PARTITIONS: i32 = 4;

/// A job configuration reading `DOCS`; `run` names its group and its query and context topics.
fn config(broker: &Broker, run: &str) -> String {
    crate::common::kafka_config(
        &broker.bootstrap(),
        &format!(
            "documents_topic = \"{DOCS}\"\nqueries_topic = \"queries-{run}\"\ncontexts_topic = \"contexts-{run}\"\ndlq_topic = \"{DLQ}\"\ngroup_id = \"{run}\""
        ),
        "",
    )
}

/// Waits until `group` committed the end of every partition of `DOCS`.
/// Waits until `group` committed the whole documents topic and every job's BM25 statistics count
/// the `chunks` live chunks (each process holds the whole corpus's); returns the seconds it took.
fn wait_indexed(broker: &Broker, group: &str, jobs: &[&Job], chunks: usize) -> f64 {
    let started = Instant::now();
    let high = broker.high_watermarks(DOCS, PARTITIONS);
    while broker.committed(group, DOCS, PARTITIONS) != high {
        assert!(
            started.elapsed() < Duration::from_secs(900),
            "{group} never committed the end of {DOCS}; logs:\n{}",
            jobs.iter()
                .map(|j| j.log())
                .collect::<Vec<_>>()
                .join("\n----\n")
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    for job in jobs {
        while crate::common::job::metric(&job.metrics(), "ragstream_bm25_corpus_chunks")
            != chunks as f64
        {
            assert!(
                started.elapsed() < Duration::from_secs(900),
                "the BM25 statistics never counted {chunks} chunks; log:\n{}",
                job.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    started.elapsed().as_secs_f64()
}

/// Produces the queries on `queries-{run}` and reads their contexts from `contexts-{run}`; every
/// query must be answered exactly once.
fn ask(
    broker: &Broker,
    run: &str,
    queries: &[(String, serde_json::Value)],
) -> BTreeMap<String, Context> {
    let topic = format!("queries-{run}");
    let events: Vec<(String, Option<Vec<u8>>)> = queries
        .iter()
        .map(|(id, query)| {
            let mut query = query.clone();
            query["query_id"] = json!(id);
            (id.clone(), Some(query.to_string().into_bytes()))
        })
        .collect();
    broker.produce(&topic, &events);
    let deadline = Instant::now() + Duration::from_secs(180);
    let contexts_topic = format!("contexts-{run}");
    loop {
        // One more than asked for: the read waits its full time, so a duplicate would show up.
        let read = broker.read_all(&contexts_topic, queries.len() + 1);
        let mut by_id: BTreeMap<String, Context> = BTreeMap::new();
        for (key, value, _) in &read {
            let context: Context =
                serde_json::from_slice(value.as_ref().expect("value")).expect("context JSON");
            let key = String::from_utf8(key.clone().expect("key")).expect("utf-8 key");
            assert_eq!(key, context.query_id);
            assert!(
                by_id.insert(key.clone(), context).is_none(),
                "two contexts for query {key} in run {run}"
            );
        }
        if by_id.len() == queries.len() {
            assert_eq!(read.len(), queries.len(), "exactly one context per query");
            return by_id;
        }
        assert!(
            Instant::now() < deadline,
            "run {run}: {} of {} contexts",
            by_id.len(),
            queries.len()
        );
    }
}

/// `POST /v1/query` to `job`: the context.
fn post(job: &Job, body: serde_json::Value) -> Context {
    let (status, answer) =
        crate::common::job::http_post_json(job.http_port, "/v1/query", &body.to_string())
            .expect("answered");
    assert_eq!(status, 200, "{answer}");
    serde_json::from_str(&answer).expect("context JSON")
}

/// Writes that only the other process indexes, seen by process 0's queries: a document whose shard
/// is process 1's (workers 2 and 3) is updated; a `read_your_writes` query to process 0 right after
/// must hold the update without waiting out its timeout, and once the next update is committed, an
/// `eventual` query to process 0 must not be served the context it cached before. Returns the
/// read-your-writes round trip and how long after the commit the cache served the new version.
fn writes_elsewhere(broker: &Broker, cluster: &[Job], oracle: &mut Oracle) -> (f64, f64) {
    let doc = (0..)
        .map(|i| format!("lighthouse-{i}"))
        .find(|id| ragstream_operators::model::DocKey::new("exact", id).route() % 4 >= 2)
        .expect("a document of process 1");
    let text = |colour: &str| {
        format!(
            "The lighthouse keeper of Varnholm painted the tower {colour} in the spring of 1911."
        )
    };
    let question = "What colour did the keeper paint the Varnholm lighthouse tower?";
    let ask = |consistency: &str| {
        post(
            &cluster[0],
            json!({"query_id": format!("exact-{consistency}"), "tenant": "exact", "text": question,
                   "token_budget": 300, "consistency": consistency}),
        )
    };
    broker.produce(
        DOCS,
        &[oracle.upsert("exact", &doc, 1, "Varnholm", &text("blue"))],
    );
    committed(broker);
    let mut first = ask("eventual");
    for _ in 0..100 {
        if first.context.contains("blue") {
            break;
        }
        // Process 0 learns of the commit within its refresh period.
        std::thread::sleep(Duration::from_millis(100));
        first = ask("eventual");
    }
    assert!(first.context.contains("blue"), "{}", first.context);
    // Asked again once the group's offsets as process 0 reads them have settled, the context comes
    // from the cache.
    let started = Instant::now();
    loop {
        let again = ask("eventual");
        assert!(again.context.contains("blue"), "{}", again.context);
        if again.latency_ms.contains_key("cache") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "never served from the cache: {:?}",
            again.latency_ms
        );
        std::thread::sleep(Duration::from_millis(300));
    }

    broker.produce(
        DOCS,
        &[oracle.upsert("exact", &doc, 2, "Varnholm", &text("red"))],
    );
    let started = Instant::now();
    let ryw = ask("read_your_writes");
    let ryw_seconds = started.elapsed().as_secs_f64();
    assert!(
        ryw.context.contains("red") && !ryw.context.contains("blue"),
        "read_your_writes missed a write indexed by the other process: {} (note {:?})",
        ryw.context,
        ryw.note
    );
    assert!(
        ryw.note.as_deref().is_none_or(|n| !n.contains("caught up")),
        "{:?}",
        ryw.note
    );

    broker.produce(
        DOCS,
        &[oracle.upsert("exact", &doc, 3, "Varnholm", &text("green"))],
    );
    committed(broker);
    let started = Instant::now();
    let mut fresh = ask("eventual");
    while !fresh.context.contains("green") {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "process 0 still serves a context cached before the other process's write: {}",
            fresh.context
        );
        std::thread::sleep(Duration::from_millis(100));
        fresh = ask("eventual");
    }
    (ryw_seconds, started.elapsed().as_secs_f64())
}

/// Waits until the cluster's group committed the whole documents topic; the time it did.
fn committed(broker: &Broker) -> Instant {
    let started = Instant::now();
    let high = broker.high_watermarks(DOCS, PARTITIONS);
    while broker.committed("cluster", DOCS, PARTITIONS) != high {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "never committed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Instant::now()
}

/// Subscribes to `query` on `job` (`min_interval_ms` 0): the id and version 1.
fn subscribe(job: &Job, query: &serde_json::Value) -> (String, serde_json::Value) {
    let body = json!({"query": query, "min_interval_ms": 0}).to_string();
    let (status, answer) =
        crate::common::job::http_post_json(job.http_port, "/v1/subscriptions", &body)
            .expect("answered");
    assert_eq!(status, 201, "{answer}");
    let version: serde_json::Value = serde_json::from_str(&answer).expect("JSON");
    let id = version["subscription_id"].as_str().expect("id").to_string();
    (id, version)
}

/// Polls subscription `id` on process `p` until it is not pending and its latest version is the
/// one-shot answer of `query` there (and holds `word`, where given): that version. Fails after 30 s.
fn at_rest(
    job: &Job,
    p: usize,
    id: &str,
    query: &serde_json::Value,
    word: Option<&str>,
) -> serde_json::Value {
    let started = Instant::now();
    let mut asked = 0;
    loop {
        let (status, body) =
            crate::common::job::http_get(job.http_port, &format!("/v1/subscriptions/{id}"))
                .expect("answered");
        assert_eq!(status, 200, "{body}");
        let status: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        let latest = status["latest"].clone();
        let context = latest["context"]["context"].as_str().unwrap_or_default();
        if status["pending"] == false && word.is_none_or(|word| context.contains(word)) {
            asked += 1;
            let mut one_shot = query.clone();
            one_shot["query_id"] = json!(format!("one-shot-{id}-{asked}"));
            let (code, answer) = crate::common::job::http_post_json(
                job.http_port,
                "/v1/query",
                &one_shot.to_string(),
            )
            .expect("answered");
            assert_eq!(code, 200, "{answer}");
            let one_shot: serde_json::Value = serde_json::from_str(&answer).expect("JSON");
            if items(&latest["context"]) == items(&one_shot) {
                return latest;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "process {p}, {id} ({}): the latest version is not the one-shot answer after 30 s\nlatest:   {:?}\none-shot: {:?}",
                query["text"],
                items(&latest["context"]),
                items(&one_shot)
            );
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "process {p}'s subscription {id} never took the change ({word:?}): {status}\n{}",
            job.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Rounds of random writes the standing queries of [`standing_across_processes`] follow, and the
/// upserts, edits and deletes drawn per round (some draws write nothing).
const ROUNDS: usize = 10;
const CHANGES_PER_ROUND: usize = 50;

/// Standing queries held by either process follow writes that only the other process indexes.
/// First the same subscription on both processes: a document of process 1's shards changes, then
/// one of process 0's; after each, both publish a new version holding the change, each the one-shot
/// answer of its process. Then 25 subscriptions on each process through [`ROUNDS`] rounds of random
/// upserts, edits and deletes spread over all four shards: at rest after every round each latest
/// version is its process's one-shot answer, and versions never go back. Returns the seconds from
/// each of the first two commits to both new versions, the subscriptions of the rounds, and the
/// versions published.
fn standing_across_processes(
    broker: &Broker,
    cluster: &[Job],
    oracle: &mut Oracle,
) -> (Vec<f64>, usize, u64) {
    let tenant = "standing";
    let owned_by = |process: u64| {
        (0..)
            .map(|i| format!("kelmouth-{process}-{i}"))
            .find(|id| {
                ragstream_operators::model::DocKey::new(tenant, id).route() % 4 / 2 == process
            })
            .expect("a document of the process")
    };
    let (far, near) = (owned_by(1), owned_by(0));
    broker.produce(
        DOCS,
        &[
            oracle.upsert(
                tenant,
                &near,
                1,
                "Kelmouth",
                "The Kelmouth ferry crosses the bay twice a day in summer.",
            ),
            oracle.upsert(
                tenant,
                &far,
                1,
                "Kelmouth",
                "The harbour locks of Kelmouth open at dawn for the fishing fleet.",
            ),
        ],
    );
    committed(broker);
    let query = json!({"tenant": tenant, "text": "When do the Kelmouth harbour locks open?", "token_budget": 300});
    let ids: Vec<String> = cluster
        .iter()
        .map(|job| {
            let (id, version) = subscribe(job, &query);
            assert!(
                version["context"]["context"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("dawn"),
                "{version}"
            );
            id
        })
        .collect();
    let mut took = Vec::new();
    let mut seen = vec![1u64; cluster.len()];
    for (doc, text, word) in [
        (
            &far,
            "The harbour locks of Kelmouth open at noon since the new sea wall was built.",
            "noon",
        ),
        (
            &near,
            "The Kelmouth harbour locks open again at dusk for the ferry's last crossing.",
            "dusk",
        ),
    ] {
        broker.produce(DOCS, &[oracle.upsert(tenant, doc, 2, "Kelmouth", text)]);
        let at = committed(broker);
        for (p, (job, id)) in cluster.iter().zip(&ids).enumerate() {
            let latest = at_rest(job, p, id, &query, Some(word));
            let number = latest["version"].as_u64().expect("version");
            assert!(
                number > seen[p],
                "process {p}: version {number} after {}",
                seen[p]
            );
            seen[p] = number;
        }
        took.push(at.elapsed().as_secs_f64());
    }

    // Random rounds over a tenant of its own.
    let tenant = "rounds";
    let towns = ["Ostwick", "Brannock", "Colmere", "Dunhallow", "Eskerby"];
    // Every template said of every town.
    let of_every_town = |templates: &[&str]| -> Vec<String> {
        towns
            .iter()
            .flat_map(|town| templates.iter().map(move |t| t.replace("{}", town)))
            .collect()
    };
    let facts = [
        "The {} lighthouse is lit at sunset and dimmed at sunrise.",
        "Ferries to {} leave from the north pier every two hours.",
        "The {} tide tables are printed each month by the harbour office.",
        "Fishing boats unload their catch at the {} market before dawn.",
        "The {} harbour master inspects the moorings every Monday.",
        "A storm in 1903 destroyed the old {} breakwater.",
        "The {} lifeboat crew trains on Thursday evenings.",
        "Cargo ships anchor outside {} when the channel is silted.",
    ];
    let sentences = of_every_town(&facts);
    let asks = [
        "When is the {} lighthouse lit?",
        "Where do ferries to {} leave from?",
        "Who inspects the moorings in {}?",
        "What happened to the {} breakwater?",
        "When does the {} lifeboat crew train?",
    ];
    let questions = of_every_town(&asks);
    let random = std::cell::Cell::new(0x2545_f491_4f6c_dd1du64);
    let next = |n: usize| {
        let mut x = random.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        random.set(x);
        (x % n as u64) as usize
    };
    let text = |serial: usize| {
        let count = 2 + next(2);
        let mut parts: Vec<String> = (0..count)
            .map(|_| sentences[next(sentences.len())].to_string())
            .collect();
        parts.push(format!("Note {serial}."));
        parts.join(" ")
    };
    let mut live: Vec<(usize, u64)> = Vec::new();
    let mut events = Vec::new();
    for serial in 0..40 {
        events.push(oracle.upsert(tenant, &format!("o{serial}"), 1, "Harbours", &text(serial)));
        live.push((serial, 1));
    }
    broker.produce(DOCS, &events);
    committed(broker);
    let mut held: Vec<(usize, String, serde_json::Value, u64)> = Vec::new();
    for (p, job) in cluster.iter().enumerate() {
        for question in &questions {
            let query = json!({"tenant": tenant, "text": question, "token_budget": 200, "k": 3});
            let (id, version) = subscribe(job, &query);
            held.push((p, id, query, version["version"].as_u64().expect("version")));
        }
    }
    let mut serial = 40;
    for _round in 0..ROUNDS {
        let mut events = Vec::new();
        for _ in 0..CHANGES_PER_ROUND {
            match next(3) {
                0 => {
                    events.push(oracle.upsert(
                        tenant,
                        &format!("o{serial}"),
                        1,
                        "Harbours",
                        &text(serial),
                    ));
                    live.push((serial, 1));
                    serial += 1;
                }
                1 if !live.is_empty() => {
                    let at = next(live.len());
                    let (doc, version) = &mut live[at];
                    *version += 1;
                    let body = text(*doc);
                    events.push(oracle.upsert(
                        tenant,
                        &format!("o{doc}"),
                        *version,
                        "Harbours",
                        &body,
                    ));
                }
                _ if live.len() > 10 => {
                    let (doc, version) = live.remove(next(live.len()));
                    events.push(oracle.delete(tenant, &format!("o{doc}"), version + 1));
                }
                _ => {}
            }
        }
        broker.produce(DOCS, &events);
        committed(broker);
        for (p, id, query, last) in &mut held {
            let latest = at_rest(&cluster[*p], *p, id, query, None);
            let number = latest["version"].as_u64().expect("version");
            assert!(
                number >= *last,
                "process {p}, {id}: version {number} after {last}"
            );
            *last = number;
        }
    }
    let versions = seen.iter().sum::<u64>() + held.iter().map(|(_, _, _, last)| last).sum::<u64>();
    (took, held.len(), versions)
}

/// Subscriptions made on the queries topic, each event read by both processes (sent to each of
/// the topic's four partitions, one per worker): each subscription is held by exactly
/// one process, which answers every read of it with version 1; an end event read by either ends
/// it there, with one tombstone. Returns the subscriptions each process held.
fn kafka_subscriptions_owned_once(
    broker: &Broker,
    cluster: &[Job],
    questions: &[(String, serde_json::Value)],
) -> [usize; 2] {
    const IDS: usize = 6;
    const KEYS: usize = PARTITIONS as usize;
    let topic = "queries-cluster";
    // What the contexts topic holds already (one-shot answers, HTTP ones too).
    let before = broker.high_watermarks("contexts-cluster", 1)[0] as usize;
    let ids: Vec<String> = (0..IDS).map(|i| format!("owned-{i}")).collect();
    // Each event sent to every partition: every worker's consumer reads it.
    let producer = broker.producer();
    let send = |standing: &dyn Fn(&str) -> serde_json::Value| {
        let bounded = questions
            .iter()
            .filter(|(_, query)| query["mode"] == "bounded");
        for (id, (_, question)) in ids.iter().zip(bounded) {
            let mut event = question.clone();
            event["query_id"] = json!(id);
            event["standing"] = standing(id);
            let payload = event.to_string();
            for partition in 0..PARTITIONS {
                let record = BaseRecord::to(topic)
                    .key(id.as_str())
                    .payload(payload.as_str())
                    .partition(partition);
                producer.send(record).map_err(|(e, _)| e).expect("sent");
            }
        }
        producer.flush(Duration::from_secs(30)).expect("flushed");
    };
    send(&|id| json!({"subscription_id": id, "min_interval_ms": 0}));
    let held_by = |id: &str| -> Vec<usize> {
        (0..cluster.len())
            .filter(|p| {
                crate::common::job::http_get(
                    cluster[*p].http_port,
                    &format!("/v1/subscriptions/{id}"),
                )
                .is_some_and(|(status, _)| status == 200)
            })
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while ids.iter().any(|id| held_by(id).is_empty()) {
        assert!(Instant::now() < deadline, "not every subscription was made");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Reads the contexts topic until `wanted` records of the subscriptions (versions or
    // tombstones) are there, or nothing more comes (other answers may land meanwhile).
    let read = |wanted: usize, tombstone: bool| {
        let mut expected = before + wanted;
        loop {
            let records = broker.read_all("contexts-cluster", expected);
            let found = records
                .iter()
                .filter(|(key, value, _)| {
                    value.is_none() == tombstone
                        && ids.iter().any(|id| key.as_deref() == Some(id.as_bytes()))
                })
                .count();
            if found >= wanted || records.len() < expected {
                return records;
            }
            expected += wanted - found;
        }
    };
    // Every read of every event answered (version 1 each time), all by the one holder.
    let records = read(IDS * KEYS, false);
    let mut held = [0; 2];
    for id in &ids {
        let holders = held_by(id);
        assert_eq!(holders.len(), 1, "{id} held by processes {holders:?}");
        held[holders[0]] += 1;
        let versions: Vec<serde_json::Value> = records
            .iter()
            .filter(|(key, _, _)| key.as_deref() == Some(id.as_bytes()))
            .map(|(_, value, _)| {
                serde_json::from_slice(value.as_deref().expect("a version")).expect("JSON")
            })
            .collect();
        assert_eq!(versions.len(), KEYS, "{id}: {versions:?}");
        assert!(versions
            .iter()
            .all(|v| v["version"] == 1 && v["context"] == versions[0]["context"]));
    }
    send(&|id| json!({"subscription_id": id, "end": true}));
    let deadline = Instant::now() + Duration::from_secs(60);
    while ids.iter().any(|id| !held_by(id).is_empty()) {
        assert!(Instant::now() < deadline, "not every subscription ended");
        std::thread::sleep(Duration::from_millis(200));
    }
    let records = read(IDS, true);
    for id in &ids {
        let tombstones = records
            .iter()
            .filter(|(key, value, _)| key.as_deref() == Some(id.as_bytes()) && value.is_none())
            .count();
        assert_eq!(tombstones, 1, "{id}");
    }
    held
}

#[test]
fn two_processes_of_two_workers_index_and_answer_like_one_worker() {
    let broker = Broker::start();
    broker.create_topic(DOCS, PARTITIONS);
    broker.create_topic(DLQ, 1);
    for run in ["cluster", "single"] {
        // The cluster's: one partition per worker (the Kafka-made subscriptions' check).
        broker.create_topic(&format!("queries-{run}"), PARTITIONS);
        broker.create_topic(&format!("contexts-{run}"), 1);
    }
    let paragraphs: Vec<_> = squad().into_iter().take(400).collect();
    let mut oracle = Oracle::default();
    let mut events: Vec<_> = paragraphs
        .iter()
        .map(|p| oracle.upsert("squad", &p.id, 1, &p.title, &p.text))
        .collect();
    for p in &paragraphs[..30] {
        let short = p.text.split(". ").next().unwrap_or(&p.text).to_string();
        events.push(oracle.upsert("squad", &p.id, 2, &p.title, &short));
    }
    for p in &paragraphs[30..45] {
        events.push(oracle.delete("squad", &p.id, 2));
    }
    broker.produce(DOCS, &events);
    let expected = oracle.expected(&default_chunker());
    let queries = queries(&paragraphs[45..]);

    // The cluster: two processes, two workers each, connected through a hostfile.
    let root = tempfile::tempdir().expect("tempdir");
    let hostfile = root.path().join("hostfile");
    std::fs::write(
        &hostfile,
        format!("127.0.0.1:{}\n127.0.0.1:{}\n", free_port(), free_port()),
    )
    .expect("hostfile");
    let hostfile = hostfile.display().to_string();
    let dirs: Vec<_> = (0..2)
        .map(|p| {
            let dir = root.path().join(format!("process-{p}"));
            std::fs::create_dir_all(&dir).expect("dir");
            dir
        })
        .collect();
    let mut cluster: Vec<Job> = (0..2)
        .map(|p| {
            let process = p.to_string();
            Job::start_with_env(
                &dirs[p],
                &config(&broker, "cluster"),
                2,
                &[
                    ("RAGSTREAM_RUNTIME__PROCESSES", "2"),
                    ("RAGSTREAM_RUNTIME__PROCESS", &process),
                    ("RAGSTREAM_RUNTIME__HOSTFILE", &hostfile),
                ],
            )
        })
        .collect();
    for job in &mut cluster {
        job.wait_ready(Duration::from_secs(120));
    }
    let cluster_seconds = wait_indexed(
        &broker,
        "cluster",
        &cluster.iter().collect::<Vec<_>>(),
        expected.len(),
    );
    let cluster_contexts = ask(&broker, "cluster", &queries);
    let (ryw_seconds, cache_seconds) = writes_elsewhere(&broker, &cluster, &mut oracle);
    let (standing_seconds, held, versions) =
        standing_across_processes(&broker, &cluster, &mut oracle);
    let owned = kafka_subscriptions_owned_once(&broker, &cluster, &queries);
    let expected = oracle.expected(&default_chunker());
    // A cluster's dataflow ends when every process stopped its sources: interrupt all, then wait.
    for job in &cluster {
        job.interrupt();
    }
    for job in &mut cluster {
        let status = job.wait_exit(Duration::from_secs(60));
        assert!(status.success(), "{}", job.log());
    }
    let mut union = BTreeSet::new();
    let mut per_process = Vec::new();
    for dir in &dirs {
        let shards = index_contents(&dir.join("index"));
        per_process.push(shards.len());
        assert!(union.is_disjoint(&shards), "a chunk is in both processes");
        union.extend(shards);
    }
    let (lost, stale, example) = compare(&expected, &union);

    // The same data through one process of one worker: one shard against the cluster's four, so
    // BM25 scores agree only because its statistics are the whole corpus's.
    let single_dir = root.path().join("single");
    std::fs::create_dir_all(&single_dir).expect("dir");
    let mut single = Job::start(&single_dir, &config(&broker, "single"), 1);
    single.wait_ready(Duration::from_secs(120));
    let single_seconds = wait_indexed(&broker, "single", &[&single], expected.len());
    let single_contexts = ask(&broker, "single", &queries);
    assert!(single.stop().success());

    let differing: Vec<&String> = cluster_contexts
        .iter()
        .filter(|(id, context)| comparable(context) != comparable(&single_contexts[*id]))
        .map(|(id, _)| id)
        .collect();
    println!(
        "cluster 2x2: {} events indexed in {cluster_seconds:.1} s ({} + {} chunks per process), lost {lost}, stale {stale}; single process x1: {single_seconds:.1} s; {} queries, one context each; {} contexts differ; a write indexed by the other process: read_your_writes answered with it in {ryw_seconds:.2} s, the cache served it {cache_seconds:.2} s after its commit; standing queries on both processes took a write of process 1, then of process 0, within {standing_seconds:.2?} s of its commit, and {held} more followed {ROUNDS} rounds of up to {CHANGES_PER_ROUND} random writes each ({versions} versions in all); subscriptions made on the queries topic, each event read by both processes, held once each ({} on process 0, {} on process 1)",
        events.len(),
        per_process[0],
        per_process[1],
        queries.len(),
        differing.len(),
        owned[0],
        owned[1],
    );
    assert_eq!((lost, stale), (0, 0), "{example}");
    assert!(
        per_process.iter().all(|&n| n > 0),
        "both processes own shards"
    );
    if let Some(id) = differing.first() {
        panic!(
            "context {id} differs:\ncluster: {}\nsingle:  {}",
            comparable(&cluster_contexts[*id]),
            comparable(&single_contexts[*id])
        );
    }
    assert!(cluster_contexts
        .values()
        .filter(|c| c.mode == Some(ragstream_core::query::Mode::Bounded))
        .all(|c| c.error.is_none() && !c.items.is_empty()));
}
