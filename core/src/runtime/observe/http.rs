//! A small, bounded HTTP/1.1 server for the metrics endpoint.
//!
//! Why not a server crate: the candidates that run without an async
//! runtime (tiny_http, and rouille on top of it) read request header lines
//! without a size limit, set no socket timeouts, and start a thread per
//! connection, so a client that sends a huge header or never finishes its
//! request holds memory or a thread for as long as it likes. The endpoint
//! must never cost the job anything, so this one is written down to its
//! bounds; `httparse` (the parser under hyper) reads the request head.
//!
//! The contract:
//!
//! - One accept thread and [`HANDLERS`] handler threads, all started once;
//!   accepted connections wait in a queue of [`QUEUE`] entries, and a
//!   connection that finds the queue full is closed at once.
//! - One request per connection (`Connection: close`); only `GET` (and
//!   `HEAD`) are served.
//! - A request head larger than [`MAX_HEAD`] bytes is answered with 431;
//!   a client that has not sent its whole head within [`HEAD_DEADLINE`],
//!   or does not take the response within [`WRITE_TIMEOUT`], is dropped.
//! - No thread here ever touches a worker's data except through the
//!   atomics and short locks of [`crate::JobHandle::metrics`].

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::cpu::{self, CpuMeter};

/// Threads answering requests: two, so that one slow client never keeps a
/// scrape waiting longer than [`HEAD_DEADLINE`].
pub(crate) const HANDLERS: usize = 2;
/// Accepted connections waiting for a handler; more are closed at once.
pub(crate) const QUEUE: usize = 16;
/// Largest request head accepted (8 KiB, what common servers allow).
pub(crate) const MAX_HEAD: usize = 8 * 1024;
/// Time a client has to send its whole request head.
pub(crate) const HEAD_DEADLINE: Duration = Duration::from_secs(2);
/// Time a client has to take each part of the response.
pub(crate) const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// An answer to a request.
pub(crate) struct Response {
    pub(crate) status: u16,
    pub(crate) content_type: &'static str,
    pub(crate) body: Vec<u8>,
}

impl Response {
    pub(crate) fn text(status: u16, body: &str) -> Self {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.as_bytes().to_vec(),
        }
    }
}

/// Maps a request path (without the query) to a response.
pub(crate) type Handler = Arc<dyn Fn(&str) -> Response + Send + Sync>;

/// The running server; dropping it stops its threads.
pub(crate) struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Server {
    /// Listens on `addr` and serves `handler` until dropped.
    pub(crate) fn start(addr: SocketAddr, handler: Handler, cpu: CpuMeter) -> std::io::Result<Server> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::sync_channel::<TcpStream>(QUEUE);
        let rx = Arc::new(Mutex::new(rx));
        let mut threads = Vec::with_capacity(HANDLERS + 1);
        for i in 0..HANDLERS {
            let rx = Arc::clone(&rx);
            let h = Arc::clone(&handler);
            let meter = cpu.clone();
            let t = thread::Builder::new()
                .name(format!("weir-metrics-{i}"))
                .spawn(move || handle_loop(&rx, &h, &meter));
            match t {
                Ok(t) => threads.push(t),
                Err(e) => {
                    drop(tx);
                    for t in threads {
                        let _ = t.join();
                    }
                    return Err(e);
                }
            }
        }
        let s = Arc::clone(&stop);
        let accept = thread::Builder::new()
            .name("weir-metrics-accept".into())
            .spawn(move || accept_loop(&listener, &tx, &s, &cpu));
        match accept {
            Ok(t) => threads.push(t),
            Err(e) => {
                // The handlers end when the sender (moved into the failed
                // closure, now dropped) is gone.
                for t in threads {
                    let _ = t.join();
                }
                return Err(e);
            }
        }
        Ok(Server { addr, stop, threads })
    }

    /// The address it listens on (with the port chosen, for port 0).
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wakes the accept thread out of `accept`; it sees `stop` and ends,
        // dropping the queue's sender, which ends the handlers.
        let _ = TcpStream::connect_timeout(&wake_addr(self.addr), Duration::from_secs(1));
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Where to connect to wake a listener on `addr` (an unspecified address
/// is reached through loopback).
fn wake_addr(addr: SocketAddr) -> SocketAddr {
    let mut a = addr;
    if a.ip().is_unspecified() {
        a.set_ip(match a {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    a
}

fn accept_loop(listener: &TcpListener, tx: &SyncSender<TcpStream>, stop: &AtomicBool, cpu: &CpuMeter) {
    let mut last = cpu::thread_cpu_ns();
    for conn in listener.incoming() {
        // What accepting the last connection cost (waiting in `accept` is
        // not CPU time).
        let now = cpu::thread_cpu_ns();
        cpu.add(now.saturating_sub(last));
        last = now;
        if stop.load(Ordering::Acquire) {
            return;
        }
        let Ok(stream) = conn else {
            // Out of file descriptors, say: back off instead of spinning.
            thread::sleep(Duration::from_millis(10));
            continue;
        };
        match tx.try_send(stream) {
            Ok(()) => {}
            // Too many waiting: closing is the bounded answer.
            Err(TrySendError::Full(s)) => drop(s),
            Err(TrySendError::Disconnected(_)) => return,
        }
    }
}

fn handle_loop(rx: &Mutex<Receiver<TcpStream>>, handler: &Handler, cpu: &CpuMeter) {
    loop {
        let next = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
        let Ok(stream) = next else { return };
        // Errors are the client's (timeouts, resets): nothing to do.
        let _ = cpu.track(|| serve(stream, handler));
    }
}

/// Reads one request head within the bounds and answers it.
fn serve(mut stream: TcpStream, handler: &Handler) -> std::io::Result<()> {
    stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
    let _ = stream.set_nodelay(true);
    let mut buf = [0u8; MAX_HEAD];
    let mut len = 0;
    let deadline = Instant::now() + HEAD_DEADLINE;
    let (method, path) = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return respond(&mut stream, false, &Response::text(408, "request head too slow\n"));
        }
        stream.set_read_timeout(Some(left))?;
        if len == buf.len() {
            return respond(&mut stream, false, &Response::text(431, "request head too large\n"));
        }
        let n = match stream.read(&mut buf[len..]) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return respond(&mut stream, false, &Response::text(408, "request head too slow\n"));
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        len += n;
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf[..len]) {
            Ok(httparse::Status::Complete(_)) => {
                let method = req.method.unwrap_or("").to_string();
                let path = req.path.unwrap_or("/").to_string();
                break (method, path);
            }
            Ok(httparse::Status::Partial) => {}
            Err(httparse::Error::TooManyHeaders) => {
                return respond(&mut stream, false, &Response::text(431, "too many request headers\n"));
            }
            Err(_) => return respond(&mut stream, false, &Response::text(400, "bad request\n")),
        }
    };
    let head_only = method == "HEAD";
    if method != "GET" && !head_only {
        return respond(&mut stream, false, &Response::text(405, "only GET is served\n"));
    }
    let path = path.split(['?', '#']).next().unwrap_or("/");
    let response = handler(path);
    respond(&mut stream, head_only, &response)
}

fn respond(stream: &mut TcpStream, head_only: bool, r: &Response) -> std::io::Result<()> {
    let reason = match r.status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        _ => "Error",
    };
    let head = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
        r.status,
        r.content_type,
        r.body.len()
    );
    stream.write_all(head.as_bytes())?;
    if !head_only {
        stream.write_all(&r.body)?;
    }
    stream.flush()?;
    let _ = stream.shutdown(Shutdown::Write);
    // Let the client read the answer before the socket closes: drain what
    // it still sends, briefly (an unread receive buffer turns the close
    // into a reset, which can discard the response in flight).
    stream.set_read_timeout(Some(Duration::from_millis(100)))?;
    let mut sink = [0u8; 1024];
    for _ in 0..16 {
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server() -> Server {
        let handler: Handler = Arc::new(|path: &str| match path {
            "/ok" => Response::text(200, "fine\n"),
            _ => Response::text(404, "not found\n"),
        });
        Server::start("127.0.0.1:0".parse().unwrap(), handler, CpuMeter::default()).unwrap()
    }

    fn get(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        // A client may be cut off mid-request (431): that is the point.
        let _ = s.write_all(request);
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    #[test]
    fn serves_and_refuses() {
        let srv = server();
        let a = srv.addr();
        let ok = get(a, b"GET /ok?x=1 HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n") && ok.ends_with("fine\n"), "{ok}");
        assert!(get(a, b"GET /nope HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404 "));
        assert!(get(a, b"POST /ok HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405 "));
        assert!(get(a, b"\x01\x02 garbage\r\n\r\n").starts_with("HTTP/1.1 400 "));
        let mut huge = b"GET /ok HTTP/1.1\r\nX-Big: ".to_vec();
        huge.resize(MAX_HEAD * 4, b'a');
        assert!(get(a, &huge).starts_with("HTTP/1.1 431 "));
        let head = get(a, b"HEAD /ok HTTP/1.1\r\n\r\n");
        assert!(
            head.starts_with("HTTP/1.1 200 ") && head.ends_with("\r\n\r\n"),
            "{head}"
        );
    }

    #[test]
    fn slow_clients_are_dropped_and_others_served() {
        let srv = server();
        let a = srv.addr();
        // More idle connections than handlers: each is dropped after the
        // head deadline, and requests behind them are still answered.
        let idle: Vec<TcpStream> = (0..HANDLERS + 1)
            .map(|_| {
                let mut s = TcpStream::connect(a).unwrap();
                s.write_all(b"GET /ok HTT").unwrap();
                s
            })
            .collect();
        let t0 = Instant::now();
        let ok = get(a, b"GET /ok HTTP/1.1\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 "), "{ok}");
        assert!(t0.elapsed() < HEAD_DEADLINE * 4, "served after {:?}", t0.elapsed());
        for mut s in idle {
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut out = String::new();
            let _ = s.read_to_string(&mut out);
            assert!(out.is_empty() || out.starts_with("HTTP/1.1 408 "), "{out}");
        }
        drop(srv);
    }
}
