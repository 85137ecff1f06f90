//! `symm-run -n N [--timeout S] [--grace S] [--job NAME] [--no-prefix] -- PROGRAM [ARGS...]`:
//! starts N ranks of a job on this host (see `symm_bootstrap::launcher`).

#[cfg(target_os = "linux")]
fn main() {
    use symm_bootstrap::launcher::{parse_args, run, LaunchError};
    let code = match parse_args(std::env::args_os().skip(1)).and_then(|o| run(&o)) {
        Ok(code) => code,
        Err(LaunchError::Help) => {
            println!("{}", symm_bootstrap::launcher::USAGE);
            0
        }
        Err(e) => {
            eprintln!("symm-run: {e}");
            eprintln!("{}", symm_bootstrap::launcher::USAGE);
            2
        }
    };
    std::process::exit(code);
}

#[cfg(not(target_os = "linux"))]
fn main() {
    eprintln!("symm-run: Linux only");
    std::process::exit(2);
}
