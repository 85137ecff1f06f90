//! `cargo xtask codegen`.

pub fn run(_args: &[String]) -> Result<(), String> {
    Err("`cargo xtask codegen` is not available in this build yet".into())
}
