use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Answers `[text length, call number]`; records each call's texts; can be told to fail.
#[derive(Clone, Default)]
struct Scripted {
    calls: Arc<Mutex<Vec<Vec<String>>>>,
    /// Calls (by number) that fail as an outage.
    outages: Arc<Mutex<Vec<usize>>>,
    /// A text that makes a call fail for good.
    poison: Option<&'static str>,
    /// Holds each call this long.
    delay: Duration,
    /// Calls running now, and the most that ever ran at once.
    running: Arc<AtomicUsize>,
    most_running: Arc<AtomicUsize>,
    /// Calls without [`QUERY`] wait until this is opened (set to true).
    gate: Option<Arc<(Mutex<bool>, Condvar)>>,
    /// Per call: the thread's name and, on Linux, its nice value.
    callers: Arc<Mutex<Vec<Call>>>,
}

/// One call: the thread's name, its nice value and the texts.
type Call = (String, i32, Vec<String>);

const QUERY: &str = "the query";

fn open(gate: &(Mutex<bool>, Condvar)) {
    *lock(&gate.0) = true;
    gate.1.notify_all();
}

#[cfg(target_os = "linux")]
fn own_nice() -> i32 {
    // SAFETY: `gettid` has no preconditions; `getpriority` only reads the thread's nice value.
    unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
}
#[cfg(not(target_os = "linux"))]
fn own_nice() -> i32 {
    0
}

impl Embedder for Scripted {
    fn version(&self) -> &str {
        "scripted"
    }
    fn dimension(&self) -> usize {
        2
    }
    fn embed(&mut self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        lock(&self.callers).push((
            std::thread::current()
                .name()
                .unwrap_or_default()
                .to_string(),
            own_nice(),
            texts.iter().map(|t| t.to_string()).collect(),
        ));
        if let Some(gate) = self.gate.as_ref().filter(|_| !texts.contains(&QUERY)) {
            let mut open = lock(&gate.0);
            while !*open {
                open = gate.1.wait(open).unwrap_or_else(|e| e.into_inner());
            }
        }
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_running.fetch_max(now, Ordering::SeqCst);
        std::thread::sleep(self.delay);
        self.running.fetch_sub(1, Ordering::SeqCst);
        let mut calls = lock(&self.calls);
        let call = calls.len();
        calls.push(texts.iter().map(|t| t.to_string()).collect());
        if lock(&self.outages).contains(&call) {
            return Err(EmbedError::Unavailable("down".into()));
        }
        if let Some(poison) = self.poison {
            if texts.iter().any(|t| t.contains(poison)) {
                return Err(EmbedError::Refused("poison".into()));
            }
        }
        Ok(texts
            .iter()
            .map(|t| vec![t.len() as f32, call as f32])
            .collect())
    }
    fn last_token_count(&self) -> usize {
        0
    }
}

/// `count` executors of the same script (sharing its records).
fn instances(embedder: &Scripted, count: usize) -> Vec<Box<dyn Embedder>> {
    (0..count)
        .map(|_| Box::new(embedder.clone()) as Box<dyn Embedder>)
        .collect()
}

fn texts(lengths: &[usize]) -> Vec<String> {
    lengths.iter().map(|&n| "x".repeat(n)).collect()
}

fn config(slice: usize) -> ServiceConfig {
    ServiceConfig {
        slice_word_pieces: slice,
        query_batch: 8,
        query_executor: false,
        version_tag: None,
        query_headroom: None,
    }
}

#[test]
fn a_query_executor_answers_while_every_ingest_executor_is_busy() {
    let gate = Arc::new((Mutex::new(false), Condvar::new()));
    let embedder = Scripted {
        gate: Some(gate.clone()),
        ..Scripted::default()
    };
    let executors = instances(&embedder, 3);
    let service = InferenceService::start(
        executors,
        ServiceConfig {
            query_executor: true,
            ..config(1)
        },
    )
    .unwrap();
    let ingest = service.submit(texts(&[10; 6]), Priority::Ingest, &nobody());
    // Both ingest executors are inside a slice that cannot finish until the gate opens.
    while lock(&embedder.callers).len() < 2 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let (done, answered) = std::sync::mpsc::channel();
    let done = Mutex::new(done);
    let woken: Waker = Arc::new(move || {
        let _ = done.lock().unwrap().send(());
    });
    let query = service.submit(vec![QUERY.into()], Priority::Query, &woken);
    let waited = answered.recv_timeout(Duration::from_secs(10));
    open(&gate);
    assert!(waited.is_ok(), "the query was answered behind no slice");
    assert_eq!(query.try_take().unwrap().unwrap().vectors.len(), 1);
    assert_eq!(ingest.wait().unwrap().vectors.len(), 6);
    let callers = lock(&embedder.callers).clone();
    for (thread, nice, texts) in &callers {
        if texts.iter().any(|t| t == QUERY) {
            assert_eq!(thread, "ragstream-embed-query");
        } else {
            assert_ne!(
                thread, "ragstream-embed-query",
                "ingest ran on the query executor"
            );
            if cfg!(target_os = "linux") {
                assert!(
                    *nice >= crate::offload::HELPER_NICE,
                    "ingest at nice {nice}"
                );
            }
        }
    }
    assert_eq!(callers.len(), 7, "six slices of one text and the query");
}

#[test]
fn vectors_come_back_in_the_order_of_the_texts_embedded_in_slices_shortest_first() {
    let embedder = Scripted::default();
    let service = InferenceService::start(vec![Box::new(embedder.clone())], config(40)).unwrap();
    let lengths = [400, 8, 120, 40, 16, 200, 4];
    let result = service
        .embed_blocking(texts(&lengths), Priority::Ingest)
        .unwrap();
    let got: Vec<f32> = result.vectors.iter().map(|v| v[0]).collect();
    assert_eq!(got, lengths.iter().map(|&n| n as f32).collect::<Vec<_>>());
    let calls = lock(&embedder.calls).clone();
    let sizes: Vec<Vec<usize>> = calls
        .iter()
        .map(|c| c.iter().map(String::len).collect())
        .collect();
    // Estimated word pieces: len/4 + 2; slices of at most 40, or one text alone.
    assert_eq!(
        sizes,
        vec![vec![4, 8, 16, 40], vec![120], vec![200], vec![400]]
    );
}

/// [`Scripted`] pooling its spans: a span's vector is `[its length, -1]`, with no call of its own.
struct Pooling(Scripted);

impl Embedder for Pooling {
    fn version(&self) -> &str {
        "pooling"
    }
    fn dimension(&self) -> usize {
        2
    }
    fn embed(&mut self, texts: &[&str]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.0.embed(texts)
    }
    fn last_token_count(&self) -> usize {
        0
    }
    fn embed_spans(
        &mut self,
        texts: &[&str],
        spans: &[Spans],
    ) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut own = self.0.embed(texts)?.into_iter();
        let mut out = Vec::new();
        for index in 0..texts.len() {
            out.push(own.next().expect("one vector a text"));
            for range in spans.get(index).map_or(&[][..], Vec::as_slice) {
                out.push(vec![range.len() as f32, -1.0]);
            }
        }
        Ok(out)
    }
    fn pools_spans(&self) -> bool {
        true
    }
}

#[test]
fn spans_come_back_after_their_text_and_cost_a_slice_only_where_not_pooled() {
    let texts = || vec!["a".repeat(40), "b".repeat(80), "c".repeat(20)];
    let spans = || vec![vec![0..10, 10..30], Vec::new(), vec![5..9]];
    // Embedded alone, through an outage on the second slice: every text, then its spans' texts.
    let embedder = Scripted::default();
    lock(&embedder.outages).push(1);
    let service = InferenceService::start(vec![Box::new(embedder.clone())], config(40)).unwrap();
    let result = service
        .embed_blocking_spans(texts(), spans(), Priority::Ingest)
        .unwrap();
    let got: Vec<f32> = result.vectors.iter().map(|v| v[0]).collect();
    assert_eq!(got, vec![40.0, 10.0, 20.0, 80.0, 20.0, 4.0]);
    // Estimated word pieces, spans included: c 7 + 3, a 12 + 4 + 7, b 22: a slice of c and a (33),
    // then b alone (55 > 40), failed once and handed out again.
    let sizes: Vec<Vec<usize>> = lock(&embedder.calls)
        .iter()
        .map(|c| c.iter().map(String::len).collect())
        .collect();
    assert_eq!(sizes, vec![vec![20, 4, 40, 10, 20], vec![80], vec![80]]);
    // Pooled, the spans cost no model time: c (7) and a (12) fit a slice of 25 they would
    // overflow unpooled (10 + 23).
    let embedder = Scripted::default();
    let service = InferenceService::start(
        vec![Box::new(Pooling(embedder.clone())) as Box<dyn Embedder>],
        config(25),
    )
    .unwrap();
    let result = service
        .embed_blocking_spans(texts(), spans(), Priority::Ingest)
        .unwrap();
    let got: Vec<(f32, f32)> = result.vectors.iter().map(|v| (v[0], v[1])).collect();
    assert_eq!(
        got,
        vec![
            (40.0, 0.0),
            (10.0, -1.0),
            (20.0, -1.0),
            (80.0, 1.0),
            (20.0, 0.0),
            (4.0, -1.0)
        ]
    );
    let sizes: Vec<Vec<usize>> = lock(&embedder.calls)
        .iter()
        .map(|c| c.iter().map(String::len).collect())
        .collect();
    assert_eq!(sizes, vec![vec![20, 40], vec![80]]);
}

#[test]
fn a_query_submitted_during_ingest_runs_before_the_remaining_slices() {
    let embedder = Scripted {
        delay: Duration::from_millis(20),
        ..Scripted::default()
    };
    let service = InferenceService::start(vec![Box::new(embedder.clone())], config(1)).unwrap();
    let ingest = service.submit(texts(&[10; 20]), Priority::Ingest, &nobody());
    // Let the executor start on the ingest work.
    while lock(&embedder.calls).is_empty() {
        std::thread::sleep(Duration::from_millis(1));
    }
    let woken = Arc::new(AtomicUsize::new(0));
    let counter = woken.clone();
    let query = service
        .submit(
            vec!["the query".into()],
            Priority::Query,
            &(Arc::new(move || {
                counter.fetch_add(1, Ordering::SeqCst);
            }) as Waker),
        )
        .wait()
        .unwrap();
    // The waker runs right after the result is stored (and `wait` may return in between).
    let deadline = Instant::now() + Duration::from_secs(5);
    while woken.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(woken.load(Ordering::SeqCst), 1, "the waker ran once");
    let query_call = query.vectors[0][1] as usize;
    assert!(
        query_call <= 2,
        "the query waited behind {query_call} slices, not the whole ingest request"
    );
    assert_eq!(ingest.wait().unwrap().vectors.len(), 20);
}

#[test]
fn an_outage_pauses_ingest_but_queries_fail_fast_and_nothing_is_lost() {
    let embedder = Scripted::default();
    lock(&embedder.outages).extend([0, 1, 2]);
    let service = InferenceService::start(vec![Box::new(embedder.clone())], config(1000)).unwrap();
    let started = Instant::now();
    let ingest = service.submit(texts(&[3, 5, 7]), Priority::Ingest, &nobody());
    // Calls 0, 1 and 2 fail: backoff 100 + 200 + 400 ms. A query in between is tried once.
    std::thread::sleep(Duration::from_millis(150));
    let query = service.embed_blocking(vec!["q".into()], Priority::Query);
    assert!(
        matches!(query, Err(EmbedError::Unavailable(_))),
        "{query:?}"
    );
    let vectors = ingest.wait().unwrap().vectors;
    assert_eq!(
        vectors.iter().map(|v| v[0]).collect::<Vec<_>>(),
        vec![3.0, 5.0, 7.0]
    );
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "backed off"
    );
}

#[test]
fn a_refused_request_fails_whole_and_later_requests_go_on() {
    let embedder = Scripted {
        poison: Some("BAD"),
        ..Scripted::default()
    };
    let service = InferenceService::start(vec![Box::new(embedder)], config(1)).unwrap();
    let bad = service.submit(
        vec!["good".into(), "BAD one".into(), "fine".into()],
        Priority::Ingest,
        &nobody(),
    );
    let good = service.submit(vec!["later".into()], Priority::Ingest, &nobody());
    assert!(matches!(bad.wait(), Err(EmbedError::Refused(_))));
    assert_eq!(good.wait().unwrap().vectors[0][0], 5.0);
}

#[test]
fn several_executors_share_one_request() {
    let embedder = Scripted {
        delay: Duration::from_millis(5),
        ..Scripted::default()
    };
    let executors = instances(&embedder, 3);
    let service = InferenceService::start(executors, config(1)).unwrap();
    // The executors are waiting for work before it comes.
    std::thread::sleep(Duration::from_millis(50));
    let lengths: Vec<usize> = (1..=30).collect();
    let vectors = service
        .embed_blocking(texts(&lengths), Priority::Ingest)
        .unwrap()
        .vectors;
    assert_eq!(
        vectors.iter().map(|v| v[0] as usize).collect::<Vec<_>>(),
        lengths
    );
    assert_eq!(lock(&embedder.calls).len(), 30, "one text per slice");
    // One submit wakes one executor; the one that takes work wakes the next while work is left.
    assert_eq!(
        embedder.most_running.load(Ordering::SeqCst),
        3,
        "all three executors worked on the one request at once"
    );
}

/// A waker nobody listens to.
fn nobody() -> Waker {
    Arc::new(|| {})
}

#[test]
fn lanes_take_turns_so_a_long_request_delays_only_its_own_lane() {
    // One executor, a slice of one text, 20 ms a call: tenant a's 100 texts take 2 s alone.
    let embedder = Scripted {
        delay: Duration::from_millis(20),
        ..Scripted::default()
    };
    let calls = embedder.calls.clone();
    let service = InferenceService::start(vec![Box::new(embedder)], config(1)).unwrap();
    let long: Vec<String> = (0..100).map(|i| format!("a{i:03}")).collect();
    let a = service.submit_in_lane("a", long, Vec::new(), Priority::Ingest, &nobody());
    std::thread::sleep(Duration::from_millis(50));
    let b = service.submit_in_lane(
        "b",
        vec!["b0".into(), "b1".into()],
        Vec::new(),
        Priority::Ingest,
        &nobody(),
    );
    let started = std::time::Instant::now();
    b.wait().expect("b's vectors");
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "b waited {:?} behind a's request",
        started.elapsed()
    );
    assert!(!a.is_ready(), "a's request is still being embedded");
    // b's texts were taken in turn with a's, not after them.
    let order: Vec<String> = lock(&calls).iter().map(|call| call[0].clone()).collect();
    let b1 = order.iter().position(|t| t == "b1").expect("b1 embedded");
    assert!(
        order[..b1].iter().filter(|t| t.starts_with('a')).count() <= 6,
        "{order:?}"
    );
    a.wait().expect("a's vectors");
    // In one lane the same requests are first in, first out.
    let embedder = Scripted::default();
    let calls = embedder.calls.clone();
    let service = InferenceService::start(vec![Box::new(embedder)], config(1)).unwrap();
    let gate_a =
        service.submit_in_lane("", texts(&[3; 5]), Vec::new(), Priority::Ingest, &nobody());
    let then_b = service.submit_in_lane(
        "",
        vec!["bb".into()],
        Vec::new(),
        Priority::Ingest,
        &nobody(),
    );
    then_b.wait().unwrap();
    gate_a.wait().unwrap();
    let order: Vec<String> = lock(&calls).iter().map(|call| call[0].clone()).collect();
    assert_eq!(order.last().map(String::as_str), Some("bb"), "{order:?}");
}

#[test]
fn one_ingest_executor_sits_out_while_queries_come_and_all_run_once_they_stop() {
    let embedder = Scripted {
        delay: Duration::from_millis(5),
        ..Scripted::default()
    };
    let executors = instances(&embedder, 3);
    let window = Duration::from_millis(1500);
    let service = InferenceService::start(
        executors,
        ServiceConfig {
            query_executor: true,
            query_headroom: Some(window),
            ..config(1)
        },
    )
    .unwrap();
    // Most ingest calls at once while embedding 40 one-text slices (5 ms each).
    let most_at_once = || {
        embedder.most_running.store(0, Ordering::SeqCst);
        service
            .embed_blocking(texts(&[10; 40]), Priority::Ingest)
            .unwrap();
        embedder.most_running.load(Ordering::SeqCst)
    };
    assert_eq!(most_at_once(), 2, "no query yet: both ingest executors run");
    let asked = Instant::now();
    service
        .embed_blocking(vec![QUERY.into()], Priority::Query)
        .unwrap();
    let within = most_at_once();
    assert!(asked.elapsed() < window, "the slices ran within the window");
    assert_eq!(within, 1, "after a query one ingest executor sits out");
    std::thread::sleep(window.saturating_sub(asked.elapsed()) + Duration::from_millis(100));
    assert_eq!(most_at_once(), 2, "no query for the window: both run again");
}

#[test]
fn headroom_never_stops_a_lone_ingest_executor() {
    let embedder = Scripted::default();
    let executors = instances(&embedder, 2);
    let service = InferenceService::start(
        executors,
        ServiceConfig {
            query_executor: true,
            query_headroom: Some(Duration::from_secs(60)),
            ..config(1)
        },
    )
    .unwrap();
    service
        .embed_blocking(vec![QUERY.into()], Priority::Query)
        .unwrap();
    let started = Instant::now();
    let embedded = service
        .embed_blocking(texts(&[10; 4]), Priority::Ingest)
        .unwrap();
    assert_eq!(embedded.vectors.len(), 4);
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "ingest went on"
    );
}
