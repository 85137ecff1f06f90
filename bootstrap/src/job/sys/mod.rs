//! Every libc call of the bootstrap and the launcher, each behind a safe function: sockets,
//! polling and memory files here, processes and signals in `proc`.
//!
//! Nothing outside this module calls libc. Every descriptor a call creates is returned as an
//! [`OwnedFd`] (closed on drop) and is created close-on-exec: sockets with `SOCK_CLOEXEC`,
//! accepted ones with `accept4(SOCK_CLOEXEC)`, received ones with `MSG_CMSG_CLOEXEC`, the memfd
//! with `MFD_CLOEXEC`, the eventfd with `EFD_CLOEXEC`. Sends use `MSG_NOSIGNAL`, so a peer that
//! went away is an `EPIPE` error, never a `SIGPIPE`.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

mod proc;
pub(crate) use proc::*;

/// `poll` readiness bits, re-exported so callers need not name libc.
pub(crate) const POLLIN: i16 = libc::POLLIN;
/// Writable.
pub(crate) const POLLOUT: i16 = libc::POLLOUT;
/// The peer shut its sending side down (it sends nothing more; it may read nothing more).
pub(crate) const POLLRDHUP: i16 = libc::POLLRDHUP;
/// Hung up or failed: the next call on the socket says how.
pub(crate) const POLLHUP_OR_ERR: i16 = libc::POLLHUP | libc::POLLERR | libc::POLLNVAL;

/// Error numbers the callers tell apart.
pub(crate) const EPIPE: i32 = libc::EPIPE;
/// See [`EPIPE`].
pub(crate) const ECONNRESET: i32 = libc::ECONNRESET;
/// See [`EPIPE`].
pub(crate) const ENOTCONN: i32 = libc::ENOTCONN;
/// See [`EPIPE`].
pub(crate) const ECONNREFUSED: i32 = libc::ECONNREFUSED;
/// See [`EPIPE`].
pub(crate) const EADDRINUSE: i32 = libc::EADDRINUSE;
/// See [`EPIPE`].
pub(crate) const ENOENT: i32 = libc::ENOENT;

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Takes ownership of a descriptor a successful call just returned.
fn owned(fd: libc::c_int) -> io::Result<OwnedFd> {
    let fd = cvt(fd)?;
    // SAFETY: `fd` is a fresh descriptor returned by the kernel to this call; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The effective user id of this process (what `SO_PEERCRED` reports to peers).
pub(crate) fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Fills `buf` from the kernel's random source (`getrandom`, blocking only until the pool is
/// first seeded at boot).
pub(crate) fn random(buf: &mut [u8]) -> io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        let rest = &mut buf[filled..];
        // SAFETY: writes at most `rest.len()` bytes into the live buffer `rest`.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        filled += n as usize;
    }
    Ok(())
}

/// A new `AF_UNIX` `SOCK_SEQPACKET` socket, non-blocking and close-on-exec.
pub(crate) fn seqpacket_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain system call with constant arguments.
    owned(unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    })
}

/// The address of `name` in the abstract namespace (a leading NUL, then the name, no terminator).
fn abstract_addr(name: &[u8]) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain data; all-zero is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if name.is_empty() || name.len() + 1 > addr.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "socket name empty or too long",
        ));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, &b) in addr.sun_path[1..].iter_mut().zip(name) {
        *dst = b as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len();
    Ok((addr, len as libc::socklen_t))
}

/// Binds `fd` to the abstract name `name` and listens.
pub(crate) fn bind_listen(fd: BorrowedFd<'_>, name: &[u8], backlog: i32) -> io::Result<()> {
    let (addr, len) = abstract_addr(name)?;
    // SAFETY: `addr` is a valid sockaddr_un of `len` bytes that outlives the call.
    cvt(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            len,
        )
    })?;
    // SAFETY: plain system call on a bound socket.
    cvt(unsafe { libc::listen(fd.as_raw_fd(), backlog) })?;
    Ok(())
}

/// Connects `fd` to the abstract name `name`.
pub(crate) fn connect(fd: BorrowedFd<'_>, name: &[u8]) -> io::Result<()> {
    let (addr, len) = abstract_addr(name)?;
    // SAFETY: `addr` is a valid sockaddr_un of `len` bytes that outlives the call.
    cvt(unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            len,
        )
    })?;
    Ok(())
}

/// Accepts one connection, non-blocking and close-on-exec.
pub(crate) fn accept(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    // SAFETY: null address pointers are allowed (the peer's address is not wanted).
    owned(unsafe {
        libc::accept4(
            fd.as_raw_fd(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
        )
    })
}

/// The effective uid of the process at the other end of a connected Unix socket (`SO_PEERCRED`:
/// the connecting process's credentials at `connect`, the listening one's at `listen`).
pub(crate) fn peer_uid(fd: BorrowedFd<'_>) -> io::Result<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a writable ucred and `len` its size; the kernel writes at most `len`.
    cvt(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    })?;
    if len as usize != std::mem::size_of::<libc::ucred>() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "short SO_PEERCRED answer",
        ));
    }
    Ok(cred.uid)
}

/// Shuts a connected socket down both ways: the peer reads EOF at once, whoever else holds the
/// socket.
pub(crate) fn shutdown(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: plain system call on a socket this process holds.
    cvt(unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_RDWR) })?;
    Ok(())
}

/// Shuts the sending side of a connected socket down: the peer reads EOF, this side still reads.
#[cfg(test)]
pub(crate) fn shutdown_write(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: plain system call on a socket this process holds.
    cvt(unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_WR) })?;
    Ok(())
}

/// A connected pair of non-blocking, close-on-exec `SOCK_SEQPACKET` sockets.
#[cfg(test)]
pub(crate) fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` is a live array of two ints the call fills.
    cvt(unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
            fds.as_mut_ptr(),
        )
    })?;
    // SAFETY: socketpair succeeded: both are fresh descriptors this process owns alone.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Sends one message (`parts` gathered) with `fds` attached, without blocking. Returns the bytes
/// sent (a seqpacket send is all or nothing); `WouldBlock` when the peer's queue is full.
pub(crate) fn send(
    fd: BorrowedFd<'_>,
    parts: &[&[u8]],
    fds: &[BorrowedFd<'_>],
) -> io::Result<usize> {
    let mut iov: Vec<libc::iovec> = parts
        .iter()
        .map(|p| libc::iovec {
            iov_base: p.as_ptr() as *mut libc::c_void,
            iov_len: p.len(),
        })
        .collect();
    let fd_bytes = std::mem::size_of_val(fds);
    // SAFETY: CMSG_SPACE is pure arithmetic.
    let space = if fds.is_empty() {
        0
    } else {
        unsafe { libc::CMSG_SPACE(fd_bytes as libc::c_uint) as usize }
    };
    // u64 words: cmsghdr alignment.
    let mut control = vec![0u64; space.div_ceil(8)];
    // SAFETY: msghdr is plain data; all-zero is a valid (empty) value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = iov.len() as _;
    if !fds.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: the control buffer holds CMSG_SPACE(fd_bytes) aligned bytes, so the first
        // header and its data (CMSG_LEN(fd_bytes) bytes) lie inside it.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(fd_bytes as libc::c_uint) as _;
            let data = libc::CMSG_DATA(c).cast::<RawFd>();
            for (i, f) in fds.iter().enumerate() {
                data.add(i).write_unaligned(f.as_raw_fd());
            }
        }
    }
    // SAFETY: `msg` points at live iovecs and control data for the duration of the call; the
    // descriptors are borrowed, so they stay open until it returns.
    let n = unsafe {
        libc::sendmsg(
            fd.as_raw_fd(),
            &msg,
            libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// One received message.
pub(crate) struct Received {
    /// Bytes written to the buffer (0 with no descriptors: the peer closed).
    pub len: usize,
    /// The message was longer than the buffer (`MSG_TRUNC`): the rest is lost.
    pub truncated: bool,
    /// More descriptors came than were asked for (`MSG_CTRUNC`): the kernel closed the rest.
    pub fds_truncated: bool,
    /// Descriptors that came with the message, owned and close-on-exec.
    pub fds: Vec<OwnedFd>,
}

/// Receives one message into `buf` without blocking, accepting up to `max_fds` descriptors.
pub(crate) fn recv(fd: BorrowedFd<'_>, buf: &mut [u8], max_fds: usize) -> io::Result<Received> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: CMSG_SPACE is pure arithmetic.
    let space =
        unsafe { libc::CMSG_SPACE((max_fds.max(1) * std::mem::size_of::<RawFd>()) as _) as usize };
    let mut control = vec![0u64; space.div_ceil(8)];
    // SAFETY: msghdr is plain data; all-zero is a valid (empty) value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg` points at a live, writable buffer and control area of the sizes given.
    let n = unsafe {
        libc::recvmsg(
            fd.as_raw_fd(),
            &mut msg,
            libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: the kernel filled `msg_controllen` bytes of `control` with well-formed headers;
    // CMSG_FIRSTHDR/NXTHDR stay inside that length. Every SCM_RIGHTS descriptor is a new one
    // installed in this process for us, so each is taken into an OwnedFd at once (closed on
    // any later error).
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let header = libc::CMSG_LEN(0) as usize;
                let count =
                    ((*c).cmsg_len as usize).saturating_sub(header) / std::mem::size_of::<RawFd>();
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                for i in 0..count {
                    let raw = data.add(i).read_unaligned();
                    if raw >= 0 {
                        fds.push(OwnedFd::from_raw_fd(raw));
                    }
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok(Received {
        len: n as usize,
        truncated: msg.msg_flags & libc::MSG_TRUNC != 0,
        fds_truncated: msg.msg_flags & libc::MSG_CTRUNC != 0,
        fds,
    })
}

/// One descriptor to wait on and what happened to it.
#[derive(Clone, Copy)]
pub(crate) struct Watch {
    /// The descriptor.
    pub fd: RawFd,
    /// What to wait for ([`POLLIN`], [`POLLOUT`]).
    pub events: i16,
    /// What happened (also hang-up and error bits, whatever was asked).
    pub revents: i16,
}

/// Waits until one of `set` is ready or `timeout` passes (`None`: forever). Returns how many are
/// ready; an interrupted wait returns 0.
pub(crate) fn poll(set: &mut [Watch], timeout: Option<Duration>) -> io::Result<usize> {
    let mut pfd: Vec<libc::pollfd> = set
        .iter()
        .map(|w| libc::pollfd {
            fd: w.fd,
            events: w.events | libc::POLLRDHUP,
            revents: 0,
        })
        .collect();
    let ms = match timeout {
        None => -1,
        // Round up so a short remaining time still waits rather than spinning.
        Some(t) => t.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int,
    };
    // SAFETY: `pfd` is a live array of `pfd.len()` pollfd structs.
    let r = unsafe { libc::poll(pfd.as_mut_ptr(), pfd.len() as libc::nfds_t, ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(0)
        } else {
            Err(e)
        };
    }
    for (w, p) in set.iter_mut().zip(&pfd) {
        w.revents = p.revents;
    }
    Ok(r as usize)
}

/// A close-on-exec, non-blocking eventfd: a wake-up a thread can send to a poller.
pub(crate) fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: plain system call with constant arguments.
    owned(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })
}

/// Makes an eventfd readable.
pub(crate) fn eventfd_wake(fd: BorrowedFd<'_>) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: writes 8 bytes from a live buffer; a full counter (EAGAIN) is already a wake-up.
    unsafe { libc::write(fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
}

/// Empties an eventfd (after a wake-up was seen).
pub(crate) fn eventfd_drain(fd: BorrowedFd<'_>) {
    let mut b = [0u8; 8];
    // SAFETY: reads at most 8 bytes into a live buffer; an empty counter (EAGAIN) is fine.
    unsafe { libc::read(fd.as_raw_fd(), b.as_mut_ptr().cast(), b.len()) };
}

/// An anonymous in-memory file (`memfd_create`, close-on-exec), as a [`std::fs::File`].
pub fn memfd(name: &str) -> io::Result<std::fs::File> {
    let name = CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in memfd name"))?;
    // SAFETY: `name` is a NUL-terminated string that outlives the call.
    let fd = owned(unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) })?;
    Ok(std::fs::File::from(fd))
}
