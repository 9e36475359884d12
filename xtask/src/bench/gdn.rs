//! Gated delta rule bench cases, Qwen3-Next shapes (H 16, HV 32, K = V = 128, f32 state; one
//! tensor-parallel rank): the fused decode (`fused_sigmoid_gating_delta_rule_update`, gating in the
//! kernel, one token per sequence) in both state layouts, a 3-token speculative step, and the
//! chunked prefill of 4096 tokens (`chunk_gated_delta_rule`; tokens/s = 4096 / time).
//!
//! The decode is memory-bound: each call reads and writes every state slot it names once (2 MiB
//! per sequence in f32), so its `fraction_of_copy` is the figure of merit. Consecutive calls
//! rotate through disjoint slot sets so that the state is cold, as in a real decode loop.

use half::bf16;
use ssm_conformance::HostTensor;
use ssm_dispatch::Runtime;
use ssm_gdn::{ChunkGatedDeltaRuleArgs, DeltaRuleArgs, FusedSigmoidGatingDeltaRuleUpdateArgs, GateInputs, StateLayout};
use ssm_tensor::{DType, TensorMut};

use super::{BenchCase, fill_values, tensor_i32};

const H: usize = 16;
const HV: usize = 32;
const K: usize = 128;
const V: usize = 128;

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// Fused decode, `steps` tokens per sequence (speculative with 2-D slot tables when > 1).
    Decode,
    /// Chunked prefill, `steps` tokens per sequence.
    Prefill,
}

pub(crate) struct GdnCase {
    kind: Kind,
    layout: StateLayout,
    batch: usize,
    steps: usize,
}

/// The case list (quick: fewer batches, a 1024-token prefill).
pub(crate) fn cases(quick: bool) -> Vec<Box<dyn BenchCase>> {
    let batches: &[usize] = if quick { &[8, 64] } else { &[1, 8, 64, 128] };
    let mut v: Vec<Box<dyn BenchCase>> = Vec::new();
    for layout in [StateLayout::VK, StateLayout::KV] {
        for &batch in batches {
            v.push(Box::new(GdnCase { kind: Kind::Decode, layout, batch, steps: 1 }));
        }
        v.push(Box::new(GdnCase { kind: Kind::Decode, layout, batch: 16, steps: 3 }));
        let tokens = if quick { 1024 } else { 4096 };
        v.push(Box::new(GdnCase { kind: Kind::Prefill, layout, batch: 1, steps: tokens }));
    }
    v
}

const SLOT_BYTES: usize = HV * K * V * 4;

impl GdnCase {
    /// Slots one call touches (speculative steps write one column per token).
    fn slots_per_call(&self) -> usize {
        match self.kind {
            Kind::Decode => self.batch * self.steps,
            Kind::Prefill => self.batch,
        }
    }
    /// Disjoint slot sets in the pool, so that consecutive calls touch cold state.
    fn rotations(&self) -> usize {
        match self.kind {
            Kind::Decode => (256usize << 20).div_ceil(self.slots_per_call() * SLOT_BYTES).clamp(1, 64),
            Kind::Prefill => 1,
        }
    }
}

fn tensor(dtype: DType, shape: &[usize], seed: u64, scale: f32, offset: f32) -> HostTensor {
    let n: usize = shape.iter().product();
    let vals: Vec<f32> = fill_values(n, seed, scale).map(|x| x + offset).collect();
    match dtype {
        DType::BF16 => {
            let bytes: Vec<u8> = vals.iter().flat_map(|v| bf16::from_f32(*v).to_le_bytes()).collect();
            HostTensor::from_bytes(DType::BF16, shape.to_vec(), &bytes)
        }
        _ => HostTensor::from_f32(dtype, shape.to_vec(), &vals),
    }
}

fn state_shape(layout: StateLayout, slots: usize) -> Vec<usize> {
    match layout {
        StateLayout::VK => vec![slots, HV, V, K],
        StateLayout::KV => vec![slots, HV, K, V],
    }
}

impl BenchCase for GdnCase {
    fn op(&self) -> &'static str {
        "gdn"
    }
    fn shape(&self) -> String {
        let layout = match self.layout {
            StateLayout::VK => "VK",
            StateLayout::KV => "KV",
        };
        match self.kind {
            Kind::Decode if self.steps > 1 => format!("qwen3-next {layout} spec"),
            Kind::Decode => format!("qwen3-next {layout} decode"),
            Kind::Prefill => format!("qwen3-next {layout} prefill"),
        }
    }
    fn state_dtype(&self) -> &'static str {
        "f32"
    }
    fn batch(&self) -> usize {
        self.batch
    }
    fn steps(&self) -> usize {
        self.steps
    }

    fn peer_case(&self) -> Option<serde_json::Value> {
        let kind = if self.kind == Kind::Decode { "decode" } else { "prefill" };
        let layout = if self.layout == StateLayout::VK { "VK" } else { "KV" };
        Some(serde_json::json!({
            "op": "gdn", "kind": kind, "layout": layout, "batch": self.batch, "steps": self.steps,
            "rotations": self.rotations(), "h": H, "hv": HV, "k": K, "v": V,
        }))
    }

    fn bytes(&self) -> u64 {
        let tokens = (self.batch * self.steps) as u64;
        // q, k (bf16), v and o (bf16), gates: once per token.
        let io = tokens * ((2 * H * K + 2 * HV * V) * 2 + 2 * HV * 2) as u64;
        let slot = SLOT_BYTES as u64;
        let state = match self.kind {
            // Read the starting slot once, write the state after every token.
            Kind::Decode => self.batch as u64 * slot * (1 + self.steps as u64),
            Kind::Prefill => self.batch as u64 * slot * 2,
        };
        io + state
    }

    fn prepare<'a>(&self, rt: &'a Runtime) -> anyhow::Result<Box<dyn FnMut() -> anyhow::Result<()> + 'a>> {
        let (batch, steps, kind, layout) = (self.batch, self.steps, self.kind, self.layout);
        let rot = self.rotations();
        let per_call = self.slots_per_call();
        // Slot 0 is the null block; sets of `per_call` slots follow.
        let state = tensor(DType::F32, &state_shape(layout, 1 + rot * per_call), 1, 0.05, 0.0);
        let tokens = batch * steps;
        let q = tensor(DType::BF16, &[1, tokens, H, K], 2, 1.0, 0.0);
        let k = tensor(DType::BF16, &[1, tokens, H, K], 3, 1.0, 0.0);
        let v = tensor(DType::BF16, &[1, tokens, HV, V], 4, 1.0, 0.0);
        let a = tensor(DType::BF16, &[tokens, HV], 5, 1.0, 0.0);
        let b = tensor(DType::BF16, &[tokens, HV], 6, 1.0, 0.0);
        let a_log = tensor(DType::F32, &[HV], 7, 0.5, 0.5);
        let dt_bias = tensor(DType::BF16, &[HV], 8, 0.5, 0.0);
        let g = tensor(DType::F32, &[1, tokens, HV], 9, 0.05, -0.06);
        let beta = tensor(DType::BF16, &[1, tokens, HV], 10, 0.3, 0.5);
        let o = HostTensor::filled(DType::BF16, vec![1, tokens, HV, V], 0.0);
        let tables: Vec<HostTensor> = (0..rot)
            .map(|r| {
                let base = 1 + r * per_call;
                match (kind, steps) {
                    (Kind::Decode, s) if s > 1 => tensor_i32(&[batch, s], (0..per_call).map(|i| (base + i) as i32)),
                    _ => tensor_i32(&[batch], (0..batch).map(|i| (base + i) as i32)),
                }
            })
            .collect();
        let starts = tensor_i32(&[batch + 1], (0..=batch).map(|i| (i * steps) as i32));
        // Accepted counts 1..=steps across the batch.
        let accepted = tensor_i32(&[batch], (0..batch).map(|i| (i % steps + 1) as i32));
        let mut prefill = PrefillInputs { q, k, v, g, beta, state, starts, layout, o };
        let mut scratch = match kind {
            Kind::Prefill => {
                let plan = ssm_tensor::Op::plan(&prefill.args(&tables[0], None))?;
                Some(HostTensor::filled(DType::F32, vec![rt.chunk_gated_delta_rule_scratch_size(&plan).max(1)], 0.0))
            }
            Kind::Decode => None,
        };
        let mut call = 0usize;
        Ok(Box::new(move || {
            let table = &tables[call % rot];
            call += 1;
            let p = &mut prefill;
            match kind {
                Kind::Decode => rt.fused_sigmoid_gating_delta_rule_update(FusedSigmoidGatingDeltaRuleUpdateArgs {
                    gates: GateInputs::new(a_log.view(), a.view(), b.view(), dt_bias.view()),
                    rule: DeltaRuleArgs {
                        q: p.q.view(),
                        k: p.k.view(),
                        v: p.v.view(),
                        scale: None,
                        initial_state: Some(p.state.view_mut()),
                        final_state: None,
                        cu_seqlens: Some(p.starts.view()),
                        ssm_state_indices: Some(table.view()),
                        num_accepted_tokens: (steps > 1).then(|| accepted.view()),
                        use_qk_l2norm_in_kernel: true,
                        eps: 1e-6,
                        state_layout: layout,
                        o: p.o.view_mut(),
                    },
                })?,
                Kind::Prefill => {
                    rt.chunk_gated_delta_rule(p.args(table, scratch.as_mut().map(HostTensor::view_mut)))?
                }
            }
            Ok(())
        }))
    }
}

/// The tensors of the chunked prefill call (the decode call reads q, k, v, the state, the
/// starts and `o` from here too), so that the plan for the scratch size and the timed calls
/// build the same arguments.
struct PrefillInputs {
    q: HostTensor,
    k: HostTensor,
    v: HostTensor,
    g: HostTensor,
    beta: HostTensor,
    state: HostTensor,
    starts: HostTensor,
    layout: StateLayout,
    o: HostTensor,
}

impl PrefillInputs {
    /// The prefill arguments with slot table `table` and the caller's `scratch`.
    fn args<'a>(&'a mut self, table: &'a HostTensor, scratch: Option<TensorMut<'a>>) -> ChunkGatedDeltaRuleArgs<'a> {
        let (q, k, v, g, beta) = (self.q.view(), self.k.view(), self.v.view(), self.g.view(), self.beta.view());
        ChunkGatedDeltaRuleArgs {
            initial_state: Some(self.state.view_mut()),
            initial_state_indices: Some(table.view()),
            pad_slot_id: Some(0),
            inplace_final_state: true,
            cu_seqlens: Some(self.starts.view()),
            use_qk_l2norm_in_kernel: true,
            state_layout: self.layout,
            scratch,
            ..ChunkGatedDeltaRuleArgs::new(q, k, v, g, beta, self.o.view_mut())
        }
    }
}
