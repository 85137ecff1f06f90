//! A minimal W3C WebDriver client for chromedriver driving headless Chromium.

use crate::request;
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde_json::Value as Json;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A chromedriver process with one browser session.
pub struct Browser {
    driver: Child,
    addr: SocketAddr,
    session: String,
    profile: PathBuf,
}

fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

impl Browser {
    /// Starts chromedriver and a headless Chromium with a fresh profile under `scratch`.
    pub fn start(chromium: &Path, chromedriver: &Path, scratch: &Path) -> Result<Browser, String> {
        let port = free_port()?;
        let driver = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("{}: {e}", chromedriver.display()))?;
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let profile = scratch.join(format!("chromium-profile-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&profile);
        std::fs::create_dir_all(&profile).map_err(|e| e.to_string())?;
        let mut b = Browser {
            driver,
            addr,
            session: String::new(),
            profile,
        };
        let t0 = Instant::now();
        while request(addr, "GET", "/status", None).is_err() {
            if t0.elapsed() > Duration::from_secs(20) {
                return Err("chromedriver did not start within 20 s".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let args = [
            "--headless".to_string(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-quic".into(),
            "--no-first-run".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--disable-dev-shm-usage".into(),
            "--window-size=1280,1000".into(),
            format!("--user-data-dir={}", b.profile.display()),
        ];
        let args: Vec<String> = args.iter().map(|a| quote(a)).collect();
        let caps = format!(
            r#"{{"capabilities":{{"alwaysMatch":{{"browserName":"chrome","goog:chromeOptions":{{"binary":{},"args":[{}]}}}}}}}}"#,
            quote(&chromium.display().to_string()),
            args.join(",")
        );
        let v = b.call("POST", "/session", Some(&caps))?;
        b.session = v
            .get("sessionId")
            .and_then(Json::as_str)
            .ok_or("no session id from chromedriver")?
            .to_string();
        Ok(b)
    }

    fn call(&self, method: &str, path: &str, body: Option<&str>) -> Result<Json, String> {
        let (code, bytes) = request(self.addr, method, path, body)?;
        let text = String::from_utf8_lossy(&bytes);
        let v = serde_json::from_str::<Json>(&text)
            .map_err(|e| format!("webdriver reply to {path}: {e}"))?;
        let value = v.get("value").cloned().unwrap_or(Json::Null);
        if code != 200 {
            let msg = value.get("message").and_then(Json::as_str).unwrap_or(&text);
            return Err(format!("webdriver {method} {path}: HTTP {code}: {msg}"));
        }
        Ok(value)
    }

    fn s(&self, rest: &str) -> String {
        format!("/session/{}{rest}", self.session)
    }

    /// Opens a URL.
    pub fn goto(&self, url: &str) -> Result<(), String> {
        self.call(
            "POST",
            &self.s("/url"),
            Some(&format!(r#"{{"url":{}}}"#, quote(url))),
        )
        .map(|_| ())
    }

    /// Runs a script (`return ...;`) and returns its value.
    pub fn js(&self, script: &str) -> Result<Json, String> {
        self.call(
            "POST",
            &self.s("/execute/sync"),
            Some(&format!(r#"{{"script":{},"args":[]}}"#, quote(script))),
        )
    }

    /// Runs an asynchronous script; it calls `arguments[0](value)` when done.
    pub fn js_async(&self, script: &str) -> Result<Json, String> {
        self.call(
            "POST",
            &self.s("/execute/async"),
            Some(&format!(r#"{{"script":{},"args":[]}}"#, quote(script))),
        )
    }

    /// The element matching a CSS selector.
    pub fn find(&self, css: &str) -> Result<String, String> {
        let v = self.call(
            "POST",
            &self.s("/element"),
            Some(&format!(
                r#"{{"using":"css selector","value":{}}}"#,
                quote(css)
            )),
        )?;
        v.get(ELEMENT)
            .and_then(Json::as_str)
            .map(str::to_string)
            .ok_or_else(|| format!("no element {css}"))
    }

    /// Clicks an element.
    pub fn click(&self, css: &str) -> Result<(), String> {
        let e = self.find(css)?;
        self.call("POST", &self.s(&format!("/element/{e}/click")), Some("{}"))
            .map(|_| ())
    }

    /// Types text (or a file path into a file input) into an element.
    pub fn keys(&self, css: &str, text: &str) -> Result<(), String> {
        let e = self.find(css)?;
        self.call(
            "POST",
            &self.s(&format!("/element/{e}/value")),
            Some(&format!(r#"{{"text":{}}}"#, quote(text))),
        )
        .map(|_| ())
    }

    /// A PNG screenshot of an element.
    pub fn screenshot(&self, css: &str) -> Result<Vec<u8>, String> {
        let e = self.find(css)?;
        let v = self.call("GET", &self.s(&format!("/element/{e}/screenshot")), None)?;
        let text = v.as_str().ok_or("screenshot is not a string")?;
        STANDARD
            .decode(text)
            .map_err(|e| format!("screenshot: {e}"))
    }

    /// Polls a script until it returns `true` or `timeout` passes.
    pub fn wait_for(&self, what: &str, script: &str, timeout: Duration) -> Result<(), String> {
        let t0 = Instant::now();
        loop {
            if self.js(script)? == Json::Bool(true) {
                return Ok(());
            }
            if t0.elapsed() > timeout {
                return Err(format!("timed out after {timeout:?} waiting for {what}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = request(self.addr, "DELETE", &self.s(""), None);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// `s` as a JSON string literal.
fn quote(s: &str) -> String {
    Json::from(s).to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn strings_are_quoted_for_the_wire() {
        assert_eq!(super::quote("a\"b\n"), r#""a\"b\n""#);
        assert_eq!(super::quote("é"), "\"é\"");
    }
}
