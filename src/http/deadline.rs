//! A connection whose writes must make progress: a client that stops reading its response (a zero
//! receive window) would otherwise hold its connection, and its slot among `http.max_connections`,
//! for as long as the kernel keeps probing, which is without end. hyper times out reading a
//! request's head, never writing a response; this wrapper does the second.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// `S` whose writes (and flushes) fail with `TimedOut` once one has waited `limit` without any
/// byte going out.
pub(super) struct WriteDeadline<S> {
    inner: S,
    limit: Duration,
    /// Armed while a write waits.
    waiting: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> WriteDeadline<S> {
    pub(super) fn new(inner: S, limit: Duration) -> Self {
        Self {
            inner,
            limit,
            waiting: None,
        }
    }

    /// `polled` as it came, arming the deadline while it is pending and failing once it passed.
    fn within<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.waiting = None;
            return polled;
        }
        let limit = self.limit;
        let waiting = self
            .waiting
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match waiting.as_mut().poll(cx) {
            Poll::Ready(()) => {
                self.waiting = None;
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the client read nothing of the response in time",
                )))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteDeadline<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.within(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.within(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.within(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.within(cx, polled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;

    /// A peer that never takes a byte (a client with a zero window) and never sends one.
    struct Stalled;

    impl AsyncRead for Stalled {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Poll::Pending
        }
    }

    impl AsyncWrite for Stalled {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &[u8],
        ) -> Poll<io::Result<usize>> {
            Poll::Pending
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[test]
    fn a_write_nobody_reads_fails_after_the_limit_and_reads_are_left_alone() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let mut stream = WriteDeadline::new(Stalled, Duration::from_millis(50));
            let started = tokio::time::Instant::now();
            let written = poll_fn(|cx| Pin::new(&mut stream).poll_write(cx, b"response")).await;
            let error = written.expect_err("timed out");
            assert_eq!(error.kind(), io::ErrorKind::TimedOut);
            assert!(started.elapsed() >= Duration::from_millis(50));
            // A read waits as long as the peer is silent (hyper's own head timeout bounds it).
            let mut buf = [0u8; 8];
            let read = tokio::time::timeout(
                Duration::from_millis(120),
                poll_fn(|cx| Pin::new(&mut stream).poll_read(cx, &mut ReadBuf::new(&mut buf))),
            )
            .await;
            assert!(read.is_err(), "no deadline on reads");
        });
    }
}
