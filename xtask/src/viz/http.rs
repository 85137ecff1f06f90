//! A tiny HTTP/1.1 server for the built app and the traces, and a tiny client for WebDriver.
//!
//! The server answers `GET` for files under the app folder, and under `/traces/` for files in
//! the traces folder; it binds 127.0.0.1 only and never serves a path with `..`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

fn content_type(path: &Path) -> &'static str {
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

fn resolve(app: &Path, traces: &Path, url: &str) -> Option<PathBuf> {
    let path = url.split(['?', '#']).next().unwrap_or("/");
    if path.split('/').any(|p| p == "..") {
        return None;
    }
    let (base, rest) = match path.strip_prefix("/traces/") {
        Some(r) => (traces, r),
        None => (app, path.trim_start_matches('/')),
    };
    let rest = if rest.is_empty() { "index.html" } else { rest };
    let p = base.join(rest);
    p.is_file().then_some(p)
}

fn answer(mut s: TcpStream, app: &Path, traces: &Path) -> std::io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut r = BufReader::new(s.try_clone()?);
    let mut line = String::new();
    r.read_line(&mut line)?;
    loop {
        let mut h = String::new();
        if r.read_line(&mut h)? == 0 || h == "\r\n" || h == "\n" {
            break;
        }
    }
    let mut parts = line.split_whitespace();
    let (method, url) = (parts.next().unwrap_or(""), parts.next().unwrap_or("/"));
    let found = (method == "GET" || method == "HEAD")
        .then(|| resolve(app, traces, url))
        .flatten();
    match found.and_then(|p| std::fs::read(&p).ok().map(|b| (p, b))) {
        Some((p, body)) => {
            write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
                content_type(&p),
                body.len()
            )?;
            if method == "GET" {
                s.write_all(&body)?;
            }
        }
        None => {
            let msg = b"not found\n";
            write!(
                s,
                "HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                msg.len()
            )?;
            s.write_all(msg)?;
        }
    }
    s.flush()
}

/// Binds 127.0.0.1:`port` (0: any free port) and serves in background threads.
pub fn start(app: &Path, traces: &Path, port: u16) -> Result<SocketAddr, String> {
    let l = TcpListener::bind(("127.0.0.1", port))
        .map_err(|e| format!("bind 127.0.0.1:{port}: {e}"))?;
    let addr = l.local_addr().map_err(|e| e.to_string())?;
    let (app, traces) = (app.to_path_buf(), traces.to_path_buf());
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let (a, t) = (app.clone(), traces.clone());
            std::thread::spawn(move || {
                let _ = answer(s, &a, &t);
            });
        }
    });
    Ok(addr)
}

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
    let mut r = BufReader::new(s);
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
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk).map_err(|e| e.to_string())?;
            out.extend_from_slice(&chunk[..n]);
        }
    } else if let Some(n) = len {
        out.resize(n, 0);
        r.read_exact(&mut out).map_err(|e| e.to_string())?;
    } else {
        r.read_to_end(&mut out).map_err(|e| e.to_string())?;
    }
    Ok((code, out))
}
