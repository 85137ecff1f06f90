//! `cargo xtask fuzz`.

pub fn run(_args: &[String]) -> Result<(), String> {
    Err("`cargo xtask fuzz` is not available in this build yet".into())
}
