//! `symm._symm.norm_reference`: the host reference of the fused all-reduce, residual add and
//! RMSNorm (`symm_core::norm`), over bf16 bytes: what the GPU's results are compared with.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// Little-endian u16 words of `b` (bf16 bits), or a `ValueError` naming `what`.
fn words(what: &str, b: &[u8]) -> PyResult<Vec<u16>> {
    if !b.len().is_multiple_of(2) {
        return Err(PyValueError::new_err(format!(
            "{what} holds {} bytes, not whole bf16 elements",
            b.len()
        )));
    }
    Ok(b.chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect())
}

/// The reference of one call: every rank's input (bf16 bytes, in rank order), the residual and
/// the weight (its length is the row width); returns (new residual, output) as bf16 bytes.
#[pyfunction]
pub fn norm_reference<'py>(
    py: Python<'py>,
    inputs: Vec<Vec<u8>>,
    residual: &[u8],
    weight: &[u8],
    eps: f32,
) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
    let xs = inputs
        .iter()
        .map(|b| words("an input", b))
        .collect::<PyResult<Vec<_>>>()?;
    let refs: Vec<&[u16]> = xs.iter().map(|v| v.as_slice()).collect();
    let (res, w) = (
        words("the residual", residual)?,
        words("the weight", weight)?,
    );
    if !eps.is_finite() || eps < 0.0 {
        return Err(PyValueError::new_err(
            symm_core::norm::NormError::BadEps.to_string(),
        ));
    }
    let (mut res_out, mut out) = (vec![0u16; res.len()], vec![0u16; res.len()]);
    symm_core::norm::all_reduce_rmsnorm(&refs, &res, &w, eps, &mut res_out, &mut out)
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let bytes = |v: &[u16]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    Ok((
        PyBytes::new(py, &bytes(&res_out)),
        PyBytes::new(py, &bytes(&out)),
    ))
}
