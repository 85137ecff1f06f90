//! `cargo xtask hw`.

pub fn run(_args: &[String]) -> Result<(), String> {
    Err("`cargo xtask hw` is not available in this build yet".into())
}
