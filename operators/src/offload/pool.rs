//! Threads that run calls (a reranker's, a HyDE writer's, the HTTP server's document checks), in
//! arrival order, as many at once as there are threads. Each call delivers its own result (a
//! [`Promise`](super::Promise), a channel).

use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};

/// A call the pool runs.
pub type Call = Box<dyn FnOnce() + Send>;

/// The pool's handle: dropping it closes the queue and the threads end once it is empty.
pub struct CallPool {
    jobs: Sender<Call>,
}

impl CallPool {
    /// Starts `threads` threads named `{name}-{index}`.
    pub fn new(name: &str, threads: usize) -> Self {
        Self::start(name, threads, false)
    }

    /// [`Self::new`] with threads at [`HELPER_NICE`](super::HELPER_NICE) (Linux): work that must
    /// not take the cores from queries where they are short (parsing a large upload).
    pub fn lowered(name: &str, threads: usize) -> Self {
        Self::start(name, threads, true)
    }

    fn start(name: &str, threads: usize, lowered: bool) -> Self {
        let (jobs, queue) = channel::<Call>();
        let queue = Arc::new(Mutex::new(queue));
        for index in 0..threads.max(1) {
            let queue = queue.clone();
            std::thread::Builder::new()
                .name(format!("{name}-{index}"))
                .spawn(move || {
                    if lowered {
                        super::lower_priority();
                    }
                    loop {
                        // The pool is dropped with its owner: the channel closes and the thread ends.
                        let next = super::lock(&queue).recv();
                        match next {
                            Ok(call) => call(),
                            Err(_) => break,
                        }
                    }
                })
                .expect("endpoint call thread starts");
        }
        Self { jobs }
    }

    /// Queues `call`; false when no thread is left to run it.
    pub fn run(&self, call: Call) -> bool {
        self.jobs.send(call).is_ok()
    }
}
