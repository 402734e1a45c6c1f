//! A lingering close for client connections. A server that answers before it has
//! read the request body (a 413 for a body over the limit, a 401 before a body is
//! read) and then closes a socket with unread data in it makes the kernel reset
//! the connection, and a client still writing its body sees a broken pipe, never
//! the answer. So a connection's socket, once the HTTP layer is done with it, is
//! half-closed (the answer and a FIN go out) and what the client still sends is
//! read and thrown away until the client stops sending, for at most
//! [`LINGER_TIME`] in all and [`LINGER_IDLE`] without a byte, before it is
//! closed: the client finishes writing, then reads the answer, whatever the size
//! of the body it was writing (a byte count would cut a large body short, and the
//! client would see the reset after all).
//!
//! It must never hold memory per byte read, nor more than [`LINGERING_AT_ONCE`]
//! sockets; past that, a socket closes at once as before. What it costs is bounded
//! by time: at most [`LINGERING_AT_ONCE`] sockets read for at most
//! [`LINGER_TIME`] each.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

/// Longest a closing connection is read from: time for a client on a fast link to
/// finish writing a body of hundreds of megabytes.
pub const LINGER_TIME: Duration = Duration::from_secs(30);

/// Longest a closing connection is read from without a byte coming.
pub const LINGER_IDLE: Duration = Duration::from_secs(2);

/// Most connections lingering at once, each holding a file descriptor and a
/// 64 KiB buffer.
pub const LINGERING_AT_ONCE: usize = 64;

static LINGERING: Semaphore = Semaphore::const_new(LINGERING_AT_ONCE);

/// A client connection that lingers when dropped (see the module's comment).
pub struct Lingering {
    // `None` only once dropped.
    stream: Option<TcpStream>,
}

impl Lingering {
    pub fn new(stream: TcpStream) -> Lingering {
        Lingering {
            stream: Some(stream),
        }
    }

    fn stream(&mut self) -> io::Result<Pin<&mut TcpStream>> {
        self.stream
            .as_mut()
            .map(Pin::new)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotConnected))
    }
}

impl AsyncRead for Lingering {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.stream() {
            Ok(s) => s.poll_read(cx, buf),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

impl AsyncWrite for Lingering {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.stream() {
            Ok(s) => s.poll_write(cx, buf),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.stream() {
            Ok(s) => s.poll_write_vectored(cx, bufs),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.as_ref().is_some_and(|s| s.is_write_vectored())
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.stream() {
            Ok(s) => s.poll_flush(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.stream() {
            Ok(s) => s.poll_shutdown(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

impl Drop for Lingering {
    fn drop(&mut self) {
        let Some(mut stream) = self.stream.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let Ok(permit) = LINGERING.try_acquire() else {
            return;
        };
        runtime.spawn(async move {
            let _permit = permit;
            // The answer is out; the FIN tells the client nothing more comes.
            let _ = stream.shutdown().await;
            let mut sink = vec![0u8; 64 * 1024];
            let _ = tokio::time::timeout(LINGER_TIME, async {
                while let Ok(Ok(n)) =
                    tokio::time::timeout(LINGER_IDLE, stream.read(&mut sink)).await
                    && n > 0
                {}
            })
            .await;
        });
    }
}
