//! ssm-kernels ops on [candle](https://github.com/huggingface/candle) tensors.
//!
//! An engine built on candle keeps its state pools and activations as `candle_core::Tensor`s.
//! The functions here run an op of [`ssm_dispatch::Runtime`] directly on those tensors' memory,
//! with no copy: the written tensors (the state pool and `out`) are updated in place, through
//! candle's in-place op interface (which takes their storage's write lock), and the read
//! tensors are viewed with their candle layout (strides and offset kept, so slices and
//! broadcasts work as they are).
//!
//! Ops: [`selective_state_update`], [`causal_conv1d_update`] and
//! [`fused_sigmoid_gating_delta_rule_update`] (the decode-path ops of Mamba2 and Qwen3-Next
//! layers), and [`chunk_gated_delta_rule`] (the Qwen3-Next prefill over the same pool).
//!
//! The contract:
//! - Tensors live on candle's CPU device; their dtype is f32, f16, bf16 (floats) or i32/i64
//!   (index tables). Other devices and dtypes are refused by name ([`Error::Unsupported`]).
//!   candle's CUDA tensors are not supported: candle's `cuda` build compiles its kernels with
//!   `nvcc` at build time, which neither this workspace's build machines nor its GPU machine
//!   have, so no CUDA path could be built or tested here.
//! - A written tensor must not share its storage with any other argument ([`Error::Aliased`]):
//!   candle's storage lock would otherwise deadlock, and the op's contract forbids it anyway.
//! - Everything else is the op's own contract, checked by its plan: a refused call writes
//!   nothing.
//!
//! ```
//! use candle_core::{DType, Device, Tensor};
//! use ssm_dispatch::{Config, Runtime};
//!
//! let rt = Runtime::new(&Config::cpu(Some(1)))?;
//! let dev = Device::Cpu;
//! // Mamba2 decode: 2 sequences, 2 heads of dim 4, dstate 8, one group; slots 3 and 0 of a pool of 4.
//! let state = Tensor::zeros((4, 2, 4, 8), DType::F32, &dev)?;
//! let x = Tensor::ones((2, 2, 4), DType::F32, &dev)?;
//! let dt = Tensor::full(0.5f32, (2, 2), &dev)?.unsqueeze(2)?.broadcast_as((2, 2, 4))?;
//! let a = Tensor::full(-1.0f32, (2, 1, 1), &dev)?.broadcast_as((2, 4, 8))?;
//! let b = Tensor::ones((2, 1, 8), DType::F32, &dev)?;
//! let c = Tensor::ones((2, 1, 8), DType::F32, &dev)?;
//! let slots = Tensor::new(&[3i64, 0], &dev)?;
//! let out = Tensor::zeros((2, 2, 4), DType::F32, &dev)?;
//! ssm_candle::selective_state_update(
//!     &rt,
//!     ssm_candle::SsuTensors::new(&state, &x, &dt, &a, &b, &c, &out).state_batch_indices(&slots),
//!     false,
//!     None,
//! )?;
//! // From a zero state: state = dt·x·B = 0.5 and y = C·state = 8 · 0.5.
//! assert_eq!(out.flatten_all()?.to_vec1::<f32>()?, vec![4.0; 16]);
//! assert_eq!(state.get(3)?.flatten_all()?.to_vec1::<f32>()?, vec![0.5; 64]);
//! assert_eq!(state.get(1)?.sum_all()?.to_scalar::<f32>()?, 0.0, "slot 1 untouched");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::cell::RefCell;

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, InplaceOp1, Layout, Storage, Tensor};
use ssm_conv::{Activation, CausalConv1dUpdateArgs, ConvStateLayout};
use ssm_dispatch::Runtime;
use ssm_gdn::{ChunkGatedDeltaRuleArgs, DeltaRuleArgs, FusedSigmoidGatingDeltaRuleUpdateArgs, GateInputs};
use ssm_ssu::SelectiveStateUpdateArgs;
use ssm_tensor::{TensorMut, TensorRef};

/// Errors of the candle adapter.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A candle operation (taking a storage lock, an in-place op) failed.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    /// The op refused the call (its plan's typed error) or its backend failed.
    #[error(transparent)]
    Op(Box<ssm_dispatch::Error>),
    /// A candle layout could not be expressed as a view.
    #[error("`{arg}`: {source}")]
    Layout {
        /// The argument.
        arg: &'static str,
        /// Why.
        source: ssm_tensor::TensorError,
    },
    /// A device or dtype this adapter does not handle.
    #[error("`{arg}`: {what} is not supported by ssm-candle (CPU tensors of f32, f16, bf16, i32 or i64)")]
    Unsupported {
        /// The argument.
        arg: &'static str,
        /// What it is.
        what: String,
    },
    /// A written tensor shares its storage with another argument.
    #[error("`{written}` shares its storage with `{other}`; a tensor the op writes must not alias another argument")]
    Aliased {
        /// The written argument.
        written: &'static str,
        /// The other argument.
        other: &'static str,
    },
}

impl From<ssm_dispatch::Error> for Error {
    fn from(e: ssm_dispatch::Error) -> Self {
        Error::Op(Box::new(e))
    }
}

/// The base address of a CPU storage's elements (which identifies the storage).
fn cpu_base(s: &CpuStorage) -> Option<usize> {
    Some(match s {
        CpuStorage::F32(v) => v.as_ptr() as usize,
        CpuStorage::F16(v) => v.as_ptr() as usize,
        CpuStorage::BF16(v) => v.as_ptr() as usize,
        CpuStorage::I32(v) => v.as_ptr() as usize,
        CpuStorage::I64(v) => v.as_ptr() as usize,
        _ => return None,
    })
}

/// Which storage `t` uses (its base address), or why it cannot be used.
fn storage_id(arg: &'static str, t: &Tensor) -> Result<usize, Error> {
    let (s, _) = t.storage_and_layout();
    match &*s {
        Storage::Cpu(c) => {
            cpu_base(c).ok_or_else(|| Error::Unsupported { arg, what: format!("dtype {:?}", c.dtype()) })
        }
        other => Err(Error::Unsupported { arg, what: format!("a tensor on {:?}", other.device().location()) }),
    }
}

fn strides(l: &Layout) -> Vec<isize> {
    l.stride().iter().map(|&s| s as isize).collect()
}

/// A read view of `s` with candle layout `l`.
fn view<'a>(arg: &'static str, s: &'a CpuStorage, l: &Layout) -> Result<TensorRef<'a>, Error> {
    let layout = |e| Error::Layout { arg, source: e };
    let flat = match s {
        CpuStorage::F32(v) => TensorRef::from_slice(v, &[v.len()]),
        CpuStorage::F16(v) => TensorRef::from_slice(v, &[v.len()]),
        CpuStorage::BF16(v) => TensorRef::from_slice(v, &[v.len()]),
        CpuStorage::I32(v) => TensorRef::from_slice(v, &[v.len()]),
        CpuStorage::I64(v) => TensorRef::from_slice(v, &[v.len()]),
        other => return Err(Error::Unsupported { arg, what: format!("dtype {:?}", other.dtype()) }),
    }
    .map_err(layout)?;
    flat.with_layout(l.dims(), &strides(l), l.start_offset()).map_err(layout)
}

/// A write view of `s` with candle layout `l`.
fn view_mut<'a>(arg: &'static str, s: &'a mut CpuStorage, l: &Layout) -> Result<TensorMut<'a>, Error> {
    let layout = |e| Error::Layout { arg, source: e };
    let flat = match s {
        CpuStorage::F32(v) => {
            let n = v.len();
            TensorMut::from_slice(v, &[n])
        }
        CpuStorage::F16(v) => {
            let n = v.len();
            TensorMut::from_slice(v, &[n])
        }
        CpuStorage::BF16(v) => {
            let n = v.len();
            TensorMut::from_slice(v, &[n])
        }
        CpuStorage::I32(v) => {
            let n = v.len();
            TensorMut::from_slice(v, &[n])
        }
        CpuStorage::I64(v) => {
            let n = v.len();
            TensorMut::from_slice(v, &[n])
        }
        other => return Err(Error::Unsupported { arg, what: format!("dtype {:?}", other.dtype()) }),
    }
    .map_err(layout)?;
    flat.with_layout(l.dims(), &strides(l), l.start_offset()).map_err(layout)
}

/// The views an op's closure receives: its two written tensors, then its read tensors in the
/// order given ([`Reads`]).
type Body<'f, R> = dyn for<'v> FnOnce([TensorMut<'v>; 2], Reads<'v>) -> Result<R, Error> + 'f;

/// An op's read views, taken in the order its `reads` list gave them.
struct Reads<'v>(std::vec::IntoIter<Option<TensorRef<'v>>>);

impl<'v> Reads<'v> {
    /// The next argument, which may be absent.
    fn opt(&mut self) -> Option<TensorRef<'v>> {
        self.0.next().flatten()
    }

    /// The next argument, one the op always passes.
    fn given(&mut self) -> TensorRef<'v> {
        self.opt().expect("a required argument is given")
    }
}

/// Runs `body` over views of two written tensors (in place, under their storage's write locks)
/// and of the read tensors (under read locks, one per distinct storage). Refuses a written
/// tensor that shares storage with any other argument, before any lock is taken.
fn in_place<R>(
    writes: [(&'static str, &Tensor); 2],
    reads: &[(&'static str, Option<&Tensor>)],
    body: Box<Body<'_, R>>,
) -> Result<R, Error> {
    // Each argument's storage, looked up once: for the aliasing check here and the read locks
    // (one per distinct storage) in `Second`.
    let read_ids =
        reads.iter().map(|&(arg, t)| t.map(|t| storage_id(arg, t)).transpose()).collect::<Result<Vec<_>, _>>()?;
    let mut ids = Vec::new();
    for &(arg, t) in &writes {
        ids.push((arg, storage_id(arg, t)?));
    }
    ids.extend(reads.iter().zip(&read_ids).filter_map(|(&(arg, _), id)| id.map(|id| (arg, id))));
    for (i, &(written, id)) in ids[..2].iter().enumerate() {
        if let Some(&(other, _)) = ids.iter().enumerate().find(|&(j, &(_, o))| j != i && o == id).map(|(_, x)| x) {
            return Err(Error::Aliased { written, other });
        }
    }
    let first = First {
        second: writes[1],
        names: [writes[0].0, writes[1].0],
        reads,
        read_ids,
        body: RefCell::new(Some(body)),
        result: RefCell::new(None),
    };
    writes[0].1.inplace_op1(&first)?;
    first.result.into_inner().unwrap_or_else(|| {
        Err(Error::Unsupported { arg: writes[0].0, what: "a storage candle did not hand over".into() })
    })
}

/// The in-place op on the first written tensor: it takes the second one's in turn.
struct First<'a, 'f, R> {
    second: (&'static str, &'a Tensor),
    names: [&'static str; 2],
    reads: &'a [(&'static str, Option<&'a Tensor>)],
    /// The storage of each read argument (`None` where absent).
    read_ids: Vec<Option<usize>>,
    body: RefCell<Option<Box<Body<'f, R>>>>,
    result: RefCell<Option<Result<R, Error>>>,
}

/// The in-place op on the second written tensor: holds the first one's storage, takes the read
/// locks and runs the body.
struct Second<'a, 'b, 'f, R> {
    first: RefCell<Option<(&'b mut CpuStorage, &'b Layout)>>,
    parent: &'b First<'a, 'f, R>,
}

impl<R> InplaceOp1 for First<'_, '_, R> {
    fn name(&self) -> &'static str {
        "ssm-candle"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let second = Second { first: RefCell::new(Some((storage, layout))), parent: self };
        self.second.1.inplace_op1(&second)
    }
}

impl<R> InplaceOp1 for Second<'_, '_, '_, R> {
    fn name(&self) -> &'static str {
        "ssm-candle"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let p = self.parent;
        let result = (|| {
            let (s0, l0) = self.first.borrow_mut().take().expect("the first tensor's storage, handed over once");
            let w = [view_mut(p.names[0], s0, l0)?, view_mut(p.names[1], storage, layout)?];
            // One read lock per distinct storage.
            let mut guards: Vec<(usize, candle_core::StorageRef<'_>)> = Vec::new();
            let mut at = Vec::with_capacity(p.reads.len());
            for (&(arg, t), &id) in p.reads.iter().zip(&p.read_ids) {
                at.push(match (t, id) {
                    (Some(t), Some(id)) => {
                        let k = match guards.iter().position(|(g, _)| *g == id) {
                            Some(k) => k,
                            None => {
                                guards.push((id, t.storage_and_layout().0));
                                guards.len() - 1
                            }
                        };
                        Some((arg, k, t.layout()))
                    }
                    _ => None,
                });
            }
            let mut views = Vec::with_capacity(at.len());
            for a in at {
                views.push(match a {
                    None => None,
                    Some((arg, k, l)) => match &*guards[k].1 {
                        Storage::Cpu(c) => Some(view(arg, c, l)?),
                        other => {
                            return Err(Error::Unsupported {
                                arg,
                                what: format!("a tensor on {:?}", other.device().location()),
                            });
                        }
                    },
                });
            }
            let body = p.body.borrow_mut().take().expect("the body runs once");
            body(w, Reads(views.into_iter()))
        })();
        *p.result.borrow_mut() = Some(result);
        Ok(())
    }
}

/// The tensors of [`selective_state_update`] (vLLM's `selective_state_update`): `state` and
/// `out` are written in place; see [`ssm_ssu::SelectiveStateUpdateArgs`] for shapes.
#[derive(Debug, Clone, Copy)]
pub struct SsuTensors<'t> {
    /// The state pool, updated in place.
    pub state: &'t Tensor,
    /// Activations.
    pub x: &'t Tensor,
    /// Time step.
    pub dt: &'t Tensor,
    /// `A`.
    pub a: &'t Tensor,
    /// `B`.
    pub b: &'t Tensor,
    /// `C`.
    pub c: &'t Tensor,
    /// Output, written in place.
    pub out: &'t Tensor,
    /// `D`.
    pub d: Option<&'t Tensor>,
    /// Gate.
    pub z: Option<&'t Tensor>,
    /// Added to `dt`.
    pub dt_bias: Option<&'t Tensor>,
    /// Slot of each sequence.
    pub state_batch_indices: Option<&'t Tensor>,
}

impl<'t> SsuTensors<'t> {
    /// The required tensors; the optional ones are absent.
    pub fn new(
        state: &'t Tensor,
        x: &'t Tensor,
        dt: &'t Tensor,
        a: &'t Tensor,
        b: &'t Tensor,
        c: &'t Tensor,
        out: &'t Tensor,
    ) -> Self {
        SsuTensors { state, x, dt, a, b, c, out, d: None, z: None, dt_bias: None, state_batch_indices: None }
    }

    /// With `D`.
    pub fn d(self, d: &'t Tensor) -> Self {
        SsuTensors { d: Some(d), ..self }
    }

    /// With the gate `z`.
    pub fn z(self, z: &'t Tensor) -> Self {
        SsuTensors { z: Some(z), ..self }
    }

    /// With `dt_bias`.
    pub fn dt_bias(self, dt_bias: &'t Tensor) -> Self {
        SsuTensors { dt_bias: Some(dt_bias), ..self }
    }

    /// With a slot table.
    pub fn state_batch_indices(self, t: &'t Tensor) -> Self {
        SsuTensors { state_batch_indices: Some(t), ..self }
    }
}

/// `selective_state_update` on candle tensors through `rt`: one decode step, `state` and `out`
/// updated in place (no copy). `dt_softplus` and `pad_slot_id` as in vLLM.
pub fn selective_state_update(
    rt: &Runtime,
    t: SsuTensors<'_>,
    dt_softplus: bool,
    pad_slot_id: Option<i64>,
) -> Result<(), Error> {
    let reads = [
        ("x", Some(t.x)),
        ("dt", Some(t.dt)),
        ("A", Some(t.a)),
        ("B", Some(t.b)),
        ("C", Some(t.c)),
        ("D", t.d),
        ("z", t.z),
        ("dt_bias", t.dt_bias),
        ("state_batch_indices", t.state_batch_indices),
    ];
    in_place(
        [("state", t.state), ("out", t.out)],
        &reads,
        Box::new(move |[state, out], mut r| {
            // The reader hands the tensors out in `reads`' order: the five required ones first.
            let (x, dt, a, b, c) = (r.given(), r.given(), r.given(), r.given(), r.given());
            let args = SelectiveStateUpdateArgs {
                d: r.opt(),
                z: r.opt(),
                dt_bias: r.opt(),
                dt_softplus,
                state_batch_indices: r.opt(),
                pad_slot_id,
                ..SelectiveStateUpdateArgs::new(state, x, dt, a, b, c, out)
            };
            Ok(rt.selective_state_update(args)?)
        }),
    )
}

/// The tensors of [`causal_conv1d_update`] (vLLM's `causal_conv1d_update`): `conv_state` and
/// `out` are written in place; see [`ssm_conv::CausalConv1dUpdateArgs`] for shapes.
#[derive(Debug, Clone, Copy)]
pub struct ConvUpdateTensors<'t> {
    /// Activations.
    pub x: &'t Tensor,
    /// The conv-state pool, updated in place.
    pub conv_state: &'t Tensor,
    /// `[dim, width]`.
    pub weight: &'t Tensor,
    /// `[dim]`.
    pub bias: Option<&'t Tensor>,
    /// Slot of each sequence.
    pub conv_state_indices: Option<&'t Tensor>,
    /// Output, written in place.
    pub out: &'t Tensor,
}

/// `causal_conv1d_update` on candle tensors through `rt` (plain decode: no speculative or
/// prefix-caching tables): `conv_state` and `out` updated in place (no copy).
pub fn causal_conv1d_update(
    rt: &Runtime,
    t: ConvUpdateTensors<'_>,
    conv_state_layout: ConvStateLayout,
    activation: Activation,
    pad_slot_id: Option<i64>,
) -> Result<(), Error> {
    let reads =
        [("x", Some(t.x)), ("weight", Some(t.weight)), ("bias", t.bias), ("conv_state_indices", t.conv_state_indices)];
    in_place(
        [("conv_state", t.conv_state), ("out", t.out)],
        &reads,
        Box::new(move |[conv_state, out], mut r| {
            let args = CausalConv1dUpdateArgs {
                x: r.given(),
                conv_state,
                conv_state_layout,
                weight: r.given(),
                bias: r.opt(),
                activation,
                conv_state_indices: r.opt(),
                num_accepted_tokens: None,
                query_start_loc: None,
                pad_slot_id,
                block_idx_last_scheduled_token: None,
                initial_state_idx: None,
                out,
            };
            Ok(rt.causal_conv1d_update(args)?)
        }),
    )
}

/// The tensors of [`fused_sigmoid_gating_delta_rule_update`] (vLLM's op of the same name, the
/// Qwen3-Next decode step): the state pool `initial_state` and `o` are written in place; see
/// [`ssm_gdn::FusedSigmoidGatingDeltaRuleUpdateArgs`] for shapes (`[V, K]` state).
#[derive(Debug, Clone, Copy)]
pub struct GdnDecodeTensors<'t> {
    /// `A_log` `[HV]`.
    pub a_log: &'t Tensor,
    /// `a` `[B·T, HV]`.
    pub a: &'t Tensor,
    /// `b` `[B·T, HV]`.
    pub b: &'t Tensor,
    /// `dt_bias` `[HV]`.
    pub dt_bias: &'t Tensor,
    /// `[B, T, H, K]`.
    pub q: &'t Tensor,
    /// `[B, T, H, K]`.
    pub k: &'t Tensor,
    /// `[B, T, HV, V]`.
    pub v: &'t Tensor,
    /// The state pool `[slots, HV, V, K]`, updated in place.
    pub initial_state: &'t Tensor,
    /// Slot of each sequence.
    pub ssm_state_indices: Option<&'t Tensor>,
    /// Packed sequence starts (`B == 1`).
    pub cu_seqlens: Option<&'t Tensor>,
    /// Output `[B, T, HV, V]`, written in place.
    pub o: &'t Tensor,
}

/// `fused_sigmoid_gating_delta_rule_update` on candle tensors through `rt`: the gates computed
/// in the kernel (softplus β 1, threshold 20), the pool updated in place through
/// `ssm_state_indices`, `o` written (no copy).
pub fn fused_sigmoid_gating_delta_rule_update(
    rt: &Runtime,
    t: GdnDecodeTensors<'_>,
    scale: Option<f32>,
    use_qk_l2norm_in_kernel: bool,
) -> Result<(), Error> {
    let reads = [
        ("A_log", Some(t.a_log)),
        ("a", Some(t.a)),
        ("b", Some(t.b)),
        ("dt_bias", Some(t.dt_bias)),
        ("q", Some(t.q)),
        ("k", Some(t.k)),
        ("v", Some(t.v)),
        ("ssm_state_indices", t.ssm_state_indices),
        ("cu_seqlens", t.cu_seqlens),
    ];
    in_place(
        [("initial_state", t.initial_state), ("o", t.o)],
        &reads,
        Box::new(move |[state, o], mut r| {
            let gates = GateInputs::new(r.given(), r.given(), r.given(), r.given());
            let (q, k, v) = (r.given(), r.given(), r.given());
            let rule = DeltaRuleArgs {
                scale,
                initial_state: Some(state),
                ssm_state_indices: r.opt(),
                cu_seqlens: r.opt(),
                use_qk_l2norm_in_kernel,
                ..DeltaRuleArgs::new(q, k, v, o)
            };
            Ok(rt.fused_sigmoid_gating_delta_rule_update(FusedSigmoidGatingDeltaRuleUpdateArgs { gates, rule })?)
        }),
    )
}

/// The tensors of [`chunk_gated_delta_rule`] (vLLM's op of the same name, the Qwen3-Next
/// prefill): the state pool `initial_state` and `o` are written in place; see
/// [`ssm_gdn::ChunkGatedDeltaRuleArgs`] for shapes (`[V, K]` state).
#[derive(Debug, Clone, Copy)]
pub struct GdnPrefillTensors<'t> {
    /// `[B, T, H, K]`.
    pub q: &'t Tensor,
    /// `[B, T, H, K]`.
    pub k: &'t Tensor,
    /// `[B, T, HV, V]`.
    pub v: &'t Tensor,
    /// `[B, T, HV]` log-space decay (what `fused_gdn_gating` writes).
    pub g: &'t Tensor,
    /// `[B, T, HV]`.
    pub beta: &'t Tensor,
    /// The state pool `[slots, HV, V, K]`: each sequence's initial state is read from its slot
    /// and its final state written back there.
    pub initial_state: &'t Tensor,
    /// Slot of each sequence (`[N]`, i32/i64).
    pub initial_state_indices: &'t Tensor,
    /// `[N]` i32/i64, nonzero where the slot holds a state to start from (else zeros).
    pub has_initial_state: Option<&'t Tensor>,
    /// Packed sequence starts `[N + 1]` (`B == 1`).
    pub cu_seqlens: Option<&'t Tensor>,
    /// Output `[B, T, HV, V]`, written in place.
    pub o: &'t Tensor,
}

/// `chunk_gated_delta_rule` on candle tensors through `rt`: every sequence starts from its
/// slot of the pool (or zeros where `has_initial_state` says so), a slot equal to `pad_slot_id`
/// skips its sequence, and the final states are written back into the slots in place; `o` is
/// written (no copy).
pub fn chunk_gated_delta_rule(
    rt: &Runtime,
    t: GdnPrefillTensors<'_>,
    scale: Option<f32>,
    pad_slot_id: Option<i64>,
    use_qk_l2norm_in_kernel: bool,
) -> Result<(), Error> {
    let reads = [
        ("q", Some(t.q)),
        ("k", Some(t.k)),
        ("v", Some(t.v)),
        ("g", Some(t.g)),
        ("beta", Some(t.beta)),
        ("initial_state_indices", Some(t.initial_state_indices)),
        ("has_initial_state", t.has_initial_state),
        ("cu_seqlens", t.cu_seqlens),
    ];
    in_place(
        [("initial_state", t.initial_state), ("o", t.o)],
        &reads,
        Box::new(move |[state, o], mut r| {
            let (q, k, v, g, beta) = (r.given(), r.given(), r.given(), r.given(), r.given());
            let args = ChunkGatedDeltaRuleArgs {
                scale,
                initial_state: Some(state),
                initial_state_indices: r.opt(),
                has_initial_state: r.opt(),
                pad_slot_id,
                inplace_final_state: true,
                cu_seqlens: r.opt(),
                use_qk_l2norm_in_kernel,
                ..ChunkGatedDeltaRuleArgs::new(q, k, v, g, beta, o)
            };
            Ok(rt.chunk_gated_delta_rule(args)?)
        }),
    )
}

/// The crate README's example runs as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
