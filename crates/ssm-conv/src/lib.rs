//! Causal conv1d: the depthwise causal convolution in front of Mamba2 and GDN layers.
//!
//! The contract is vLLM's Triton `causal_conv1d_update` and `causal_conv1d_fn`
//! (SEMANTICS.md; semantics/gdn_conv.md §4): per channel c,
//! `y_t[c] = act(bias[c] + Σ_j w[c][j] · x_{t−(width−1)+j}[c])`, where inputs before a
//! sequence's start come from its conv-state slot (the raw inputs of the last `width − 1`
//! positions, oldest first) or are zeros. Both ops update the slot in place.
//!
//! - `causal_conv1d_update` (decode): one or more tokens per sequence, a slot table with a
//!   caller-named pad, the speculative rolling buffer (`num_accepted_tokens`: the window
//!   starts at column `num_accepted − 1`, the buffer keeps `width − 2` old entries from there
//!   and appends the step's tokens, state length `width − 2 + q`), and prefix-caching tables
//!   (`initial_state_idx` / `block_idx_last_scheduled_token` into a 2-D table).
//! - `causal_conv1d_fn` (prefill): packed varlen tokens with `query_start_loc`,
//!   `cache_indices` and `has_initial_state`; writes each sequence's last `width − 1`
//!   inputs back into columns `[0, width − 1)` of its slot.
//!
//! Both state layouts are accepted, `(slots, state_len, dim)` and `(slots, dim, state_len)`,
//! named by an explicit [`ConvStateLayout`] argument; strides come from the view.
//!
//! Deliberate differences from vLLM, all outside what vLLM's callers do:
//! - `x`/`out` are token-major (`[.., tokens, dim]`); vLLM's `[batch, dim, seqlen]` and
//!   `[dim, num_tokens]` tensors are passed as permuted-stride views of the same memory.
//! - `out` is a separate tensor; vLLM writes into `x` by default. Rows vLLM leaves
//!   unwritten (pads, empty sequences) keep `out`'s previous content.
//! - A varlen update without `num_accepted_tokens` rolls each sequence's `width − 1`
//!   window (vLLM shrinks the window by `max_query_len − q`, a case it never calls).
//! - A prefix-caching write column holding the pad skips the state write (vLLM would write
//!   into the null block).
//! - Host index values are checked before anything is written; sequences of one call must
//!   not write the same slot or write a slot another one reads (parallel backends rely on it).
//!
//! The crate has the four pieces every op family has:
//! - [`CausalConv1dUpdateArgs`], [`CausalConv1dFnArgs`]: the borrowed arguments;
//! - [`plan`]: every check, once, returning the arguments and their [`ConvPlan`] as one
//!   [`Planned`] call, the only thing a backend accepts (`impl Run<CausalConv1dUpdateArgs> for …`);
//! - [`mod@reference`]: the kernel-faithful scalar implementation (f32, and an f64 variant).

mod args;
mod error;
mod plan;
pub mod reference;

pub use args::{Activation, CausalConv1dFnArgs, CausalConv1dUpdateArgs, ConvStateLayout};
pub use error::{ConvError, PadDisplay};
pub use plan::{BiasStrides, ConvCheckpoint, ConvOp, ConvPlan, ConvSeq, StateStrides, TokenStrides, WeightStrides};
pub use ssm_tensor::{Op, Planned, Run};

ssm_tensor::op_family! {
    /// A backend of both causal conv1d ops.
    family ConvBackend, error ConvError;
    CausalConv1dUpdateArgs => "causal_conv1d_update", ConvPlan, plan::plan_causal_conv1d_update;
    CausalConv1dFnArgs => "causal_conv1d_fn", ConvPlan, plan::plan_causal_conv1d_fn;
}

/// The crate README's example runs as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
