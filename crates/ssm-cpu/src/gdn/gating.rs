//! Gating (semantics/gdn_conv.md §1.3): `g = −e^{A_log}·softplus(a + dt_bias)` and
//! `β = sigmoid(b)`, with the reference's formulas (`ssm_gdn::reference::{gate, sigmoid}`, in f32).

use ssm_gdn::FusedGdnGatingArgs;
use ssm_gdn::plan::GatingPlan;
use ssm_gdn::reference::{gate, sigmoid};
use ssm_tensor::elem::{read_f32, write_f32};
use ssm_tensor::{DType, Planned, Run};

use crate::{CpuBackend, CpuError, require_host};

/// Writes `g` (f32) and `beta_output` for every (token, value head) of the plan.
fn gating(plan: &GatingPlan, args: &mut FusedGdnGatingArgs<'_>) {
    let p = plan;
    let (a_log, a, b, dt) = (
        args.gates.a_log.host_bytes().expect("host checked"),
        args.gates.a.host_bytes().expect("host checked"),
        args.gates.b.host_bytes().expect("host checked"),
        args.gates.dt_bias.host_bytes().expect("host checked"),
    );
    let (ad, bd, dd, ld) =
        (args.gates.a.dtype(), args.gates.b.dtype(), args.gates.dt_bias.dtype(), args.gates.a_log.dtype());
    let bo_dtype = args.beta_output.dtype();
    let g_out = args.g.host_bytes_mut().expect("host checked");
    let beta_out = args.beta_output.host_bytes_mut().expect("host checked");
    for h in 0..p.v_heads {
        let a_log_h = read_f32(a_log, ld, p.a_log.at([h]));
        let bias = read_f32(dt, dd, p.dt_bias.at([h]));
        for t in 0..p.tokens {
            let g = gate(a_log_h, read_f32(a, ad, p.a.at([t, h])), bias, p.softplus_beta, p.threshold);
            let beta = sigmoid(read_f32(b, bd, p.b.at([t, h])));
            write_f32(g_out, DType::F32, p.g.at([t, h]), g);
            write_f32(beta_out, bo_dtype, p.beta_output.at([t, h]), beta);
        }
    }
}

impl Run<FusedGdnGatingArgs<'_>> for CpuBackend {
    type Error = CpuError;
    fn run(&self, call: Planned<FusedGdnGatingArgs<'_>>) -> Result<(), CpuError> {
        let (mut args, plan) = call.into_parts();
        for (arg, d) in [
            ("A_log", args.gates.a_log.device()),
            ("a", args.gates.a.device()),
            ("b", args.gates.b.device()),
            ("dt_bias", args.gates.dt_bias.device()),
            ("g", args.g.device()),
            ("beta_output", args.beta_output.device()),
        ] {
            require_host(arg, d)?;
        }
        gating(&plan, &mut args);
        Ok(())
    }
}
