//! Names from Python to values, through core's one parser per kind (`symm_core::name`): an
//! unknown name is a `ValueError` that lists the valid ones.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use symm_core::cost::Topology;
use symm_core::dtype::{DType, ReduceOp};
use symm_core::name::UnknownName;
use symm_core::sched::{Algorithm, Collective};

/// The `ValueError` of an unknown name.
fn unknown(e: UnknownName) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// A rank argument of a world of `world` ranks.
fn rank(what: &str, r: i64, world: u16) -> PyResult<u16> {
    if r < 0 || r >= i64::from(world) {
        return Err(PyValueError::new_err(format!(
            "{what} {r} is not a rank of a world of {world}"
        )));
    }
    Ok(r as u16)
}

/// The collective named `name` at `world` ranks, with its root (`root`) or its sender and
/// receiver (`src`, `dst`, the last rank when `None`). An all-to-allv request's `nbytes` is
/// every rank's buffer size (the largest row or column total of its counts): enough for its
/// sizes and its cost; the runs that need its counts refuse it ([`crate`]'s data requests).
pub(crate) fn collective(
    name: &str,
    world: u16,
    root: i64,
    src: i64,
    dst: Option<i64>,
) -> PyResult<Collective> {
    Ok(match Collective::parse(name).map_err(unknown)? {
        Collective::SendRecv { .. } => Collective::SendRecv {
            src: rank("src", src, world)?,
            dst: rank("dst", dst.unwrap_or(i64::from(world) - 1), world)?,
        },
        c @ (Collective::Broadcast { .. }
        | Collective::Reduce { .. }
        | Collective::Scatter { .. }
        | Collective::Gather { .. }) => c.with_root(rank("root", root, world)?),
        c => c,
    })
}

/// The algorithm named `name`.
pub(crate) fn algorithm(name: &str) -> PyResult<Algorithm> {
    Algorithm::parse(name).map_err(unknown)
}

/// The element type named `name`.
pub(crate) fn dtype(name: &str) -> PyResult<DType> {
    DType::parse(name).map_err(unknown)
}

/// The reduction operator named `name`.
pub(crate) fn reduce_op(name: &str) -> PyResult<ReduceOp> {
    ReduceOp::parse(name).map_err(unknown)
}

/// The topology named `name`.
pub(crate) fn topology(name: &str) -> PyResult<Topology> {
    Topology::parse(name).map_err(unknown)
}

/// Every name of every kind, for `symm.names()`: (kind, names).
pub(crate) fn all() -> Vec<(&'static str, Vec<&'static str>)> {
    let coll = Collective::ALL.iter().map(|c| c.name()).collect();
    vec![
        ("collectives", coll),
        (
            "algorithms",
            Algorithm::ALL.iter().map(|a| a.name()).collect(),
        ),
        ("dtypes", DType::ALL.iter().map(|d| d.name()).collect()),
        ("ops", ReduceOp::ALL.iter().map(|o| o.name()).collect()),
        (
            "topologies",
            Topology::ALL.iter().map(|t| t.name()).collect(),
        ),
    ]
}

/// An integer argument of a class the extension defines (the functions check theirs in
/// `symm._args` first): an `int` that is not a `bool` (`TypeError` otherwise), within a signed
/// 64-bit integer (`ValueError` otherwise, never the `OverflowError` of the conversion).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Int(pub(crate) i64);

impl<'py> FromPyObject<'py> for Int {
    fn extract_bound(ob: &Bound<'py, PyAny>) -> PyResult<Self> {
        use pyo3::exceptions::PyTypeError;
        use pyo3::types::{PyBool, PyInt};
        if ob.is_instance_of::<PyBool>() || !ob.is_instance_of::<PyInt>() {
            return Err(PyTypeError::new_err(format!(
                "must be an int, not {}",
                ob.get_type().name()?
            )));
        }
        ob.extract::<i64>().map(Int).map_err(|_| {
            PyValueError::new_err(format!(
                "{} is outside what symm takes ({} to {})",
                ob.str().map(|s| s.to_string()).unwrap_or_default(),
                i64::MIN,
                i64::MAX
            ))
        })
    }
}
