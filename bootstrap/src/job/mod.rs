//! The process-per-GPU bootstrap: how the processes of one job on one host find each other,
//! prove they belong to the job, exchange bytes and file descriptors, and notice when one dies.
//!
//! # Protocol
//!
//! * **Environment** ([`env`](mod@env)): `RANK`, `WORLD_SIZE`, `LOCAL_RANK` as torchrun sets them, plus
//!   `SYMM_JOB` (the job's name) and `SYMM_TOKEN` (its secret), all parsed strictly.
//! * **Socket**: rank 0, the root, listens on the `AF_UNIX` `SOCK_SEQPACKET` socket
//!   `symm-<job>-<uid>` in Linux's *abstract* namespace. Abstract over a path in a 0700 folder:
//!   nothing on disk to create, secure or clean up after a crash (the name is freed when the
//!   root's socket closes), and no dependence on a shared writable folder. The namespace has no
//!   permissions, so both ends check each other instead: the root refuses a peer whose uid
//!   (`SO_PEERCRED`) is not its own, and a rank refuses to say hello to a root that is not its
//!   own user. A uid is not enough where every process is uid 0 (containers sharing the host's
//!   network), so both sides also prove that they know the token, and the token never travels:
//!   a process squatting on the name can deny service but learns nothing of the token and
//!   receives no rank's data or descriptors. Sequenced packets keep message boundaries, so
//!   descriptors sent with a frame arrive with that frame.
//! * **Rendezvous** ([`meet`]): each rank connects (retrying until the deadline) and sends a
//!   hello (rank, world, local rank, a fresh nonce); the root answers with its own nonce and an
//!   HMAC-SHA256 of both nonces and the claims keyed by the token (`auth`); the rank checks it
//!   ([`BootstrapError::Unauthenticated`] when it fails, having sent nothing derived from the
//!   token) and answers with its own HMAC; the root checks uid, that proof (constant time),
//!   world, rank range and uniqueness, and refuses with a reason the peer receives as
//!   [`BootstrapError::Refused`]. When all ranks arrived the root frees the name and releases
//!   everyone; at the deadline every side gets [`BootstrapError::Missing`] naming the absent ranks.
//! * **Frames** ([`wire`]): a 16-byte header with the payload length, at most
//!   [`wire::MAX_PAYLOAD`] bytes and [`wire::MAX_FDS`] descriptors; anything longer is cut by the
//!   kernel and refused, so a hostile peer costs bounded memory.
//! * **Collectives** ([`SocketBootstrap::barrier`], [`SocketBootstrap::all_gather`],
//!   [`SocketBootstrap::all_gather_fds`]): rounds through the root, each with a deadline.
//! * **Lost peers** ([`watch`]): connections stay open for the job. A watcher thread per process
//!   sees a peer's socket close (EOF or reset: its process died, however it died); the root first
//!   tells every other rank, then the watcher records the rank in the lost word
//!   ([`SocketBootstrap::lost_word`]) and runs the callbacks ([`SocketBootstrap::on_lost`]); a
//!   rank that loses the root loses rank 0. Every collective then fails with [`BootstrapError::PeerLost`].
//!   [`SocketBootstrap::finish`] ends a job in order, so that its closing is not a loss.
//!
//! `sys` holds every libc call. The launcher that sets the environment is
//! [`crate::launcher`] (`symm-run`).

mod auth;
mod collective;
pub mod env;
pub mod error;
pub mod meet;
#[cfg(test)]
mod recover_tests;
pub(crate) mod sys;
pub mod watch;
pub mod wire;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use env::{EnvError, JobEnv, Token};
pub use error::{BootstrapError, Refusal, Result};
pub use sys::memfd;
pub use watch::NOT_LOST;

/// One process's membership in a job: its connections (to every rank at the root, to the root
/// elsewhere) and the watcher thread that reads them.
pub struct SocketBootstrap {
    shared: Arc<watch::Shared>,
    watcher: Option<JoinHandle<()>>,
    /// The last collective's sequence number; held for the whole of a collective.
    seq: Mutex<u32>,
    local_rank: u16,
    job: String,
}

impl SocketBootstrap {
    /// Reads the job environment and joins the job, waiting at most `timeout` for every rank.
    pub fn from_env(timeout: Duration) -> Result<SocketBootstrap> {
        Self::join(&JobEnv::from_env()?, timeout)
    }

    /// Joins `job` as its rank: the root waits for every rank, the others connect to it. Fails
    /// after `timeout` naming the ranks that did not arrive.
    pub fn join(job: &JobEnv, timeout: Duration) -> Result<SocketBootstrap> {
        let deadline = wire::after(Instant::now(), timeout);
        let links = if job.rank == 0 {
            meet::root(job, deadline)?
                .into_iter()
                .enumerate()
                .map(|(i, fd)| watch::Link {
                    peer: i as u16 + 1,
                    fd,
                })
                .collect()
        } else {
            vec![watch::Link {
                peer: 0,
                fd: meet::join(job, deadline)?,
            }]
        };
        let shared = Arc::new(watch::Shared::new(job.rank, job.world, links)?);
        let watcher = {
            let sh = shared.clone();
            std::thread::Builder::new()
                .name("symm-bootstrap".into())
                .spawn(move || watch::run(sh))
                .map_err(|e| BootstrapError::sys("spawn", e))?
        };
        Ok(SocketBootstrap {
            shared,
            watcher: Some(watcher),
            seq: Mutex::new(0),
            local_rank: job.local_rank,
            job: job.job.clone(),
        })
    }

    /// This process's rank.
    pub fn rank(&self) -> u16 {
        self.shared.rank
    }

    /// Ranks in the job.
    pub fn world(&self) -> u16 {
        self.shared.world
    }

    /// This process's rank on its host.
    pub fn local_rank(&self) -> u16 {
        self.local_rank
    }

    /// The job's name.
    pub fn job(&self) -> &str {
        &self.job
    }

    /// The first lost rank, if a peer was lost.
    pub fn lost(&self) -> Option<u16> {
        self.shared.lost_rank()
    }

    /// The lost word: [`NOT_LOST`] until a peer is lost, then that rank. The watcher stores it
    /// (release) as soon as it sees the loss; a runtime may poll it from any thread.
    pub fn lost_word(&self) -> Arc<AtomicU32> {
        self.shared.lost.clone()
    }

    /// Runs `f` once with the first lost rank: on the watcher thread when the loss is seen, or
    /// at once if a peer is already lost. `f` must be quick and must not call the bootstrap.
    pub fn on_lost(&self, f: impl Fn(u16) + Send + Sync + 'static) {
        self.shared.on_lost(Box::new(f));
    }

    /// Waits until a peer is lost (returns it) or `timeout` passes (returns `None`).
    pub fn wait_lost(&self, timeout: Duration) -> Option<u16> {
        self.shared.wait_lost(timeout)
    }

    /// Leaves the job at once, for a rank that failed and will take no further part: the other
    /// ranks see it lost, exactly as if its process had died, and this process's calls fail
    /// with [`BootstrapError::Poisoned`] holding [`BootstrapError::Left`]. The connections stay
    /// allocated until drop.
    pub fn leave(&self) {
        let sh = &*self.shared;
        // Closing first, so that the EOFs this causes here are not blamed on the peers.
        sh.closing.store(true, Ordering::Release);
        {
            let mut st = sh.lock();
            if st.poisoned.is_none() {
                st.poisoned = Some(BootstrapError::Left { rank: sh.rank });
            }
        }
        for l in &sh.links {
            // A connection already gone needs no shutdown.
            let _ = sys::shutdown(std::os::fd::AsFd::as_fd(&l.fd));
        }
        sh.cv.notify_all();
    }

    /// Ends the job in order: a last barrier, after which closing connections are not losses.
    /// Dropping without it is seen by the other ranks as this rank's loss.
    pub fn finish(&self, timeout: Duration) -> Result<()> {
        self.shared.closing.store(true, Ordering::Release);
        self.barrier(timeout)
    }
}

impl Drop for SocketBootstrap {
    fn drop(&mut self) {
        self.shared.stop();
        if let Some(t) = self.watcher.take() {
            let _ = t.join();
        }
    }
}
