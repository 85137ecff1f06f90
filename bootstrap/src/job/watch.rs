//! The watcher: one thread per process that reads every connection and notices lost peers.
//!
//! It is the only reader of the sockets. Collective frames go into a bounded queue per
//! connection, where the calling thread takes them (`Shared::take`); everything else is
//! handled here:
//!
//! * EOF, a reset or a protocol violation on a connection marks its peer dead. Unless the job is
//!   closing (`Shared::closing`), that peer is *lost*: the root first sends `Lost { rank }` to
//!   every other rank, then the lost word takes its rank (the first loss only) and the callbacks
//!   run once. Telling the others first matters: a root whose own calls fail on the loss may
//!   exit at once, and its EOF must not reach a rank before the notice does (that rank would
//!   take the root for the lost one).
//! * A rank other than the root treats `Lost { rank }` the same way, and EOF from the root as the
//!   loss of rank 0.
//!
//! `poll` wakes the thread as soon as the kernel sees a peer's socket close, which happens when
//! its process dies however it dies, so every live rank learns of a loss within a few
//! milliseconds. An eventfd wakes the thread to stop.

use std::collections::VecDeque;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::error::{BootstrapError, Result};
use super::sys;
use super::wire::{self, Frame, Head, Kind, LinkError};

/// The lost word's value while no peer is lost.
pub const NOT_LOST: u32 = u32::MAX;
/// How long the root spends telling one rank of a loss.
const NOTICE: Duration = Duration::from_millis(200);

/// Called once, on the watcher thread, with the first lost rank.
pub type LostCallback = Box<dyn Fn(u16) + Send + Sync>;

/// One connection: to a rank (at the root) or to the root.
pub(crate) struct Link {
    /// The rank at the other end.
    pub peer: u16,
    pub fd: OwnedFd,
}

/// What the watcher and the calling thread share, under [`Shared::state`].
pub(crate) struct State {
    /// Frames waiting per link.
    pub queues: Vec<VecDeque<Frame>>,
    /// Per link: why it is dead, if it is (`None`: closed or reset).
    pub dead: Vec<Option<Option<&'static str>>>,
    /// The error that made the bootstrap unusable.
    pub poisoned: Option<BootstrapError>,
}

/// The watcher's and the callers' common state.
pub(crate) struct Shared {
    pub rank: u16,
    pub world: u16,
    pub links: Vec<Link>,
    pub state: Mutex<State>,
    pub cv: Condvar,
    /// The first lost rank, or [`NOT_LOST`].
    pub lost: Arc<AtomicU32>,
    /// Set by `finish`: from then on a closed connection is the end of the job, not a loss.
    pub closing: AtomicBool,
    /// The epoch this process is in: what it sends carries it (see `SocketBootstrap::recover`).
    pub epoch: AtomicU8,
    stop: AtomicBool,
    wake: OwnedFd,
    callbacks: Mutex<Vec<LostCallback>>,
    /// Most frames a link's queue holds.
    cap: usize,
}

impl Shared {
    pub fn new(rank: u16, world: u16, links: Vec<Link>) -> Result<Shared> {
        let wake = sys::eventfd().map_err(|e| BootstrapError::sys("eventfd", e))?;
        let n = links.len();
        Ok(Shared {
            rank,
            world,
            links,
            state: Mutex::new(State {
                queues: (0..n).map(|_| VecDeque::new()).collect(),
                dead: vec![None; n],
                poisoned: None,
            }),
            cv: Condvar::new(),
            lost: Arc::new(AtomicU32::new(NOT_LOST)),
            closing: AtomicBool::new(false),
            epoch: AtomicU8::new(0),
            stop: AtomicBool::new(false),
            wake,
            callbacks: Mutex::new(Vec::new()),
            // The root holds at most one contribution per rank and its recover; a rank, one
            // result (a part per source rank), an abort, the root's notice that it recovers
            // and its recover.
            cap: if rank == 0 { 2 } else { world as usize + 3 },
        })
    }

    /// The state, even if a thread panicked holding it (the state stays consistent: every
    /// update is a single assignment or push).
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The first lost rank, if any.
    pub fn lost_rank(&self) -> Option<u16> {
        match self.lost.load(Ordering::Acquire) {
            NOT_LOST => None,
            r => u16::try_from(r).ok(),
        }
    }

    /// Records `rank` as lost (the first loss sets the word and runs the callbacks).
    pub fn raise_lost(&self, rank: u16) {
        {
            let cbs = self.callbacks.lock().unwrap_or_else(|p| p.into_inner());
            let first = self
                .lost
                .compare_exchange(NOT_LOST, rank as u32, Ordering::AcqRel, Ordering::Acquire)
                .is_ok();
            if first {
                for cb in cbs.iter() {
                    cb(rank);
                }
            }
        }
        // Taking the lock orders the notification after any waiter's check.
        drop(self.lock());
        self.cv.notify_all();
    }

    /// Adds a callback; runs it at once if a peer is already lost.
    pub fn on_lost(&self, cb: LostCallback) {
        let mut cbs = self.callbacks.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = self.lost_rank() {
            cb(r);
        }
        cbs.push(cb);
    }

    /// Waits until a peer is lost or `timeout` passes.
    pub fn wait_lost(&self, timeout: Duration) -> Option<u16> {
        let deadline = wire::after(Instant::now(), timeout);
        let mut st = self.lock();
        loop {
            if let Some(r) = self.lost_rank() {
                return Some(r);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            st = self
                .cv
                .wait_timeout(st, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Takes the next frame from link `i` by `deadline`: fails when the link is dead and empty,
    /// when any peer is lost (outside closing), or when the bootstrap is poisoned.
    pub fn take(&self, i: usize, op: &'static str, deadline: Instant) -> Result<Frame> {
        let peer = self.links.get(i).map_or(0, |l| l.peer);
        let mut st = self.lock();
        loop {
            if let Some(e) = &st.poisoned {
                return Err(BootstrapError::Poisoned(Box::new(e.clone())));
            }
            if let Some(f) = st.queues.get_mut(i).and_then(VecDeque::pop_front) {
                return Ok(f);
            }
            let dead = st.dead.get(i).copied().flatten();
            if let Some(Some(what)) = dead {
                return Err(BootstrapError::Protocol { rank: peer, what });
            }
            // The first loss, which may be what closed this link (a rank losing rank 1 hears of
            // it from the root, which may then close).
            if !self.closing.load(Ordering::Acquire) {
                if let Some(rank) = self.lost_rank() {
                    return Err(BootstrapError::PeerLost { rank });
                }
            }
            if dead.is_some() {
                return Err(BootstrapError::PeerLost { rank: peer });
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(BootstrapError::Timeout {
                    op,
                    waiting_for: vec![peer],
                });
            }
            st = self
                .cv
                .wait_timeout(st, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Puts `f`, taken from link `i`, back at the front of its queue.
    pub fn put_back(&self, i: usize, f: Frame) {
        if let Some(q) = self.lock().queues.get_mut(i) {
            q.push_front(f);
        }
        self.cv.notify_all();
    }

    /// Whether link `i` has a frame waiting.
    pub fn has_frame(&self, i: usize) -> bool {
        self.lock().queues.get(i).is_some_and(|q| !q.is_empty())
    }

    /// Marks link `i` dead (`what`: the protocol violation, if that was the cause). Outside
    /// closing, the root tells the other ranks first, then the loss is raised (word, callbacks)
    /// before any waiting call can see the link dead.
    fn dead(&self, i: usize, what: Option<&'static str>) {
        let Some(link) = self.links.get(i) else {
            return;
        };
        let lost = !self.closing.load(Ordering::Acquire);
        if lost {
            self.tell_lost(link.peer);
            self.raise_lost(link.peer);
        }
        {
            let mut st = self.lock();
            if let Some(d) = st.dead.get_mut(i) {
                *d = Some(what);
            }
        }
        self.cv.notify_all();
    }

    /// At the root: tells every other rank that `rank` was lost.
    fn tell_lost(&self, rank: u16) {
        if self.rank == 0 {
            let notice = Instant::now() + NOTICE;
            let head = Head::control(Kind::Lost, rank);
            for l in self.links.iter().filter(|l| l.peer != rank) {
                let _ = wire::send(l.fd.as_fd(), head, &[], &[], notice);
            }
        }
    }

    /// Handles one frame from link `i`.
    fn handle(&self, i: usize, f: Frame) -> std::result::Result<(), &'static str> {
        let expected = match (self.rank, f.head.kind) {
            (0, Kind::Contribute | Kind::Recover) => true,
            (0, _) => return Err("unexpected frame from a rank"),
            (_, Kind::Part | Kind::Abort | Kind::Recover) => true,
            (_, Kind::Lost) if f.head.rank < self.world && f.head.rank != self.rank => {
                if !self.closing.load(Ordering::Acquire) {
                    self.raise_lost(f.head.rank);
                }
                false
            }
            _ => return Err("unexpected frame from the root"),
        };
        if expected {
            {
                let mut st = self.lock();
                let q = st.queues.get_mut(i).ok_or("no such link")?;
                if q.len() >= self.cap {
                    return Err("more frames than the protocol allows");
                }
                q.push_back(f);
            }
            self.cv.notify_all();
        }
        Ok(())
    }

    /// Asks the watcher to stop.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        sys::eventfd_wake(self.wake.as_fd());
    }
}

/// The watcher thread's body: runs until [`Shared::stop`].
pub(crate) fn run(shared: Arc<Shared>) {
    let mut buf = vec![0u8; wire::MAX_FRAME];
    let mut live: Vec<bool> = vec![true; shared.links.len()];
    loop {
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        let mut set = vec![sys::Watch {
            fd: shared.wake.as_raw_fd(),
            events: sys::POLLIN,
            revents: 0,
        }];
        let mut which = Vec::new();
        for (i, l) in shared.links.iter().enumerate() {
            if live[i] {
                set.push(sys::Watch {
                    fd: l.fd.as_raw_fd(),
                    events: sys::POLLIN,
                    revents: 0,
                });
                which.push(i);
            }
        }
        if sys::poll(&mut set, None).is_err() {
            // poll fails only on resource exhaustion; wait and try again rather than spin.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        if set[0].revents != 0 {
            sys::eventfd_drain(shared.wake.as_fd());
        }
        for (w, &i) in set[1..].iter().zip(&which) {
            if w.revents == 0 {
                continue;
            }
            // Drain what is there (bounded: a full queue is a violation), then look again.
            loop {
                match wire::try_recv(shared.links[i].fd.as_fd(), &mut buf) {
                    Ok(Some(f)) => {
                        if let Err(what) = shared.handle(i, f) {
                            live[i] = false;
                            shared.dead(i, Some(what));
                            break;
                        }
                    }
                    Ok(None) => break,
                    Err(LinkError::Protocol(what)) => {
                        live[i] = false;
                        shared.dead(i, Some(what));
                        break;
                    }
                    Err(_) => {
                        live[i] = false;
                        shared.dead(i, None);
                        break;
                    }
                }
            }
        }
    }
}
