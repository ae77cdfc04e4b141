//! Standing queries through the HTTP API of a running job (the embedded index, and a Qdrant server
//! collection; the local model; documents posted over HTTP): subscriptions follow random upserts,
//! edits and deletes; at every quiet point
//! each subscription's latest version is what a one-shot query with the same body answers; versions
//! are numbered without gaps, never go backwards, and no two consecutive versions carry the same
//! items; the event stream resumes after `Last-Event-ID` with nothing missed; another tenant's
//! subscriptions never move; caps and bad parameters are refused with problems.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::common::contexts::{items, Items};
use crate::common::job::{http_get, http_post_json, Job};
use serde_json::{json, Value};

/// Sentences of the corpus, by topic; documents draw from them. No question asks about the last
/// topic: its documents should move no subscription (the filter skips them).
const TOPICS: [&[&str]; 6] = [
    &[
        "The ferry to the island leaves the harbour at seven and returns at dusk.",
        "Ferry tickets are sold at the pier office and on board.",
        "In winter the ferry runs twice a day when the sea allows.",
    ],
    &[
        "The lighthouse lamp is inspected every week by the keeper.",
        "A spare lamp for the lighthouse is kept in the store room.",
        "The lighthouse keeper writes the lamp hours in the log book.",
    ],
    &[
        "Tide tables are published each month by the harbour master.",
        "High tide at the quay comes about forty minutes after the bay.",
        "Spring tides flood the lower car park twice a year.",
    ],
    &[
        "Harbour fees are paid by the day for every boat over six metres.",
        "Fishing boats of the town pay no harbour fee in the off season.",
        "The fee schedule of the harbour is reviewed every spring.",
    ],
    &[
        "Pier repairs close the north walkway from March to May.",
        "The pier was rebuilt in oak after the storm of the old winter.",
        "Divers check the pier piles for rot every second year.",
    ],
    &[
        "The bakery sells rye bread and seed rolls from six.",
        "Sourdough loaves need a night of slow proving.",
        "Our cinnamon buns sell out before noon on Saturdays.",
    ],
];

/// Questions of the subscriptions of tenant `port` (the changing one).
const QUESTIONS: [&str; 8] = [
    "when does the ferry leave",
    "who inspects the lighthouse lamp",
    "how are the tide tables published",
    "what are the harbour fees for boats",
    "when are the pier repairs",
    "ferry tickets",
    "spring tides car park",
    "pier piles rot",
];

/// Subscriptions of tenant `port`.
const SUBSCRIPTIONS: usize = 50;

/// The questions of the [`SUBSCRIPTIONS`]: [`QUESTIONS`], then the opening and the closing words
/// of every harbour sentence, then a sentence of one harbour topic with one of another.
fn questions() -> Vec<String> {
    let harbour = &TOPICS[..TOPICS.len() - 1];
    let sentences: Vec<Vec<&str>> = harbour
        .iter()
        .flat_map(|topic| topic.iter())
        .map(|sentence| sentence.trim_end_matches('.').split(' ').collect())
        .collect();
    let mut questions: Vec<String> = QUESTIONS.iter().map(|q| q.to_string()).collect();
    questions.extend(
        sentences
            .iter()
            .map(|words| words[..4.min(words.len())].join(" ")),
    );
    questions.extend(
        sentences
            .iter()
            .map(|words| words[words.len().saturating_sub(4)..].join(" ")),
    );
    for (a, b) in (0..harbour.len()).flat_map(|a| (0..harbour.len()).map(move |b| (a, b))) {
        if a != b {
            questions.push(format!("{} and {}", harbour[a][0], harbour[b][1]));
        }
    }
    questions.truncate(SUBSCRIPTIONS);
    assert_eq!(questions.len(), SUBSCRIPTIONS);
    questions
}

/// A small deterministic generator (the test's sequence is the same on every run).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, bound: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % bound.max(1)
    }
}

/// A document of two to four sentences from one or two topics, numbered `serial`.
fn text(random: &mut Lcg, serial: usize) -> String {
    let mut text = format!("Notice {serial}. ");
    let first = random.next(TOPICS.len());
    let second = random.next(TOPICS.len());
    for _ in 0..2 + random.next(3) {
        let topic = TOPICS[if random.next(2) == 0 { first } else { second }];
        text.push_str(topic[random.next(topic.len())]);
        text.push(' ');
    }
    text
}

fn query_body(tenant: &str, question: &str) -> Value {
    json!({"tenant": tenant, "text": question, "token_budget": 300})
}

/// `POST /v1/documents` (waiting until indexed).
fn post(port: u16, documents: Vec<Value>) {
    let (status, body) = http_post_json(
        port,
        "/v1/documents",
        &json!({ "documents": documents }).to_string(),
    )
    .expect("answered");
    assert_eq!(status, 200, "{body}");
}

/// Every subscription's status once none is pending.
fn settled(port: u16, ids: &[String]) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let statuses: Vec<Value> = ids
            .iter()
            .map(|id| {
                let (status, body) =
                    http_get(port, &format!("/v1/subscriptions/{id}")).expect("answered");
                assert_eq!(status, 200, "{body}");
                serde_json::from_str(&body).expect("JSON")
            })
            .collect();
        if statuses.iter().all(|s| s["pending"] == false) {
            return statuses;
        }
        assert!(
            Instant::now() < deadline,
            "subscriptions still pending after 120 s: {statuses:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The `version` events of `id` after `last`, read from the event stream until version `until`.
fn events(port: u16, id: &str, last: u64, until: u64) -> Vec<Value> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    write!(
        stream,
        "GET /v1/subscriptions/{id}/events HTTP/1.1\r\nHost: 127.0.0.1\r\nLast-Event-ID: {last}\r\n\r\n"
    )
    .expect("request");
    let mut read = String::new();
    let mut buffer = [0u8; 65536];
    let mut versions = Vec::new();
    while versions
        .last()
        .map_or(last, |v: &Value| v["version"].as_u64().unwrap_or(0))
        < until
    {
        let n = stream.read(&mut buffer).expect("the stream goes on");
        assert!(n > 0, "the stream ended early: {read}");
        read.push_str(&String::from_utf8_lossy(&buffer[..n]));
        versions = read
            .split("\n\n")
            .filter_map(|event| {
                let data = event.lines().find_map(|line| line.strip_prefix("data: "))?;
                event
                    .lines()
                    .any(|line| line == "event: version")
                    .then(|| serde_json::from_str(data).ok())
                    .flatten()
            })
            .collect();
    }
    assert!(read.contains("text/event-stream"), "{read}");
    versions
}

#[test]
fn standing_versions_follow_the_corpus_and_equal_one_shot_answers_when_quiet() {
    follow_the_corpus(crate::common::JSONL_SERVING.to_string(), false);
}

/// The same on a Qdrant server collection, which weighs BM25 terms across tenants: a change of one
/// tenant re-answers every subscription, and the other tenant's latest version is its one-shot
/// answer too.
#[test]
fn standing_versions_on_a_qdrant_server_equal_one_shot_answers_when_quiet() {
    let Some(server) = crate::common::qdrant::QdrantServer::start() else {
        return;
    };
    follow_the_corpus(
        server.index_config(crate::common::JSONL_SERVING, "standing"),
        true,
    );
}

/// The scenario of both tests on the job `config` starts (`cross_tenant`: its index weighs terms
/// across tenants).
fn follow_the_corpus(config: String, cross_tenant: bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("events.jsonl"), "").expect("events");
    let config = config
        + &format!("[standing]\nmax_per_tenant = {SUBSCRIPTIONS}\ndefault_min_interval_ms = 0\n");
    let mut job = Job::start(dir.path(), &config, 1);
    job.wait_ready(Duration::from_secs(120));
    let port = job.http_port;
    let mut random = Lcg(7);

    // A first corpus for both tenants.
    let mut serial = 0;
    let mut live: Vec<usize> = Vec::new();
    let mut documents = Vec::new();
    for _ in 0..120 {
        serial += 1;
        live.push(serial);
        documents.push(json!({"tenant": "port", "doc_id": format!("d{serial}"), "version": 1, "text": text(&mut random, serial)}));
    }
    documents.push(json!({"tenant": "inland", "doc_id": "i1", "version": 1, "text": "The inland canal locks open at nine. The ferry to the island is not ours."}));
    post(port, documents);

    // Subscriptions: fifty of the changing tenant, one of the other.
    let subscribe = |body: Value| {
        http_post_json(port, "/v1/subscriptions", &body.to_string()).expect("answered")
    };
    let mut subscriptions: Vec<(String, Value)> = Vec::new();
    for question in questions() {
        let query = query_body("port", &question);
        let (status, body) = subscribe(json!({"query": query, "min_interval_ms": 0}));
        assert_eq!(status, 201, "{body}");
        let version: Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(version["version"], 1);
        let id = version["subscription_id"].as_str().expect("id").to_string();
        subscriptions.push((id, query));
    }
    let inland_query = query_body("inland", "when does the ferry leave");
    let (status, body) = subscribe(json!({"query": inland_query}));
    assert_eq!(status, 201, "{body}");
    let inland: Value = serde_json::from_str(&body).expect("JSON");
    let inland_id = inland["subscription_id"].as_str().expect("id").to_string();

    // Refusals: the tenant's cap, bad parameters, an unknown subscription.
    let (status, body) = subscribe(json!({"query": query_body("port", "one too many")}));
    assert_eq!(
        status, 403,
        "one past port's standing.max_per_tenant: {body}"
    );
    assert!(body.contains("subscriptions_exceeded"), "{body}");
    let (status, body) =
        subscribe(json!({"query": query_body("inland", "x"), "min_interval_ms": u64::MAX}));
    assert_eq!(status, 400, "{body}");
    let (status, body) = subscribe(json!({"query": query_body("inland", "x"), "ttl_secs": 0}));
    assert_eq!(status, 400, "{body}");
    let (status, body) = subscribe(json!({"query": {"tenant": "inland", "text": "x", "k": -1}}));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("invalid_query"), "{body}");
    assert_eq!(
        http_get(port, "/v1/subscriptions/sub-0-0").map(|a| a.0),
        Some(404)
    );

    // Rounds of random upserts, edits and deletes of port's documents; after each, the versions.
    let ids: Vec<String> = subscriptions.iter().map(|(id, _)| id.clone()).collect();
    let mut seen: Vec<(u64, u64, Items)> = vec![(1, 0, (Vec::new(), String::new())); ids.len()];
    let mut versions_published = 0;
    let mut changes = 0;
    for round in 0..20 {
        let mut documents = Vec::new();
        for _ in 0..25 {
            match random.next(4) {
                3 => {
                    // A bakery notice: nothing any question asks about.
                    serial += 1;
                    live.push(serial);
                    let bakery = TOPICS[TOPICS.len() - 1];
                    let text = format!(
                        "Notice {serial}. {} {}",
                        bakery[random.next(3)],
                        bakery[random.next(3)]
                    );
                    documents.push(json!({"tenant": "port", "doc_id": format!("d{serial}"), "version": round + 2, "text": text}));
                }
                0 => {
                    serial += 1;
                    live.push(serial);
                    documents.push(json!({"tenant": "port", "doc_id": format!("d{serial}"), "version": round + 2, "text": text(&mut random, serial)}));
                }
                1 if !live.is_empty() => {
                    let doc = live[random.next(live.len())];
                    documents.push(json!({"tenant": "port", "doc_id": format!("d{doc}"), "version": round + 2, "text": text(&mut random, doc)}));
                }
                _ if live.len() > 4 => {
                    let doc = live.remove(random.next(live.len()));
                    documents.push(json!({"op": "delete", "tenant": "port", "doc_id": format!("d{doc}"), "version": round + 2}));
                }
                _ => {}
            }
        }
        if documents.is_empty() {
            continue;
        }
        changes += documents.len();
        post(port, documents);
        let statuses = settled(port, &ids);
        for (index, ((id, query), status)) in subscriptions.iter().zip(&statuses).enumerate() {
            let latest = &status["latest"];
            let version = latest["version"].as_u64().expect("version");
            let frontier = latest["index_watermark"]["frontier_ms"]
                .as_u64()
                .expect("watermark");
            let (last_version, last_frontier, last_items) = &seen[index];
            assert!(version >= *last_version, "{id}: versions went backwards");
            assert!(
                frontier >= *last_frontier,
                "{id}: the watermark went backwards"
            );
            // Exact at rest: the one-shot answer with the same body.
            let mut one_shot = query.clone();
            one_shot["query_id"] = json!(format!("one-shot-{round}-{index}"));
            let (code, answer) =
                http_post_json(port, "/v1/query", &one_shot.to_string()).expect("answered");
            assert_eq!(code, 200, "{answer}");
            let one_shot: Value = serde_json::from_str(&answer).expect("JSON");
            assert_eq!(
                items(&latest["context"]),
                items(&one_shot),
                "round {round}, {id} ({}): the latest version is not the one-shot answer",
                query["text"]
            );
            // Every version since the last look, from the event stream: numbered without gaps,
            // each different from the one before.
            if version > *last_version {
                let fresh = events(port, id, *last_version, version);
                let numbers: Vec<u64> =
                    fresh.iter().filter_map(|v| v["version"].as_u64()).collect();
                assert_eq!(
                    numbers,
                    (*last_version + 1..=version).collect::<Vec<_>>(),
                    "{id}: versions after {last_version}"
                );
                let mut before = if *last_version == 1 && last_items.0.is_empty() {
                    None
                } else {
                    Some(last_items.clone())
                };
                for fresh in &fresh {
                    let now = items(&fresh["context"]);
                    assert_ne!(before.as_ref(), Some(&now), "{id}: an empty version");
                    before = Some(now);
                }
                versions_published += numbers.len();
            }
            seen[index] = (version, frontier, items(&latest["context"]));
        }
    }
    assert!(
        versions_published >= 4,
        "the rounds moved some contexts: {versions_published} versions"
    );

    // The other tenant's subscription: its latest version is its one-shot answer; where each
    // tenant's statistics are its own, it never moved.
    let inland = settled(port, std::slice::from_ref(&inland_id)).remove(0);
    let mut one_shot = inland_query.clone();
    one_shot["query_id"] = json!("one-shot-inland");
    let (code, answer) =
        http_post_json(port, "/v1/query", &one_shot.to_string()).expect("answered");
    assert_eq!(code, 200, "{answer}");
    let one_shot: Value = serde_json::from_str(&answer).expect("JSON");
    assert_eq!(items(&inland["latest"]["context"]), items(&one_shot));
    if !cross_tenant {
        assert_eq!(inland["latest"]["version"], 1, "{inland}");
    }

    // Unsubscribing ends it.
    let delete = |id: &str| {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        write!(
            stream,
            "DELETE /v1/subscriptions/{id} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n"
        )
        .expect("request");
        let mut answer = String::new();
        stream.read_to_string(&mut answer).expect("answer");
        answer
    };
    let status = |answer: String| answer.split_whitespace().nth(1).map(str::to_string);
    assert_eq!(status(delete(&inland_id)).as_deref(), Some("200"));
    assert_eq!(status(delete(&inland_id)).as_deref(), Some("404"));
    let metrics = job.metrics();
    let metric = |name: &str| crate::common::job::metric(&metrics, name);
    let (evaluations, filtered) = (
        metric("ragstream_standing_evaluations_total"),
        metric("ragstream_standing_filtered_total"),
    );
    println!(
        "{changes} changes over the rounds: {evaluations} re-evaluations, {filtered} \
         subscriptions found unmoved by a change, {versions_published} versions"
    );
    if !cross_tenant {
        // Documents of the bakery move no harbour question: the filter skipped subscriptions.
        assert!(filtered > 0.0, "{metrics}");
    }
    assert!(
        crate::common::job::metric(&metrics, "ragstream_standing_versions_total")
            >= (versions_published + 9) as f64,
        "{metrics}"
    );
    job.stop();
}

/// Hostile subscribers: one tenant asks for 10 000 subscriptions (from eight clients at once, some
/// with `min_interval_ms` 0) and holds event streams it never reads while its documents change; the
/// cap refuses the excess with a problem, the job stays up, and another tenant's queries and its
/// subscription's new version come through.
#[test]
fn standing_queries_survive_a_flooding_tenant_and_streams_never_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("events.jsonl"), "").expect("events");
    let mut job = Job::start(dir.path(), crate::common::JSONL_SERVING, 1);
    job.wait_ready(Duration::from_secs(120));
    let port = job.http_port;
    let mut random = Lcg(11);
    let documents: Vec<Value> = (0..20)
        .flat_map(|n| {
            let text = text(&mut random, n);
            [
                json!({"tenant": "flood", "doc_id": format!("f{n}"), "version": 1, "text": text}),
                json!({"tenant": "calm", "doc_id": format!("c{n}"), "version": 1, "text": text}),
            ]
        })
        .collect();
    post(port, documents);
    let calm_query = |serial: usize| {
        let started = Instant::now();
        let body = json!({"query_id": format!("calm-{serial}"), "tenant": "calm", "text": "when does the ferry leave"});
        let (status, body) =
            http_post_json(port, "/v1/query", &body.to_string()).expect("answered");
        assert_eq!(status, 200, "{body}");
        started.elapsed()
    };
    let idle: Vec<Duration> = (0..20).map(calm_query).collect();
    let (status, body) = http_post_json(
        port,
        "/v1/subscriptions",
        &json!({"query": query_body("calm", "who inspects the lighthouse lamp"), "min_interval_ms": 0}).to_string(),
    )
    .expect("answered");
    assert_eq!(status, 201, "{body}");
    let calm: Value = serde_json::from_str(&body).expect("JSON");
    let calm_id = calm["subscription_id"].as_str().expect("id").to_string();

    // The flood, beside calm's questions.
    let next = std::sync::atomic::AtomicUsize::new(0);
    let (made, refused) = (
        std::sync::Mutex::new(Vec::new()),
        std::sync::atomic::AtomicUsize::new(0),
    );
    let flood_started = Instant::now();
    let loaded = std::thread::scope(|scope| {
        for _ in 0..8 {
            scope.spawn(|| loop {
                let n = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if n >= 10_000 {
                    break;
                }
                let interval = if n.is_multiple_of(2) { 0 } else { 250 };
                let body = json!({"query": query_body("flood", &format!("ferry {n}")), "min_interval_ms": interval});
                let (status, answer) =
                    http_post_json(port, "/v1/subscriptions", &body.to_string())
                        .expect("answered");
                match status {
                    201 => made.lock().expect("lock").push(
                        serde_json::from_str::<Value>(&answer).expect("JSON")["subscription_id"]
                            .as_str()
                            .expect("id")
                            .to_string(),
                    ),
                    403 => {
                        assert!(answer.contains("subscriptions_exceeded"), "{answer}");
                        refused.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    other => panic!("subscription {n} answered {other}: {answer}"),
                }
            });
        }
        let calm = scope.spawn(|| {
            let mut times = Vec::new();
            let mut serial = 100;
            while next.load(std::sync::atomic::Ordering::SeqCst) < 10_000 {
                times.push(calm_query(serial));
                serial += 1;
            }
            times
        });
        calm.join().expect("calm's questions")
    });
    let made = made.into_inner().expect("lock");
    let refused = refused.into_inner();
    println!(
        "flood: {} made, {refused} refused in {:.1} s; calm's questions idle {:?} / during {:?} (max)",
        made.len(),
        flood_started.elapsed().as_secs_f64(),
        idle.iter().max(),
        loaded.iter().max()
    );
    assert_eq!(made.len(), 100, "standing.max_per_tenant's default");
    assert_eq!(refused, 9_900);
    assert!(
        loaded.iter().all(|took| *took < Duration::from_secs(5)),
        "a question of calm took {:?} during the flood",
        loaded.iter().max()
    );

    // Event streams of the flood that are never read, while the flood's documents change.
    let unread: Vec<TcpStream> = made
        .iter()
        .take(32)
        .map(|id| {
            let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
            write!(
                stream,
                "GET /v1/subscriptions/{id}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
            )
            .expect("request");
            stream
        })
        .collect();
    for round in 0..3 {
        let documents: Vec<Value> = (0..20)
            .map(|n| json!({"tenant": "flood", "doc_id": format!("f{n}"), "version": round + 2, "text": text(&mut random, n + 100 * round as usize)}))
            .collect();
        post(port, documents);
    }
    // Calm's subscription still moves: a document answering its question.
    post(
        port,
        vec![
            json!({"tenant": "calm", "doc_id": "c-lamp", "version": 1, "text": "The lighthouse lamp is inspected by the keeper, who inspects the lighthouse lamp at dawn."}),
        ],
    );
    let settled = settled(port, std::slice::from_ref(&calm_id)).remove(0);
    assert!(
        settled["latest"]["version"].as_u64() > Some(1),
        "calm's subscription moved: {settled}"
    );
    let (status, _) = http_get(port, "/healthz").expect("answered");
    assert_eq!(status, 200);
    calm_query(999);
    drop(unread);
    let metrics = job.metrics();
    assert_eq!(
        crate::common::job::metric(&metrics, "ragstream_standing_queries"),
        101.0,
        "{metrics}"
    );
    job.stop();
}

/// Subscriptions outlive the process: killed and started again on the same index, the job takes
/// back every subscription still alive (same id, latest version and number), publishes nothing
/// where nothing moved, numbers the next version after the kept one and serves it to a stream
/// resuming after `Last-Event-ID`; unsubscribed and expired ones stay gone, and a file it cannot
/// read is left alone without stopping the job.
#[test]
fn standing_queries_come_back_after_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("events.jsonl"), "").expect("events");
    let mut job = Job::start(dir.path(), crate::common::JSONL_SERVING, 1);
    job.wait_ready(Duration::from_secs(120));
    let port = job.http_port;
    let harbour = |serial: usize, sentence: &str| json!({"tenant": "port", "doc_id": format!("d{serial}"), "version": 1, "text": format!("Notice {serial}. {sentence}")});
    post(
        job.http_port,
        vec![
            harbour(1, TOPICS[0][0]),
            harbour(2, TOPICS[1][0]),
            harbour(3, TOPICS[5][0]),
        ],
    );
    let subscribe = |port: u16, question: &str, ttl: u64| {
        let body =
            json!({"query": query_body("port", question), "min_interval_ms": 0, "ttl_secs": ttl});
        let (status, body) =
            http_post_json(port, "/v1/subscriptions", &body.to_string()).expect("answered");
        assert_eq!(status, 201, "{body}");
        let version: Value = serde_json::from_str(&body).expect("JSON");
        version["subscription_id"].as_str().expect("id").to_string()
    };
    let kept = subscribe(port, "when does the ferry leave", 3600);
    let ended = subscribe(port, "who inspects the lighthouse lamp", 3600);
    let expiring = subscribe(port, "ferry tickets", 2);
    // A second version for the kept one.
    post(port, vec![harbour(4, TOPICS[0][1])]);
    let before = settled(port, std::slice::from_ref(&kept)).remove(0);
    assert_eq!(before["latest"]["version"], 2, "{before}");
    let (status, _) = {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        write!(
            stream,
            "DELETE /v1/subscriptions/{ended} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )
        .expect("request");
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        (answer.split(' ').nth(1).unwrap_or_default().to_string(), ())
    };
    assert_eq!(status, "200");
    let files = dir.path().join("index").join("subscriptions");
    std::fs::write(files.join("broken.json"), "{not json").expect("a broken file");
    std::thread::sleep(Duration::from_secs(3));

    job.restart(1);
    job.wait_ready(Duration::from_secs(120));
    let port = job.http_port;
    let after = settled(port, std::slice::from_ref(&kept)).remove(0);
    assert_eq!(
        after["latest"]["version"], 2,
        "nothing moved across the restart: no new version ({after})"
    );
    assert_eq!(
        items(&after["latest"]["context"]),
        items(&before["latest"]["context"])
    );
    let one_shot = {
        let mut query = query_body("port", "when does the ferry leave");
        query["query_id"] = json!("one-shot");
        let (status, body) =
            http_post_json(port, "/v1/query", &query.to_string()).expect("answered");
        assert_eq!(status, 200, "{body}");
        serde_json::from_str::<Value>(&body).expect("JSON")
    };
    assert_eq!(items(&after["latest"]["context"]), items(&one_shot));
    for gone in [&ended, &expiring] {
        assert_eq!(
            http_get(port, &format!("/v1/subscriptions/{gone}")).map(|a| a.0),
            Some(404),
            "{gone} ended before the restart"
        );
        assert!(
            !files.join(format!("{gone}.json")).exists(),
            "{gone}'s file"
        );
    }
    assert!(files.join("broken.json").exists(), "left alone");
    assert!(
        job.log().contains("unreadable subscription file"),
        "named in the log"
    );

    // The next version is 3, and a stream resuming after 2 gets it.
    post(port, vec![harbour(5, TOPICS[0][2])]);
    let moved = settled(port, std::slice::from_ref(&kept)).remove(0);
    assert_eq!(moved["latest"]["version"], 3, "{moved}");
    let resumed = events(port, &kept, 2, 3);
    assert_eq!(resumed.len(), 1, "{resumed:?}");
    assert_eq!(resumed[0]["version"], 3);
    assert_eq!(
        items(&resumed[0]["context"]),
        items(&moved["latest"]["context"])
    );
    let fresh = subscribe(port, "pier piles rot", 3600);
    assert_ne!(fresh, kept, "a new id after the restart");
}

/// Standing queries over Kafka: a queries-topic event with a `standing` object subscribes; its
/// versions reach the contexts topic keyed by the subscription id, each with its number, watermark,
/// diff and full context; the same event read again subscribes once (its latest version comes
/// again); a document that moves the context publishes version 2; an end event ends it with a
/// tombstone; a bad `standing` object is dead-lettered with its value.
#[test]
fn standing_queries_over_kafka_publish_versions_keyed_by_subscription_and_end_with_a_tombstone() {
    use crate::common::broker::Broker;
    let broker = Broker::start();
    let (docs, queries, contexts, dlq) = ("s-docs", "s-queries", "s-contexts", "s-dlq");
    for topic in [docs, queries, contexts, dlq] {
        broker.create_topic(topic, 1);
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let config = crate::common::kafka_config(
        &broker.bootstrap(),
        &format!("documents_topic = \"{docs}\"\nqueries_topic = \"{queries}\"\ncontexts_topic = \"{contexts}\"\ndlq_topic = \"{dlq}\"\ngroup_id = \"standing-it\""),
        "[standing]\ndefault_min_interval_ms = 0\n",
    );
    let mut job = Job::start(dir.path(), &config, 1);
    job.wait_ready(Duration::from_secs(120));
    let document = |doc_id: &str, text: &str| {
        let value = json!({"op": "upsert", "tenant": "acme", "doc_id": doc_id, "version": 1, "source": format!("acme/{doc_id}"), "kind": "prose", "text": text});
        (
            format!("acme/{doc_id}"),
            Some(value.to_string().into_bytes()),
        )
    };
    broker.produce(
        docs,
        &[
            document("handbook", "To roll back a release, run deployctl rollback --to <version> from the ops bastion. A rollback takes about four minutes."),
            document("faq", "The cafeteria opens at eight. Coffee is free for employees and visitors."),
        ],
    );
    job.wait_indexed(2);
    let id = "acme-rollback";
    let subscribe = json!({"query_id": "q-1", "tenant": "acme", "text": "How do I roll back a release?", "token_budget": 300, "fill": true, "standing": {"subscription_id": id, "min_interval_ms": 0}});
    let bad = json!({"query_id": "q-bad", "tenant": "acme", "text": "x", "standing": {"subscription_id": "../etc"}});
    let record = |value: &Value| (id.to_string(), Some(value.to_string().into_bytes()));
    let mut other = subscribe.clone();
    other["text"] = json!("Where is the office?");
    broker.produce(
        queries,
        &[
            record(&subscribe),
            record(&bad),
            record(&subscribe),
            record(&other),
        ],
    );

    // The topic's records of the subscription, once `until` holds of them.
    let versions = |until: &dyn Fn(&[Option<Value>]) -> bool, least: usize| {
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut least = least;
        loop {
            let read: Vec<Option<Value>> = broker
                .read_all(contexts, least)
                .into_iter()
                .filter(|(key, _, _)| key.as_deref() == Some(id.as_bytes()))
                .map(|(_, value, _)| value.map(|v| serde_json::from_slice(&v).expect("JSON")))
                .collect();
            if until(&read) {
                return read;
            }
            least = read.len() + 1;
            assert!(Instant::now() < deadline, "contexts topic: {read:?}");
        }
    };
    let number = |value: &Option<Value>| value.as_ref().and_then(|v| v["version"].as_u64());
    let first = versions(&|read| read.len() >= 2, 2);
    assert!(
        first.iter().all(|v| number(v) == Some(1)),
        "the event read twice subscribes once: version 1 twice, {first:?}"
    );
    let first = first[0].clone().expect("a version");
    assert_eq!(first["subscription_id"], id);
    assert!(first["index_watermark"]["frontier_ms"].as_u64() > Some(0));
    assert_eq!(
        first["diff"]["added"].as_array().map(Vec::len),
        first["context"]["items"].as_array().map(Vec::len)
    );
    assert!(first["context"]["context"]
        .as_str()
        .is_some_and(|text| text.contains("deployctl rollback")));

    // A document that moves the context: version 2, with what it added.
    broker.produce(
        docs,
        &[document("runbook", "How to roll back a release in an emergency: log in to bastion-7 and run deployctl rollback --fast to roll back the release.")],
    );
    let moved = versions(&|read| read.iter().any(|v| number(v) == Some(2)), 3);
    let second = moved
        .iter()
        .flatten()
        .find(|v| v["version"] == 2)
        .expect("version 2");
    assert!(second["context"]["context"]
        .as_str()
        .is_some_and(|text| text.contains("bastion-7")));
    assert!(!second["diff"]["added"]
        .as_array()
        .expect("added")
        .is_empty());
    assert!(
        second["index_watermark"]["frontier_ms"].as_u64()
            >= first["index_watermark"]["frontier_ms"].as_u64()
    );
    // The same subscription over HTTP.
    let (status, body) =
        http_get(job.http_port, &format!("/v1/subscriptions/{id}")).expect("answered");
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).expect("JSON")["latest"]["version"],
        2
    );

    // Killed and started again: the subscription is taken back (still published to the topic),
    // and the next change publishes version 3.
    job.restart(1);
    job.wait_ready(Duration::from_secs(120));
    let (status, body) =
        http_get(job.http_port, &format!("/v1/subscriptions/{id}")).expect("answered");
    assert_eq!(status, 200, "taken back after the restart: {body}");
    broker.produce(
        docs,
        &[document("checklist", "Before you roll back a release, tell the on-call engineer and freeze the deploy queue: the rollback checklist.")],
    );
    let moved = versions(
        &|read| read.iter().any(|v| number(v) == Some(3)),
        moved.len() + 1,
    );
    let third = moved
        .iter()
        .flatten()
        .find(|v| v["version"] == 3)
        .expect("version 3");
    assert!(third["context"]["context"]
        .as_str()
        .is_some_and(|text| text.contains("checklist")));

    // An end event: a tombstone, and the subscription is gone.
    let end = json!({"query_id": "q-end", "tenant": "acme", "standing": {"subscription_id": id, "end": true}});
    broker.produce(queries, &[record(&end)]);
    let ended = versions(
        &|read| read.last().is_some_and(Option::is_none),
        moved.len() + 1,
    );
    assert!(ended.last().is_some_and(Option::is_none), "{ended:?}");
    assert_eq!(
        http_get(job.http_port, &format!("/v1/subscriptions/{id}")).map(|a| a.0),
        Some(404)
    );
    // The events and versions as their topic schemas describe them (a bad object fails).
    let case = crate::api::topic_case;
    crate::api::check_schemas(
        dir.path(),
        None,
        &[
            case(
                "standing-query",
                subscribe.clone(),
                "a subscribe event".into(),
                true,
            ),
            case("standing-query", end.clone(), "an end event".into(), true),
            case(
                "standing-query",
                json!({"tenant": "acme", "text": "x", "standing": {"subscription": 1}}),
                "a bad standing object".into(),
                false,
            ),
            case("standing-version", first.clone(), "version 1".into(), true),
            case("standing-version", second.clone(), "version 2".into(), true),
        ],
    );
    // Dead-lettered with their values: the bad object, and another query under the held id.
    let refused = broker.read_all(dlq, 2);
    assert_eq!(refused.len(), 2, "{refused:?}");
    for ((_, value, headers), event) in refused.iter().zip([&bad, &other]) {
        assert_eq!(value.as_deref(), Some(event.to_string().as_bytes()));
        assert!(headers
            .iter()
            .any(|(key, value)| key == "reason" && value == b"invalid_query"));
    }
    let error = refused[1].2.iter().find(|(key, _)| key == "error");
    assert!(
        error.is_some_and(
            |(_, message)| String::from_utf8_lossy(message).contains("held with another query")
        ),
        "{error:?}"
    );
}
