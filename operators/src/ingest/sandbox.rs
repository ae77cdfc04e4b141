//! Sandbox: files (HTML, PDF, DOCX) read in a child process under hard limits, never in the job.
//!
//! The parsers are third-party code over hostile bytes: a crafted PDF of a few kilobytes can make
//! one allocate gigabytes, an HTML page can cost minutes of CPU. Each file is therefore read by a
//! fresh child process (the job's own binary in its `parse` mode, [`serve`]) that holds nothing but
//! the file and dies after it. [`Sandbox`] starts it and waits for it off the dataflow workers.
//!
//! # Guarantees
//! - The child runs under `RLIMIT_AS` (address space, [`SandboxLimits::memory_mib`]), `RLIMIT_CPU`
//!   ([`SandboxLimits::cpu_secs`]), no core dump, no file writes, at most 64 descriptors, every
//!   inherited descriptor but its three pipes closed at exec, at a lower CPU priority than the
//!   job's workers, and is killed with the job. On Linux a seccomp filter refuses `socket(2)`: it
//!   reaches no network.
//! - The parent kills a child still running after [`SandboxLimits::wall_secs`], or one whose answer
//!   outgrows the text limit, and reads at most 8 KiB of its standard error.
//! - A child that failed is a refusal naming why: `memory limit`, `time limit`, `output limit` or
//!   `crashed`; the job's own memory does not move with the file.
//! - At most [`SandboxLimits::max_parallel`] children run at once; a reader waits for a slot.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::ingest::extract::{self, ExtractError, ExtractLimits, Extracted, FileReader};
use crate::model::DocKind;
use crate::offload::lock;

/// Where a child's answer begins on its standard output (anything before it is not the answer).
const ANSWER: &[u8] = b"\nragstream-parse/1\n";
/// Bytes of a child's standard error kept for its refusal's message.
const STDERR_KEPT: usize = 8 << 10;
/// The nice value of a child: below the workers' (0) and the helper threads' ([`crate::offload::HELPER_NICE`]).
const CHILD_NICE: i32 = 10;

/// The outcomes of a read (the `outcome` label of `ragstream_sandbox_reads_total`).
pub const OUTCOMES: [&str; 6] = [
    "read",
    "refused",
    "memory_limit",
    "time_limit",
    "output_limit",
    "crashed",
];

/// Why the sandbox read no text from a file: the message of the file's refusal (and DLQ record),
/// and the `outcome` label of `ragstream_sandbox_reads_total` ([`SandboxError::outcome`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SandboxError {
    /// No child could be started.
    #[error("the file sandbox cannot start: {0}")]
    CannotStart(String),
    /// The child ran out of address space.
    #[error("memory limit: the parser needed more than {0} MiB")]
    Memory(u64),
    /// No answer within the wall-clock limit (seconds).
    #[error("time limit: not read within {0} s")]
    Wall(u64),
    /// The child used its CPU time (seconds).
    #[error("time limit: the parser used more than {0} s of CPU")]
    Cpu(u64),
    /// The child's answer outgrew the text limit (bytes).
    #[error("output limit: the parser's answer exceeds {0} bytes")]
    Output(usize),
    /// The child died or answered nonsense.
    #[error("crashed: {0}")]
    Crashed(String),
    /// The parser read the file and refused it (not a PDF, encrypted, no text…).
    #[error("{0}")]
    Refused(String),
}

impl SandboxError {
    /// The `outcome` label of this refusal (one of [`OUTCOMES`]).
    pub fn outcome(&self) -> &'static str {
        match self {
            SandboxError::Memory(_) => "memory_limit",
            SandboxError::Wall(_) | SandboxError::Cpu(_) => "time_limit",
            SandboxError::Output(_) => "output_limit",
            SandboxError::Crashed(_) => "crashed",
            SandboxError::CannotStart(_) | SandboxError::Refused(_) => "refused",
        }
    }
}

/// Limits of one child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SandboxLimits {
    /// Address space of the child, in MiB (its binary's mappings included).
    pub memory_mib: u64,
    /// CPU time of the child, in seconds.
    pub cpu_secs: u64,
    /// Time from start to answer, in seconds.
    pub wall_secs: u64,
    /// Children at once.
    pub max_parallel: usize,
}

impl Default for SandboxLimits {
    fn default() -> Self {
        Self {
            memory_mib: 1024,
            cpu_secs: 20,
            wall_secs: 30,
            max_parallel: 2,
        }
    }
}

/// Reads files in child processes (see the module's guarantees).
#[derive(Debug)]
pub struct Sandbox {
    program: PathBuf,
    args: Vec<String>,
    limits: SandboxLimits,
    running: Mutex<usize>,
    freed: Condvar,
}

impl Sandbox {
    /// A sandbox that starts `program` with `args` for each file; the program speaks [`serve`]'s
    /// protocol (the job: its own binary with `parse`).
    pub fn new(program: PathBuf, args: Vec<String>, limits: SandboxLimits) -> Self {
        Self {
            program,
            args,
            limits: SandboxLimits {
                max_parallel: limits.max_parallel.max(1),
                ..limits
            },
            running: Mutex::new(0),
            freed: Condvar::new(),
        }
    }

    /// The running binary in its `parse` mode.
    pub fn of_this_binary(limits: SandboxLimits) -> std::io::Result<Self> {
        Ok(Self::new(
            std::env::current_exe()?,
            vec!["parse".into()],
            limits,
        ))
    }

    /// Reads a small HTML page: whether children start and answer here (checked at the job's start,
    /// so a platform that cannot run them stops the job with the reason instead of refusing every
    /// file).
    pub fn check(&self) -> Result<(), String> {
        let page = b"<html><body><p>sandbox check</p></body></html>";
        let limits = ExtractLimits::for_documents(1 << 20);
        match self.read(DocKind::Html, page, &limits) {
            Ok(extracted) if extracted.text.contains("sandbox check") => Ok(()),
            Ok(extracted) => Err(format!(
                "the file sandbox answered {:?} for a test page",
                extracted.text
            )),
            Err(error) => Err(format!(
                "the file sandbox ({} {}) cannot read a test page: {}",
                self.program.display(),
                self.args.join(" "),
                error.message
            )),
        }
    }

    fn acquire(&self) -> Slot<'_> {
        let mut running = lock(&self.running);
        while *running >= self.limits.max_parallel {
            running = self.freed.wait(running).unwrap_or_else(|e| e.into_inner());
        }
        *running += 1;
        Slot(self)
    }

    fn command(&self) -> Command {
        let mut command = Command::new(&self.program);
        command
            .args(&self.args)
            .env_clear()
            // mimalloc reserves address space in large arenas unless told otherwise; under
            // RLIMIT_AS that reservation alone could fail.
            .env("MIMALLOC_ARENA_RESERVE", "16MiB")
            .env("RUST_BACKTRACE", "0")
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let limits = self.limits;
        #[cfg(unix)]
        {
            use std::os::unix::process::CommandExt as _;
            // A group of its own: a kill reaches whatever it started too.
            command.process_group(0);
            // SAFETY: the closure runs in the child between fork and exec and calls only
            // async-signal-safe functions (setrlimit, setpriority, prctl, syscall, fcntl), allocating
            // nothing.
            unsafe {
                command.pre_exec(move || confine(limits));
            }
        }
        command
    }

    fn run(
        &self,
        kind: DocKind,
        bytes: &[u8],
        limits: &ExtractLimits,
    ) -> Result<Extracted, SandboxError> {
        let _slot = self.acquire();
        let started = Instant::now();
        let mut child = self
            .command()
            .spawn()
            .map_err(|error| SandboxError::CannotStart(error.to_string()))?;
        let header = serde_json::json!({
            "kind": kind.as_str(),
            "max_text_bytes": limits.max_text_bytes,
            "max_inflated_bytes": limits.max_inflated_bytes,
            "max_pages": limits.max_pages,
        });
        let mut stdin = child.stdin.take().expect("piped");
        let mut stdout = child.stdout.take().expect("piped");
        let mut stderr = child.stderr.take().expect("piped");
        // The answer: the text (JSON escapes at most six bytes a byte) and the title.
        let most = limits
            .max_text_bytes
            .saturating_mul(6)
            .saturating_add(64 << 10);
        let outcome = std::thread::scope(|scope| {
            scope.spawn(move || {
                // A child that stopped reading (it died) makes this fail: its status tells why.
                let _ = stdin
                    .write_all(header.to_string().as_bytes())
                    .and_then(|()| stdin.write_all(b"\n"))
                    .and_then(|()| stdin.write_all(bytes));
            });
            let errors = scope.spawn(move || {
                let (kept, _) = read_at_most(&mut stderr, STDERR_KEPT);
                // The rest is read and dropped: a child blocked on a full pipe would only wait out
                // its time.
                let _ = std::io::copy(&mut stderr, &mut std::io::sink());
                kept
            });
            let pid = child.id();
            let answer = scope.spawn(move || {
                let (answer, over) = read_at_most(&mut stdout, most);
                if over {
                    kill(pid);
                }
                (answer, over)
            });
            let status = wait_until(
                &mut child,
                started + Duration::from_secs(self.limits.wall_secs),
            );
            let (answer, over) = answer.join().unwrap_or_default();
            let errors = errors.join().unwrap_or_default();
            (status, answer, over, errors)
        });
        let (status, answer, over, errors) = outcome;
        let status = match status {
            Some(status) => status,
            None => return Err(SandboxError::Wall(self.limits.wall_secs)),
        };
        if over {
            return Err(SandboxError::Output(most));
        }
        if !status.success() {
            return Err(self.failure(status, &errors));
        }
        let Some(at) = memchr::memmem::find(&answer, ANSWER) else {
            return Err(SandboxError::Crashed("the parser gave no answer".into()));
        };
        decode_answer(&answer[at + ANSWER.len()..])
    }

    /// Why a child that did not exit 0 failed.
    fn failure(&self, status: ExitStatus, errors: &[u8]) -> SandboxError {
        let errors = String::from_utf8_lossy(errors);
        let last = errors
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        let last: String = last.chars().take(300).collect();
        let signal = signal_of(&status);
        if errors.contains("memory allocation of") || errors.contains("out of memory") {
            return SandboxError::Memory(self.limits.memory_mib);
        }
        if matches!(signal, Some(libc::SIGXCPU) | Some(libc::SIGKILL)) {
            return SandboxError::Cpu(self.limits.cpu_secs);
        }
        let how = match signal {
            Some(signal) => format!("the parser died of signal {signal} {last}"),
            None => format!("the parser exited with {status} {last}"),
        };
        SandboxError::Crashed(how.trim_end().to_string())
    }
}

impl FileReader for Sandbox {
    fn read(
        &self,
        kind: DocKind,
        bytes: &[u8],
        limits: &ExtractLimits,
    ) -> Result<Extracted, ExtractError> {
        let outcome = self.run(kind, bytes, limits);
        if let Err(message) = &outcome {
            tracing::info!(format = kind.as_str(), bytes = bytes.len(), %message, "file refused by the sandbox");
        }
        crate::metrics::metrics()
            .sandbox_reads
            .with_label_values(&[outcome
                .as_ref()
                .map_or_else(SandboxError::outcome, |_| "read")])
            .inc();
        outcome.map_err(|error| ExtractError::new(kind, error.to_string()))
    }
}

/// A running child's place among [`SandboxLimits::max_parallel`].
struct Slot<'a>(&'a Sandbox);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        *lock(&self.0.running) -= 1;
        self.0.freed.notify_one();
    }
}

/// Reads up to `most` bytes; stops at the first read past them (true: there was more).
fn read_at_most(reader: &mut impl Read, most: usize) -> (Vec<u8>, bool) {
    let mut kept = Vec::new();
    let mut buffer = [0u8; 64 << 10];
    loop {
        match reader.read(&mut buffer) {
            Ok(0) => return (kept, false),
            Ok(read) => {
                if kept.len().saturating_add(read) > most {
                    return (kept, true);
                }
                kept.extend_from_slice(&buffer[..read]);
            }
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return (kept, false),
        }
    }
}

/// Waits for the child until `deadline`; past it, kills it (`None`).
fn wait_until(child: &mut Child, deadline: Instant) -> Option<ExitStatus> {
    let mut pause = Duration::from_millis(1);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() >= deadline => {
                kill(child.id());
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            Ok(None) => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(20));
            }
            Err(_) => {
                kill(child.id());
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

/// Kills a child's process group (the child leads it).
fn kill(pid: u32) {
    #[cfg(unix)]
    // SAFETY: signals the group of the child this sandbox started and has not reaped yet (its pid,
    // and so its group's id, is not reused before `wait`).
    unsafe {
        libc::kill(-(pid as libc::pid_t), libc::SIGKILL);
    }
}

fn signal_of(status: &ExitStatus) -> Option<i32> {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt as _;
        status.signal()
    }
    #[cfg(not(unix))]
    {
        let _ = status;
        None
    }
}

fn decode_answer(json: &[u8]) -> Result<Extracted, SandboxError> {
    let answer: serde_json::Value = serde_json::from_slice(json).map_err(|error| {
        SandboxError::Crashed(format!("the parser's answer is not JSON: {error}"))
    })?;
    if let Some(error) = answer.get("error").and_then(|e| e.as_str()) {
        return Err(SandboxError::Refused(error.to_string()));
    }
    let text = answer
        .get("text")
        .and_then(|t| t.as_str())
        .ok_or_else(|| SandboxError::Crashed("the parser's answer has no text".into()))?
        .to_string();
    let title = answer
        .get("title")
        .and_then(|t| t.as_str())
        .map(str::to_string);
    Ok(Extracted { text, title })
}

/// Applies the limits to the child (between fork and exec).
#[cfg(unix)]
fn confine(limits: SandboxLimits) -> std::io::Result<()> {
    let set = |resource, soft: u64, hard: u64| -> std::io::Result<()> {
        let limit = libc::rlimit {
            rlim_cur: soft as libc::rlim_t,
            rlim_max: hard as libc::rlim_t,
        };
        // SAFETY: setrlimit reads the struct it is given.
        if unsafe { libc::setrlimit(resource, &limit) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    };
    let memory = limits.memory_mib.saturating_mul(1 << 20);
    set(libc::RLIMIT_AS, memory, memory)?;
    // SIGXCPU at the soft limit, SIGKILL a second later.
    set(
        libc::RLIMIT_CPU,
        limits.cpu_secs.max(1),
        limits.cpu_secs.max(1).saturating_add(1),
    )?;
    set(libc::RLIMIT_CORE, 0, 0)?;
    set(libc::RLIMIT_FSIZE, 0, 0)?;
    set(libc::RLIMIT_NOFILE, 64, 64)?;
    // SAFETY: lowers this (child) process's own priority.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, CHILD_NICE);
    }
    #[cfg(target_os = "linux")]
    linux::confine()?;
    Ok(())
}

#[cfg(target_os = "linux")]
mod linux {
    /// `AUDIT_ARCH_*` of the architectures the filter knows (linux/audit.h).
    #[cfg(target_arch = "x86_64")]
    const AUDIT_ARCH: u32 = 0xC000_003E;
    #[cfg(target_arch = "aarch64")]
    const AUDIT_ARCH: u32 = 0xC000_00B7;

    /// Dies with the parent, closes every descriptor but the pipes at exec, refuses `socket(2)`.
    pub(super) fn confine() -> std::io::Result<()> {
        // SAFETY: each call passes constants or pointers to locals that outlive it.
        unsafe {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Every descriptor above the three pipes closes at exec (a library's descriptor opened
            // without O_CLOEXEC included).
            if libc::syscall(
                libc::SYS_close_range,
                3u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            ) != 0
            {
                for fd in 3..1024 {
                    libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
                }
            }
            no_sockets()
        }
    }

    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    unsafe fn no_sockets() -> std::io::Result<()> {
        use libc::{
            sock_filter, sock_fprog, BPF_ABS, BPF_JEQ, BPF_JMP, BPF_K, BPF_LD, BPF_RET, BPF_W,
        };
        let statement = |code: u32, k: u32| sock_filter {
            code: code as u16,
            jt: 0,
            jf: 0,
            k,
        };
        let jump = |k: u32, jt: u8, jf: u8| sock_filter {
            code: (BPF_JMP | BPF_JEQ | BPF_K) as u16,
            jt,
            jf,
            k,
        };
        // seccomp_data: nr at offset 0, arch at 4.
        let program = [
            statement(BPF_LD | BPF_W | BPF_ABS, 4),
            jump(AUDIT_ARCH, 1, 0),
            statement(BPF_RET | BPF_K, libc::SECCOMP_RET_KILL_PROCESS),
            statement(BPF_LD | BPF_W | BPF_ABS, 0),
            jump(libc::SYS_socket as u32, 0, 1),
            statement(
                BPF_RET | BPF_K,
                libc::SECCOMP_RET_ERRNO | (libc::EPERM as u32),
            ),
            statement(BPF_RET | BPF_K, libc::SECCOMP_RET_ALLOW),
        ];
        let filter = sock_fprog {
            len: program.len() as u16,
            filter: program.as_ptr() as *mut sock_filter,
        };
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
            || libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &filter as *const sock_fprog,
            ) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    unsafe fn no_sockets() -> std::io::Result<()> {
        Ok(())
    }
}

/// The child's side (the binary's `parse` mode): reads one request from standard input (a JSON
/// line of the format and limits, then the file's bytes), extracts it in this process and writes
/// the answer (`{"text", "title"}` or `{"error"}`) after a marker on standard output. Returns the
/// exit status.
pub fn serve() -> i32 {
    let mut input = Vec::new();
    if std::io::stdin().lock().read_to_end(&mut input).is_err() {
        return 2;
    }
    let Some(newline) = memchr::memchr(b'\n', &input) else {
        return 2;
    };
    let answer = match request(&input[..newline]) {
        Ok((kind, limits)) => match extract::extract(kind, &input[newline + 1..], &limits) {
            Ok(file) => serde_json::json!({"text": file.text, "title": file.title}),
            Err(error) => serde_json::json!({"error": error.message}),
        },
        Err(error) => serde_json::json!({"error": error}),
    };
    drop(input);
    let mut stdout = std::io::stdout().lock();
    let written = stdout
        .write_all(ANSWER)
        .and_then(|()| serde_json::to_writer(&mut stdout, &answer).map_err(Into::into))
        .and_then(|()| stdout.flush());
    if written.is_ok() {
        0
    } else {
        2
    }
}

fn request(header: &[u8]) -> Result<(DocKind, ExtractLimits), String> {
    let header: serde_json::Value =
        serde_json::from_slice(header).map_err(|e| format!("bad request: {e}"))?;
    let number = |name: &str| {
        header
            .get(name)
            .and_then(|n| n.as_u64())
            .map(|n| n as usize)
            .ok_or_else(|| format!("bad request: no {name}"))
    };
    let kind = header
        .get("kind")
        .and_then(|k| k.as_str())
        .and_then(DocKind::parse)
        .filter(|kind| extract::is_file_kind(*kind))
        .ok_or("bad request: no file kind")?;
    Ok((
        kind,
        ExtractLimits {
            max_text_bytes: number("max_text_bytes")?,
            max_inflated_bytes: number("max_inflated_bytes")?,
            max_pages: number("max_pages")?,
        },
    ))
}

#[cfg(all(test, target_os = "linux"))]
mod tests;
