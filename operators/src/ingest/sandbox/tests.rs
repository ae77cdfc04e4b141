use super::*;
use ragstream_core::testing::hostile;

/// This test binary's own test that, started as a child, serves one request ([`child`]).
const CHILD: &str = "ingest::sandbox::tests::child";

/// Started by the sandbox with [`CHILD`] as its filter: answers one request as the binary's
/// `parse` mode does. Run any other way, it does nothing.
#[test]
#[ignore = "the child side of the sandbox tests, started by them"]
fn child() {
    if std::env::args().any(|arg| arg == CHILD) {
        std::process::exit(serve());
    }
}

/// A sandbox whose children are this test binary serving one request.
fn of_this_test(limits: SandboxLimits) -> Sandbox {
    let args = [
        CHILD,
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ];
    Sandbox::new(
        std::env::current_exe().expect("the test binary"),
        args.iter().map(|a| a.to_string()).collect(),
        limits,
    )
}

/// A sandbox whose children are `sh -c script`.
fn shell(script: &str, limits: SandboxLimits) -> Sandbox {
    Sandbox::new("/bin/sh".into(), vec!["-c".into(), script.into()], limits)
}

fn limits() -> ExtractLimits {
    ExtractLimits::for_documents(1 << 20)
}

fn refusal(sandbox: &Sandbox, kind: DocKind, bytes: &[u8]) -> String {
    match sandbox.read(kind, bytes, &ExtractLimits::for_documents(8 << 20)) {
        Ok(file) => panic!("read {} bytes of text", file.text.len()),
        Err(error) => error.message,
    }
}

#[test]
fn a_child_reads_a_file_as_the_job_would() {
    let sandbox = of_this_test(SandboxLimits::default());
    sandbox.check().expect("the test page");
    let page = b"<html><head><title>Runbook</title></head><body><h1>Roll back</h1><p>Run deployctl rollback.</p></body></html>";
    let read = sandbox.read(DocKind::Html, page, &limits()).expect("read");
    assert_eq!(
        read,
        extract::extract(DocKind::Html, page, &limits()).expect("in process")
    );
    assert_eq!(read.title.as_deref(), Some("Runbook"));
    let pdf = ragstream_core::testing::pdf_file(&["First page", "Second page"]);
    let read = sandbox.read(DocKind::Pdf, &pdf, &limits()).expect("read");
    assert_eq!(read.text, "First page\n\x0cSecond page\n");
    // A refusal of the parser comes back as it is.
    let refused = sandbox
        .read(DocKind::Pdf, b"%PDF-1.4 not really", &limits())
        .unwrap_err();
    assert_eq!(
        refused,
        extract::extract(DocKind::Pdf, b"%PDF-1.4 not really", &limits()).unwrap_err()
    );
}

#[test]
fn a_file_that_needs_too_much_memory_is_refused_and_named_so() {
    let sandbox = of_this_test(SandboxLimits {
        memory_mib: 768,
        ..SandboxLimits::default()
    });
    // 64 KiB on disk, 48 MiB of operators inflated: gigabytes parsed.
    let amplifying = hostile::pdf_amplifying_content(48 << 20);
    assert!(amplifying.len() < 256 << 10, "{} bytes", amplifying.len());
    let message = refusal(&sandbox, DocKind::Pdf, &amplifying);
    assert!(message.starts_with("memory limit"), "{message}");
    let copies = hostile::pdf_object_stream_copies(4000, 100_000);
    assert!(copies.len() < 1 << 20, "{} bytes", copies.len());
    let message = refusal(&sandbox, DocKind::Pdf, &copies);
    assert!(message.starts_with("memory limit"), "{message}");
}

#[test]
fn a_child_past_its_time_is_killed() {
    let wall = shell(
        "sleep 30",
        SandboxLimits {
            wall_secs: 1,
            cpu_secs: 1,
            ..SandboxLimits::default()
        },
    );
    let started = Instant::now();
    let message = refusal(&wall, DocKind::Html, b"<html>");
    assert!(
        message.starts_with("time limit: not read within 1 s"),
        "{message}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    let cpu = shell(
        "while :; do :; done",
        SandboxLimits {
            wall_secs: 30,
            cpu_secs: 1,
            ..SandboxLimits::default()
        },
    );
    let message = refusal(&cpu, DocKind::Html, b"<html>");
    assert!(
        message.starts_with("time limit: the parser used more than 1 s of CPU"),
        "{message}"
    );
}

#[test]
fn a_crash_or_an_endless_answer_is_a_refusal() {
    let crash = shell("kill -SEGV $$", SandboxLimits::default());
    let message = refusal(&crash, DocKind::Html, b"<html>");
    assert!(
        message.starts_with("crashed: the parser died of signal 11"),
        "{message}"
    );
    let silent = shell("cat >/dev/null; exit 0", SandboxLimits::default());
    assert_eq!(
        refusal(&silent, DocKind::Html, b"<html>"),
        "crashed: the parser gave no answer"
    );
    let endless = shell("cat >/dev/null; yes", SandboxLimits::default());
    let message = match endless.read(
        DocKind::Html,
        b"<html>",
        &ExtractLimits::for_documents(1000),
    ) {
        Ok(_) => panic!("an endless answer read"),
        Err(error) => error.message,
    };
    assert!(message.starts_with("output limit"), "{message}");
}

#[test]
fn a_child_holds_no_descriptor_of_the_job_and_opens_no_socket() {
    // A descriptor the job holds without close-on-exec (as a C library may open one).
    // SAFETY: duplicates standard error; closed below.
    let leaked = unsafe { libc::dup(2) };
    assert!(leaked > 2);
    let answer = |listing: &str| {
        format!(
            "cat >/dev/null; printf '\\nragstream-parse/1\\n{{\"text\": \"%s\"}}' \"$({listing})\""
        )
    };
    let descriptors = shell(
        &answer("ls /proc/self/fd | tr '\\n' ' '"),
        SandboxLimits::default(),
    )
    .read(DocKind::Html, b"<html>", &limits())
    .expect("listed");
    // SAFETY: the descriptor duplicated above.
    unsafe { libc::close(leaked) };
    let open: Vec<i32> = descriptors
        .text
        .split_whitespace()
        .filter_map(|fd| fd.parse().ok())
        .collect();
    // 0-2: the pipes; 3: the listing's own directory.
    assert!(
        open.iter().all(|fd| *fd <= 3),
        "open in the child: {open:?} (leaked {leaked})"
    );
    if std::path::Path::new("/usr/bin/python3").exists() {
        let socket = shell(
            &answer("python3 -c 'import socket; socket.socket()' 2>&1 | tail -n 1"),
            SandboxLimits::default(),
        )
        .read(DocKind::Html, b"<html>", &limits())
        .expect("answered");
        assert!(
            socket.text.contains("Operation not permitted"),
            "a socket in the child: {:?}",
            socket.text
        );
    }
}

#[test]
fn children_run_at_most_max_parallel_at_once() {
    // Each child writes when it started and ended (nanoseconds): one slot, no overlap.
    let sandbox = std::sync::Arc::new(shell(
        "cat >/dev/null; a=$(date +%s%N); sleep 0.2; b=$(date +%s%N); printf '\\nragstream-parse/1\\n{\"text\": \"%s %s\"}' $a $b",
        SandboxLimits {
            max_parallel: 1,
            ..SandboxLimits::default()
        },
    ));
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let sandbox = sandbox.clone();
            std::thread::spawn(move || {
                let read = sandbox
                    .read(DocKind::Html, b"<html>", &limits())
                    .expect("answered");
                let times: Vec<u128> = read
                    .text
                    .split_whitespace()
                    .map(|t| t.parse().expect("a time"))
                    .collect();
                (times[0], times[1])
            })
        })
        .collect();
    let mut spans: Vec<(u128, u128)> = threads
        .into_iter()
        .map(|t| t.join().expect("reader"))
        .collect();
    spans.sort();
    for pair in spans.windows(2) {
        assert!(pair[0].1 <= pair[1].0, "children overlapped: {spans:?}");
    }
}

#[test]
fn each_refusal_names_its_limit_and_counts_under_its_outcome() {
    for (error, prefix, outcome) in [
        (SandboxError::Memory(256), "memory limit", "memory_limit"),
        (SandboxError::Wall(1), "time limit", "time_limit"),
        (SandboxError::Cpu(1), "time limit", "time_limit"),
        (SandboxError::Output(10), "output limit", "output_limit"),
        (
            SandboxError::Crashed("signal 11".into()),
            "crashed",
            "crashed",
        ),
        (
            SandboxError::Refused("encrypted".into()),
            "encrypted",
            "refused",
        ),
        (
            SandboxError::CannotStart("no such file".into()),
            "the file sandbox cannot start",
            "refused",
        ),
    ] {
        assert!(error.to_string().starts_with(prefix), "{error}");
        assert_eq!(error.outcome(), outcome, "{error}");
        assert!(OUTCOMES.contains(&outcome));
    }
}
