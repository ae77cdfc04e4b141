//! Threads that run calls (a reranker's, a HyDE writer's), in arrival order, as many at once as there
//! are threads. Each call keeps its own [`Promise`](super::Promise).

use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};

/// A call the pool runs.
pub(crate) type Call = Box<dyn FnOnce() + Send>;

/// The pool's handle: dropping it closes the queue and the threads end once it is empty.
pub(crate) struct CallPool {
    jobs: Sender<Call>,
}

impl CallPool {
    /// Starts `threads` threads named `{name}-{index}`.
    pub(crate) fn new(name: &str, threads: usize) -> Self {
        let (jobs, queue) = channel::<Call>();
        let queue = Arc::new(Mutex::new(queue));
        for index in 0..threads.max(1) {
            let queue = queue.clone();
            std::thread::Builder::new()
                .name(format!("{name}-{index}"))
                .spawn(move || loop {
                    // The pool is dropped with its operator: the channel closes and the thread ends.
                    let next = super::lock(&queue).recv();
                    match next {
                        Ok(call) => call(),
                        Err(_) => break,
                    }
                })
                .expect("endpoint call thread starts");
        }
        Self { jobs }
    }

    /// Queues `call`; false when no thread is left to run it.
    pub(crate) fn run(&self, call: Call) -> bool {
        self.jobs.send(call).is_ok()
    }
}
