//! `impl Run<CopyRowsArgs>` for [`CpuBackend`]: the checked rows, one `memcpy` each.

use ssm_tensor::{CopyRowsArgs, Planned, Run};

use crate::{CpuBackend, CpuError};

impl Run<CopyRowsArgs<'_>> for CpuBackend {
    type Error = CpuError;
    fn run(&self, call: Planned<CopyRowsArgs<'_>>) -> Result<(), CpuError> {
        let (mut args, plan) = call.into_parts();
        let device = plan.device;
        let es = args.src.dtype().size();
        let src = args.src.host_bytes().ok_or(CpuError::NotHost { arg: "src", device })?;
        let index = plan.host_index.as_ref().ok_or(CpuError::NotHost { arg: "index", device })?;
        let dst = args.dst.host_bytes_mut().ok_or(CpuError::NotHost { arg: "dst", device })?;
        let w = plan.width * es;
        // Byte offset of row `r` of side `s` (the plan bounds-checked every row it admits).
        let at = |s: usize, r: usize| (plan.offsets[s] as isize + r as isize * plan.row_strides[s]) as usize * es;
        for (i, &r) in index.iter().enumerate() {
            let (s, d) = plan.rows_of_move(i, r);
            let (s0, d0) = (at(0, s), at(1, d));
            dst[d0..d0 + w].copy_from_slice(&src[s0..s0 + w]);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use ssm_tensor::{CopyRowsArgs, DType, HostTensor, Planned, RowDirection, Run};

    use crate::{CpuBackend, Par};

    #[test]
    fn gather_then_scatter_moves_exactly_the_named_rows() {
        let be = CpuBackend::new(Par::Seq).unwrap();
        let vals: Vec<f32> = (0..5 * 3).map(|v| v as f32).collect();
        let src = HostTensor::from_f32(DType::F32, vec![5, 3], &vals);
        let index = HostTensor::from_i64(DType::I64, vec![3], &[4, 1, 2]);
        let mut mid = HostTensor::filled(DType::F32, vec![3, 3], -1.0);
        let gather =
            CopyRowsArgs { src: src.view(), dst: mid.view_mut(), index: index.view(), direction: RowDirection::Gather };
        be.run(Planned::new(gather).unwrap()).unwrap();
        assert_eq!(mid.to_f64_vec(), [12., 13., 14., 3., 4., 5., 6., 7., 8.]);
        // Scatter into a strided view (rows 4 apart in a [5, 4] buffer, last column untouched).
        let mut back = HostTensor::filled(DType::F32, vec![5, 4], -1.0);
        let dst = back.view_mut().with_layout(&[5, 3], &[4, 1], 0).unwrap();
        let scatter = CopyRowsArgs { src: mid.view(), dst, index: index.view(), direction: RowDirection::Scatter };
        be.run(Planned::new(scatter).unwrap()).unwrap();
        let got = back.to_f64_vec();
        for r in 0..5 {
            let want: Vec<f64> =
                if [4, 1, 2].contains(&r) { (0..3).map(|c| (r * 3 + c) as f64).collect() } else { vec![-1.0; 3] };
            assert_eq!(got[r * 4..r * 4 + 3], want[..], "row {r}");
            assert_eq!(got[r * 4 + 3], -1.0, "row {r} pad column");
        }
    }

    fn refused(src: &HostTensor, dst: &mut HostTensor, index: &HostTensor, direction: RowDirection) -> String {
        let args = CopyRowsArgs { src: src.view(), dst: dst.view_mut(), index: index.view(), direction };
        Planned::new(args).err().expect("refused").to_string()
    }

    #[test]
    fn bad_arguments_are_typed_errors() {
        let src = HostTensor::filled(DType::F32, vec![4, 2], 0.0);
        let idx = HostTensor::from_i64(DType::I32, vec![2], &[0, 1]);
        let e = refused(&src, &mut HostTensor::filled(DType::BF16, vec![4, 2], 0.0), &idx, RowDirection::Gather);
        assert!(e.contains("`dst` must be f32"), "{e}");
        let mut short = HostTensor::filled(DType::F32, vec![1, 2], 0.0);
        let e = refused(&src, &mut short, &idx, RowDirection::Gather);
        assert!(e.contains("[≥ 2, 2]"), "{e}");
        let neg = HostTensor::from_i64(DType::I32, vec![1], &[-1]);
        let e = refused(&src, &mut short, &neg, RowDirection::Scatter);
        assert!(e.contains("entry 0 = -1 must be a row in [0, 1)"), "{e}");
        let f = HostTensor::filled(DType::F32, vec![1], 0.0);
        let e = refused(&src, &mut short, &f, RowDirection::Scatter);
        assert!(e.contains("i32 or i64"), "{e}");
    }
}
