//! CUDA graphs of a Comm's collectives that cannot outlive what they use.
//!
//! A graph replays device addresses: the plan, the heap, the counters, the records, the buffers.
//! [`Comm::capture`] is the one safe way to capture a Comm's work:
//!
//! * the [`CommGraph`] borrows the Comm, so the Comm (its module, plans and heap) cannot be
//!   dropped while the graph lives;
//! * every buffer the capture names is pinned: [`Comm::free`] and [`CommTeam::free`] refuse it
//!   until the graph is dropped, so no replay writes into memory a later allocation received;
//! * every replay ([`CommGraph::launch`]) checks that the Comm is not poisoned and no peer was
//!   lost, takes the launch lock (so it cannot race [`Comm::reset`]) and is ordered after the
//!   Comm's earlier collectives on other streams (`order`).
//!
//! Plans must exist before the capture (stream capture forbids the allocation that uploads one):
//! [`Comm::prepare`] / [`CommTeam::prepare`] (or admit) each request first, or run it once eagerly.

use std::cell::RefCell;
use std::collections::HashMap;

use symm_core::sched::Request;

use super::{Admitted, Comm, CommTeam};
use crate::cuda::bounds::Buffers;
use crate::cuda::device::Stream;
use crate::cuda::error::{CudaError, Result};
use crate::cuda::launch::Graph;

/// What a capture body enqueues through (see [`Comm::capture`]).
pub struct Capture<'a> {
    comm: &'a Comm,
    stream: &'a Stream,
    pinned: RefCell<Vec<Buffers>>,
    /// The team ids (0: the job) whose collectives the capture holds.
    teams: RefCell<Vec<u16>>,
}

impl Capture<'_> {
    /// Enqueues `req` over `b` into the graph (the request's plan must be prepared) and pins `b`.
    pub fn enqueue(&self, req: &Request, b: &Buffers) -> Result<()> {
        let comm = self.comm;
        let a = comm.admit_prepared((0, *req), comm.buffer_area(), comm.job.world)?;
        self.launch(&a, b)
    }

    /// Launches the admitted request `a` over `b` into the graph and pins `b` (its plan exists:
    /// it was admitted).
    pub fn launch(&self, a: &Admitted, b: &Buffers) -> Result<()> {
        let _g = self.comm.enter()?;
        a.check(self.comm, b)?;
        // Pinned before the graph names them: a `free` on another thread meanwhile is refused.
        self.pin(b);
        self.comm
            .launch_entered(a, (b, [false; 2]), self.stream, None, None)?;
        self.teams.borrow_mut().push(a.team());
        Ok(())
    }

    /// Enqueues the team collective `req` over `b` (buffers of the team's region) into the
    /// graph and pins `b`.
    pub fn enqueue_team(&self, team: &CommTeam<'_>, req: &Request, b: &Buffers) -> Result<()> {
        if !std::ptr::eq(team.comm(), self.comm) {
            return Err(CudaError::WrongOwner { what: "the team" });
        }
        let a = team.admit_prepared(req)?;
        self.launch(&a, b)
    }

    /// Pins buffers that other work in the capture uses (a library's collective enqueued on
    /// [`Capture::stream`]), so they are not freed while the graph lives. The pin holds from
    /// this call: a `free` of them (on any thread) is refused until the graph is dropped, or
    /// until the capture fails.
    pub fn pin(&self, b: &Buffers) {
        self.comm.pin_all(std::slice::from_ref(b));
        self.pinned.borrow_mut().push(*b);
    }

    /// The capturing stream, for other work to capture into the same graph.
    pub fn stream(&self) -> &Stream {
        self.stream
    }
}

/// A CUDA graph of a Comm's work; replay with [`CommGraph::launch`]. It borrows the Comm and
/// pins the buffers it names until dropped.
pub struct CommGraph<'c> {
    comm: &'c Comm,
    graph: Graph,
    pinned: Vec<Buffers>,
    teams: Vec<u16>,
}

/// The heap offsets of a set of buffers (each a live allocation of its own).
fn offsets(b: &Buffers) -> [u64; 3] {
    [b.input, b.output, b.scratch]
}

impl Comm {
    /// Captures what `body` enqueues through its [`Capture`] on `stream` into a CUDA graph.
    /// The request plans must be prepared first ([`Comm::prepare`]). The graph borrows the Comm
    /// and pins every buffer the capture names.
    pub fn capture<'c>(
        &'c self,
        stream: &Stream,
        body: impl FnOnce(&Capture<'_>) -> Result<()>,
    ) -> Result<CommGraph<'c>> {
        let _g = self.enter_on(stream)?;
        let cap = Capture {
            comm: self,
            stream,
            pinned: RefCell::new(Vec::new()),
            teams: RefCell::new(Vec::new()),
        };
        let graph = Graph::capture(&self.dev, stream, || body(&cap));
        let pinned = cap.pinned.into_inner();
        let graph = match graph {
            Ok(g) => g,
            Err(err) => {
                self.unpin_all(&pinned);
                return Err(err);
            }
        };
        let mut teams = cap.teams.into_inner();
        teams.sort_unstable();
        teams.dedup();
        Ok(CommGraph {
            comm: self,
            graph,
            pinned,
            teams,
        })
    }

    /// Counts one more pin of each of the buffers' offsets (a poisoned registry is still used:
    /// a pin must never be lost).
    fn pin_all(&self, bs: &[Buffers]) {
        let mut a = self.alloc.lock().unwrap_or_else(|e| e.into_inner());
        for b in bs {
            for o in offsets(b) {
                *a.pins.entry(o).or_insert(0) += 1;
            }
        }
    }

    /// Takes back one pin of each of the buffers' offsets.
    fn unpin_all(&self, bs: &[Buffers]) {
        let mut a = self.alloc.lock().unwrap_or_else(|e| e.into_inner());
        for b in bs {
            for o in offsets(b) {
                if let Some(n) = a.pins.get_mut(&o) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        a.pins.remove(&o);
                    }
                }
            }
        }
    }

    /// Fails when a live graph names any of `b`'s buffers.
    pub(super) fn check_unpinned(&self, b: &Buffers) -> Result<()> {
        check_unpinned_in(&self.alloc_lock()?.pins, b)
    }
}

/// Fails when the pin registry `reg` names any of `b`'s buffers (a `free` holds the registry's
/// lock from this check until the buffers are back in the heap, so no capture pins them
/// between).
pub(super) fn check_unpinned_in(reg: &HashMap<u64, usize>, b: &Buffers) -> Result<()> {
    if offsets(b).iter().any(|o| reg.contains_key(o)) {
        return Err(CudaError::Pinned);
    }
    Ok(())
}

impl CommGraph<'_> {
    /// Replays the graph on `stream` (of the Comm's device): refused when the Comm is poisoned
    /// or a peer was lost; ordered after the Comm's earlier collectives. Errors of the replay
    /// itself are reported by [`Comm::check`] or [`Comm::synchronize`].
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        let comm = self.comm;
        let _g = comm.enter_on(stream)?;
        let mut l = comm.launch_lock()?;
        let order = &mut l.order;
        let mut record = Vec::with_capacity(self.teams.len());
        for &t in &self.teams {
            record.push(comm.order_before(order, t, stream, None)?);
        }
        let r = self.graph.launch(stream);
        if let Err(e) = &r {
            comm.poison.raise(e);
        }
        r?;
        for (&t, &rec) in self.teams.iter().zip(&record) {
            comm.ordered_after(order, t, stream, rec)?;
        }
        Ok(())
    }
}

impl Drop for CommGraph<'_> {
    fn drop(&mut self) {
        self.comm.unpin_all(&self.pinned);
    }
}
