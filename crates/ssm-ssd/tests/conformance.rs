//! Every `mamba_chunk_scan_combined_varlen` conformance vector through the reference
//! (f32 and f64), with each file's tolerance.

mod common;

use common::{Case, Tensor, load};
use ssm_ssd::{MambaChunkScanCombinedVarlen, reference};
use ssm_tensor::DType;

fn state_dtype(case: &Case) -> Option<DType> {
    match case.args["state_dtype"].as_str() {
        None => None,
        Some("float32") => Some(DType::F32),
        Some("bfloat16") => Some(DType::BF16),
        Some("float16") => Some(DType::F16),
        Some(s) => panic!("{}: unknown state_dtype {s}", case.name),
    }
}

fn run(case: &Case, f64: bool) {
    let mut out = case.input_copy("out");
    let want = case.expected("varlen_states");
    let mut states = Tensor::new(want.dtype, &want.shape, &vec![0xffu8; want.bytes().len()]);
    let i = |n: &str| case.input(n).map(|t| t.view());
    let lim = &case.args["dt_limit"];
    let args = MambaChunkScanCombinedVarlen {
        x: i("x").unwrap(),
        dt: i("dt").unwrap(),
        a: i("A").unwrap(),
        b: i("B").unwrap(),
        c: i("C").unwrap(),
        chunk_size: case.args["chunk_size"].as_u64().unwrap() as usize,
        cu_seqlens: i("cu_seqlens").unwrap(),
        cu_chunk_seqlens: i("cu_chunk_seqlens").unwrap(),
        last_chunk_indices: i("last_chunk_indices").unwrap(),
        seq_idx: i("seq_idx").unwrap(),
        out: Some(out.view_mut()),
        d: i("D"),
        z: i("z"),
        dt_bias: i("dt_bias"),
        initial_states: i("initial_states"),
        dt_softplus: case.args["dt_softplus"].as_bool().unwrap(),
        dt_limit: (common::json_f32(&lim[0]), common::json_f32(&lim[1])),
        return_intermediate_states: case.args["return_intermediate_states"].as_bool().unwrap(),
        state_dtype: state_dtype(case),
        varlen_states: states.view_mut(),
        workspace: None,
    };
    let p = ssm_tensor::Planned::new(args).unwrap_or_else(|e| panic!("{}: {e}", case.name));
    if f64 {
        reference::mamba_chunk_scan_combined_varlen_f64(p);
    } else {
        reference::mamba_chunk_scan_combined_varlen(p);
    }
    let (e1, n1) = case.check("out", &out);
    let (e2, n2) = case.check("varlen_states", &states);
    println!("{} (f64={f64}): out max err {e1:.2e} over {n1}, varlen_states max err {e2:.2e} over {n2}", case.name);
}

#[test]
fn reference_passes_every_vector() {
    let cases = load("mamba_chunk_scan_combined_varlen");
    assert!(cases.len() >= 6, "expected the 6 recorded cases, found {}", cases.len());
    for case in &cases {
        run(case, false);
        run(case, true);
    }
}
