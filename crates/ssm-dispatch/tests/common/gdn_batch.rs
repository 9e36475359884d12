//! The GDN attention core's test batch, shared by the host test (`gdn_core.rs`) and the GPU
//! test (`gpu_core.rs`): speculative sequences, decodes with a padded row, prefills with and
//! without initial state, tokens interleaved.

use ssm_conv::{Activation, ConvStateLayout};
use ssm_dispatch::{GdnAttentionCoreArgs, GdnAttentionMetadata};
use ssm_gdn::StateLayout;
use ssm_tensor::{DType, HostTensor};

use super::{ints, values};

pub(crate) const H: usize = 2;
pub(crate) const K: usize = 16;
pub(crate) const HV: usize = 4;
pub(crate) const V: usize = 8;
pub(crate) const CONV_DIM: usize = 2 * H * K + HV * V;
pub(crate) const WIDTH: usize = 4;
pub(crate) const STATE_LEN: usize = WIDTH - 1 + 2;
pub(crate) const SLOTS: usize = 16;

pub(crate) fn t(shape: &[usize], seed: u64, scale: f32) -> HostTensor {
    HostTensor::from_f32(DType::F32, shape.to_vec(), &values(shape.iter().product(), seed, scale))
}

pub(crate) fn bools(v: &[i64]) -> HostTensor {
    HostTensor::from_bytes(DType::Bool, vec![v.len()], &v.iter().map(|&x| x as u8).collect::<Vec<_>>())
}

pub(crate) fn rows(x: &HostTensor, rows: &[usize]) -> HostTensor {
    let w = x.shape[1..].iter().product::<usize>();
    let mut shape = x.shape.clone();
    shape[0] = rows.len();
    let vals: Vec<f32> =
        rows.iter().flat_map(|&r| (0..w).map(move |j| (r, j))).map(|(r, j)| x.to_f64_vec()[r * w + j] as f32).collect();
    HostTensor::from_f32(x.dtype, shape, &vals)
}

pub(crate) fn close(what: &str, got: &HostTensor, want: &HostTensor, tol: f64) {
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    assert_eq!(g.len(), w.len(), "{what}");
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        assert!((a - b).abs() <= tol * (1.0 + b.abs()), "{what}[{i}]: {a} vs {b}");
    }
}

pub(crate) struct Batch {
    pub(crate) mixed: HostTensor,
    pub(crate) a: HostTensor,
    pub(crate) b: HostTensor,
    pub(crate) weight: HostTensor,
    pub(crate) bias: HostTensor,
    pub(crate) a_log: HostTensor,
    pub(crate) dt_bias: HostTensor,
    pub(crate) conv: HostTensor,
    pub(crate) ssm: HostTensor,
    /// Batch rows of: spec seq 0 (3), spec seq 1 (3), decode 0, decode 1 (padded), prefill 0 (70), prefill 1 (5).
    pub(crate) spec_rows: Vec<usize>,
    pub(crate) dec_rows: Vec<usize>,
    pub(crate) pre_rows: Vec<usize>,
}

pub(crate) fn batch(layout: StateLayout) -> Batch {
    // Token order: decode0, spec0 ×3, prefill0 ×70, spec1 ×3, decode1, prefill1 ×5.
    let mut order = Vec::new();
    order.extend(std::iter::repeat_n("d0", 1));
    order.extend(std::iter::repeat_n("s0", 3));
    order.extend(std::iter::repeat_n("p0", 70));
    order.extend(std::iter::repeat_n("s1", 3));
    order.extend(std::iter::repeat_n("d1", 1));
    order.extend(std::iter::repeat_n("p1", 5));
    let pick = |names: &[&str]| -> Vec<usize> {
        names.iter().flat_map(|n| order.iter().enumerate().filter(move |(_, o)| *o == n).map(|(i, _)| i)).collect()
    };
    let tokens = order.len();
    let ssm_shape = match layout {
        StateLayout::VK => vec![SLOTS, HV, V, K],
        StateLayout::KV => vec![SLOTS, HV, K, V],
    };
    Batch {
        mixed: t(&[tokens, CONV_DIM], 1, 1.0),
        a: t(&[tokens, HV], 2, 2.0),
        b: t(&[tokens, HV], 3, 2.0),
        weight: t(&[CONV_DIM, WIDTH], 4, 0.5),
        bias: t(&[CONV_DIM], 5, 0.1),
        a_log: t(&[HV], 6, 1.0),
        dt_bias: t(&[HV], 7, 0.5),
        conv: t(&[SLOTS, STATE_LEN, CONV_DIM], 8, 1.0),
        ssm: HostTensor::from_f32(DType::F32, ssm_shape.clone(), &values(ssm_shape.iter().product(), 9, 0.5)),
        spec_rows: pick(&["s0", "s1"]),
        dec_rows: pick(&["d0", "d1"]),
        pre_rows: pick(&["p0", "p1"]),
    }
}

// Slots: spec 0 → [1, 2, 3], spec 1 → [4, 5, 6]; decodes → [7, 0 (pad)]; prefills → [9, 10].
pub(crate) const SPEC_TABLE: [i64; 6] = [1, 2, 3, 4, 5, 6];
pub(crate) const NON_SPEC_SLOTS: [i64; 4] = [7, 0, 9, 10];
pub(crate) const ACCEPTED: [i64; 2] = [1, 2];
pub(crate) const HAS_INIT: [i64; 4] = [1, 1, 1, 0];
pub(crate) const TOUCHED: [usize; 9] = [1, 2, 3, 4, 5, 6, 7, 9, 10];

/// The index tensors of the test batch's metadata, with the given non-speculative slots.
pub(crate) struct Tables {
    pub(crate) spec_table: HostTensor,
    pub(crate) spec_indx: HostTensor,
    pub(crate) non_spec_indx: HostTensor,
    pub(crate) spec_qsl: HostTensor,
    pub(crate) non_spec_qsl: HostTensor,
    pub(crate) non_spec_slots: HostTensor,
    pub(crate) accepted: HostTensor,
    pub(crate) has_init: HostTensor,
}

impl Tables {
    pub(crate) fn new(base: &Batch, non_spec_slots: HostTensor) -> Tables {
        let non_spec_rows: Vec<usize> = base.dec_rows.iter().chain(&base.pre_rows).copied().collect();
        Tables {
            spec_table: HostTensor::from_i64(DType::I32, vec![2, 3], &SPEC_TABLE),
            spec_indx: ints(&base.spec_rows.iter().map(|&r| r as i64).collect::<Vec<_>>()),
            non_spec_indx: ints(&non_spec_rows.iter().map(|&r| r as i64).collect::<Vec<_>>()),
            spec_qsl: ints(&[0, 3, 6]),
            non_spec_qsl: ints(&[0, 1, 2, 72, 77]),
            non_spec_slots,
            accepted: ints(&ACCEPTED),
            has_init: bools(&HAS_INIT),
        }
    }

    /// The metadata of the test batch of `tokens` tokens.
    pub(crate) fn metadata(&self, tokens: usize) -> GdnAttentionMetadata<'_> {
        GdnAttentionMetadata {
            num_prefills: 2,
            num_prefill_tokens: 75,
            num_decodes: 2,
            num_decode_tokens: 2,
            num_spec_decodes: 2,
            num_spec_decode_tokens: 6,
            num_actual_tokens: tokens,
            has_initial_state: Some(self.has_init.view()),
            spec_query_start_loc: Some(self.spec_qsl.view()),
            non_spec_query_start_loc: Some(self.non_spec_qsl.view()),
            spec_state_indices_tensor: Some(self.spec_table.view()),
            non_spec_state_indices_tensor: Some(self.non_spec_slots.view()),
            spec_token_indx: Some(self.spec_indx.view()),
            non_spec_token_indx: Some(self.non_spec_indx.view()),
            num_accepted_tokens: Some(self.accepted.view()),
        }
    }
}

/// The core call on the test batch with pools and output `state` (conv, ssm, out).
pub(crate) fn core_args<'a>(
    base: &'a Batch,
    dt_bias: &'a HostTensor,
    ssm_state_layout: StateLayout,
    state: &'a mut (HostTensor, HostTensor, HostTensor),
    metadata: GdnAttentionMetadata<'a>,
) -> GdnAttentionCoreArgs<'a> {
    GdnAttentionCoreArgs {
        mixed_qkv: base.mixed.view(),
        b: base.b.view(),
        a: base.a.view(),
        conv_weight: base.weight.view(),
        conv_bias: Some(base.bias.view()),
        activation: Activation::Silu,
        conv_state: state.0.view_mut(),
        conv_state_layout: ConvStateLayout::StateLenDim,
        ssm_state: state.1.view_mut(),
        ssm_state_layout,
        a_log: base.a_log.view(),
        dt_bias: dt_bias.view(),
        num_k_heads: H,
        pad_slot_id: Some(0),
        metadata,
        core_attn_out: state.2.view_mut(),
    }
}
