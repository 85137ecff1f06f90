//! Runtime errors as Python exceptions, by their kind ([`CudaError::kind`]), never by variant:
//! the C ABI maps the same kinds, so both bindings classify every error alike.
//!
//! | kind | raises |
//! |---|---|
//! | invalid argument, ranks differ | `ValueError` |
//! | timeout | `symm.TimeoutError` (rank, peer, slot, expected, found where a device wait has them) |
//! | peer lost | `symm.PeerLostError` (the rank) |
//! | poisoned | `symm.PoisonedError` |
//! | anything else | `symm.SymmError` |

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use symm_driver::cuda::{CudaError, ErrorKind};

/// The Python exception of `e` (see the module doc).
pub(crate) fn py_err(py: Python<'_>, e: CudaError) -> PyErr {
    let msg = e.to_string();
    let build = || -> PyResult<PyErr> {
        let errors = py.import("symm.errors")?;
        let obj = match e.kind() {
            ErrorKind::InvalidArgument | ErrorKind::RanksDiffer => {
                return Ok(PyValueError::new_err(msg.clone()))
            }
            ErrorKind::Timeout => {
                let cls = errors.getattr("TimeoutError")?;
                match &e {
                    CudaError::Timeout {
                        rank,
                        peer,
                        slot,
                        expected,
                        found,
                        ..
                    } => cls.call1((msg.clone(), *rank, *peer, *slot, *expected, *found))?,
                    _ => cls.call1((msg.clone(),))?,
                }
            }
            ErrorKind::PeerLost => errors
                .getattr("PeerLostError")?
                .call1((msg.clone(), e.lost_rank()))?,
            ErrorKind::Poisoned => errors.getattr("PoisonedError")?.call1((msg.clone(),))?,
            _ => errors.getattr("SymmError")?.call1((msg.clone(),))?,
        };
        Ok(PyErr::from_value(obj))
    };
    build().unwrap_or_else(|err| err)
}
