//! Causal conv1d bench cases: Qwen3-Next's GDN conv (conv_dim 8192, width 4) and the Mamba2
//! conv (conv_dim 10240, width 4), bf16, vLLM's default `(slots, state_len, dim)` state:
//! one-token decode, a 3-token speculative step (rolling buffer, state_len 5), and a
//! 4096-token varlen prefill.

use ssm_conformance::HostTensor;
use ssm_conv::{Activation, CausalConv1dFnArgs, CausalConv1dUpdateArgs, ConvStateLayout};
use ssm_dispatch::Runtime;
use ssm_tensor::DType;

use super::{BenchCase, fill_tensor, tensor_i32};

const WIDTH: usize = 4;

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// `causal_conv1d_update`, `steps` tokens per sequence (speculative when > 1).
    Update,
    /// `causal_conv1d_fn`, `steps` tokens per sequence.
    Prefill,
}

pub(crate) struct ConvCase {
    name: &'static str,
    dim: usize,
    kind: Kind,
    batch: usize,
    steps: usize,
}

/// The case list (quick: Qwen3-Next only, batch 1 and 64, a shorter prefill).
pub(crate) fn cases(quick: bool) -> Vec<Box<dyn BenchCase>> {
    let models: &[(&'static str, usize)] =
        if quick { &[("qwen3-next", 8192)] } else { &[("qwen3-next", 8192), ("mamba2", 10240)] };
    let batches: &[usize] = if quick { &[1, 64] } else { &[1, 8, 64, 256] };
    let mut v: Vec<Box<dyn BenchCase>> = Vec::new();
    for &(name, dim) in models {
        for steps in [1, 3] {
            for &batch in batches {
                v.push(Box::new(ConvCase { name, dim, kind: Kind::Update, batch, steps }));
            }
        }
        // 4096 prefill tokens: 4 sequences of 1024 (quick: 2 of 512).
        let (batch, steps) = if quick { (2, 512) } else { (4, 1024) };
        v.push(Box::new(ConvCase { name, dim, kind: Kind::Prefill, batch, steps }));
    }
    v
}

impl ConvCase {
    fn state_len(&self) -> usize {
        match self.kind {
            Kind::Update => WIDTH - 1 + (self.steps - 1),
            Kind::Prefill => WIDTH - 1,
        }
    }
    /// Disjoint slot sets in the pool, so that consecutive calls touch cold state.
    fn rotations(&self) -> usize {
        let set = self.batch * self.state_len() * self.dim * 2;
        (256usize << 20).div_ceil(set).clamp(1, 64)
    }
}

impl BenchCase for ConvCase {
    fn op(&self) -> &'static str {
        "conv"
    }
    fn shape(&self) -> String {
        match self.kind {
            Kind::Update if self.steps > 1 => format!("{} d{} spec", self.name, self.dim),
            Kind::Update => format!("{} d{} update", self.name, self.dim),
            Kind::Prefill => format!("{} d{} prefill", self.name, self.dim),
        }
    }
    fn state_dtype(&self) -> &'static str {
        "bf16"
    }
    fn batch(&self) -> usize {
        self.batch
    }
    fn steps(&self) -> usize {
        self.steps
    }

    fn peer_case(&self) -> Option<serde_json::Value> {
        let kind = if self.kind == Kind::Update { "update" } else { "prefill" };
        Some(serde_json::json!({
            "op": "conv", "dim": self.dim, "width": WIDTH, "kind": kind, "batch": self.batch,
            "steps": self.steps, "rotations": self.rotations(),
        }))
    }

    fn bytes(&self) -> u64 {
        let (dim, b, steps) = (self.dim as u64, self.batch as u64, self.steps as u64);
        let rows = b * steps;
        // x read and out written once; weight and bias once.
        let io = 2 * rows * dim * 2 + (WIDTH as u64 + 1) * dim * 2;
        // State: the window read (width − 1 columns, from the accepted offset) and the new
        // window written (state_len columns, or width − 1 for prefill).
        let state = b * dim * 2 * ((WIDTH as u64 - 1) + self.state_len() as u64);
        let indices = b * 4 * if self.steps > 1 { 3 } else { 1 };
        io + state + indices
    }

    fn prepare<'a>(&self, rt: &'a Runtime) -> anyhow::Result<Box<dyn FnMut() -> anyhow::Result<()> + 'a>> {
        let (dim, batch, steps, kind) = (self.dim, self.batch, self.steps, self.kind);
        let rot = self.rotations();
        let state_len = self.state_len();
        let mut state = fill_tensor(DType::BF16, &[rot * batch, state_len, dim], 1, 1.0);
        let rows = batch * steps;
        let x = fill_tensor(DType::BF16, &[rows, dim], 2, 1.0);
        let mut out = HostTensor::filled(DType::BF16, vec![rows, dim], 0.0);
        let weight = fill_tensor(DType::BF16, &[dim, WIDTH], 3, 0.5);
        let bias = fill_tensor(DType::BF16, &[dim], 4, 0.1);
        let tables: Vec<HostTensor> =
            (0..rot).map(|r| tensor_i32(&[batch], (0..batch).map(|i| (r * batch + i) as i32))).collect();
        let starts = tensor_i32(&[batch + 1], (0..=batch).map(|i| (i * steps) as i32));
        // Accepted counts 1..=steps across the batch.
        let accepted = tensor_i32(&[batch], (0..batch).map(|i| (i % steps + 1) as i32));
        let has_init = HostTensor::from_bytes(DType::Bool, vec![batch], &vec![1u8; batch]);
        let mut call = 0usize;
        Ok(Box::new(move || {
            let table = &tables[call % rot];
            call += 1;
            match kind {
                Kind::Update => rt.causal_conv1d_update(CausalConv1dUpdateArgs {
                    x: x.view(),
                    conv_state: state.view_mut(),
                    conv_state_layout: ConvStateLayout::StateLenDim,
                    weight: weight.view(),
                    bias: Some(bias.view()),
                    activation: Activation::Silu,
                    conv_state_indices: Some(table.view()),
                    num_accepted_tokens: (steps > 1).then(|| accepted.view()),
                    query_start_loc: (steps > 1).then(|| starts.view()),
                    pad_slot_id: Some(-1),
                    block_idx_last_scheduled_token: None,
                    initial_state_idx: None,
                    out: out.view_mut(),
                })?,
                Kind::Prefill => rt.causal_conv1d_fn(CausalConv1dFnArgs {
                    x: x.view(),
                    weight: weight.view(),
                    bias: Some(bias.view()),
                    conv_states: state.view_mut(),
                    conv_state_layout: ConvStateLayout::StateLenDim,
                    query_start_loc: starts.view(),
                    cache_indices: Some(table.view()),
                    has_initial_state: Some(has_init.view()),
                    activation: Activation::Silu,
                    pad_slot_id: Some(-1),
                    checkpoint_offsets: None,
                    checkpoint_state_indices: None,
                    out: out.view_mut(),
                })?,
            }
            Ok(())
        }))
    }
}
