//! Random SSD prefill problems (`mamba_chunk_scan_combined_varlen`): uneven varlen batches
//! with resumed and fresh sequences (short first and last chunks), groups < heads and = heads,
//! odd head dims and dstates, optional D (per head or per head-dim), z, dt_bias, initial states
//! and `dt_limit`, f32 or bf16 activations, and state pools with pads, permuted slots and
//! sequences that read one slot and write another. The one generator of every backend's SSD
//! property tests (the CPU backend's and the CUDA backend's).

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use ssm_ssd::{MambaChunkScanCombinedVarlenArgs, compute_chunk_metadata, compute_chunk_metadata_with_checkpoints};
use ssm_tensor::{DType, TensorMut, TensorRef, bf16};

/// A random SSD problem in f32 (or bf16 activations), with its chunk metadata.
#[derive(Clone)]
pub struct Problem {
    /// Heads `H`.
    pub heads: usize,
    /// Head dim `P`.
    pub dim: usize,
    /// State size `N`.
    pub dstate: usize,
    /// Groups `G` (divides `H`).
    pub groups: usize,
    /// `chunk_size`.
    pub chunk: usize,
    /// Tokens of each sequence.
    pub seqlens: Vec<usize>,
    /// `x` `[T, H, P]`.
    pub x: Vec<f32>,
    /// Raw `dt` `[T, H]`.
    pub dt: Vec<f32>,
    /// `A` `[H]`.
    pub a: Vec<f32>,
    /// `B` `[T, G, N]`.
    pub b: Vec<f32>,
    /// `C` `[T, G, N]`.
    pub c: Vec<f32>,
    /// `D` and whether it is per head-dim (`[H, P]`) rather than per head.
    pub d: Option<(Vec<f32>, bool)>,
    /// Gate `z` `[T, H, P]`.
    pub z: Option<Vec<f32>>,
    /// `dt_bias` `[H]`.
    pub dt_bias: Option<Vec<f32>>,
    /// `initial_states` `[batch, H, P, N]`.
    pub init: Option<Vec<f32>>,
    /// `dt_softplus`.
    pub softplus: bool,
    /// `dt_limit`.
    pub dt_limit: (f32, f32),
    /// Sequence starts.
    pub cu_seqlens: Vec<i32>,
    /// `cu_chunk_seqlens`.
    pub cu_chunk: Vec<i32>,
    /// `seq_idx`.
    pub seq_idx: Vec<i32>,
    /// `last_chunk_indices`.
    pub last_chunk: Vec<i32>,
    /// x, B, C, z and out in bf16 (else f32).
    pub bf16_io: bool,
}

fn fill(rng: &mut ChaCha8Rng, n: usize, mut f: impl FnMut(&mut ChaCha8Rng) -> f32) -> Vec<f32> {
    (0..n).map(|_| f(rng)).collect()
}

fn normal(rng: &mut ChaCha8Rng) -> f32 {
    // Sum of uniforms: close enough to N(0, 1) for test data.
    (0..4).map(|_| rng.random::<f32>()).sum::<f32>() * 1.7 - 3.4
}

impl Problem {
    /// Packed tokens.
    pub fn tokens(&self) -> usize {
        self.seqlens.iter().sum()
    }

    /// Random sizes from a small matrix (odd head dims and dstates, chunk 4, 8 or 16) over the
    /// sequence lengths `seqlens`, each resuming after `computed` tokens (chunk alignment).
    pub fn random(rng: &mut ChaCha8Rng, seqlens: Vec<usize>, computed: Vec<usize>, groups_lt_heads: bool) -> Self {
        let heads = [2, 4, 6][rng.random_range(0..3)];
        let groups = if groups_lt_heads { [1, heads / 2][rng.random_range(0..2)] } else { heads };
        let dim = [5, 8, 16, 19][rng.random_range(0..4)];
        let dstate = [4, 8, 16, 13][rng.random_range(0..4)];
        let chunk = [4, 8, 16][rng.random_range(0..3)];
        Self::random_shaped(rng, seqlens, computed, [heads, groups, dim, dstate, chunk])
    }

    /// A random problem of the given `[heads, groups, dim, dstate, chunk]` (random values and
    /// options) over `seqlens`, each resuming after `computed` tokens.
    pub fn random_shaped(
        rng: &mut ChaCha8Rng,
        seqlens: Vec<usize>,
        computed: Vec<usize>,
        [heads, groups, dim, dstate, chunk]: [usize; 5],
    ) -> Self {
        let t: usize = seqlens.iter().sum();
        let batch = seqlens.len();
        let x = fill(rng, t * heads * dim, normal);
        let softplus = rng.random_bool(0.7);
        let dt = if softplus {
            fill(rng, t * heads, |r| normal(r) * 0.5 - 1.0)
        } else {
            fill(rng, t * heads, |r| r.random_range(-0.05..0.4))
        };
        let a = fill(rng, heads, |r| -(r.random_range(0.0f32..2.0)).exp());
        let b = fill(rng, t * groups * dstate, normal);
        let c = fill(rng, t * groups * dstate, normal);
        let d = match rng.random_range(0..3) {
            0 => None,
            1 => Some((fill(rng, heads, |r| 1.0 + normal(r) * 0.3), false)),
            _ => Some((fill(rng, heads * dim, |r| 1.0 + normal(r) * 0.3), true)),
        };
        let z = rng.random_bool(0.4).then(|| fill(rng, t * heads * dim, normal));
        let dt_bias = rng.random_bool(0.6).then(|| fill(rng, heads, |r| normal(r) * 0.3));
        let init = rng.random_bool(0.6).then(|| fill(rng, batch * heads * dim * dstate, |r| normal(r) * 0.5));
        let dt_limit = if rng.random_bool(0.3) { (0.01, 0.3) } else { (0.0, f32::INFINITY) };
        let mut cu = vec![0i64];
        for &l in &seqlens {
            cu.push(cu.last().unwrap() + l as i64);
        }
        let comp: Vec<i64> = computed.iter().map(|&c| c as i64).collect();
        let m = compute_chunk_metadata(&cu, &comp, chunk);
        Problem {
            heads,
            dim,
            dstate,
            groups,
            chunk,
            x,
            dt,
            a,
            b,
            c,
            d,
            z,
            dt_bias,
            init,
            softplus,
            dt_limit,
            cu_seqlens: cu.iter().map(|&v| v as i32).collect(),
            cu_chunk: m.cu_chunk_seqlens,
            seq_idx: m.seq_idx,
            last_chunk: m.last_chunk_indices,
            seqlens,
            bf16_io: rng.random_bool(0.3),
        }
    }

    /// This one-sequence problem (resumed after `computed` tokens) with a prefix-caching
    /// checkpoint `at` tokens in: its chunk metadata rebuilt by
    /// `compute_chunk_metadata_with_checkpoints`, and the chunk that ends on the checkpoint.
    pub fn with_checkpoint(&self, computed: usize, at: usize) -> (Problem, i64) {
        let total = self.tokens() as i64;
        let m = compute_chunk_metadata_with_checkpoints(&[0, total], &[computed as i64], self.chunk, &[at as i64]);
        let pr = Problem {
            cu_chunk: m.cu_chunk_seqlens,
            seq_idx: m.seq_idx,
            last_chunk: m.last_chunk_indices,
            ..self.clone()
        };
        (pr, m.checkpoint_chunk_indices[0] as i64)
    }

    /// Tokens `[from, to)` of this one-sequence problem as a problem of their own (the same
    /// shapes and options), resumed after `computed` tokens and entering with `init`.
    pub fn slice(&self, from: usize, to: usize, computed: usize, init: Option<Vec<f32>>) -> Problem {
        let (h, p, n, g) = (self.heads, self.dim, self.dstate, self.groups);
        let sl = |v: &[f32], w: usize| v[from * w..to * w].to_vec();
        let len = to - from;
        let m = compute_chunk_metadata(&[0, len as i64], &[computed as i64], self.chunk);
        Problem {
            seqlens: vec![len],
            x: sl(&self.x, h * p),
            dt: sl(&self.dt, h),
            b: sl(&self.b, g * n),
            c: sl(&self.c, g * n),
            z: self.z.as_ref().map(|z| sl(z, h * p)),
            init,
            cu_seqlens: vec![0, len as i32],
            cu_chunk: m.cu_chunk_seqlens,
            seq_idx: m.seq_idx,
            last_chunk: m.last_chunk_indices,
            ..self.clone()
        }
    }

    /// Runs one call through `run` (a backend or a reference, given the unplanned arguments);
    /// returns (out, states) as f32, NaN-poisoned before the call.
    pub fn run_with(
        &self,
        intermediate: bool,
        run: impl FnOnce(MambaChunkScanCombinedVarlenArgs<'_>),
    ) -> (Vec<f32>, Vec<f32>) {
        self.run_pooled_with(intermediate, None, run)
    }

    /// [`Problem::run_with`], with the initial states read from and the final states (and
    /// checkpoints) written to `pool` (`[slots, H, P, N]` f32) through its tables when given
    /// (then `init` is unused and the returned states are empty).
    pub fn run_pooled_with(
        &self,
        intermediate: bool,
        pool: Option<&mut Pool>,
        run: impl FnOnce(MambaChunkScanCombinedVarlenArgs<'_>),
    ) -> (Vec<f32>, Vec<f32>) {
        let (t, h, p, n, g) = (self.tokens(), self.heads, self.dim, self.dstate, self.groups);
        let batch = self.seqlens.len();
        let nchunks = self.seq_idx.len();
        let rows = if intermediate { nchunks } else { batch };
        let to_bf = |v: &[f32]| v.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<bf16>>();
        let (xb, bb, cb, zb) = (to_bf(&self.x), to_bf(&self.b), to_bf(&self.c), self.z.as_deref().map(to_bf));
        let mut out = vec![f32::NAN; t * h * p];
        let mut out_b = vec![bf16::NAN; t * h * p];
        let mut states = vec![f32::NAN; rows * h * p * n];
        macro_rules! io {
            ($f:expr, $b:expr, $shape:expr) => {
                if self.bf16_io {
                    TensorRef::from_slice(&$b[..], $shape).unwrap()
                } else {
                    TensorRef::from_slice(&$f[..], $shape).unwrap()
                }
            };
        }
        let out_view = if self.bf16_io {
            TensorMut::from_slice(&mut out_b[..], &[t, h, p]).unwrap()
        } else {
            TensorMut::from_slice(&mut out[..], &[t, h, p]).unwrap()
        };
        let args = MambaChunkScanCombinedVarlenArgs {
            x: io!(self.x, xb, &[t, h, p]),
            dt: TensorRef::from_slice(&self.dt, &[t, h]).unwrap(),
            a: TensorRef::from_slice(&self.a, &[h]).unwrap(),
            b: io!(self.b, bb, &[t, g, n]),
            c: io!(self.c, cb, &[t, g, n]),
            chunk_size: self.chunk,
            cu_seqlens: TensorRef::from_slice(&self.cu_seqlens, &[batch + 1]).unwrap(),
            cu_chunk_seqlens: TensorRef::from_slice(&self.cu_chunk, &[nchunks + 1]).unwrap(),
            last_chunk_indices: TensorRef::from_slice(&self.last_chunk, &[batch]).unwrap(),
            seq_idx: TensorRef::from_slice(&self.seq_idx, &[nchunks]).unwrap(),
            out: Some(out_view),
            d: self.d.as_ref().map(|(d, per_dim)| {
                let shape: Vec<usize> = if *per_dim { vec![h, p] } else { vec![h] };
                TensorRef::from_slice(d, &shape).unwrap()
            }),
            z: match (&self.z, &zb) {
                (Some(z), Some(zb)) => Some(io!(z, zb, &[t, h, p])),
                _ => None,
            },
            dt_bias: self.dt_bias.as_ref().map(|b| TensorRef::from_slice(b, &[h]).unwrap()),
            initial_states: self.init.as_ref().map(|s| TensorRef::from_slice(s, &[batch, h, p, n]).unwrap()),
            ssm_state: None,
            initial_state_indices: None,
            has_initial_state: None,
            final_state_indices: None,
            checkpoint_chunk_indices: None,
            checkpoint_state_indices: None,
            pad_slot_id: None,
            dt_softplus: self.softplus,
            dt_limit: self.dt_limit,
            return_intermediate_states: intermediate,
            state_dtype: Some(DType::F32),
            varlen_states: Some(TensorMut::from_slice(&mut states[..], &[rows, h, p, n]).unwrap()),
            scratch: None,
        };
        let mut args = args;
        if let Some(pool) = pool {
            let slots = pool.states.len() / (h * p * n);
            args.initial_states = None;
            args.varlen_states = None;
            args.ssm_state = Some(TensorMut::from_slice(&mut pool.states[..], &[slots, h, p, n]).unwrap());
            args.initial_state_indices = Some(TensorRef::from_slice(&pool.read, &[batch]).unwrap());
            args.has_initial_state = Some(TensorRef::from_slice(&pool.has_init, &[batch]).unwrap());
            args.final_state_indices = Some(TensorRef::from_slice(&pool.write, &[batch]).unwrap());
            if let Some((chunks, slots)) = &pool.checkpoints {
                args.checkpoint_chunk_indices = Some(TensorRef::from_slice(chunks, &[batch]).unwrap());
                args.checkpoint_state_indices = Some(TensorRef::from_slice(slots, &[batch]).unwrap());
            }
            args.pad_slot_id = Some(PAD);
        }
        run(args);
        if self.bf16_io {
            out = out_b.iter().map(|v| v.to_f32()).collect();
        }
        (out, states)
    }
}

/// The pad of the pool tests' slot tables.
pub const PAD: i64 = -1;

/// A state pool with its tables: sequence `b` reads slot `read[b]` (where `has_init[b]`),
/// writes slot `write[b]` and, with checkpoints, the end state of its chunk `chunks[b]` into
/// slot `slots[b]`; `PAD` entries read zeros / write nothing.
#[derive(Clone)]
pub struct Pool {
    /// The pool `[slots, H, P, N]`.
    pub states: Vec<f32>,
    /// Slot each sequence reads (`PAD`: none).
    pub read: Vec<i64>,
    /// Slot each sequence writes (`PAD`: none).
    pub write: Vec<i64>,
    /// Whether each sequence reads its slot.
    pub has_init: Vec<u8>,
    /// Prefix-caching checkpoints: each sequence's chunk (-1: none) and slot (`PAD`: none).
    pub checkpoints: Option<(Vec<i64>, Vec<i64>)>,
}

impl Pool {
    /// Random slots for `batch` sequences in a pool with 3 spare slots: permuted, some pads,
    /// some sequences reading nothing, some reading one slot and writing another (never one
    /// another sequence uses).
    pub fn random(rng: &mut ChaCha8Rng, batch: usize, per: usize) -> Self {
        let slots = 2 * batch + 3;
        let mut order: Vec<i64> = (0..slots as i64).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.random_range(0..=i));
        }
        let (mut read, mut write, mut has_init) = (vec![], vec![], vec![]);
        for b in 0..batch {
            let own = order[2 * b];
            read.push(if rng.random_bool(0.2) { PAD } else { own });
            write.push(match rng.random_range(0..5) {
                0 => PAD,
                1 => order[2 * b + 1],
                _ => own,
            });
            has_init.push(rng.random_bool(0.75) as u8);
        }
        let states = (0..slots * per).map(|i| ((i * 37 % 101) as f32) * 0.01 - 0.5).collect();
        Pool { states, read, write, has_init, checkpoints: None }
    }

    /// Adds checkpoints for `pr`'s sequences: each gets a fresh slot appended to the pool
    /// (filled like the others) or, one time in five, `PAD`, and one of its chunks or, one time
    /// in four (and always for an empty sequence), -1.
    pub fn add_checkpoints(&mut self, rng: &mut ChaCha8Rng, pr: &Problem, per: usize) {
        let slots = self.states.len() / per;
        let (mut chunks, mut to) = (vec![], vec![]);
        let mut first = 0i64;
        for (b, &last) in pr.last_chunk.iter().enumerate() {
            let last = last as i64;
            chunks.push(if last < first || rng.random_bool(0.25) { -1 } else { rng.random_range(first..=last) });
            to.push(if rng.random_bool(0.2) { PAD } else { (slots + b) as i64 });
            first = first.max(last + 1);
        }
        let extra = chunks.len() * per;
        self.states.extend((0..extra).map(|i| ((i * 53 % 97) as f32) * 0.01 - 0.4));
        self.checkpoints = Some((chunks, to));
    }

    /// The checkpoints' scatter after a call that returned every chunk's state
    /// (`[nchunks, H, P, N]`): `pool[slots[b]] = chunk_states[chunks[b]]`.
    pub fn scatter_checkpoints(&mut self, chunk_states: &[f32], per: usize) {
        let Some((chunks, slots)) = self.checkpoints.clone() else { return };
        for (&c, &s) in chunks.iter().zip(&slots) {
            if c >= 0 && s != PAD {
                let (c, s) = (c as usize, s as usize);
                self.states[s * per..(s + 1) * per].copy_from_slice(&chunk_states[c * per..(c + 1) * per]);
            }
        }
    }

    /// A pool of two slots for one sequence: it enters from slot 0 (holding `init`), writes its
    /// final state there and its checkpoint, the end state of chunk `chunk`, to slot 1.
    pub fn one_checkpoint(init: &[f32], chunk: i64) -> Self {
        Pool {
            states: init.iter().copied().chain(std::iter::repeat_n(9.0, init.len())).collect(),
            read: vec![0],
            write: vec![0],
            has_init: vec![1],
            checkpoints: Some((vec![chunk], vec![1])),
        }
    }

    /// Whether slot `s` is written by the call (a final state or a checkpoint).
    pub fn writes(&self, s: usize) -> bool {
        let s = s as i64;
        self.write.contains(&s)
            || self.checkpoints.as_ref().is_some_and(|(c, slots)| slots.iter().zip(c).any(|(&t, &c)| t == s && c >= 0))
    }

    /// vLLM's gather: `where(has_init, pool[read], 0)` as `[batch, H, P, N]`.
    pub fn gather(&self, per: usize) -> Vec<f32> {
        let mut init = vec![0.0; self.read.len() * per];
        for (b, (&s, &has)) in self.read.iter().zip(&self.has_init).enumerate() {
            if has != 0 && s != PAD {
                init[b * per..(b + 1) * per].copy_from_slice(&self.states[s as usize * per..(s as usize + 1) * per]);
            }
        }
        init
    }

    /// vLLM's scatter: `pool[write] = finals` (pads skipped).
    pub fn scatter(&mut self, finals: &[f32], per: usize) {
        for (b, &s) in self.write.iter().enumerate() {
            if s != PAD {
                self.states[s as usize * per..(s as usize + 1) * per].copy_from_slice(&finals[b * per..(b + 1) * per]);
            }
        }
    }
}
