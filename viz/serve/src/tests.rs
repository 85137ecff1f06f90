//! The server over real TCP, with raw requests (paths are sent exactly as written, as
//! `curl --path-as-is` would).

use super::path::Roots;
use super::serve::{host_allowed, start_with, Limits};
use super::Port;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const SECRET: &[u8] = b"SECRET-OUTSIDE-THE-ROOTS";
const TRACE: &[u8] = b"\x00symm trace bytes\xff";

/// base/{secret.txt, Cargo.toml, app/{index.html, app.js}, traces/{a.trace, b c.trace, links}}.
struct Site {
    base: PathBuf,
    addr: SocketAddr,
}

impl Drop for Site {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

fn site(tag: &str, limits: Limits) -> Site {
    let base = std::env::temp_dir().join(format!("symm-http-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let (app, traces) = (base.join("app"), base.join("traces"));
    std::fs::create_dir_all(&app).unwrap();
    std::fs::create_dir_all(&traces).unwrap();
    std::fs::write(base.join("secret.txt"), SECRET).unwrap();
    std::fs::write(base.join("Cargo.toml"), SECRET).unwrap();
    std::fs::write(app.join("index.html"), b"<html>app</html>").unwrap();
    std::fs::write(app.join("app.js"), b"js").unwrap();
    std::fs::write(traces.join("a.trace"), TRACE).unwrap();
    std::fs::write(traces.join("b c.trace"), TRACE).unwrap();
    let link = |to: PathBuf, name: &str| std::os::unix::fs::symlink(to, traces.join(name)).unwrap();
    link(base.join("secret.txt"), "out.trace");
    link(PathBuf::from("/etc/passwd"), "passwd");
    link(base.clone(), "up");
    link(traces.join("a.trace"), "same.trace");
    let roots = Roots { app, traces };
    let addr = start_with(roots, 0, limits).unwrap();
    Site { base, addr }
}

/// The status, headers and body of the answer to `raw`.
fn send(addr: SocketAddr, raw: &[u8]) -> (u16, String, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    // The server may answer (and stop reading) before an oversized request is all sent.
    let _ = s.write_all(raw);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    parse(&out)
}

fn parse(out: &[u8]) -> (u16, String, Vec<u8>) {
    let end = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no head in {:?}", String::from_utf8_lossy(out)));
    let head = String::from_utf8_lossy(&out[..end]).into_owned();
    let code = head.split(' ').nth(1).unwrap().parse().unwrap();
    (code, head, out[end + 4..].to_vec())
}

fn get_as(addr: SocketAddr, host: &str, target: &str) -> (u16, Vec<u8>) {
    let req = format!("GET {target} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: t\r\n\r\n");
    let (code, _, body) = send(addr, req.as_bytes());
    (code, body)
}

fn get(addr: SocketAddr, target: &str) -> (u16, Vec<u8>) {
    get_as(addr, &format!("127.0.0.1:{}", addr.port()), target)
}

fn leaks(body: &[u8]) -> bool {
    body.windows(SECRET.len()).any(|w| w == SECRET) || body.windows(5).any(|w| w == b"root:")
}

#[test]
fn files_under_the_roots_are_served() {
    let s = site("ok", Limits::default());
    assert_eq!(get(s.addr, "/traces/a.trace"), (200, TRACE.to_vec()));
    assert_eq!(get(s.addr, "/traces/b%20c.trace"), (200, TRACE.to_vec()));
    assert_eq!(get(s.addr, "/traces/same.trace"), (200, TRACE.to_vec()));
    assert_eq!(get(s.addr, "/"), (200, b"<html>app</html>".to_vec()));
    assert_eq!(
        get(s.addr, "/?trace=traces/a.trace"),
        (200, b"<html>app</html>".to_vec())
    );
    assert_eq!(
        get(s.addr, "/app.js?x=../secret.txt#f"),
        (200, b"js".to_vec())
    );
    let (code, head, body) = send(
        s.addr,
        format!(
            "HEAD /traces/a.trace HTTP/1.1\r\nHost: localhost:{}\r\n\r\n",
            s.addr.port()
        )
        .as_bytes(),
    );
    assert_eq!(code, 200);
    assert!(
        head.contains(&format!("Content-Length: {}", TRACE.len())),
        "{head}"
    );
    assert!(body.is_empty());
    // The WebDriver client of this module reads it too.
    let (code, body) = super::request(s.addr, "GET", "/traces/a.trace", None).unwrap();
    assert_eq!((code, body), (200, TRACE.to_vec()));
}

#[test]
fn nothing_outside_the_roots_is_served() {
    let s = site("escape", Limits::default());
    let cases = [
        ("/traces//etc/passwd", 404),
        ("//etc/passwd", 404),
        ("/traces/../Cargo.toml", 404),
        ("/traces/../secret.txt", 404),
        ("/../secret.txt", 404),
        ("/traces/./a.trace", 404),
        ("/traces/%2e%2e/secret.txt", 404),
        ("/traces/%2E%2E/Cargo.toml", 404),
        ("/%2e%2e/secret.txt", 404),
        ("/traces/..%2fsecret.txt", 404),
        ("/traces/%2Fetc%2Fpasswd", 404),
        ("/traces/%2fetc/passwd", 404),
        ("/traces/..%5csecret.txt", 404),
        ("/traces/a.trace%00", 404),
        ("/traces/out.trace", 404),
        ("/traces/passwd", 404),
        ("/traces/up/secret.txt", 404),
        ("/traces/up/Cargo.toml", 404),
        ("/traces/", 404),
        ("/traces", 404),
        ("/missing.js", 404),
        ("/traces/%zz", 400),
        ("/traces/%2", 400),
        ("traces/a.trace", 400),
        ("http://127.0.0.1/traces/a.trace", 400),
        ("*", 400),
    ];
    for (target, want) in cases {
        let (code, body) = get(s.addr, target);
        assert_eq!(code, want, "{target}");
        assert!(!leaks(&body), "{target} leaked");
    }
}

#[test]
fn only_the_bound_loopback_host_is_answered() {
    let s = site("host", Limits::default());
    let port = s.addr.port();
    for ok in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("LocalHost:{port}"),
        format!("[::1]:{port}"),
    ] {
        assert_eq!(get_as(s.addr, &ok, "/traces/a.trace").0, 200, "{ok}");
    }
    for bad in [
        format!("evil.example:{port}"),
        format!("127.0.0.1:{}", port.wrapping_add(1)),
        "127.0.0.1".into(),
        "localhost".into(),
        format!("127.0.0.1.nip.io:{port}"),
        String::new(),
    ] {
        let (code, body) = get_as(s.addr, &bad, "/traces/a.trace");
        assert_eq!(code, 421, "{bad:?}");
        assert!(!body.windows(TRACE.len()).any(|w| w == TRACE));
    }
    // No Host, or two.
    let (code, _, _) = send(s.addr, b"GET /traces/a.trace HTTP/1.1\r\n\r\n");
    assert_eq!(code, 400);
    let two = format!("GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nhost: evil:{port}\r\n\r\n");
    assert_eq!(send(s.addr, two.as_bytes()).0, 400);
    assert!(host_allowed(&format!("127.0.0.1:{port}"), port));
    assert!(!host_allowed(&format!("127.0.0.2:{port}"), port));
}

#[test]
fn methods_and_malformed_heads_are_refused() {
    let s = site("method", Limits::default());
    let port = s.addr.port();
    let post = format!(
        "POST /traces/a.trace HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\n\r\n"
    );
    let (code, head, _) = send(s.addr, post.as_bytes());
    assert_eq!(code, 405);
    assert!(head.contains("Allow: GET, HEAD"));
    for raw in [
        "GET /\r\n\r\n".to_string(),
        "GET / HTTP/2.0\r\n\r\n".into(),
        "GET  / HTTP/1.1\r\n\r\n".into(),
        format!("GET / HTTP/1.1\r\nHost 127.0.0.1:{port}\r\n\r\n"),
        format!("GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n folded\r\n\r\n"),
        "\u{ff} \u{ff} \u{ff}\r\n\r\n".into(),
    ] {
        assert_eq!(send(s.addr, raw.as_bytes()).0, 400, "{raw:?}");
    }
}

#[test]
fn oversized_lines_and_headers_are_refused() {
    let s = site("size", Limits::default());
    let host = format!("Host: 127.0.0.1:{}\r\n", s.addr.port());
    let long = format!("GET /{} HTTP/1.1\r\n{host}\r\n", "a".repeat(9000));
    assert_eq!(send(s.addr, long.as_bytes()).0, 414);
    // A line of 8 KiB exactly is read (and is simply not found).
    let target = format!("/{}", "a".repeat(8192 - "GET  HTTP/1.1".len() - 1));
    let fits = format!("GET {target} HTTP/1.1\r\n{host}\r\n");
    assert_eq!(send(s.addr, fits.as_bytes()).0, 404);
    let many = format!("GET / HTTP/1.1\r\n{host}{}\r\n", "X-A: b\r\n".repeat(70));
    assert_eq!(send(s.addr, many.as_bytes()).0, 431);
    let big = format!(
        "GET / HTTP/1.1\r\n{host}{}\r\n",
        format!("X-A: {}\r\n", "b".repeat(4000)).repeat(5)
    );
    assert_eq!(send(s.addr, big.as_bytes()).0, 431);
    let endless = format!("GET / HTTP/1.1\r\n{host}X-A: {}", "b".repeat(64 << 10));
    assert_eq!(send(s.addr, endless.as_bytes()).0, 431);
    let under = format!("GET / HTTP/1.1\r\n{host}{}\r\n", "X-A: b\r\n".repeat(60));
    assert_eq!(send(s.addr, under.as_bytes()).0, 200);
}

#[test]
fn a_slow_client_is_cut_off_and_blocks_nobody() {
    let head_timeout = Duration::from_secs(2);
    let limits = Limits {
        head_timeout,
        ..Limits::default()
    };
    let s = site("slow", limits);
    let t = Instant::now();
    // A client that sends half a request and waits.
    let mut idle = TcpStream::connect(s.addr).unwrap();
    idle.write_all(b"GET /traces/a.trace HTTP/1.1\r\n").unwrap();
    // A client that trickles a header byte every 50 ms, for ever.
    let mut drip = TcpStream::connect(s.addr).unwrap();
    let mut drip_w = drip.try_clone().unwrap();
    let dripper = std::thread::spawn(move || {
        let _ = drip_w.write_all(b"GET / HTTP/1.1\r\nX-Slow: ");
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(8) && drip_w.write_all(b"a").is_ok() {
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    // Meanwhile others are served, well before the slow ones time out.
    assert_eq!(get(s.addr, "/traces/a.trace"), (200, TRACE.to_vec()));
    let served = t.elapsed();
    assert!(served < head_timeout * 3 / 4, "{served:?}");
    // Both slow clients get 408 and are closed once the head time is up, not later.
    for c in [&mut idle, &mut drip] {
        c.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
        let mut out = Vec::new();
        let _ = c.read_to_end(&mut out);
        assert_eq!(parse(&out).0, 408);
    }
    let cut = t.elapsed();
    assert!(cut >= head_timeout && cut < head_timeout * 3, "{cut:?}");
    let _ = drip.shutdown(Shutdown::Both);
    dripper.join().unwrap();
}

/// The WebDriver client's peer claims bodies it cannot send: refused, not allocated.
#[test]
fn a_client_request_refuses_an_answer_longer_than_its_bound() {
    let heads = [
        "HTTP/1.1 200 OK\r\nContent-Length: 18446744073709551615\r\n\r\n".to_string(),
        format!(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n",
            u64::MAX
        ),
        format!(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n",
            usize::MAX
        ),
    ];
    for head in heads {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut c, _) = l.accept().unwrap();
            let mut buf = [0u8; 1024];
            let _ = c.read(&mut buf);
            let _ = c.write_all(head.as_bytes());
        });
        let r = super::request(addr, "GET", "/", None);
        assert!(r.is_err(), "{r:?}");
        server.join().unwrap();
    }
}

#[test]
fn an_answer_gets_time_for_its_bytes_and_no_more() {
    let l = Limits::default();
    assert_eq!(super::serve::answer_time(&l, 0), l.head_timeout);
    assert_eq!(
        super::serve::answer_time(&l, 18 << 20),
        l.head_timeout + Duration::from_secs(72)
    );
    assert_eq!(super::serve::answer_time(&l, u64::MAX), l.answer_timeout);
}

/// `--port N` taken is an error naming the port; the default port taken is a free port and a
/// notice naming both; a free default port is used as is.
#[test]
fn a_taken_port_is_said_so() {
    let base = std::env::temp_dir().join(format!("symm-http-port-{}", std::process::id()));
    let (app, traces) = (base.join("app"), base.join("traces"));
    std::fs::create_dir_all(&app).unwrap();
    std::fs::create_dir_all(&traces).unwrap();
    std::fs::write(app.join("index.html"), b"<html>app</html>").unwrap();

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let p = taken.local_addr().unwrap().port();
    let err = super::start(&app, &traces, Port::Given(p)).unwrap_err();
    assert!(
        err.contains(&format!("127.0.0.1:{p}"))
            && err.contains(&format!("port {p} is already in use")),
        "{err}"
    );

    let s = super::start(&app, &traces, Port::Default(p)).unwrap();
    assert_ne!(s.addr.port(), p);
    let notice = s.notice.expect("a notice when the default port is taken");
    assert!(
        notice.contains(&format!("default port {p} is already in use"))
            && notice.contains(&format!("serving on port {} instead", s.addr.port())),
        "{notice}"
    );
    assert_eq!(get(s.addr, "/").0, 200);

    let free = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let s = super::start(&app, &traces, Port::Default(free)).unwrap();
    assert_eq!((s.addr.port(), s.notice), (free, None));
    drop(taken);
    let _ = std::fs::remove_dir_all(&base);
}
