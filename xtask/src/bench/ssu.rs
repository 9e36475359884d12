//! SSU bench cases: Mamba2-2.7B, a Nemotron-H-8B-like shape and Falcon-Mamba-7B (Mamba1),
//! one-token decode and a 4-token speculative step, state f32 and bf16.

use ssm_conformance::HostTensor;
use ssm_dispatch::Runtime;
use ssm_ssu::SelectiveStateUpdateArgs;
use ssm_tensor::DType;

use super::{BenchCase, fill_tensor, fill_values, tensor_i32};

#[derive(Clone, Copy)]
struct Model {
    name: &'static str,
    heads: usize,
    dim: usize,
    dstate: usize,
    groups: usize,
    /// Mamba1 form: no heads axis, per-channel A/dt/D/dt_bias, a z gate.
    mamba1: bool,
}

const MAMBA2_2_7B: Model = Model { name: "mamba2-2.7b", heads: 80, dim: 64, dstate: 128, groups: 1, mamba1: false };
const NEMOTRON_H_8B: Model =
    Model { name: "nemotron-h-8b", heads: 128, dim: 64, dstate: 128, groups: 8, mamba1: false };
const FALCON_MAMBA_7B: Model =
    Model { name: "falcon-mamba-7b", heads: 1, dim: 8192, dstate: 16, groups: 1, mamba1: true };

pub(crate) struct SsuCase {
    model: Model,
    state: DType,
    batch: usize,
    /// 1 = one-token decode; >1 = speculative step with this many tokens per sequence.
    steps: usize,
}

/// The case list (quick: batch 64 and one model per form).
pub(crate) fn cases(quick: bool) -> Vec<Box<dyn BenchCase>> {
    let models: &[Model] =
        if quick { &[MAMBA2_2_7B, FALCON_MAMBA_7B] } else { &[MAMBA2_2_7B, NEMOTRON_H_8B, FALCON_MAMBA_7B] };
    let batches: &[usize] = if quick { &[1, 64] } else { &[1, 8, 64, 256] };
    let mut v: Vec<Box<dyn BenchCase>> = Vec::new();
    for &model in models {
        for state in [DType::F32, DType::BF16] {
            for steps in [1, 4] {
                if model.mamba1 && steps > 1 {
                    continue;
                }
                for &batch in batches {
                    v.push(Box::new(SsuCase { model, state, batch, steps }));
                }
            }
        }
    }
    v
}

impl SsuCase {
    fn slot_elems(&self) -> usize {
        self.model.heads * self.model.dim * self.model.dstate
    }
    fn rows(&self) -> usize {
        self.batch * self.steps
    }
    /// Slots one call touches per sequence (read one, write `steps` in spec mode).
    fn slots_per_seq(&self) -> usize {
        self.steps
    }
    /// How many disjoint slot sets the pool holds, so that consecutive calls touch cold memory.
    fn rotations(&self) -> usize {
        let set = self.batch * self.slots_per_seq() * self.slot_elems() * self.state.size();
        (256usize << 20).div_ceil(set).clamp(1, 64)
    }
}

impl BenchCase for SsuCase {
    fn op(&self) -> &'static str {
        "ssu"
    }
    fn shape(&self) -> String {
        let m = self.model;
        if m.mamba1 { format!("{} d{} n{}", m.name, m.dim, m.dstate) } else { m.name.to_string() }
    }
    fn state_dtype(&self) -> &'static str {
        self.state.name()
    }
    fn batch(&self) -> usize {
        self.batch
    }
    fn steps(&self) -> usize {
        self.steps
    }

    fn peer_case(&self) -> Option<serde_json::Value> {
        let m = self.model;
        Some(serde_json::json!({
            "op": "ssu", "heads": m.heads, "dim": m.dim, "dstate": m.dstate, "groups": m.groups,
            "mamba1": m.mamba1, "state": self.state.name(), "batch": self.batch, "steps": self.steps,
            "rotations": self.rotations(),
        }))
    }

    fn bytes(&self) -> u64 {
        let m = self.model;
        let slot = (self.slot_elems() * self.state.size()) as u64;
        // State: one read and `steps` writes per sequence (one-token: read + write in place).
        let state = self.batch as u64 * slot * (1 + self.steps as u64);
        let rows = self.rows() as u64;
        let act = rows * (m.heads * m.dim) as u64 * 2; // bf16 x / out / z
        let bc = 2 * rows * (m.groups * m.dstate) as u64 * 2;
        let (dt, params) = if m.mamba1 {
            (act, (m.dim * m.dstate * 4 + 2 * m.dim * 4) as u64)
        } else {
            (rows * m.heads as u64 * 2, 3 * m.heads as u64 * 4)
        };
        let z_out = if m.mamba1 { 2 * act } else { act };
        let indices = self.batch as u64 * (self.steps as u64 * 4 + if self.steps > 1 { 8 } else { 0 });
        state + act + bc + dt + params + z_out + indices
    }

    fn prepare<'a>(&self, rt: &'a Runtime) -> anyhow::Result<Box<dyn FnMut() -> anyhow::Result<()> + 'a>> {
        let m = self.model;
        let (batch, steps, rows) = (self.batch, self.steps, self.rows());
        let rot = self.rotations();
        let slots = rot * batch * self.slots_per_seq();
        let mut state = if m.mamba1 {
            fill_tensor(self.state, &[slots, m.dim, m.dstate], 1, 0.5)
        } else {
            fill_tensor(self.state, &[slots, m.heads, m.dim, m.dstate], 1, 0.5)
        };
        let io = DType::BF16;
        let x = if m.mamba1 {
            fill_tensor(io, &[rows, m.dim], 2, 1.0)
        } else {
            fill_tensor(io, &[rows, m.heads, m.dim], 2, 1.0)
        };
        let z = m.mamba1.then(|| fill_tensor(io, &[rows, m.dim], 3, 1.0));
        let mut out = HostTensor::filled(io, x.shape.clone(), 0.0);
        let (dt, a, d, dt_bias) = if m.mamba1 {
            (
                fill_tensor(io, &[rows, m.dim], 4, 0.5),
                HostTensor::from_bytes(
                    DType::F32,
                    vec![m.dim, m.dstate],
                    &fill_values(m.dim * m.dstate, 5, 1.0)
                        .flat_map(|v| (-1.0 - v.abs()).to_le_bytes())
                        .collect::<Vec<_>>(),
                ),
                fill_tensor(DType::F32, &[m.dim], 6, 1.0),
                fill_tensor(DType::F32, &[m.dim], 7, 0.5),
            )
        } else {
            (
                fill_tensor(io, &[rows, m.heads, 1], 4, 0.5),
                HostTensor::from_bytes(
                    DType::F32,
                    vec![m.heads, 1, 1],
                    &fill_values(m.heads, 5, 1.0).flat_map(|v| (-1.0 - v.abs()).to_le_bytes()).collect::<Vec<_>>(),
                ),
                fill_tensor(DType::F32, &[m.heads, 1], 6, 1.0),
                fill_tensor(DType::F32, &[m.heads, 1], 7, 0.5),
            )
        };
        let bc_shape: Vec<usize> = if m.mamba1 { vec![rows, m.dstate] } else { vec![rows, m.groups, m.dstate] };
        let b = fill_tensor(io, &bc_shape, 8, 1.0);
        let c = fill_tensor(io, &bc_shape, 9, 1.0);
        // Per rotation: the slot table (1-D for one token, [batch, steps] for speculative).
        let tables: Vec<HostTensor> = (0..rot)
            .map(|r| {
                if steps == 1 {
                    tensor_i32(&[batch], (0..batch).map(|i| (r * batch + i) as i32))
                } else {
                    tensor_i32(&[batch, steps], (0..batch * steps).map(|i| (r * batch * steps + i) as i32))
                }
            })
            .collect();
        let cu = (steps > 1).then(|| tensor_i32(&[batch + 1], (0..=batch).map(|i| (i * steps) as i32)));
        // Accepted counts 1..=steps across the batch.
        let nacc = (steps > 1).then(|| tensor_i32(&[batch], (0..batch).map(|i| (i % steps + 1) as i32)));
        let mut call = 0usize;
        Ok(Box::new(move || {
            let table = &tables[call % rot];
            call += 1;
            fn expand<'t>(t: &'t HostTensor, shape: &[usize]) -> ssm_tensor::TensorRef<'t> {
                t.view().expand(shape).expect("broadcast")
            }
            let (dtv, av, dv, dbv) = if m.mamba1 {
                (dt.view(), a.view(), d.view(), dt_bias.view())
            } else {
                (
                    expand(&dt, &[rows, m.heads, m.dim]),
                    expand(&a, &[m.heads, m.dim, m.dstate]),
                    expand(&d, &[m.heads, m.dim]),
                    expand(&dt_bias, &[m.heads, m.dim]),
                )
            };
            rt.selective_state_update(SelectiveStateUpdateArgs {
                d: Some(dv),
                dt_bias: Some(dbv),
                z: z.as_ref().map(|z| z.view()),
                dt_softplus: true,
                state_batch_indices: Some(table.view()),
                pad_slot_id: Some(-1),
                num_accepted_tokens: nacc.as_ref().map(|t| t.view()),
                cu_seqlens: cu.as_ref().map(|t| t.view()),
                ..SelectiveStateUpdateArgs::new(state.view_mut(), x.view(), dtv, av, b.view(), c.view(), out.view_mut())
            })?;
            Ok(())
        }))
    }
}
