//! Random `gdn_decode_step` calls (the conv update, then the sigmoid-gated recurrence on its
//! output) as owned host tensors: one generator for every backend's tests (the CPU backend
//! against the reference, the CUDA fused kernel against its two launches).
//!
//! Each case mixes the slot cases a decode batch can meet: a conv pad with a real SSM slot (the
//! recurrence then reads whatever the conv output row held), a real conv slot with a null SSM
//! slot, and, on request, slots far past both pools.

use ssm_conv::{Activation, CausalConv1dUpdateArgs, ConvStateLayout};
use ssm_gdn::{GateInputs, GdnDecodeStepArgs, GdnError, StateLayout};
use ssm_tensor::{DType, HostTensor};

use crate::gdn_random::SplitMix;

/// The pad value of the conv table in every case.
pub const STEP_PAD: i64 = -1;

/// The shape of one random step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepSpec {
    /// Sequences (one token each).
    pub batch: usize,
    /// q/k heads `H`.
    pub h: usize,
    /// Value heads `HV` (a multiple of `H`).
    pub hv: usize,
    /// `head_k_dim`.
    pub k: usize,
    /// `head_v_dim`.
    pub v: usize,
    /// Conv width (2..=4).
    pub width: usize,
    /// Whether the conv has a bias.
    pub bias: bool,
    /// SSM-state dtype.
    pub state: DType,
    /// Conv-state axis order.
    pub layout: ConvStateLayout,
    /// Put out-of-range slots in both tables (sequences 3 and 4).
    pub garbage: bool,
}

impl StepSpec {
    /// `batch` Qwen3-Next-like sequences at small head counts: H 2, HV 4, K = V = 128, width 4,
    /// no bias, `[slots, state_len, dim]` conv state.
    pub fn decode(batch: usize, state: DType) -> Self {
        StepSpec {
            batch,
            h: 2,
            hv: 4,
            k: 128,
            v: 128,
            width: 4,
            bias: false,
            state,
            layout: ConvStateLayout::StateLenDim,
            garbage: false,
        }
    }
}

/// One step's host tensors (bf16 activations and conv, f32 `A_log`/`dt_bias`).
#[derive(Debug, Clone)]
pub struct StepCase {
    /// The shape it was drawn with.
    pub spec: StepSpec,
    /// `[B, 2·H·K + HV·V]` projected rows.
    pub x: HostTensor,
    /// `[dim, width]`.
    pub w: HostTensor,
    /// `[dim]`.
    pub bias: Option<HostTensor>,
    /// The conv-state pool.
    pub conv_state: HostTensor,
    /// `[B]` i32 conv slots (pad [`STEP_PAD`]).
    pub conv_idx: HostTensor,
    /// `[B, dim]` conv output: NaN in rows the conv writes, values in the pad row.
    pub out: HostTensor,
    /// `[HV]`.
    pub a_log: HostTensor,
    /// `[HV]`.
    pub dt_bias: HostTensor,
    /// `[B, HV]`.
    pub a: HostTensor,
    /// `[B, HV]`.
    pub b: HostTensor,
    /// `[slots, HV, V, K]`.
    pub ssm_state: HostTensor,
    /// `[B]` i32 SSM slots (null block 0).
    pub ssm_idx: HostTensor,
    /// `[B, 1, HV, V]`, NaN.
    pub o: HostTensor,
}

impl StepCase {
    /// A random case of `spec` from `seed`.
    pub fn random(spec: StepSpec, seed: u64) -> Self {
        let s = spec;
        let mut r = SplitMix::new(seed);
        let dim = 2 * s.h * s.k + s.hv * s.v;
        let slots = s.batch + 3;
        let bf = DType::BF16;
        let conv_shape = match s.layout {
            ConvStateLayout::StateLenDim => vec![slots, s.width - 1, dim],
            ConvStateLayout::DimStateLen => vec![slots, dim, s.width - 1],
        };
        let perm = r.perm(slots - 1);
        let mut conv_idx: Vec<i64> = (0..s.batch).map(|i| (perm[i] + 1) as i64).collect();
        let mut ssm_idx = conv_idx.clone();
        if s.batch > 2 {
            conv_idx[1] = STEP_PAD;
            ssm_idx[2] = 0;
        }
        if s.garbage && s.batch > 4 {
            conv_idx[3] = 1_000_000;
            ssm_idx[4] = 1_000_000;
        }
        let mut out: Vec<f32> =
            r.tensor(bf, &[s.batch, dim], -1.0, 1.0).to_f64_vec().iter().map(|&v| v as f32).collect();
        for (row, vals) in out.chunks_mut(dim).enumerate() {
            if conv_idx[row] != STEP_PAD {
                vals.fill(f32::NAN);
            }
        }
        StepCase {
            spec,
            x: r.tensor(bf, &[s.batch, dim], -1.0, 1.0),
            w: r.tensor(bf, &[dim, s.width], -0.6, 0.6),
            bias: s.bias.then(|| r.tensor(bf, &[dim], -0.3, 0.3)),
            conv_state: r.tensor(bf, &conv_shape, -1.0, 1.0),
            conv_idx: HostTensor::from_i64(DType::I32, vec![s.batch], &conv_idx),
            out: HostTensor::from_f32(bf, vec![s.batch, dim], &out),
            a_log: r.tensor(DType::F32, &[s.hv], -1.0, 0.5),
            dt_bias: r.tensor(DType::F32, &[s.hv], -0.5, 0.5),
            a: r.tensor(bf, &[s.batch, s.hv], -2.0, 2.0),
            b: r.tensor(bf, &[s.batch, s.hv], -2.0, 2.0),
            ssm_state: r.tensor(s.state, &[slots, s.hv, s.v, s.k], -0.5, 0.5),
            ssm_idx: HostTensor::from_i64(DType::I32, vec![s.batch], &ssm_idx),
            o: HostTensor::filled(bf, vec![s.batch, 1, s.hv, s.v], f32::NAN),
        }
    }

    /// The conv slots a valid run may write (pads and out-of-range entries excluded).
    pub fn conv_writable(&self) -> Vec<usize> {
        writable(&self.conv_idx, self.conv_state.shape[0])
    }

    /// The SSM slots a valid run may write (null and out-of-range entries excluded).
    pub fn ssm_writable(&self) -> Vec<usize> {
        writable(&self.ssm_idx, self.ssm_state.shape[0])
    }
}

fn writable(t: &HostTensor, slots: usize) -> Vec<usize> {
    t.to_f64_vec().iter().filter(|&&v| v >= 0.0 && (v as usize) < slots).map(|&v| v as usize).collect()
}

/// The tensors of one step, borrowed (host views of a [`StepCase`], or device views of its
/// staged copies).
pub struct StepTensors<'a> {
    /// See [`StepCase`].
    pub x: ssm_tensor::TensorRef<'a>,
    /// See [`StepCase`].
    pub w: ssm_tensor::TensorRef<'a>,
    /// See [`StepCase`].
    pub bias: Option<ssm_tensor::TensorRef<'a>>,
    /// See [`StepCase`].
    pub conv_state: ssm_tensor::TensorMut<'a>,
    /// See [`StepCase`].
    pub conv_idx: ssm_tensor::TensorRef<'a>,
    /// See [`StepCase`].
    pub out: ssm_tensor::TensorMut<'a>,
    /// See [`StepCase`].
    pub a_log: ssm_tensor::TensorRef<'a>,
    /// See [`StepCase`].
    pub dt_bias: ssm_tensor::TensorRef<'a>,
    /// See [`StepCase`].
    pub a: ssm_tensor::TensorRef<'a>,
    /// See [`StepCase`].
    pub b: ssm_tensor::TensorRef<'a>,
    /// See [`StepCase`].
    pub ssm_state: ssm_tensor::TensorMut<'a>,
    /// See [`StepCase`].
    pub ssm_idx: ssm_tensor::TensorRef<'a>,
    /// See [`StepCase`].
    pub o: ssm_tensor::TensorMut<'a>,
}

impl<'a> StepTensors<'a> {
    /// The step's arguments: silu, pad [`STEP_PAD`], `[V,K]` SSM state.
    pub fn args(self, spec: &StepSpec) -> Result<GdnDecodeStepArgs<'a>, GdnError> {
        let conv = CausalConv1dUpdateArgs {
            x: self.x,
            conv_state: self.conv_state,
            conv_state_layout: spec.layout,
            weight: self.w,
            bias: self.bias,
            activation: Activation::Silu,
            conv_state_indices: Some(self.conv_idx),
            num_accepted_tokens: None,
            query_start_loc: None,
            pad_slot_id: Some(STEP_PAD),
            block_idx_last_scheduled_token: None,
            initial_state_idx: None,
            out: self.out,
        };
        let gates = GateInputs::new(self.a_log, self.a, self.b, self.dt_bias);
        GdnDecodeStepArgs::new(conv, spec.h, gates, self.ssm_state, Some(self.ssm_idx), StateLayout::VK, self.o)
    }
}

impl StepCase {
    /// Host views of every tensor.
    pub fn tensors(&mut self) -> StepTensors<'_> {
        StepTensors {
            x: self.x.view(),
            w: self.w.view(),
            bias: self.bias.as_ref().map(|b| b.view()),
            conv_state: self.conv_state.view_mut(),
            conv_idx: self.conv_idx.view(),
            out: self.out.view_mut(),
            a_log: self.a_log.view(),
            dt_bias: self.dt_bias.view(),
            a: self.a.view(),
            b: self.b.view(),
            ssm_state: self.ssm_state.view_mut(),
            ssm_idx: self.ssm_idx.view(),
            o: self.o.view_mut(),
        }
    }

    /// The step's arguments on host views.
    pub fn args(&mut self) -> Result<GdnDecodeStepArgs<'_>, GdnError> {
        let spec = self.spec;
        self.tensors().args(&spec)
    }
}
