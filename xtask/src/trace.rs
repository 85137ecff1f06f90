//! `cargo xtask trace`.

pub fn run(_args: &[String]) -> Result<(), String> {
    Err("`cargo xtask trace` is not available in this build yet".into())
}
