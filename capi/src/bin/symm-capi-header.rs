//! Prints `capi/include/symm.h`, the C header of symm-capi:
//! `cargo run -p symm-capi --bin symm-capi-header > capi/include/symm.h`.

use std::io::Write as _;

const USAGE: &str = "usage: symm-capi-header
  prints the C header of symm-capi (capi/include/symm.h) to standard output; regenerate with
  cargo run -p symm-capi --bin symm-capi-header > capi/include/symm.h";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        None => {}
        Some("--help" | "-h") => {
            println!("{USAGE}");
            return;
        }
        Some(other) => {
            eprintln!("symm-capi-header: unexpected argument {other:?}\n{USAGE}");
            std::process::exit(2);
        }
    }
    let text = symm::header::generate();
    if let Err(e) = std::io::stdout().lock().write_all(text.as_bytes()) {
        eprintln!("symm-capi-header: {e}");
        std::process::exit(1);
    }
}
