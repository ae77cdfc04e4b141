//! Hostile clients against the real job on loopback: overflowing and oversized `Content-Length`,
//! slow heads and bodies on four times as many connections as the server has threads and more,
//! garbage bytes, deep JSON, every numeric query field at its extremes, a foreign `Host`, wrong and
//! cross-tenant tokens; at `POST /v1/documents` the same and files built to cost (an archive bomb, an
//! HTML page nested 400 000 deep). After each: the process is alive, `/healthz` answers within 100 ms
//! and a normal query is answered.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use base64::Engine as _;

use super::common::job::{http_post_json_with, Job};
use super::common::JSONL_SERVING;
use super::support::two_tenant_runbooks;
use serde_json::json;

const TOKEN: &str = "tok-hostile-8e1f2a93c4";
const ACME_TOKEN: &str = "tok-acme-hostile-47d0b1";
/// Connections held open at once by the slow-client cases: four times the 16 threads the former
/// server had, and more than the new one's runtime threads by far.
const SLOW_CONNECTIONS: usize = 64;

/// Sends `bytes` on a fresh connection and reads the answer (`None`: closed without one).
fn raw(port: u16, bytes: &[u8]) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .ok()?;
    stream.write_all(bytes).ok()?;
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    (!answer.is_empty()).then(|| String::from_utf8_lossy(&answer).into_owned())
}

fn status(answer: &Option<String>) -> Option<u16> {
    answer.as_ref()?.split_whitespace().nth(1)?.parse().ok()
}

/// The job is alive, `/healthz` answers within 100 ms (the best of three tries, on a shared
/// machine) and a normal query is answered with its context.
fn still_serving(job: &mut Job, after: &str) {
    assert!(job.running(), "the job died after {after}");
    let best = (0..3)
        .map(|_| {
            let started = Instant::now();
            let answer = raw(
                job.http_port,
                b"GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n",
            );
            assert_eq!(status(&answer), Some(200), "/healthz after {after}");
            started.elapsed()
        })
        .min()
        .expect("three tries");
    assert!(
        best <= Duration::from_millis(100),
        "/healthz took {best:?} after {after}"
    );
    let bearer = format!("Bearer {TOKEN}");
    let body = json!({"query_id": format!("normal-{after}"), "tenant": "acme", "text": "how to roll back"});
    let (code, answer) = http_post_json_with(
        job.http_port,
        "/v1/query",
        &body.to_string(),
        &[("Authorization", bearer.as_str())],
    )
    .unwrap_or_else(|| panic!("no answer to a normal query after {after}"));
    assert_eq!(code, 200, "a normal query after {after}: {answer}");
    assert!(answer.contains("deployctl rollback"), "{answer}");
    println!("FAULT hostile: {after}: alive, /healthz in {best:?}, a normal query answered");
}

/// Opens `count` connections that each send `head` and then nothing, and keeps them open.
fn hold_open(port: u16, count: usize, head: &[u8]) -> Vec<TcpStream> {
    (0..count)
        .filter_map(|_| {
            let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
            stream.write_all(head).ok()?;
            Some(stream)
        })
        .collect()
}

/// The server closes every one of `held` within 20 s (its head deadline is 2 s here).
fn closed_by_the_server(held: Vec<TcpStream>, what: &str) {
    let started = Instant::now();
    for mut stream in held {
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
    }
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{what} are closed by the head deadline"
    );
}

#[test]
fn hostile_clients_neither_stop_nor_stall_the_job() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("events.jsonl"), two_tenant_runbooks()).expect("events");
    let mut job = Job::start_with_env(
        dir.path(),
        &format!(
            "{}\n[http.tokens]\nRAGSTREAM_ACME_TOKEN = [\"acme\"]\n",
            JSONL_SERVING.replace(
                "listen = \"{http}\"",
                "listen = \"{http}\"\nread_timeout_secs = 2"
            )
        ),
        1,
        &[
            ("RAGSTREAM_QUERY_TOKEN", TOKEN),
            ("RAGSTREAM_ACME_TOKEN", ACME_TOKEN),
        ],
    );
    job.wait_ready(Duration::from_secs(120));
    job.wait_indexed(2);
    let port = job.http_port;
    still_serving(&mut job, "start");

    // A body announced far beyond memory, on an endpoint that reads none: answered, nothing allocated.
    let answer = raw(
        port,
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 4611686018427387904\r\n\r\n",
    );
    assert_eq!(status(&answer), Some(200), "{answer:?}");
    let answer = raw(
        port,
        b"POST /v1/query HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 4611686018427387904\r\n\r\n",
    );
    assert!(
        matches!(status(&answer), Some(401 | 413)),
        "an oversized body is refused before it is read: {answer:?}"
    );
    still_serving(&mut job, "a 4 EiB Content-Length");

    // Overflowing lengths, many times over.
    for _ in 0..32 {
        let answer = raw(
            port,
            b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 18446744073709551615\r\n\r\n",
        );
        assert!(
            matches!(status(&answer), None | Some(200 | 400 | 431)),
            "{answer:?}"
        );
        let answer = raw(
            port,
            b"POST /v1/query HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 18446744073709551616\r\n\r\n",
        );
        assert!(
            matches!(status(&answer), None | Some(400 | 431)),
            "{answer:?}"
        );
    }
    still_serving(&mut job, "32 overflowing Content-Lengths");

    // Heads announcing 100 000 bytes, over the body limit (twice 8 KiB): refused before any is read.
    let bearer = format!("Bearer {TOKEN}");
    let announced = |length: usize| {
        format!(
            "POST /v1/query HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {bearer}\r\nContent-Length: {length}\r\n\r\n{{\"query_id\":"
        )
    };
    for _ in 0..SLOW_CONNECTIONS {
        let answer = raw(port, announced(100_000).as_bytes());
        assert_eq!(status(&answer), Some(413), "{answer:?}");
    }
    // Slow bodies: heads announcing 10 000 bytes (within the limit), then nothing, on 64 connections.
    let slow_body = announced(10_000);
    let held = hold_open(port, SLOW_CONNECTIONS, slow_body.as_bytes());
    assert_eq!(held.len(), SLOW_CONNECTIONS);
    still_serving(&mut job, "64 slow bodies held open");
    // The body deadline (2 s here) answers them 408 and frees their slots.
    for mut stream in held {
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    }
    // Slow heads: a request line and half a header, then nothing.
    let held = hold_open(
        port,
        SLOW_CONNECTIONS,
        b"POST /v1/query HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ",
    );
    still_serving(&mut job, "64 slow heads held open");
    closed_by_the_server(held, "slow heads");
    // Silent connections: connected, nothing sent.
    let held = hold_open(port, SLOW_CONNECTIONS, b"");
    still_serving(&mut job, "64 silent connections held open");
    closed_by_the_server(held, "silent connections");

    // Garbage: random bytes, a binary request line, a huge header.
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..16 {
        let garbage: Vec<u8> = (0..4096)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect();
        let _ = raw(port, &garbage);
    }
    let _ = raw(port, b"\x00\xff\xfe GET / HTTP/9.9\r\n\r\n");
    let huge_header = format!(
        "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: {}\r\n\r\n",
        "a".repeat(1 << 20)
    );
    let answer = raw(port, huge_header.as_bytes());
    assert!(
        matches!(status(&answer), None | Some(400 | 431)),
        "{answer:?}"
    );
    still_serving(&mut job, "garbage bytes and a 1 MiB header");

    // Deep JSON and bodies over the limit.
    let post = |body: &str, headers: &[(&str, &str)]| {
        http_post_json_with(port, "/v1/query", body, headers).expect("an answer")
    };
    let auth = [("Authorization", bearer.as_str())];
    let (code, answer) = post(&"[".repeat(5_000), &auth);
    assert_eq!(code, 400, "{answer}");
    let deep = format!("{}1{}", "{\"a\":".repeat(1_000), "}".repeat(1_000));
    let (code, answer) = post(&deep, &auth);
    assert_eq!(code, 400, "{answer}");
    let (code, answer) = post(&"x".repeat(40_000), &auth);
    assert_eq!(code, 413, "{answer}");
    still_serving(&mut job, "deep JSON and oversized bodies");

    // The same at `POST /v1/documents` (bodies up to four times ingest.max_document_bytes, 32 MiB),
    // and files built to cost: an archive entry inflating past its bound (65 MiB of spaces in
    // 64 KiB), an HTML page nested 400 000 elements deep.
    let documents = |body: &[u8]| {
        let head = format!(
            "POST /v1/documents HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {bearer}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        let mut request = head.into_bytes();
        request.extend_from_slice(body);
        raw(port, &request)
    };
    let answer = raw(
        port,
        format!("POST /v1/documents HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {bearer}\r\nContent-Length: 40000000\r\n\r\n{{").as_bytes(),
    );
    assert_eq!(status(&answer), Some(413), "{answer:?}");
    let answer = documents(format!("{{\"documents\":{}", "[".repeat(5_000)).as_bytes());
    assert_eq!(status(&answer), Some(400), "{answer:?}");
    let slow = format!(
        "POST /v1/documents HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {bearer}\r\nContent-Length: 1000\r\n\r\n{{\"documents\":"
    );
    let held = hold_open(port, 4, slow.as_bytes());
    still_serving(&mut job, "slow document bodies held open");
    for mut stream in held {
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        assert!(
            answer.starts_with("HTTP/1.1 408") || answer.starts_with("HTTP/1.1 503"),
            "{answer}"
        );
    }
    let bomb = ragstream_core::testing::zip_file(&[("word/document.xml", &vec![b' '; 65 << 20])]);
    assert!(bomb.len() < 1 << 20, "{} bytes", bomb.len());
    let started = Instant::now();
    let event = json!({"documents": [{"tenant": "acme", "doc_id": "bomb.docx", "version": 1,
        "content_base64": base64::engine::general_purpose::STANDARD.encode(&bomb)}]});
    let answer = documents(event.to_string().as_bytes());
    assert_eq!(status(&answer), Some(422), "{answer:?}");
    assert!(
        answer
            .as_deref()
            .unwrap_or("")
            .contains("inflates past the limit"),
        "{answer:?}"
    );
    let deep_html = format!(
        "<html><body>{}<p>deep text</p>{}</body></html>",
        "<div>".repeat(400_000),
        "</div>".repeat(400_000)
    );
    let event = json!({"documents": [{"tenant": "acme", "doc_id": "deep.html", "version": 1,
        "text": deep_html}]});
    let answer = documents(event.to_string().as_bytes());
    assert_eq!(status(&answer), Some(200), "{answer:?}");
    println!(
        "FAULT hostile documents: a 40 MB announced body 413, 5000-deep JSON 400, 4 slow bodies \
         answered, a {} KiB DOCX inflating to 65 MiB refused 422, a 400000-deep HTML page \
         indexed; {:.1} s for both files",
        bomb.len() >> 10,
        started.elapsed().as_secs_f64()
    );
    still_serving(&mut job, "hostile documents");

    // Every numeric field at 0, negative, its maximum and beyond.
    for field in ["k", "token_budget", "context_window", "reserve_output"] {
        for value in [
            "0",
            "-1",
            "1000000",
            "4294967296",
            "18446744073709551615",
            "18446744073709551616",
            "1e308",
        ] {
            let mut body = format!(
                r#"{{"query_id":"n-{field}-{value}","tenant":"acme","text":"roll back","{field}":{value}"#
            );
            if field == "reserve_output" {
                body.push_str(r#","context_window":1000"#);
            }
            body.push('}');
            let (code, answer) = post(&body, &auth);
            assert!(
                matches!(code, 200 | 400),
                "{field} = {value}: {code} {answer}"
            );
        }
    }
    still_serving(&mut job, "numeric fields at their extremes");

    // A foreign Host (DNS rebinding) is refused on the data endpoints; health answers any.
    let foreign =
        "POST /v1/query HTTP/1.0\r\nHost: evil.example:9464\r\nContent-Length: 2\r\n\r\n{}";
    assert_eq!(status(&raw(port, foreign.as_bytes())), Some(403));
    let foreign = "GET /v1/invalidations HTTP/1.0\r\nHost: evil.example\r\n\r\n";
    assert_eq!(status(&raw(port, foreign.as_bytes())), Some(403));
    let probe = "GET /healthz HTTP/1.0\r\nHost: 10.1.2.3:9464\r\n\r\n";
    assert_eq!(status(&raw(port, probe.as_bytes())), Some(200));

    // Wrong and cross-tenant tokens.
    let body = json!({"query_id": "x", "tenant": "globex", "text": "roll back"}).to_string();
    let (code, _) = post(&body, &[("Authorization", "Bearer tok-hostile-8e1f2a93c5")]);
    assert_eq!(code, 401);
    let (code, _) = post(&body, &[("Authorization", &format!("Bearer {TOKEN}x"))]);
    assert_eq!(code, 401);
    let acme = format!("Bearer {ACME_TOKEN}");
    let (code, answer) = post(&body, &[("Authorization", acme.as_str())]);
    assert_eq!(code, 403, "{answer}");
    assert!(!answer.contains("shipit"), "{answer}");
    still_serving(&mut job, "foreign hosts and wrong tokens");

    let metrics = job.metrics();
    assert!(metrics.contains("ragstream_"), "metrics still served");
    job.stop();
}
