//! A tiny HTTP/1.1 server for the built app and the traces, and a tiny client for WebDriver.
//!
//! The server binds 127.0.0.1 only and answers `GET` and `HEAD` for regular files under the app
//! folder, and under `/traces/` for files in the traces folder, nothing else: targets are
//! percent-decoded once and refused with any empty, `.` or `..` component, backslash or control
//! byte, then resolved and checked to be still under the resolved root ([`path`]). Requests must
//! name the bound loopback address in `Host` (421 otherwise), and their size and time are
//! bounded ([`serve`]).
//!
//! [`webdriver`] drives headless Chromium through chromedriver over [`request`], for the viz's
//! browser tests.
#![forbid(unsafe_code)]

pub mod path;
pub mod serve;
#[cfg(test)]
mod tests;
pub mod webdriver;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::Duration;

/// The port the server listens on when none is given.
pub const DEFAULT_PORT: u16 = 8000;

/// Which port to serve on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Port {
    /// The port the user asked for (`--port N`; 0: any free port): taken is an error.
    Given(u16),
    /// The default port: when it cannot be bound, any free port, with a notice saying so.
    Default(u16),
}

/// A running server.
#[derive(Debug)]
pub struct Started {
    /// Where it listens.
    pub addr: SocketAddr,
    /// A line for the user when it does not listen where it was asked to (the default port was
    /// taken).
    pub notice: Option<String>,
}

/// Binds 127.0.0.1 on `port` and serves the app and the traces in background threads, with the
/// default [`serve::Limits`].
pub fn start(app: &Path, traces: &Path, port: Port) -> Result<Started, String> {
    let roots = path::Roots {
        app: app.to_path_buf(),
        traces: traces.to_path_buf(),
    };
    let (listener, notice) = bind(port)?;
    let addr = serve::serve_listener(listener, roots, serve::Limits::default())?;
    Ok(Started { addr, notice })
}

/// Binds 127.0.0.1 on `port`: a given port or an error naming it; the default port or, when it
/// cannot be bound, any free port and a notice naming both.
fn bind(port: Port) -> Result<(TcpListener, Option<String>), String> {
    let at = |p: u16| TcpListener::bind(("127.0.0.1", p));
    let why = |p: u16, e: std::io::Error| match e.kind() {
        std::io::ErrorKind::AddrInUse => format!("port {p} is already in use"),
        _ => format!("port {p} cannot be bound ({e})"),
    };
    match port {
        Port::Given(p) => at(p).map(|l| (l, None)).map_err(|e| {
            format!(
                "cannot serve on 127.0.0.1:{p}: {}; pick another with --port N (0: any free port)",
                why(p, e)
            )
        }),
        Port::Default(p) => match at(p) {
            Ok(l) => Ok((l, None)),
            Err(first) => {
                let l = at(0).map_err(|e| format!("cannot bind any port on 127.0.0.1: {e}"))?;
                let got = l.local_addr().map_err(|e| e.to_string())?.port();
                let notice = format!(
                    "viz: the default {}; serving on port {got} instead (--port N picks one)",
                    why(p, first)
                );
                Ok((l, Some(notice)))
            }
        },
    }
}

/// The most bytes an answer to [`request`] may take, head and body (a full-page screenshot is
/// a few MiB): a longer one is an error, never an allocation of what its peer claims.
pub const MAX_RESPONSE: u64 = 256 << 20;

/// Sends one request and returns (status, body).
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Result<(u16, Vec<u8>), String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("connect {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(120)))
        .map_err(|e| e.to_string())?;
    let body = body.unwrap_or("");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .map_err(|e| e.to_string())?;
    let mut r = BufReader::new(s).take(MAX_RESPONSE);
    let too_long = || format!("an answer longer than {MAX_RESPONSE} bytes");
    let mut status = String::new();
    r.read_line(&mut status).map_err(|e| e.to_string())?;
    let code = status
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("bad status line {status:?}"))?;
    let mut len = None;
    let mut chunked = false;
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).map_err(|e| e.to_string())? == 0 || h.trim().is_empty() {
            break;
        }
        let lower = h.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            len = v.trim().parse::<usize>().ok();
        }
        if lower.starts_with("transfer-encoding:") && lower.contains("chunked") {
            chunked = true;
        }
    }
    let mut out = Vec::new();
    if chunked {
        loop {
            let mut size = String::new();
            r.read_line(&mut size).map_err(|e| e.to_string())?;
            let n = usize::from_str_radix(size.trim(), 16).map_err(|e| e.to_string())?;
            if n == 0 {
                break;
            }
            if n as u64 > r.limit() {
                return Err(too_long());
            }
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk).map_err(|e| e.to_string())?;
            out.extend_from_slice(&chunk[..n]);
        }
    } else if let Some(n) = len {
        if n as u64 > r.limit() {
            return Err(too_long());
        }
        out.resize(n, 0);
        r.read_exact(&mut out).map_err(|e| e.to_string())?;
    } else {
        r.read_to_end(&mut out).map_err(|e| e.to_string())?;
        if r.limit() == 0 {
            return Err(too_long());
        }
    }
    Ok((code, out))
}
