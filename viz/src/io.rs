//! Getting bytes in and out of the browser: files, URLs, downloads, the clock.

use js_sys::Uint8Array;
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;

/// Milliseconds since the page started loading.
pub fn now_ms() -> f64 {
    web_sys::window()
        .and_then(|w| w.performance())
        .map_or(0.0, |p| p.now())
}

fn js_reason(v: JsValue) -> String {
    v.as_string()
        .or_else(|| {
            v.dyn_ref::<js_sys::Error>()
                .map(|e| String::from(e.message()))
        })
        .unwrap_or_else(|| "the browser refused".to_string())
}

/// The bytes of a picked or dropped file.
pub async fn read_file(file: web_sys::File) -> Result<Vec<u8>, String> {
    let buf = JsFuture::from(file.array_buffer())
        .await
        .map_err(js_reason)?;
    Ok(Uint8Array::new(&buf).to_vec())
}

/// The bytes at a URL.
pub async fn fetch(url: &str) -> Result<Vec<u8>, String> {
    let window = web_sys::window().ok_or("no window")?;
    let resp = JsFuture::from(window.fetch_with_str(url))
        .await
        .map_err(js_reason)?;
    let resp: web_sys::Response = resp.dyn_into().map_err(js_reason)?;
    if !resp.ok() {
        return Err(format!("HTTP {} {}", resp.status(), resp.status_text()));
    }
    let buf = JsFuture::from(resp.array_buffer().map_err(js_reason)?)
        .await
        .map_err(js_reason)?;
    Ok(Uint8Array::new(&buf).to_vec())
}

/// The `name` parameter of the page's query string.
pub fn query_param(name: &str) -> Option<String> {
    let search = web_sys::window()?.location().search().ok()?;
    web_sys::UrlSearchParams::new_with_str(&search)
        .ok()?
        .get(name)
}

/// An object URL holding `text` as JSON (the caller revokes the previous one).
pub fn json_url(text: &str) -> Result<String, String> {
    let parts = js_sys::Array::of1(&JsValue::from_str(text));
    let opts = web_sys::BlobPropertyBag::new();
    opts.set_type("application/json");
    let blob =
        web_sys::Blob::new_with_str_sequence_and_options(&parts, &opts).map_err(js_reason)?;
    web_sys::Url::create_object_url_with_blob(&blob).map_err(js_reason)
}

/// Releases an object URL.
pub fn revoke(url: &str) {
    let _ = web_sys::Url::revoke_object_url(url);
}
