//! Template calls of the ops without golden vectors. The two layer cores: mixed batches (speculative sequences, decodes with a
//! padded row, prefills with and without initial state), as the cores' own tests in
//! `ssm-dispatch` build them; `checkpointing_ssu` over rings with history; and `copy_rows`.

use ssm_conv::{Activation, ConvStateLayout};
use ssm_dispatch::{GdnAttentionCoreArgs, GdnAttentionMetadata, Mamba2AttentionMetadata, Mamba2MixerCoreArgs};
use ssm_gdn::StateLayout;
use ssm_tensor::{DType, HostTensor};

/// `n` deterministic values in `[offset - scale, offset + scale)` (xorshift from `seed`).
pub fn values(n: usize, seed: u64, scale: f32, offset: f32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale + offset
        })
        .collect()
}

fn t(shape: &[usize], seed: u64, scale: f32, offset: f32) -> HostTensor {
    HostTensor::from_f32(DType::F32, shape.to_vec(), &values(shape.iter().product(), seed, scale, offset))
}

fn ints(v: &[i64]) -> HostTensor {
    HostTensor::from_i64(DType::I32, vec![v.len()], v)
}

fn bools(v: &[i64]) -> HostTensor {
    HostTensor::from_i64(DType::Bool, vec![v.len()], v)
}

/// A Qwen3-Next layer step: decode, 3-token speculative, prefill of 70 (resumed), speculative,
/// decode on the pad slot, fresh prefill of 5; tokens interleaved.
pub struct GdnCoreCase {
    mixed: HostTensor,
    a: HostTensor,
    b: HostTensor,
    weight: HostTensor,
    bias: HostTensor,
    a_log: HostTensor,
    dt_bias: HostTensor,
    conv: HostTensor,
    ssm: HostTensor,
    out: HostTensor,
    tables: [HostTensor; 8],
}

const GH: usize = 2;
const GK: usize = 16;
const GHV: usize = 4;
const GV: usize = 8;
const G_CONV: usize = 2 * GH * GK + GHV * GV;

impl GdnCoreCase {
    /// The case, values from `seed`.
    pub fn new(seed: u64) -> Self {
        let order = [("d0", 1), ("s0", 3), ("p0", 70), ("s1", 3), ("d1", 1), ("p1", 5)];
        let names: Vec<&str> = order.iter().flat_map(|&(n, k)| std::iter::repeat_n(n, k)).collect();
        let rows = |want: &[&str]| -> Vec<i64> {
            want.iter()
                .flat_map(|w| names.iter().enumerate().filter(move |(_, n)| *n == w).map(|(i, _)| i as i64))
                .collect()
        };
        let tokens = names.len();
        let s = seed.wrapping_mul(16);
        GdnCoreCase {
            mixed: t(&[tokens, G_CONV], s + 1, 1.0, 0.0),
            a: t(&[tokens, GHV], s + 2, 2.0, 0.0),
            b: t(&[tokens, GHV], s + 3, 2.0, 0.0),
            weight: t(&[G_CONV, 4], s + 4, 0.5, 0.0),
            bias: t(&[G_CONV], s + 5, 0.1, 0.0),
            a_log: t(&[GHV], s + 6, 1.0, 0.0),
            dt_bias: t(&[GHV], s + 7, 0.5, 0.0),
            conv: t(&[16, 5, G_CONV], s + 8, 1.0, 0.0),
            ssm: t(&[16, GHV, GV, GK], s + 9, 0.5, 0.0),
            out: HostTensor::filled(DType::F32, vec![tokens, GHV, GV], 7.0),
            tables: [
                bools(&[1, 1, 1, 0]),
                ints(&[0, 3, 6]),
                ints(&[0, 1, 2, 72, 77]),
                HostTensor::from_i64(DType::I32, vec![2, 3], &[1, 2, 3, 4, 5, 6]),
                ints(&[7, 0, 9, 10]),
                ints(&rows(&["s0", "s1"])),
                ints(&rows(&["d0", "d1", "p0", "p1"])),
                ints(&[1, 2]),
            ],
        }
    }

    /// The core call over the case's tensors.
    pub fn args(&mut self) -> GdnAttentionCoreArgs<'_> {
        let [has, sq, nq, st, nst, si, nsi, acc] = &self.tables;
        GdnAttentionCoreArgs {
            mixed_qkv: self.mixed.view(),
            b: self.b.view(),
            a: self.a.view(),
            conv_weight: self.weight.view(),
            conv_bias: Some(self.bias.view()),
            activation: Activation::Silu,
            conv_state: self.conv.view_mut(),
            conv_state_layout: ConvStateLayout::StateLenDim,
            ssm_state: self.ssm.view_mut(),
            ssm_state_layout: StateLayout::VK,
            a_log: self.a_log.view(),
            dt_bias: self.dt_bias.view(),
            num_k_heads: GH,
            pad_slot_id: Some(0),
            metadata: GdnAttentionMetadata {
                num_prefills: 2,
                num_prefill_tokens: 75,
                num_decodes: 2,
                num_decode_tokens: 2,
                num_spec_decodes: 2,
                num_spec_decode_tokens: 6,
                num_actual_tokens: self.mixed.shape[0],
                has_initial_state: Some(has.view()),
                spec_query_start_loc: Some(sq.view()),
                non_spec_query_start_loc: Some(nq.view()),
                spec_state_indices_tensor: Some(st.view()),
                non_spec_state_indices_tensor: Some(nst.view()),
                spec_token_indx: Some(si.view()),
                non_spec_token_indx: Some(nsi.view()),
                num_accepted_tokens: Some(acc.view()),
            },
            core_attn_out: self.out.view_mut(),
        }
    }
}

const MH: usize = 4;
const MP: usize = 8;
const MG: usize = 2;
const MN: usize = 16;
const M_CONV: usize = MH * MP + 2 * MG * MN;
const CHUNK: usize = 16;

/// A Mamba2 layer step: three speculative decodes (one on the pad slot), then prefills of 5
/// (resumed at 13), 40 (resumed mid-chunk at 21) and 3 (pad slot) tokens.
pub struct Mamba2CoreCase {
    xbc: HostTensor,
    dt: HostTensor,
    weight: HostTensor,
    bias: HostTensor,
    a: HostTensor,
    d: HostTensor,
    dt_bias: HostTensor,
    conv: HostTensor,
    ssm: HostTensor,
    out: HostTensor,
    tables: [HostTensor; 9],
}

impl Mamba2CoreCase {
    /// The case, values from `seed`.
    pub fn new(seed: u64) -> Self {
        let (lens, computed) = ([5usize, 40, 3], [13i64, 21, 0]);
        let decode_tokens = 7;
        let tokens = decode_tokens + lens.iter().sum::<usize>();
        let starts: Vec<i64> = std::iter::once(0)
            .chain(lens.iter().scan(0i64, |acc, &l| {
                *acc += l as i64;
                Some(*acc)
            }))
            .collect();
        let meta = ssm_ssd::compute_chunk_metadata(&starts, &computed, CHUNK);
        let wide = |v: &[i32]| ints(&v.iter().map(|&x| x as i64).collect::<Vec<_>>());
        let s = seed.wrapping_mul(16);
        Mamba2CoreCase {
            xbc: t(&[tokens, M_CONV], s + 1, 1.0, 0.0),
            dt: t(&[tokens, MH], s + 2, 1.0, -0.5),
            weight: t(&[M_CONV, 4], s + 3, 0.5, 0.0),
            bias: t(&[M_CONV], s + 4, 0.1, 0.0),
            a: t(&[MH], s + 5, 0.5, -1.0),
            d: t(&[MH], s + 6, 1.0, 0.0),
            dt_bias: t(&[MH], s + 7, 0.5, 0.0),
            conv: t(&[16, 5, M_CONV], s + 8, 1.0, 0.0),
            ssm: t(&[16, MH, MP, MN], s + 9, 0.5, 0.0),
            out: HostTensor::filled(DType::F32, vec![tokens, MH, MP], 7.0),
            tables: [
                ints(&starts),
                bools(&computed.iter().map(|&c| i64::from(c > 0)).collect::<Vec<_>>()),
                wide(&meta.seq_idx),
                wide(&meta.cu_chunk_seqlens),
                wide(&meta.last_chunk_indices),
                ints(&[7, 8, 0]),
                HostTensor::from_i64(DType::I32, vec![3, 3], &[1, 2, 3, 4, 5, 6, 0, 0, 0]),
                ints(&[0, 3, 6, 7]),
                ints(&[1, 2, 1]),
            ],
        }
    }

    /// The core call over the case's tensors.
    pub fn args(&mut self) -> Mamba2MixerCoreArgs<'_> {
        let [qsl, has, seq_idx, cu_chunk, last, slots_p, table_d, qsl_d, acc] = &self.tables;
        Mamba2MixerCoreArgs {
            xbc: self.xbc.view(),
            dt: self.dt.view(),
            conv_weight: self.weight.view(),
            conv_bias: Some(self.bias.view()),
            activation: Activation::Silu,
            conv_state: self.conv.view_mut(),
            conv_state_layout: ConvStateLayout::StateLenDim,
            ssm_state: self.ssm.view_mut(),
            a: self.a.view(),
            d: Some(self.d.view()),
            dt_bias: Some(self.dt_bias.view()),
            num_groups: MG,
            pad_slot_id: Some(0),
            metadata: Mamba2AttentionMetadata {
                num_prefills: 3,
                num_prefill_tokens: 48,
                num_decodes: 3,
                num_decode_tokens: 7,
                query_start_loc_p: Some(qsl.view()),
                has_initial_states_p: Some(has.view()),
                prep_initial_states: true,
                chunk_size: CHUNK,
                seq_idx_p: Some(seq_idx.view()),
                cu_chunk_seqlen_p: Some(cu_chunk.view()),
                last_chunk_indices_p: Some(last.view()),
                state_indices_tensor_p: Some(slots_p.view()),
                state_indices_tensor_d: Some(table_d.view()),
                query_start_loc_d: Some(qsl_d.view()),
                num_accepted_tokens: Some(acc.view()),
                checkpoint_offsets_p: None,
                checkpoint_state_indices_p: None,
                checkpoint_chunk_indices_p: None,
            },
            conv_out: None,
            out: self.out.view_mut(),
        }
    }
}

/// A ReplaySSM step: 3 packed sequences of 1–3 new tokens over rings of 8 with history
/// (`prev_num_accepted_tokens` 0–4, ring starts anywhere), one on the pad slot.
pub struct CheckpointCase {
    state: HostTensor,
    x_cache: HostTensor,
    b_cache: HostTensor,
    dt_cache: HostTensor,
    ring_start: HostTensor,
    prev: HostTensor,
    x: HostTensor,
    dt: HostTensor,
    a: HostTensor,
    b: HostTensor,
    c: HostTensor,
    out: HostTensor,
    d: HostTensor,
    dt_bias: HostTensor,
    slots: HostTensor,
    cu: HostTensor,
}

impl CheckpointCase {
    /// The case, values from `seed`.
    pub fn new(seed: u64) -> Self {
        let (cache, h, g, p, n, l) = (6, 2, 1, 8, 8, 8);
        let lens = [1 + seed as usize % 3, 2, 3];
        let rows: usize = lens.iter().sum();
        let s = seed.wrapping_mul(16);
        CheckpointCase {
            state: t(&[cache, h, p, n], s + 1, 0.5, 0.0),
            x_cache: t(&[cache, h, l, p], s + 2, 1.0, 0.0),
            b_cache: t(&[cache, g, l, n], s + 3, 1.0, 0.0),
            dt_cache: t(&[cache, h, l], s + 4, 0.5, 0.5),
            ring_start: HostTensor::from_i64(DType::I64, vec![cache], &[0, 7, 1, 6, 0, 3]),
            prev: HostTensor::from_i64(DType::I64, vec![cache], &[0, 2, 4, 1, 3, 0]),
            x: t(&[rows, h, p], s + 5, 1.0, 0.0),
            dt: t(&[rows, h], s + 6, 1.0, 0.0),
            a: t(&[h], s + 7, 0.5, -1.0),
            b: t(&[rows, g, n], s + 8, 1.0, 0.0),
            c: t(&[rows, g, n], s + 9, 1.0, 0.0),
            out: HostTensor::filled(DType::F32, vec![rows, h, p], f32::NAN),
            d: t(&[h], s + 10, 1.0, 0.0),
            dt_bias: t(&[h], s + 11, 0.3, -1.0),
            slots: ints(&[2, 0, 4]),
            cu: ints(&[0, lens[0] as i64, (lens[0] + lens[1]) as i64, rows as i64]),
        }
    }

    /// The call over the case's tensors.
    pub fn args(&mut self) -> ssm_ring::CheckpointingSsuArgs<'_> {
        ssm_ring::CheckpointingSsuArgs {
            state: self.state.view_mut(),
            x_cache: self.x_cache.view_mut(),
            b_cache: self.b_cache.view_mut(),
            dt_cache: self.dt_cache.view_mut(),
            ring_start: self.ring_start.view(),
            prev_num_accepted_tokens: self.prev.view(),
            x: self.x.view(),
            dt: self.dt.view(),
            a: self.a.view(),
            b: self.b.view(),
            c: self.c.view(),
            out: self.out.view_mut(),
            d: Some(self.d.view()),
            z: None,
            dt_bias: Some(self.dt_bias.view()),
            dt_softplus: true,
            state_batch_indices: Some(self.slots.view()),
            pad_slot_id: Some(0),
            cu_seqlens: Some(self.cu.view()),
            max_seqlen: Some(3),
        }
    }
}

/// A `copy_rows` call as the GDN core makes them: token rows of a strided batch tensor gathered
/// into a dense buffer, or a dense buffer's rows scattered back into strided rows (distinct
/// rows, in a shuffled order); dtype, sizes and direction from `seed`.
pub struct RowsCase {
    src: HostTensor,
    dst: HostTensor,
    index: HostTensor,
    direction: ssm_tensor::RowDirection,
    /// Row length and row stride of the strided side.
    width: usize,
    pitch: usize,
}

impl RowsCase {
    /// The case, values from `seed`.
    pub fn new(seed: u64) -> Self {
        use ssm_tensor::RowDirection;
        let dtype = [DType::F32, DType::BF16, DType::F16][seed as usize % 3];
        let (rows, width) = (5 + seed as usize % 11, 1 + (seed as usize / 3) % 37);
        let (n, pitch) = (1 + seed as usize % rows, width + seed as usize % 5);
        let direction = if seed.is_multiple_of(2) { RowDirection::Gather } else { RowDirection::Scatter };
        // Distinct rows (n ≤ rows), descending and wrapped around from a seed-chosen start.
        let index: Vec<i64> = (0..n).rev().map(|i| ((i + seed as usize) % rows) as i64).collect();
        let strided = HostTensor::from_f32(dtype, vec![rows, pitch], &values(rows * pitch, seed, 1.0, 0.0));
        let dense = HostTensor::from_f32(dtype, vec![n, width], &values(n * width, seed ^ 0x55, 1.0, 0.0));
        let (src, dst) = match direction {
            RowDirection::Gather => (strided, HostTensor::filled(dtype, vec![n, width], f32::NAN)),
            RowDirection::Scatter => (dense, strided),
        };
        RowsCase { src, dst, index: HostTensor::from_i64(DType::I64, vec![n], &index), direction, width, pitch }
    }

    /// The call over the case's tensors (the strided side as a `[rows, width]` view of its
    /// `[rows, pitch]` memory).
    pub fn args(&mut self) -> ssm_tensor::CopyRowsArgs<'_> {
        use ssm_tensor::RowDirection;
        let (w, p) = (self.width, self.pitch as isize);
        let rows = |t: &HostTensor| [t.shape[0], w];
        let (src, dst) = match self.direction {
            RowDirection::Gather => {
                let shape = rows(&self.src);
                (self.src.view().with_layout(&shape, &[p, 1], 0).expect("rows fit"), self.dst.view_mut())
            }
            RowDirection::Scatter => {
                let shape = rows(&self.dst);
                (self.src.view(), self.dst.view_mut().with_layout(&shape, &[p, 1], 0).expect("rows fit"))
            }
        };
        ssm_tensor::CopyRowsArgs { src, dst, index: self.index.view(), direction: self.direction }
    }
}
