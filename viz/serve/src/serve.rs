//! The file server: one thread per connection, one request per connection, bounded in size and
//! time.
//!
//! Answers, in the order they are checked:
//!
//! * 408 when the request head (line and headers) is not in within [`Limits::head_timeout`];
//! * 414 for a request line over [`Limits::line`] bytes; 431 for more than [`Limits::headers`]
//!   header lines or more than [`Limits::header_bytes`] bytes of them; 400 for a head that is
//!   not HTTP/1.x;
//! * 400 without exactly one `Host`; 421 (Misdirected Request) when it is not the loopback
//!   address the server bound, `127.0.0.1:PORT`, `localhost:PORT` or `[::1]:PORT`, so a page
//!   from another origin that rebinds its name to 127.0.0.1 gets nothing;
//! * 405 for methods other than `GET` and `HEAD`;
//! * 400 for a target that is not an origin-form path or is badly percent-encoded;
//! * 404 for anything that is not a regular file under one of the roots (see [`super::path`]);
//! * 200 with the file.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::path::{lookup, Lookup, Roots};

/// Bounds on what one client may send and how long it may take.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Longest request line, in bytes (without the line end).
    pub line: usize,
    /// Most header lines.
    pub headers: usize,
    /// Most bytes of header lines in all.
    pub header_bytes: usize,
    /// Time for the whole request head to arrive.
    pub head_timeout: Duration,
    /// Most time for the whole answer to be sent; a shorter answer gets less (`answer_time`).
    pub answer_timeout: Duration,
    /// Connections served at once; more are closed unanswered.
    pub connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            line: 8 << 10,
            headers: 64,
            header_bytes: 16 << 10,
            head_timeout: Duration::from_secs(10),
            answer_timeout: Duration::from_secs(300),
            connections: 64,
        }
    }
}

/// Why a request head was not read.
#[derive(Debug, PartialEq, Eq)]
enum Refusal {
    /// The client closed or the connection failed: nothing to answer.
    Gone,
    /// 408.
    Timeout,
    /// 414.
    LineTooLong,
    /// 431.
    HeadersTooLarge,
    /// 400.
    Bad,
}

/// Reads one line (without its `\r\n` or `\n`) of at most `max` bytes before `deadline`.
fn read_line(
    r: &mut BufReader<&TcpStream>,
    max: usize,
    deadline: Instant,
    too_long: Refusal,
) -> Result<Vec<u8>, Refusal> {
    let mut line = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Refusal::Timeout);
        }
        r.get_ref()
            .set_read_timeout(Some(left))
            .map_err(|_| Refusal::Gone)?;
        let buf = match r.fill_buf() {
            Ok([]) => return Err(Refusal::Gone),
            Ok(b) => b,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(Refusal::Timeout)
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return Err(Refusal::Gone),
        };
        let (chunk, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..i], true),
            None => (buf, false),
        };
        // One byte of slack for the `\r` that may end the line.
        if line.len() + chunk.len() > max.saturating_add(1) {
            return Err(too_long);
        }
        line.extend_from_slice(chunk);
        let used = chunk.len() + done as usize;
        r.consume(used);
        if done {
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            if line.len() > max {
                return Err(too_long);
            }
            return Ok(line);
        }
    }
}

/// A parsed request head.
#[derive(Debug)]
struct Head {
    method: String,
    target: String,
    hosts: Vec<String>,
}

fn read_head(s: &TcpStream, limits: &Limits) -> Result<Head, Refusal> {
    let deadline = Instant::now() + limits.head_timeout;
    let mut r = BufReader::with_capacity(4096, s);
    let line = read_line(&mut r, limits.line, deadline, Refusal::LineTooLong)?;
    let line = String::from_utf8(line).map_err(|_| Refusal::Bad)?;
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Refusal::Bad);
    };
    if method.is_empty() || target.is_empty() || !matches!(version, "HTTP/1.0" | "HTTP/1.1") {
        return Err(Refusal::Bad);
    }
    let mut hosts = Vec::new();
    let (mut count, mut bytes) = (0, 0);
    loop {
        let left = limits.header_bytes.saturating_sub(bytes);
        let h = read_line(&mut r, left, deadline, Refusal::HeadersTooLarge)?;
        if h.is_empty() {
            break;
        }
        count += 1;
        bytes += h.len() + 2;
        if count > limits.headers {
            return Err(Refusal::HeadersTooLarge);
        }
        // No folded continuation lines, and every header has a name and a colon.
        let colon = h.iter().position(|&b| b == b':').ok_or(Refusal::Bad)?;
        let name = &h[..colon];
        if name.is_empty() || name.iter().any(|b| b.is_ascii_whitespace()) {
            return Err(Refusal::Bad);
        }
        if name.eq_ignore_ascii_case(b"host") {
            let value = String::from_utf8_lossy(&h[colon + 1..]);
            hosts.push(value.trim_matches([' ', '\t']).to_string());
        }
    }
    Ok(Head {
        method: method.into(),
        target: target.into(),
        hosts,
    })
}

/// Whether `host` names the loopback server on `port`.
pub fn host_allowed(host: &str, port: u16) -> bool {
    ["127.0.0.1", "localhost", "[::1]"]
        .iter()
        .any(|h| host.eq_ignore_ascii_case(&format!("{h}:{port}")))
}

fn content_type(path: &std::path::Path) -> &'static str {
    match path.extension().and_then(|e| e.to_str()).unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "js" => "text/javascript",
        "wasm" => "application/wasm",
        "css" => "text/css",
        "json" => "application/json",
        "png" => "image/png",
        _ => "application/octet-stream",
    }
}

fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        414 => "URI Too Long",
        421 => "Misdirected Request",
        431 => "Request Header Fields Too Large",
        _ => "Internal Server Error",
    }
}

fn head_lines(code: u16, kind: &str, len: u64, extra: &str) -> String {
    format!(
        "HTTP/1.1 {code} {}\r\nContent-Type: {kind}\r\nContent-Length: {len}\r\n\
         Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n{extra}Connection: close\r\n\r\n",
        reason(code)
    )
}

fn error(s: &mut TcpStream, code: u16, with_body: bool) -> std::io::Result<()> {
    let body = format!("{code} {}\n", reason(code));
    let extra = if code == 405 {
        "Allow: GET, HEAD\r\n"
    } else {
        ""
    };
    s.write_all(
        head_lines(code, "text/plain; charset=utf-8", body.len() as u64, extra).as_bytes(),
    )?;
    if with_body {
        s.write_all(body.as_bytes())?;
    }
    Ok(())
}

fn answer(s: &mut TcpStream, roots: &Roots, port: u16, limits: &Limits) -> std::io::Result<()> {
    s.set_write_timeout(Some(limits.head_timeout))?;
    let head = match read_head(s, limits) {
        Ok(h) => h,
        Err(Refusal::Gone) => return Ok(()),
        Err(Refusal::Timeout) => return error(s, 408, true),
        Err(Refusal::LineTooLong) => return error(s, 414, true),
        Err(Refusal::HeadersTooLarge) => return error(s, 431, true),
        Err(Refusal::Bad) => return error(s, 400, true),
    };
    let body = head.method != "HEAD";
    match head.hosts.as_slice() {
        [h] if host_allowed(h, port) => {}
        [_] => return error(s, 421, body),
        _ => return error(s, 400, body),
    }
    if head.method != "GET" && head.method != "HEAD" {
        return error(s, 405, body);
    }
    let path = match lookup(roots, &head.target) {
        Lookup::File(p) => p,
        Lookup::NotFound => return error(s, 404, body),
        Lookup::Malformed => return error(s, 400, body),
    };
    let Ok(mut f) = std::fs::File::open(&path) else {
        return error(s, 404, body);
    };
    let len = f.metadata()?.len();
    s.write_all(head_lines(200, content_type(&path), len, "").as_bytes())?;
    if body {
        send_file(s, &mut f, len, Instant::now() + answer_time(limits, len))?;
    }
    Ok(())
}

/// Time to send an answer of `len` bytes: the head's time plus four seconds per MiB (a reader
/// of 256 KiB/s, a slow tunnel's pace), at most [`Limits::answer_timeout`]. A client that
/// reads slower than that holds its connection no longer than the answer needs at that rate.
pub(crate) fn answer_time(limits: &Limits, len: u64) -> Duration {
    limits
        .head_timeout
        .saturating_add(Duration::from_secs((len >> 20).saturating_mul(4)))
        .min(limits.answer_timeout)
}

/// Sends `len` bytes of `f`, failing when `deadline` passes.
fn send_file(
    s: &mut TcpStream,
    f: &mut std::fs::File,
    len: u64,
    deadline: Instant,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 64 << 10];
    let mut left = len;
    while left > 0 {
        let want = left.min(buf.len() as u64) as usize;
        let n = f.read(&mut buf[..want])?;
        if n == 0 {
            return Err(ErrorKind::UnexpectedEof.into());
        }
        let mut chunk = &buf[..n];
        while !chunk.is_empty() {
            let t = deadline.saturating_duration_since(Instant::now());
            if t.is_zero() {
                return Err(ErrorKind::TimedOut.into());
            }
            s.set_write_timeout(Some(t))?;
            let w = s.write(chunk)?;
            if w == 0 {
                return Err(ErrorKind::WriteZero.into());
            }
            chunk = &chunk[w..];
        }
        left -= n as u64;
    }
    Ok(())
}

/// Ends a connection without losing the answer: stop writing, then read what the client still
/// sends, for at most a second and 256 KiB (closing with unread input would reset the
/// connection, and the client could lose the answer).
fn close(mut s: &TcpStream) {
    let _ = s.flush();
    if s.shutdown(std::net::Shutdown::Write).is_err() {
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(1);
    let mut sink = [0u8; 4096];
    let mut left = 256usize << 10;
    while left > 0 {
        let t = deadline.saturating_duration_since(Instant::now());
        if t.is_zero()
            || s.set_read_timeout(Some(t.min(Duration::from_millis(200))))
                .is_err()
        {
            break;
        }
        match s.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
}

/// Binds 127.0.0.1:`port` (0: any free port) and serves `roots` in background threads.
#[cfg(test)]
pub fn start_with(roots: Roots, port: u16, limits: Limits) -> Result<SocketAddr, String> {
    let l = TcpListener::bind(("127.0.0.1", port))
        .map_err(|e| format!("bind 127.0.0.1:{port}: {e}"))?;
    serve_listener(l, roots, limits)
}

/// Serves `roots` on a bound listener in background threads; its address.
pub fn serve_listener(l: TcpListener, roots: Roots, limits: Limits) -> Result<SocketAddr, String> {
    let addr = l.local_addr().map_err(|e| e.to_string())?;
    let busy = Arc::new(AtomicUsize::new(0));
    let shared = Arc::new((roots, limits));
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            if busy.fetch_add(1, Ordering::AcqRel) >= shared.1.connections {
                busy.fetch_sub(1, Ordering::AcqRel);
                continue;
            }
            let (mine, shared) = (busy.clone(), shared.clone());
            let spawned = std::thread::Builder::new().spawn(move || {
                let mut s = s;
                let (roots, limits) = &*shared;
                let _ = answer(&mut s, roots, addr.port(), limits);
                close(&s);
                mine.fetch_sub(1, Ordering::AcqRel);
            });
            if spawned.is_err() {
                // The connection was dropped with the closure; give its place back.
                busy.fetch_sub(1, Ordering::AcqRel);
            }
        }
    });
    Ok(addr)
}
