use crate::HostTensor;

/// `|got − want| ≤ atol + rtol·|want|`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    /// Absolute part.
    pub atol: f64,
    /// Relative part.
    pub rtol: f64,
}

/// Error figures of one output.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputReport {
    /// Output name.
    pub name: String,
    /// Elements compared.
    pub compared: usize,
    /// Elements skipped (NaN expected: unspecified).
    pub unspecified: usize,
    /// Elements out of tolerance.
    pub failed: usize,
    /// Largest absolute error.
    pub max_abs: f64,
    /// Largest relative error (`|got − want| / |want|`, over elements with `want ≠ 0`).
    pub max_rel: f64,
}

impl OutputReport {
    /// Whether every compared element is within tolerance.
    pub fn passed(&self) -> bool {
        self.failed == 0
    }
}

/// Compares `got` with `want` element by element (floats compared in f64 after exact widening).
pub fn compare(name: &str, got: &HostTensor, want: &HostTensor, tol: Tolerance) -> Result<OutputReport, String> {
    if got.shape.iter().product::<usize>() != want.shape.iter().product::<usize>() {
        return Err(format!("`{name}`: produced shape {:?}, expected {:?}", got.shape, want.shape));
    }
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let exact = want.dtype.is_index() || want.dtype == ssm_tensor::DType::Bool;
    let mut r =
        OutputReport { name: name.to_string(), compared: 0, unspecified: 0, failed: 0, max_abs: 0.0, max_rel: 0.0 };
    for (&gv, &wv) in g.iter().zip(&w) {
        if wv.is_nan() {
            r.unspecified += 1;
            continue;
        }
        r.compared += 1;
        let err = (gv - wv).abs();
        let ok = if exact { gv == wv } else { err <= tol.atol + tol.rtol * wv.abs() };
        if !ok || gv.is_nan() {
            r.failed += 1;
        }
        let err = if gv.is_nan() { f64::INFINITY } else { err };
        r.max_abs = r.max_abs.max(err);
        if wv != 0.0 {
            r.max_rel = r.max_rel.max(err / wv.abs());
        }
    }
    Ok(r)
}
