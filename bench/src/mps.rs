//! MPS for ranks that share a GPU (`symm-bench check --share-gpus`).
//!
//! Ranks that share a GPU run their kernels at the same time only under MPS; without it they
//! take turns in time slices (correct, but a signal between them takes milliseconds). The check
//! starts its own MPS daemon as the current user, in a private directory (mode 0700) that the
//! daemon, this process and every rank it starts find through `CUDA_MPS_PIPE_DIRECTORY` and
//! `CUDA_MPS_LOG_DIRECTORY`, and stops it once the run's process has ended, however it ends
//! (a stopper in its own process group waits for it: the daemon's `quit` waits for its clients,
//! and this process is one). Nothing on the GPU is changed: no compute mode, clocks or settings. A
//! user who already runs MPS (the variables set) keeps theirs.

use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Stdio;

use symm_driver::safety_env;

/// The control program of the MPS daemon.
const CONTROL: &str = "nvidia-cuda-mps-control";

/// A running MPS daemon this process started, stopped on drop.
pub struct Mps {
    dir: Option<PathBuf>,
}

impl Mps {
    /// Sets `SYMM_DEVICES=mod` (ranks share the GPUs there are) and the MPS directories for this
    /// process and its children, then starts the daemon. Without `nvidia-cuda-mps-control` the
    /// run goes on time sliced, and says so.
    ///
    /// # Safety
    ///
    /// Writes the environment: no other thread may run, and no CUDA library may be loaded yet
    /// (MPS is chosen when CUDA initialises): call it at the top of `main`.
    pub unsafe fn start() -> Mps {
        if std::env::var_os("SYMM_DEVICES").is_none() {
            std::env::set_var("SYMM_DEVICES", "mod");
        }
        if std::env::var_os("CUDA_MPS_PIPE_DIRECTORY").is_some() {
            println!("mps: CUDA_MPS_PIPE_DIRECTORY is set: using the MPS daemon already there");
            return Mps { dir: None };
        }
        let dir = std::env::temp_dir().join(format!("symm-mps-{}", std::process::id()));
        let (pipe, log) = (dir.join("pipe"), dir.join("log"));
        let made = [&dir, &pipe, &log].iter().try_for_each(|d| {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(d)
        });
        if let Err(e) = made {
            println!(
                "mps: cannot make {}: {e}; running time sliced",
                dir.display()
            );
            return Mps { dir: None };
        }
        std::env::set_var("CUDA_MPS_PIPE_DIRECTORY", &pipe);
        std::env::set_var("CUDA_MPS_LOG_DIRECTORY", &log);
        match safety_env::command(CONTROL).arg("-d").status() {
            Ok(s) if s.success() => {}
            other => {
                println!("mps: {CONTROL} -d did not start ({other:?}); ranks that share a GPU take turns");
                let _ = std::fs::remove_dir_all(&dir);
                std::env::remove_var("CUDA_MPS_PIPE_DIRECTORY");
                std::env::remove_var("CUDA_MPS_LOG_DIRECTORY");
                return Mps { dir: None };
            }
        }
        // The daemon's `quit` waits for its clients to leave, and this process is one from its
        // first CUDA call on: a stopper in its own process group waits for this process to end
        // (however it ends), then stops the daemon and removes the directory.
        let stopper = safety_env::command("sh")
            .args([
                "-c",
                "while kill -0 \"$1\" 2>/dev/null; do sleep 0.2; done; \
                 echo quit | nvidia-cuda-mps-control; rm -rf \"$2\"",
                "symm-mps-stop",
            ])
            .arg(std::process::id().to_string())
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn();
        match stopper {
            Ok(_) => println!(
                "mps: started in {} (stopped when this run ends)",
                dir.display()
            ),
            Err(e) => println!(
                "mps: started in {}, but no stopper ({e}): stop it with `echo quit | {CONTROL}`",
                dir.display()
            ),
        }
        Mps { dir: Some(dir) }
    }
}

impl Drop for Mps {
    fn drop(&mut self) {
        if let Some(dir) = self.dir.take() {
            println!(
                "mps: the daemon in {} stops once this process has exited",
                dir.display()
            );
        }
    }
}
