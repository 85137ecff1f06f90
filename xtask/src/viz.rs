//! `cargo xtask viz`.

pub fn run(_args: &[String]) -> Result<(), String> {
    Err("`cargo xtask viz` is not available in this build yet".into())
}
