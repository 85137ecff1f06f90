//! The launcher's process calls: process groups, signals, the parent-death signal and the
//! watchdog that outlives a killed launcher.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::cvt;

/// The terminating signals the launcher forwards.
pub(crate) const SIGINT: i32 = libc::SIGINT;
/// See [`SIGINT`].
pub(crate) const SIGTERM: i32 = libc::SIGTERM;
/// Cannot be caught: the last word to a rank that ignores `SIGTERM`.
pub(crate) const SIGKILL: i32 = libc::SIGKILL;

/// Sends `sig` to every process of process group `pgid`.
pub(crate) fn kill_group(pgid: u32, sig: i32) -> io::Result<()> {
    let pgid = libc::pid_t::try_from(pgid)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pgid out of range"))?;
    if pgid <= 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a process group",
        ));
    }
    // SAFETY: plain system call; a negative pid names the group `pgid` (checked above 1).
    cvt(unsafe { libc::kill(-pgid, sig) })?;
    Ok(())
}

/// Signals caught by [`catch_signals`], one bit per signal number.
static CAUGHT: AtomicU64 = AtomicU64::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    if (0..64).contains(&sig) {
        // Lock-free atomics are async-signal-safe.
        CAUGHT.fetch_or(1 << sig, Ordering::Relaxed);
    }
}

/// Installs a handler for each of `signals` that only records it (see [`take_caught`]), until
/// the returned guard drops: then each signal's earlier action is back, and a signal recorded
/// but not taken is raised again, so a process that goes on after the launcher (symm-bench's
/// report, a test) still dies of SIGTERM as it would have without the launcher.
pub(crate) fn catch_signals(signals: &[i32]) -> io::Result<CaughtSignals> {
    let mut guard = CaughtSignals { old: Vec::new() };
    for &sig in signals {
        // SAFETY: sigaction is plain data; all-zero is a valid starting value.
        let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
        act.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        act.sa_flags = libc::SA_RESTART;
        // SAFETY: `act.sa_mask` is a valid sigset to initialise; `act` outlives the call, and the
        // handler only touches an atomic (async-signal-safe).
        cvt(unsafe { libc::sigemptyset(&mut act.sa_mask) })?;
        // SAFETY: as above; all-zero is a valid sigaction for the old action to be written to.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: `act` and `old` are valid for the call; the handler is async-signal-safe.
        cvt(unsafe { libc::sigaction(sig, &act, &mut old) })?;
        guard.old.push((sig, old));
    }
    Ok(guard)
}

/// The handlers of [`catch_signals`], in place until this drops.
pub(crate) struct CaughtSignals {
    old: Vec<(i32, libc::sigaction)>,
}

impl Drop for CaughtSignals {
    fn drop(&mut self) {
        for (sig, old) in &self.old {
            // SAFETY: `old` is the action sigaction returned for `sig`; restoring it is a plain
            // system call (an error leaves the recording handler, which is harmless).
            unsafe { libc::sigaction(*sig, old, std::ptr::null_mut()) };
        }
        let left = take_caught();
        for (sig, _) in &self.old {
            if left & (1 << sig) != 0 {
                // SAFETY: plain system call; the signal's own earlier action handles it.
                unsafe { libc::raise(*sig) };
            }
        }
    }
}

/// The signals caught since the last call, as a bit set by signal number.
pub(crate) fn take_caught() -> u64 {
    CAUGHT.swap(0, Ordering::Relaxed)
}

/// Makes the child that `cmd` starts receive `sig` when this process dies (and refuse to start
/// when it already has).
pub(crate) fn die_with_parent(cmd: &mut std::process::Command, sig: i32) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id();
    // SAFETY: the closure runs between fork and exec and only makes two async-signal-safe
    // system calls (prctl, getppid); it allocates nothing.
    unsafe {
        cmd.pre_exec(move || set_death_signal(sig, parent));
    }
}

/// Between fork and exec: asks for `sig` when the parent dies, and fails when the parent is
/// already gone (it is no longer `parent`).
fn set_death_signal(sig: i32, parent: u32) -> io::Result<()> {
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number and has no memory arguments.
    cvt(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, sig as libc::c_ulong, 0, 0, 0) })?;
    // SAFETY: getppid has no preconditions and cannot fail.
    if unsafe { libc::getppid() } as u32 != parent {
        // No allocation here (between fork and exec): a plain code.
        return Err(io::Error::from_raw_os_error(libc::ESRCH));
    }
    Ok(())
}

/// How often the watchdog looks whether the groups it ended are empty.
const WATCH_TICK_MS: u64 = 20;

/// A process that ends the launcher's rank groups when the launcher dies, however it dies.
///
/// It is forked from the launcher before any rank starts, in a process group of its own (so a
/// signal to the launcher's group spares it), with every descriptor closed but the read end of
/// a pipe whose only write end the launcher holds. The launcher writes each rank's process group
/// id into the pipe (4 bytes, native order). When the pipe reports end of file (the launcher
/// exited or was killed: the kernel closes its descriptors), the watchdog sends `SIGTERM` to
/// every group, waits until they are empty or the grace period passed, then sends `SIGKILL`,
/// and exits. A record of 0 disarms it: it exits at once (the launcher has emptied the groups).
///
/// Between fork and exit the watchdog runs only async-signal-safe system calls on memory it
/// owns (its stack), so forking from a multi-threaded launcher is sound.
pub(crate) struct Watchdog {
    pid: libc::pid_t,
    feed: Option<OwnedFd>,
}

/// Most groups a watchdog guards (the largest world).
const MAX_GROUPS: usize = 1024;

impl Watchdog {
    /// Forks the watchdog; `grace` is the time between `SIGTERM` and `SIGKILL`.
    pub(crate) fn start(grace: Duration) -> io::Result<Watchdog> {
        let mut ends = [0 as libc::c_int; 2];
        // SAFETY: `ends` is a writable array of two ints, as pipe2 requires.
        cvt(unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) })?;
        // SAFETY: both are fresh descriptors this call owns.
        let (read, write) =
            unsafe { (OwnedFd::from_raw_fd(ends[0]), OwnedFd::from_raw_fd(ends[1])) };
        let ticks = (grace.as_millis() as u64).div_ceil(WATCH_TICK_MS).max(1);
        // SAFETY: the child runs only `watchdog_main`, which makes async-signal-safe system calls
        // on its own stack and never returns (it calls `_exit`); the parent goes on as usual.
        let pid = cvt(unsafe { libc::fork() })?;
        if pid == 0 {
            watchdog_main(read.as_raw_fd(), ticks);
        }
        drop(read);
        Ok(Watchdog {
            pid,
            feed: Some(write),
        })
    }

    /// Adds process group `pgid` to the groups ended when the launcher dies.
    pub(crate) fn guard(&self, pgid: u32) -> io::Result<()> {
        let pgid = libc::pid_t::try_from(pgid)
            .ok()
            .filter(|&p| p > 1)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a process group"))?;
        self.write(pgid)
    }

    fn write(&self, record: libc::pid_t) -> io::Result<()> {
        let feed = self
            .feed
            .as_ref()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))?;
        let b = record.to_ne_bytes();
        loop {
            // SAFETY: writes 4 bytes from a live buffer; a pipe write of at most PIPE_BUF bytes
            // is atomic, so records never interleave or split.
            let n = unsafe { libc::write(feed.as_raw_fd(), b.as_ptr().cast(), b.len()) };
            if n == b.len() as isize {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if n >= 0 || e.kind() != io::ErrorKind::Interrupted {
                return Err(if n >= 0 {
                    io::Error::new(io::ErrorKind::WriteZero, "short write to the watchdog")
                } else {
                    e
                });
            }
        }
    }

    /// Tells the watchdog that the groups are empty and waits for it to exit.
    pub(crate) fn disarm(mut self) {
        let _ = self.write(0);
        self.feed = None;
        self.reap();
    }

    fn reap(&mut self) {
        let mut status = 0;
        loop {
            // SAFETY: waits for this process's own child `pid`; `status` is a live int.
            let r = unsafe { libc::waitpid(self.pid, &mut status, 0) };
            if r >= 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                return;
            }
        }
    }
}

impl Drop for Watchdog {
    /// Not disarmed: closing the pipe makes the watchdog end every group it guards; this waits
    /// for it (at most the grace period and a tick).
    fn drop(&mut self) {
        if self.feed.take().is_some() {
            self.reap();
        }
    }
}

/// The watchdog's body, in the forked child. Never returns.
fn watchdog_main(feed: RawFd, ticks: u64) -> ! {
    // SAFETY: only async-signal-safe calls (setpgid, sigaction, close, read,
    // kill, nanosleep, _exit), on buffers of this stack frame.
    unsafe {
        libc::setpgid(0, 0);
        let mut ign: libc::sigaction = std::mem::zeroed();
        ign.sa_sigaction = libc::SIG_IGN;
        for sig in [
            libc::SIGINT,
            libc::SIGTERM,
            libc::SIGHUP,
            libc::SIGPIPE,
            libc::SIGQUIT,
        ] {
            libc::sigaction(sig, &ign, std::ptr::null_mut());
        }
        // Hold nothing of the launcher's: its output pipes, sockets, the pipe's write end.
        let max = libc::c_uint::MAX;
        // Below the feed only when there is a below (a launcher started with stdin closed
        // gets its pipe at descriptor 0).
        let low = if feed > 0 {
            libc::syscall(
                libc::SYS_close_range,
                0 as libc::c_uint,
                (feed - 1) as libc::c_uint,
                0,
            )
        } else {
            0
        };
        let high = libc::syscall(libc::SYS_close_range, (feed + 1) as libc::c_uint, max, 0);
        if low != 0 || high != 0 {
            for fd in 0..65536 {
                if fd != feed {
                    libc::close(fd);
                }
            }
        }
        let mut groups = [0 as libc::pid_t; MAX_GROUPS];
        let mut count = 0usize;
        let mut rec = [0u8; 4];
        let mut filled = 0usize;
        loop {
            let n = libc::read(feed, rec.as_mut_ptr().add(filled).cast(), 4 - filled);
            if n < 0 && *libc::__errno_location() == libc::EINTR {
                continue;
            }
            if n <= 0 {
                break;
            }
            filled += n as usize;
            if filled == 4 {
                filled = 0;
                match libc::pid_t::from_ne_bytes(rec) {
                    0 => libc::_exit(0),
                    g if g > 1 && count < MAX_GROUPS => {
                        groups[count] = g;
                        count += 1;
                    }
                    _ => {}
                }
            }
        }
        let groups = &groups[..count];
        for &g in groups {
            libc::kill(-g, libc::SIGTERM);
        }
        let tick = libc::timespec {
            tv_sec: 0,
            tv_nsec: (WATCH_TICK_MS * 1_000_000) as libc::c_long,
        };
        for _ in 0..ticks {
            if !groups.iter().any(|&g| libc::kill(-g, 0) == 0) {
                libc::_exit(0);
            }
            libc::nanosleep(&tick, std::ptr::null_mut());
        }
        for &g in groups {
            libc::kill(-g, libc::SIGKILL);
        }
        libc::_exit(0)
    }
}

/// Whether process group `pgid` still has a process (zombies count until reaped).
pub(crate) fn group_alive(pgid: u32) -> bool {
    match libc::pid_t::try_from(pgid) {
        // SAFETY: signal 0 only checks that the group exists; `pgid` > 1 names a group.
        Ok(p) if p > 1 => unsafe { libc::kill(-p, 0) == 0 },
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The disposition of `sig` now (handler address, SIG_DFL or SIG_IGN).
    fn action(sig: i32) -> libc::sighandler_t {
        // SAFETY: all-zero is a valid sigaction to be written to; a null new action only reads.
        let mut now: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        cvt(unsafe { libc::sigaction(sig, std::ptr::null(), &mut now) }).unwrap();
        now.sa_sigaction
    }

    #[test]
    fn the_launchers_handlers_go_when_it_returns_and_a_pending_signal_is_raised_again() {
        let sig = libc::SIGUSR2;
        // Ignored before: the raise on drop then goes to the restored SIG_IGN, not the test.
        // SAFETY: plain system call with a valid disposition.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
        let guard = catch_signals(&[sig]).unwrap();
        assert_eq!(
            action(sig),
            on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t
        );
        // SAFETY: plain system call; the recording handler is installed.
        unsafe { libc::raise(sig) };
        drop(guard);
        assert_eq!(action(sig), libc::SIG_IGN, "the earlier action is back");
        // SAFETY: plain system call with a valid disposition.
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    }
}
