use ssm_tensor::ArgError;
use ssm_tensor::{DType, Device, Layout, SlotUse, TensorMut, TensorRef, first_slot_conflict};

use crate::{Activation, CausalConv1dFnArgs, CausalConv1dUpdateArgs, ConvError, ConvStateLayout, error::PadDisplay};

/// Which op a [`ConvPlan`] was built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConvOp {
    /// `causal_conv1d_update`.
    Update,
    /// `causal_conv1d_fn`.
    Fn,
}

/// Strides (elements) of a token-major tensor `[.., tokens, dim]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenStrides {
    /// Between consecutive tokens of one sequence.
    pub token: isize,
    /// Between channels.
    pub dim: isize,
}

/// Resolved geometry of the conv-state pool: element `(slot, column, channel)` lives at
/// `offset + slot·slot_stride + column·col + channel·dim`, whatever the layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateStrides {
    /// Element offset of `(0, 0, 0)`.
    pub offset: usize,
    /// Between slots.
    pub slot: isize,
    /// Between state columns (time).
    pub col: isize,
    /// Between channels.
    pub dim: isize,
}

/// Element `(channel, tap)` of `weight` lives at `offset + channel·dim + tap·tap_stride`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WeightStrides {
    /// Element offset of `(0, 0)`.
    pub offset: usize,
    /// Between channels.
    pub dim: isize,
    /// Between taps.
    pub tap: isize,
}

/// Element `channel` of `bias` lives at `offset + channel·dim`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BiasStrides {
    /// Element offset of channel 0.
    pub offset: usize,
    /// Between channels.
    pub dim: isize,
}

/// One sequence's work, resolved from the index tables. Pad sequences and empty sequences
/// have no entry: they write nothing.
///
/// The sequence reads its history window from columns `[offset, offset + width − 1)` of
/// `read_slot` (zeros when `None`), writes columns `[0, state_len)` of `write_slot`:
/// `new[i] = old[offset + i + shift]` while `i + len < state_len` (zeros when `read_slot` is
/// `None`), else `x[i − (state_len − len)]`; and writes `len` output rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvSeq {
    /// Position of the sequence in the batch.
    pub seq: usize,
    /// Element index (in `x`'s memory) of the sequence's first token, channel 0.
    pub x_start: isize,
    /// Element index (in `out`'s memory) of the first output row, channel 0.
    pub out_start: isize,
    /// Tokens of the sequence (≥ 1).
    pub len: usize,
    /// Slot the history is read from; `None`: zero history (prefill without initial state).
    pub read_slot: Option<usize>,
    /// Slot the new window is written to; `None`: no state write (prefix-caching write
    /// column holding the pad).
    pub write_slot: Option<usize>,
    /// First history column: `num_accepted_tokens − 1` in speculative mode, else 0.
    pub offset: usize,
    /// How far the kept history moves: 1 in speculative mode, else `len`.
    pub shift: usize,
    /// Effective state length `L`: columns `[0, L)` of the write slot are written.
    pub state_len: usize,
    /// `causal_conv1d_fn`'s prefix-caching checkpoint, if the sequence has one.
    pub checkpoint: Option<ConvCheckpoint>,
}

/// A checkpoint of `causal_conv1d_fn`: columns `[0, width − 1)` of `slot` take the window after
/// the sequence's first `tokens` tokens, `new[i] = old[i + tokens]` while `i + tokens < width −
/// 1` (zeros without a read slot), else `x[i + tokens − (width − 1)]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvCheckpoint {
    /// The slot written.
    pub slot: usize,
    /// Tokens of the sequence before the checkpoint (`1 ≤ tokens < len`).
    pub tokens: usize,
}

/// Everything a backend needs, checked once by [`crate::plan`] (of a `causal_conv1d_update` or a
/// `causal_conv1d_fn` call). Backends trust it and never re-validate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConvPlan {
    /// The op.
    pub op: ConvOp,
    /// The one floating-point dtype of `x`, `out`, `weight`, `bias` and the state.
    pub dtype: DType,
    /// Where every tensor lives.
    pub device: Device,
    /// Channels.
    pub dim: usize,
    /// Conv width (2..=4).
    pub width: usize,
    /// Slots in the pool.
    pub slots: usize,
    /// Physical state length of the pool (columns per slot).
    pub state_len: usize,
    /// Sequences of the call (including pads and empty ones).
    pub batch: usize,
    /// Activation.
    pub activation: Activation,
    /// `x` strides.
    pub x: TokenStrides,
    /// `out` strides.
    pub out: TokenStrides,
    /// Conv-state geometry.
    pub state: StateStrides,
    /// Weight geometry.
    pub weight: WeightStrides,
    /// Bias geometry, when there is a bias.
    pub bias: Option<BiasStrides>,
    /// Per-sequence work in batch order; `None` when the tensors live on a device (the
    /// index tables were not read on the host).
    pub seqs: Option<Vec<ConvSeq>>,
}

impl ConvPlan {
    /// Total output rows the plan writes.
    pub fn rows_written(&self) -> usize {
        self.seqs.as_ref().map_or(0, |s| s.iter().map(|q| q.len).sum())
    }
}

const FLOATS: &str = "f32, f16 or bf16";

fn check_dtype(arg: &'static str, actual: DType, want: DType) -> Result<(), ConvError> {
    if actual != want {
        return Err(ConvError::from(ArgError::DType { arg, expected: format!("{want} (the dtype of `x`)"), actual }));
    }
    Ok(())
}

fn check_index_dtype(arg: &'static str, t: &TensorRef<'_>) -> Result<(), ConvError> {
    if !t.dtype().is_index() {
        return Err(ConvError::from(ArgError::DType { arg, expected: "i32 or i64".into(), actual: t.dtype() }));
    }
    Ok(())
}

fn check_device(arg: &'static str, actual: Device, expected: Device) -> Result<(), ConvError> {
    if actual != expected {
        return Err(ConvError::from(ArgError::Device { arg, expected, actual, reference: "x" }));
    }
    Ok(())
}

fn check_1d(arg: &'static str, t: &TensorRef<'_>, len: usize, name: &str) -> Result<(), ConvError> {
    if t.shape() != [len] {
        return Err(ConvError::from(ArgError::Shape {
            arg,
            expected: format!("[{name}={len}]"),
            actual: t.shape().to_vec(),
        }));
    }
    Ok(())
}

/// A 1-D table of at least `len` entries (vLLM's kernels read entry `b` of each sequence `b`
/// and ignore the rest: a wider table, as vLLM's own tests pass, is accepted).
fn check_1d_at_least(arg: &'static str, t: &TensorRef<'_>, len: usize, name: &str) -> Result<(), ConvError> {
    if t.rank() != 1 || t.shape()[0] < len {
        return Err(ConvError::from(ArgError::Shape {
            arg,
            expected: format!("[n ≥ {name}={len}]"),
            actual: t.shape().to_vec(),
        }));
    }
    Ok(())
}

/// Reads one host index (the plan checked dtype and device before).
fn read(t: &TensorRef<'_>, idx: &[usize]) -> i64 {
    t.get_i64(idx).expect("host index tensor of checked dtype")
}

/// The weight `[dim, width]`: returns the width.
fn check_weight(weight: &TensorRef<'_>, dim: usize) -> Result<usize, ConvError> {
    if weight.rank() != 2 {
        return Err(ConvError::from(ArgError::Rank {
            arg: "weight",
            expected: "2 ([dim, width])",
            actual: weight.shape().to_vec(),
        }));
    }
    let width = weight.shape()[1];
    if !(2..=4).contains(&width) {
        return Err(ConvError::Width { actual: width, shape: weight.shape().to_vec() });
    }
    if weight.shape()[0] != dim {
        return Err(ConvError::from(ArgError::Shape {
            arg: "weight",
            expected: format!("[dim={dim}, width]"),
            actual: weight.shape().to_vec(),
        }));
    }
    Ok(width)
}

/// The state pool: returns (slots, state_len, strides).
fn check_state(
    arg: &'static str,
    shape: &[usize],
    strides: &[isize],
    offset: usize,
    layout: ConvStateLayout,
    dim: usize,
    width: usize,
) -> Result<(usize, usize, StateStrides), ConvError> {
    if shape.len() != 3 {
        return Err(ConvError::from(ArgError::Rank {
            arg,
            expected: match layout {
                ConvStateLayout::StateLenDim => "3 ((slots, state_len, dim))",
                ConvStateLayout::DimStateLen => "3 ((slots, dim, state_len))",
            },
            actual: shape.to_vec(),
        }));
    }
    let (d, l, col, dstride) = match layout {
        ConvStateLayout::StateLenDim => (shape[2], shape[1], strides[1], strides[2]),
        ConvStateLayout::DimStateLen => (shape[1], shape[2], strides[2], strides[1]),
    };
    if d != dim {
        return Err(ConvError::from(ArgError::Shape {
            arg,
            expected: match layout {
                ConvStateLayout::StateLenDim => format!("(slots, state_len, dim={dim}) for layout StateLenDim"),
                ConvStateLayout::DimStateLen => format!("(slots, dim={dim}, state_len) for layout DimStateLen"),
            },
            actual: shape.to_vec(),
        }));
    }
    if l < width - 1 {
        return Err(ConvError::StateLen {
            arg,
            layout: layout.describe(),
            needed: width - 1,
            actual: l,
            shape: shape.to_vec(),
        });
    }
    Ok((shape[0], l, StateStrides { offset, slot: strides[0], col, dim: dstride }))
}

fn check_bias(
    bias: Option<&TensorRef<'_>>,
    dim: usize,
    dtype: DType,
    device: Device,
) -> Result<Option<BiasStrides>, ConvError> {
    let Some(b) = bias else { return Ok(None) };
    check_1d("bias", b, dim, "dim")?;
    check_dtype("bias", b.dtype(), dtype)?;
    check_device("bias", b.device(), device)?;
    Ok(Some(BiasStrides { offset: b.layout().offset(), dim: b.strides()[0] }))
}

/// Validates `query_start_loc` values: non-decreasing within `[0, num_tokens]`.
fn check_query_starts(qsl: &TensorRef<'_>, num_tokens: usize) -> Result<Vec<i64>, ConvError> {
    let n = qsl.shape()[0];
    let v: Vec<i64> = (0..n).map(|i| read(qsl, &[i])).collect();
    let ok = v.iter().all(|&s| s >= 0 && s <= num_tokens as i64) && v.windows(2).all(|w| w[0] <= w[1]);
    if !ok {
        return Err(ConvError::QueryStartLoc { num_tokens, actual: v });
    }
    Ok(v)
}

/// Resolves one slot-table entry: `Ok(None)` for the pad, the slot otherwise.
fn resolve_slot(
    arg: &'static str,
    value: i64,
    position: Vec<usize>,
    pad: Option<i64>,
    slots: usize,
) -> Result<Option<usize>, ConvError> {
    if pad == Some(value) {
        return Ok(None);
    }
    if value < 0 || value >= slots as i64 {
        return Err(ConvError::SlotOutOfRange { arg, position, value, pad: PadDisplay(pad), slots });
    }
    Ok(Some(value as usize))
}

/// The aliasing rule of every family ([`ssm_tensor::first_slot_conflict`]): every written slot
/// is written by one sequence only and read by no other sequence, so backends may run
/// sequences in parallel.
fn check_conflicts(arg: &'static str, seqs: &[ConvSeq]) -> Result<(), ConvError> {
    let mut uses: Vec<SlotUse> = seqs
        .iter()
        .flat_map(|s| {
            let read = s.read_slot.map(|slot| SlotUse { slot, written: false, seq: s.seq });
            let write = s.write_slot.map(|slot| SlotUse { slot, written: true, seq: s.seq });
            let checkpoint = s.checkpoint.map(|c| SlotUse { slot: c.slot, written: true, seq: s.seq });
            read.into_iter().chain(write).chain(checkpoint)
        })
        .collect();
    match first_slot_conflict(&mut uses) {
        Some(c) => {
            // Name the checkpoint table where the slot is a checkpoint's.
            let arg = if seqs.iter().any(|s| s.checkpoint.is_some_and(|k| k.slot == c.slot)) {
                "checkpoint_state_indices"
            } else {
                arg
            };
            Err(ConvError::SlotConflict { arg, slot: c.slot, writer: c.writer().seq, other: c.other().seq })
        }
        None => Ok(()),
    }
}

/// Two tables that come together: both (returned) or neither; `needs` says why the first needs
/// the second and the reverse.
fn both_or_neither<'r, 'a>(
    (a, ta): (&'static str, &'r Option<TensorRef<'a>>),
    (b, tb): (&'static str, &'r Option<TensorRef<'a>>),
    needs: (&'static str, &'static str),
) -> Result<Option<(&'r TensorRef<'a>, &'r TensorRef<'a>)>, ConvError> {
    match (ta, tb) {
        (None, None) => Ok(None),
        (Some(x), Some(y)) => Ok(Some((x, y))),
        (Some(_), None) => Err(ConvError::Combination { arg: a, why: needs.0 }),
        (None, Some(_)) => Err(ConvError::Combination { arg: b, why: needs.1 }),
    }
}

fn check_float(arg: &'static str, t: DType) -> Result<DType, ConvError> {
    if !t.is_float() {
        return Err(ConvError::from(ArgError::DType { arg, expected: FLOATS.into(), actual: t }));
    }
    Ok(t)
}

/// What both ops check the same way once `x` gave the dtype, device and `dim`.
struct SharedChecks {
    dtype: DType,
    device: Device,
    dim: usize,
    width: usize,
    slots: usize,
    state_len: usize,
    state: StateStrides,
    weight: WeightStrides,
    bias: Option<BiasStrides>,
}

impl SharedChecks {
    /// The plan of `op` over `batch` sequences, before the host index values are resolved.
    fn plan(self, op: ConvOp, batch: usize, activation: Activation, x: TokenStrides, out: TokenStrides) -> ConvPlan {
        let SharedChecks { dtype, device, dim, width, slots, state_len, state, weight, bias } = self;
        ConvPlan {
            op,
            dtype,
            device,
            dim,
            width,
            slots,
            state_len,
            batch,
            activation,
            x,
            out,
            state,
            weight,
            bias,
            seqs: None,
        }
    }
}

/// Checks, in this order, the weight, `out` (the shape, dtype and device of `x`, no
/// overlapping elements), the state pool (named `state_arg`) and the bias.
fn check_shared(
    x: &TensorRef<'_>,
    (dtype, device, dim): (DType, Device, usize),
    weight: &TensorRef<'_>,
    bias: Option<&TensorRef<'_>>,
    out: &TensorMut<'_>,
    (state_arg, cs, layout): (&'static str, &TensorMut<'_>, ConvStateLayout),
) -> Result<SharedChecks, ConvError> {
    let width = check_weight(weight, dim)?;
    check_dtype("weight", weight.dtype(), dtype)?;
    check_device("weight", weight.device(), device)?;
    if out.shape() != x.shape() {
        return Err(ConvError::from(ArgError::Shape {
            arg: "out",
            expected: format!("{:?} (the shape of `x`)", x.shape()),
            actual: out.shape().to_vec(),
        }));
    }
    check_dtype("out", out.dtype(), dtype)?;
    check_device("out", out.device(), device)?;
    ArgError::check_written("out", out.layout())?;
    let (slots, state_len, state) =
        check_state(state_arg, cs.shape(), cs.strides(), cs.layout().offset(), layout, dim, width)?;
    check_dtype(state_arg, cs.dtype(), dtype)?;
    check_device(state_arg, cs.device(), device)?;
    ArgError::check_written(state_arg, cs.layout())?;
    let bias = check_bias(bias, dim, dtype, device)?;
    let weight = WeightStrides { offset: weight.layout().offset(), dim: weight.strides()[0], tap: weight.strides()[1] };
    Ok(SharedChecks { dtype, device, dim, width, slots, state_len, state, weight, bias })
}

/// Checks every argument of `causal_conv1d_update` and resolves the per-sequence work.
///
/// Errors: ranks and shapes ([`ArgError::Rank`], [`ArgError::Shape`]), width outside
/// 2..=4, state length below `width − 1` or too short for the speculative buffer, dtypes,
/// devices, argument combinations, non-monotone `query_start_loc`, and host index values
/// out of range (slots, prefix-caching columns, accepted counts) or in conflict. Only the
/// table entries the call uses are checked (column 0 or the prefix-caching columns; the
/// accepted count of pad and empty sequences is ignored).
pub(crate) fn plan_causal_conv1d_update(args: &CausalConv1dUpdateArgs<'_>) -> Result<ConvPlan, ConvError> {
    let x = &args.x;
    let dtype = check_float("x", x.dtype())?;
    let device = x.device();
    let varlen = args.query_start_loc.is_some();
    let xs = x.shape();
    let st = x.strides();
    // (batch-or-tokens, seqlen, dim) and token/sequence strides.
    let (rows, seqlen, dim, seq_stride, x_tok) = match (varlen, xs.len()) {
        (true, 2) => (xs[0], 1, xs[1], 0, TokenStrides { token: st[0], dim: st[1] }),
        (false, 2) => (xs[0], 1, xs[1], st[0], TokenStrides { token: 0, dim: st[1] }),
        (false, 3) => (xs[0], xs[1], xs[2], st[0], TokenStrides { token: st[1], dim: st[2] }),
        (true, _) => {
            return Err(ConvError::from(ArgError::Rank {
                arg: "x",
                expected: "2 ([num_tokens, dim]) with `query_start_loc`",
                actual: xs.to_vec(),
            }));
        }
        (false, _) => {
            return Err(ConvError::from(ArgError::Rank {
                arg: "x",
                expected: "2 ([batch, dim]) or 3 ([batch, seqlen, dim])",
                actual: xs.to_vec(),
            }));
        }
    };
    let out = &args.out;
    let cs = &args.conv_state;
    let shared = check_shared(
        x,
        (dtype, device, dim),
        &args.weight,
        args.bias.as_ref(),
        out,
        ("conv_state", cs, args.conv_state_layout),
    )?;
    let (width, slots, state_len) = (shared.width, shared.slots, shared.state_len);
    let ost = out.strides();
    let (out_seq_stride, out_tok) = match (varlen, xs.len()) {
        (true, _) => (0, TokenStrides { token: ost[0], dim: ost[1] }),
        (false, 2) => (ost[0], TokenStrides { token: 0, dim: ost[1] }),
        _ => (ost[0], TokenStrides { token: ost[1], dim: ost[2] }),
    };

    // Batch size and the tables' shapes.
    let batch = match (&args.conv_state_indices, &args.query_start_loc) {
        (Some(ci), _) => {
            if ci.rank() == 0 || ci.rank() > 2 || (ci.rank() == 2 && ci.shape()[1] == 0) {
                return Err(ConvError::from(ArgError::Rank {
                    arg: "conv_state_indices",
                    expected: "1 ([batch]) or 2 ([batch, n], n ≥ 1)",
                    actual: ci.shape().to_vec(),
                }));
            }
            ci.shape()[0]
        }
        (None, Some(q)) => q.shape().first().copied().unwrap_or(1).saturating_sub(1),
        (None, None) => rows,
    };
    if let Some(ci) = &args.conv_state_indices {
        check_index_dtype("conv_state_indices", ci)?;
        check_device("conv_state_indices", ci.device(), device)?;
        if !varlen && ci.shape()[0] != rows {
            return Err(ConvError::from(ArgError::Shape {
                arg: "conv_state_indices",
                expected: format!("[batch={rows}] or [batch={rows}, n] (rows of `x`)"),
                actual: ci.shape().to_vec(),
            }));
        }
    } else if batch > slots {
        return Err(ConvError::from(ArgError::Shape {
            arg: "conv_state",
            expected: format!("at least batch={batch} slots when `conv_state_indices` is None"),
            actual: cs.shape().to_vec(),
        }));
    }
    if let Some(q) = &args.query_start_loc {
        check_index_dtype("query_start_loc", q)?;
        check_device("query_start_loc", q.device(), device)?;
        check_1d("query_start_loc", q, batch + 1, "batch + 1")?;
    }
    if let Some(n) = &args.num_accepted_tokens {
        check_index_dtype("num_accepted_tokens", n)?;
        check_device("num_accepted_tokens", n.device(), device)?;
        check_1d("num_accepted_tokens", n, batch, "batch")?;
    }
    let apc = both_or_neither(
        ("initial_state_idx", &args.initial_state_idx),
        ("block_idx_last_scheduled_token", &args.block_idx_last_scheduled_token),
        (
            "needs `block_idx_last_scheduled_token` (prefix caching takes both)",
            "needs `initial_state_idx` (prefix caching takes both)",
        ),
    )?;
    if let Some((i, l)) = apc {
        match &args.conv_state_indices {
            Some(ci) if ci.rank() == 2 => {}
            _ => {
                return Err(ConvError::Combination {
                    arg: "initial_state_idx",
                    why: "(prefix caching) needs a 2-D `conv_state_indices` [batch, n]",
                });
            }
        }
        for (arg, t) in [("initial_state_idx", i), ("block_idx_last_scheduled_token", l)] {
            check_index_dtype(arg, t)?;
            check_device(arg, t.device(), device)?;
            check_1d(arg, t, batch, "batch")?;
        }
    }

    let mut plan = shared.plan(ConvOp::Update, batch, args.activation, x_tok, out_tok);
    if device != Device::Cpu {
        return Ok(plan);
    }

    // Host index values.
    let starts = match &args.query_start_loc {
        Some(q) => Some(check_query_starts(q, rows)?),
        None => None,
    };
    let len_of = |b: usize| starts.as_ref().map_or(seqlen, |s| (s[b + 1] - s[b]) as usize);
    let cols = args.conv_state_indices.as_ref().filter(|c| c.rank() == 2).map_or(1, |c| c.shape()[1]);
    let pad = args.pad_slot_id;
    let mut seqs = Vec::with_capacity(batch);
    for b in 0..batch {
        let (read_col, write_col) = match apc {
            Some((i, l)) => {
                let col = |arg: &'static str, t: &TensorRef<'_>| {
                    let v = read(t, &[b]);
                    if v < 0 || v >= cols as i64 {
                        return Err(ConvError::ColumnOutOfRange { arg, position: b, value: v, columns: cols });
                    }
                    Ok(v as usize)
                };
                (col("initial_state_idx", i)?, col("block_idx_last_scheduled_token", l)?)
            }
            None => (0, 0),
        };
        let entry = |c: usize| -> Result<Option<usize>, ConvError> {
            match &args.conv_state_indices {
                None => Ok(Some(b)),
                Some(ci) => {
                    let pos = if ci.rank() == 2 { vec![b, c] } else { vec![b] };
                    resolve_slot("conv_state_indices", read(ci, &pos), pos, pad, slots)
                }
            }
        };
        let Some(read_slot) = entry(read_col)? else { continue };
        let write_slot = if write_col == read_col { Some(read_slot) } else { entry(write_col)? };
        let len = len_of(b);
        if len == 0 {
            continue;
        }
        let (offset, shift, eff) = match &args.num_accepted_tokens {
            Some(n) => {
                let v = read(n, &[b]);
                let max = state_len + 2 - width;
                if v < 1 || v > max as i64 {
                    return Err(ConvError::AcceptedTokens { position: b, value: v, max, state_len, width });
                }
                if width - 2 + len > state_len {
                    return Err(ConvError::SpecStateLen {
                        needed: width - 2 + len,
                        width,
                        query_len: len,
                        actual: state_len,
                    });
                }
                (v as usize - 1, 1, width - 2 + len)
            }
            None => (0, len, width - 1),
        };
        let (x_start, out_start) = match &starts {
            Some(s) => (
                row_start("x", x.layout(), s[b] as usize, x_tok.token)?,
                row_start("out", out.layout(), s[b] as usize, out_tok.token)?,
            ),
            None => (row_start("x", x.layout(), b, seq_stride)?, row_start("out", out.layout(), b, out_seq_stride)?),
        };
        seqs.push(ConvSeq {
            seq: b,
            x_start,
            out_start,
            len,
            read_slot: Some(read_slot),
            write_slot,
            offset,
            shift,
            state_len: eff,
            checkpoint: None,
        });
    }
    check_conflicts("conv_state_indices", &seqs)?;
    plan.seqs = Some(seqs);
    Ok(plan)
}

/// Checks every argument of `causal_conv1d_fn` and resolves the per-sequence work.
///
/// Errors as [`plan_causal_conv1d_update`]; `has_initial_state` must be bool, `cache_indices` 1-D, and
/// slots of non-pad, non-empty sequences pairwise distinct; the checkpoint tables come
/// together, a checkpoint offset is 0 or inside its sequence, and a checkpoint's slot is
/// neither its own sequence's slot nor used by another sequence (checked only where the
/// sequence writes, as for the slots).
pub(crate) fn plan_causal_conv1d_fn(args: &CausalConv1dFnArgs<'_>) -> Result<ConvPlan, ConvError> {
    let x = &args.x;
    let dtype = check_float("x", x.dtype())?;
    let device = x.device();
    if x.rank() != 2 {
        return Err(ConvError::from(ArgError::Rank {
            arg: "x",
            expected: "2 ([num_tokens, dim])",
            actual: x.shape().to_vec(),
        }));
    }
    let (num_tokens, dim) = (x.shape()[0], x.shape()[1]);
    let x_tok = TokenStrides { token: x.strides()[0], dim: x.strides()[1] };
    let out = &args.out;
    let cs = &args.conv_states;
    let shared = check_shared(
        x,
        (dtype, device, dim),
        &args.weight,
        args.bias.as_ref(),
        out,
        ("conv_states", cs, args.conv_state_layout),
    )?;
    let (width, slots) = (shared.width, shared.slots);
    let out_tok = TokenStrides { token: out.strides()[0], dim: out.strides()[1] };

    let qsl = &args.query_start_loc;
    check_index_dtype("query_start_loc", qsl)?;
    check_device("query_start_loc", qsl.device(), device)?;
    if qsl.rank() != 1 || qsl.shape()[0] == 0 {
        return Err(ConvError::from(ArgError::Rank {
            arg: "query_start_loc",
            expected: "1 ([batch + 1])",
            actual: qsl.shape().to_vec(),
        }));
    }
    let batch = qsl.shape()[0] - 1;
    if let Some(ci) = &args.cache_indices {
        check_index_dtype("cache_indices", ci)?;
        check_device("cache_indices", ci.device(), device)?;
        check_1d_at_least("cache_indices", ci, batch, "batch (len(query_start_loc) - 1)")?;
    } else if batch > slots {
        return Err(ConvError::from(ArgError::Shape {
            arg: "conv_states",
            expected: format!("at least batch={batch} slots when `cache_indices` is None"),
            actual: cs.shape().to_vec(),
        }));
    }
    if let Some(h) = &args.has_initial_state {
        if h.dtype() != DType::Bool {
            return Err(ConvError::from(ArgError::DType {
                arg: "has_initial_state",
                expected: "bool".into(),
                actual: h.dtype(),
            }));
        }
        check_device("has_initial_state", h.device(), device)?;
        check_1d_at_least("has_initial_state", h, batch, "batch (len(query_start_loc) - 1)")?;
    }
    let checkpoints = both_or_neither(
        ("checkpoint_offsets", &args.checkpoint_offsets),
        ("checkpoint_state_indices", &args.checkpoint_state_indices),
        (
            "needs `checkpoint_state_indices` (where the checkpoints go)",
            "needs `checkpoint_offsets` (where each sequence's checkpoint lies)",
        ),
    )?;
    if let Some((o, c)) = checkpoints {
        for (arg, t) in [("checkpoint_offsets", o), ("checkpoint_state_indices", c)] {
            check_index_dtype(arg, t)?;
            check_device(arg, t.device(), device)?;
            check_1d_at_least(arg, t, batch, "batch (len(query_start_loc) - 1)")?;
        }
    }

    let mut plan = shared.plan(ConvOp::Fn, batch, args.activation, x_tok, out_tok);
    if device != Device::Cpu {
        return Ok(plan);
    }
    let starts = check_query_starts(qsl, num_tokens)?;
    let mut seqs = Vec::with_capacity(batch);
    for b in 0..batch {
        let slot = match &args.cache_indices {
            None => Some(b),
            Some(ci) => resolve_slot("cache_indices", read(ci, &[b]), vec![b], args.pad_slot_id, slots)?,
        };
        let Some(slot) = slot else { continue };
        let len = (starts[b + 1] - starts[b]) as usize;
        if len == 0 {
            continue;
        }
        let init = args.has_initial_state.as_ref().is_some_and(|h| read(h, &[b]) != 0);
        let checkpoint = match checkpoints {
            None => None,
            Some((o, c)) => match read(o, &[b]) {
                0 => None,
                v if v < 0 || v >= len as i64 => {
                    return Err(ConvError::CheckpointOffset { seq: b, value: v, tokens: len });
                }
                v => {
                    let ck = resolve_slot("checkpoint_state_indices", read(c, &[b]), vec![b], args.pad_slot_id, slots)?;
                    match ck {
                        Some(ck) if ck == slot => return Err(ConvError::CheckpointIsStateSlot { seq: b, slot }),
                        ck => ck.map(|slot| ConvCheckpoint { slot, tokens: v as usize }),
                    }
                }
            },
        };
        seqs.push(ConvSeq {
            seq: b,
            x_start: row_start("x", x.layout(), starts[b] as usize, x_tok.token)?,
            out_start: row_start("out", out.layout(), starts[b] as usize, out_tok.token)?,
            len,
            read_slot: init.then_some(slot),
            write_slot: Some(slot),
            offset: 0,
            shift: len,
            state_len: width - 1,
            checkpoint,
        });
    }
    check_conflicts("cache_indices", &seqs)?;
    plan.seqs = Some(seqs);
    Ok(plan)
}

/// Element index `offset + row·stride` of a sequence's first token in a view. Checked: an
/// empty view (a zero `dim`) admits any stride, so the product could otherwise wrap.
fn row_start(arg: &'static str, layout: &Layout, row: usize, stride: isize) -> Result<isize, ConvError> {
    isize::try_from(row)
        .ok()
        .and_then(|row| row.checked_mul(stride))
        .and_then(|d| isize::try_from(layout.offset()).ok()?.checked_add(d))
        .ok_or_else(|| {
            ConvError::from(ArgError::Overflow {
                arg,
                what: "token offset",
                shape: layout.shape().to_vec(),
                strides: layout.strides().to_vec(),
            })
        })
}
