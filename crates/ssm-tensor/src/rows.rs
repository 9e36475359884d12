//! `copy_rows`: whole rows moved between two row-major tensors through an index list, the
//! gather and scatter a layer core uses to run one group of a mixed batch's tokens (vLLM's
//! `mixed_qkv[spec_token_indx]` and `core_attn_out[spec_token_indx] = …`).
//!
//! The op lives here, next to [`Op`], because it belongs to no op family: every backend runs
//! it (`Run<CopyRowsArgs>`), and it is reached, like every op, only through its plan.
//!
//! ```
//! use ssm_tensor::{CopyRowsArgs, DType, HostTensor, Op, RowDirection};
//!
//! let src = HostTensor::from_f32(DType::F32, vec![3, 2], &[0., 1., 10., 11., 20., 21.]);
//! let mut dst = HostTensor::filled(DType::F32, vec![2, 2], 0.0);
//! let index = HostTensor::from_i64(DType::I32, vec![2], &[2, 0]);
//! let args = CopyRowsArgs { src: src.view(), dst: dst.view_mut(), index: index.view(), direction: RowDirection::Gather };
//! let plan = args.plan().unwrap();
//! assert_eq!((plan.n, plan.width), (2, 2));
//! // A host index outside the indexed tensor's rows is refused by the plan.
//! let bad = HostTensor::from_i64(DType::I32, vec![1], &[3]);
//! let args = CopyRowsArgs { src: src.view(), dst: dst.view_mut(), index: bad.view(), direction: RowDirection::Gather };
//! assert!(args.plan().unwrap_err().to_string().contains("[0, 3)"));
//! ```

use crate::{ArgError, DType, Device, Op, Planned, TensorMut, TensorRef};

/// Which tensor the index list addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowDirection {
    /// `dst[i] = src[index[i]]` for `i < n`.
    Gather,
    /// `dst[index[i]] = src[i]` for `i < n`.
    Scatter,
}

/// Moves `n = index.len()` whole rows from `src` to `dst`.
///
/// Contract:
/// - `src` `[rows_s, width]` and `dst` `[rows_d, width]`: rank 2, the same dtype, the same
///   width, each row contiguous (last stride 1); `dst` disjoint in itself;
/// - `index` `[n]` of `i32` or `i64`, on the same device; the side it does not address has at
///   least `n` rows;
/// - host index values must lie in `[0, rows)` of the addressed tensor (the plan refuses
///   others); device index values are checked by the kernel, which skips such a row and sets
///   the error word (nothing of that row is written);
/// - a scatter whose index list repeats a row writes one of the repeated rows there.
///
/// Writes the `n` rows of `dst` it names, nothing else.
pub struct CopyRowsArgs<'a> {
    /// `[rows_s, width]`.
    pub src: TensorRef<'a>,
    /// `[rows_d, width]`.
    pub dst: TensorMut<'a>,
    /// `[n]` row indices (`i32`/`i64`) into `src` (gather) or `dst` (scatter).
    pub index: TensorRef<'a>,
    /// Which side `index` addresses.
    pub direction: RowDirection,
}

/// The checked form of a [`CopyRowsArgs`] call.
#[derive(Debug, Clone)]
pub struct CopyRowsPlan {
    /// Where every tensor lives.
    pub device: Device,
    /// Rows moved.
    pub n: usize,
    /// Elements per row.
    pub width: usize,
    /// Rows of `src` and of `dst`.
    pub rows: [usize; 2],
    /// Row strides of `src` and `dst`, in elements.
    pub row_strides: [isize; 2],
    /// Element offsets of row 0 of `src` and `dst`.
    pub offsets: [usize; 2],
    /// The direction.
    pub direction: RowDirection,
    /// Host index values, checked; `None` for device indices (checked by the kernel).
    pub host_index: Option<Vec<usize>>,
}

/// Why a [`CopyRowsArgs`] call was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RowsError {
    /// A tensor argument does not meet the contract.
    #[error(transparent)]
    Arg(#[from] ArgError),
    /// A host index value outside the addressed tensor's rows.
    #[error("`index` entry {i} = {value} must be a row in [0, {rows})")]
    Index {
        /// Position in the list.
        i: usize,
        /// Its value.
        value: i64,
        /// Rows of the addressed tensor.
        rows: usize,
    },
}

fn rows_of(arg: &'static str, shape: &[usize], strides: &[isize]) -> Result<(), ArgError> {
    if shape.len() != 2 {
        return Err(ArgError::Rank { arg, expected: "2 ([rows, width])", actual: shape.to_vec() });
    }
    if strides[1] != 1 && shape[1] > 1 {
        return Err(ArgError::Strides {
            arg,
            what: "contiguous along its rows (last stride 1)",
            shape: shape.to_vec(),
            strides: strides.to_vec(),
        });
    }
    Ok(())
}

fn plan_copy_rows(a: &CopyRowsArgs<'_>) -> Result<CopyRowsPlan, RowsError> {
    let device = a.src.device();
    for (arg, d) in [("dst", a.dst.device()), ("index", a.index.device())] {
        if d != device {
            return Err(ArgError::Device { arg, reference: "src", expected: device, actual: d }.into());
        }
    }
    rows_of("src", a.src.shape(), a.src.strides())?;
    rows_of("dst", a.dst.shape(), a.dst.strides())?;
    ArgError::check_written("dst", a.dst.layout())?;
    if a.dst.dtype() != a.src.dtype() {
        return Err(ArgError::DType { arg: "dst", expected: a.src.dtype().to_string(), actual: a.dst.dtype() }.into());
    }
    let width = a.src.shape()[1];
    let rows = [a.src.shape()[0], a.dst.shape()[0]];
    if a.dst.shape()[1] != width {
        return Err(ArgError::Shape {
            arg: "dst",
            expected: format!("[rows, width = {width}] (the width of `src`)"),
            actual: a.dst.shape().to_vec(),
        }
        .into());
    }
    if !matches!(a.index.dtype(), DType::I32 | DType::I64) {
        return Err(ArgError::DType { arg: "index", expected: "i32 or i64".into(), actual: a.index.dtype() }.into());
    }
    if a.index.rank() != 1 {
        return Err(ArgError::Rank { arg: "index", expected: "1 ([n])", actual: a.index.shape().to_vec() }.into());
    }
    let n = a.index.shape()[0];
    let (addressed, dense, dense_arg) = match a.direction {
        RowDirection::Gather => (rows[0], rows[1], "dst"),
        RowDirection::Scatter => (rows[1], rows[0], "src"),
    };
    if dense < n {
        let actual = if dense_arg == "dst" { a.dst.shape() } else { a.src.shape() };
        return Err(ArgError::Shape {
            arg: dense_arg, expected: format!("[≥ {n}, {width}]"), actual: actual.to_vec()
        }
        .into());
    }
    let host_index = match a.index.host_bytes() {
        None => None,
        Some(_) => Some(
            (0..n)
                .map(|i| {
                    let value = a.index.get_i64(&[i]).map_err(|source| ArgError::Tensor { arg: "index", source })?;
                    usize::try_from(value).ok().filter(|&r| r < addressed).ok_or(RowsError::Index {
                        i,
                        value,
                        rows: addressed,
                    })
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
    };
    Ok(CopyRowsPlan {
        device,
        n,
        width,
        rows,
        row_strides: [a.src.strides()[0], a.dst.strides()[0]],
        offsets: [a.src.layout().offset(), a.dst.layout().offset()],
        direction: a.direction,
        host_index,
    })
}

impl Op for CopyRowsArgs<'_> {
    const NAME: &'static str = "copy_rows";
    type Plan = CopyRowsPlan;
    type Error = RowsError;
    fn plan(&self) -> Result<CopyRowsPlan, RowsError> {
        plan_copy_rows(self)
    }
    fn device(plan: &CopyRowsPlan) -> Device {
        plan.device
    }
}

/// The scalar reference of `copy_rows` on host tensors: every element of every named row moved
/// as its bytes, through both layouts, in index order (a repeated scatter row ends with the
/// last move). The oracle the backends and the fuzz harness are checked against.
///
/// # Panics
/// If the call's tensors are not on the host (the plan admits device calls; run those on a
/// backend).
pub fn copy_rows_reference(call: Planned<CopyRowsArgs<'_>>) {
    let (mut args, plan) = call.into_parts();
    let es = args.src.dtype().size();
    let index = plan.host_index.as_ref().expect("the reference runs host calls");
    let (src_layout, dst_layout) = (*args.src.layout(), *args.dst.layout());
    let src = args.src.host_bytes().expect("the reference runs host calls");
    let dst = args.dst.host_bytes_mut().expect("the reference runs host calls");
    for (i, &r) in index.iter().enumerate() {
        let (s, d) = plan.rows_of_move(i, r);
        for c in 0..plan.width {
            let (from, to) = (src_layout.index(&[s, c]) * es, dst_layout.index(&[d, c]) * es);
            dst[to..to + es].copy_from_slice(&src[from..from + es]);
        }
    }
}

impl CopyRowsPlan {
    /// The (source row, destination row) of move `i` for index value `r`.
    pub fn rows_of_move(&self, i: usize, r: usize) -> (usize, usize) {
        match self.direction {
            RowDirection::Gather => (r, i),
            RowDirection::Scatter => (i, r),
        }
    }
}
