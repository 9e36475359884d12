//! The mutations: one draw changes one thing about one argument (or one scalar), the way a
//! caller's bug would: a shape, a rank, a stride, an offset, a dtype, the memory behind a
//! view, an optional argument's presence, an index value, the device, a float value.

use rand::{Rng, RngCore};
use ssm_tensor::{DType, Device, elem};

use crate::scalar::{edge_i64, edge_usize};
use crate::spec::TensorSpec;

/// Memory the fuzzer allocates for one re-shaped argument at most (elements).
const MAX_FRESH_ELEMENTS: usize = 1 << 20;

/// Writes fresh values into `spec.memory` (`n` elements of `spec.dtype`): floats in
/// `[-1, 1]` (`A` in `[-1, 0)`: Mamba's `A = -exp(A_log)` is negative, and where `A·dt > 0`
/// the chunked evaluation vLLM and the backends run clamps each in-chunk decay at 1 while the
/// sequential reference does not), indices in `[-1, 4]`, flags 0/1.
fn fill(spec: &mut TensorSpec, n: usize, rng: &mut dyn RngCore) {
    let hi = if spec.name == "A" { -1e-3 } else { 1.0 };
    spec.memory = vec![0; n * spec.dtype.size()];
    for i in 0..n {
        match spec.dtype {
            DType::Bool => elem::write_i64(&mut spec.memory, spec.dtype, i, rng.random_range(0..2)),
            DType::I32 | DType::I64 => elem::write_i64(&mut spec.memory, spec.dtype, i, rng.random_range(-1..5)),
            d => elem::write_f32(&mut spec.memory, d, i, rng.random_range(-1.0..hi)),
        }
    }
}

fn contiguous(shape: &[usize]) -> Vec<isize> {
    let mut strides = vec![0isize; shape.len()];
    let mut acc = 1isize;
    for d in (0..shape.len()).rev() {
        strides[d] = acc;
        acc = acc.saturating_mul(shape[d] as isize);
    }
    strides
}

/// Makes `spec` a fresh contiguous tensor of its shape when that is small enough.
fn recontiguous(spec: &mut TensorSpec, rng: &mut dyn RngCore) -> bool {
    let n = spec.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    match n {
        Some(n) if n <= MAX_FRESH_ELEMENTS => {
            spec.strides = contiguous(&spec.shape);
            spec.offset = 0;
            fill(spec, n, rng);
            true
        }
        _ => false,
    }
}

/// An element of `spec`'s memory that the view reaches (a random multi-index), if any.
fn reached_element(spec: &TensorSpec, rng: &mut dyn RngCore) -> Option<usize> {
    if spec.shape.contains(&0) || spec.memory_len() == 0 {
        return None;
    }
    let mut off = spec.offset as i128;
    for (&n, &s) in spec.shape.iter().zip(&spec.strides) {
        off = off.saturating_add((rng.random_range(0..n) as i128).saturating_mul(s as i128));
    }
    (0..spec.memory_len() as i128).contains(&off).then_some(off as usize)
}

fn pick<'a>(
    specs: &'a mut [TensorSpec],
    rng: &mut dyn RngCore,
    ok: impl Fn(&TensorSpec) -> bool,
) -> Option<&'a mut TensorSpec> {
    let idx: Vec<usize> = (0..specs.len()).filter(|&i| ok(&specs[i])).collect();
    if idx.is_empty() {
        return None;
    }
    let i = idx[rng.random_range(0..idx.len())];
    Some(&mut specs[i])
}

/// One applied mutation.
pub(crate) struct Mutation {
    /// What it did.
    pub(crate) what: String,
    /// Whether it put a non-finite or overflowing value into a float input (the results are
    /// then compared only where they are finite: NaN and infinity may spread differently
    /// through a chunked and a sequential evaluation).
    pub(crate) nonfinite: bool,
}

/// Applies one random mutation to the tensor arguments; returns what it did, or `None` when
/// the drawn kind had nothing to act on.
pub(crate) fn mutate_tensor(specs: &mut [TensorSpec], rng: &mut dyn RngCore) -> Option<Mutation> {
    let mut nonfinite = false;
    let what = mutate_inner(specs, rng, &mut nonfinite)?;
    Some(Mutation { what, nonfinite })
}

fn mutate_inner(specs: &mut [TensorSpec], rng: &mut dyn RngCore, nonfinite: &mut bool) -> Option<String> {
    let kind = rng.random_range(0..14);
    // Index values dominate: they reach the deepest checks with every shape still valid.
    if kind < 4 {
        let s = pick(specs, rng, |s| s.present && s.is_integer() && s.device == Device::Cpu)?;
        let e = reached_element(s, rng)?;
        let v = if rng.random_bool(0.6) {
            edge_i64(rng)
        } else {
            // Another value of the same tensor: a duplicate.
            let other = reached_element(s, rng)?;
            elem::read_i64(&s.memory, s.dtype, other)
        };
        elem::write_i64(&mut s.memory, s.dtype, e, v);
        return Some(format!("{}[{e}] = {v}", s.name));
    }
    let s = pick(specs, rng, |s| s.present)?;
    let name = s.name;
    let rank = s.shape.len();
    Some(match kind {
        4 | 5 if rank > 0 => {
            let d = rng.random_range(0..rank);
            let n = s.shape[d];
            let new = match rng.random_range(0..6) {
                0 => 0,
                1 => n.saturating_add(1),
                2 => n.saturating_sub(1),
                3 => n.saturating_mul(2),
                4 => 1,
                _ => edge_usize(rng),
            };
            s.shape[d] = new;
            let fresh = kind == 5 && recontiguous(s, rng);
            format!("{name}.shape[{d}] = {new}{}", if fresh { " (fresh memory)" } else { "" })
        }
        6 => {
            if rank > 0 && rng.random_bool(0.4) {
                let d = rng.random_range(0..rank);
                s.shape.remove(d);
                s.strides.remove(d);
                format!("{name}: dim {d} removed")
            } else {
                let d = rng.random_range(0..=rank);
                let n = if rng.random_bool(0.7) { 1 } else { edge_usize(rng) };
                s.shape.insert(d, n);
                s.strides.insert(d, if rng.random_bool(0.5) { 0 } else { rng.random_range(-3i64..1000) as isize });
                format!("{name}: dim {d} of {n} inserted")
            }
        }
        7 | 8 if rank > 0 => {
            let d = rng.random_range(0..rank);
            let old = s.strides[d];
            let new = match rng.random_range(0..7) {
                0 => 0,
                1 => {
                    // Reversed, with the offset moved so the view stays in its memory.
                    s.offset = s.offset.saturating_add(s.shape[d].saturating_sub(1).saturating_mul(old.unsigned_abs()));
                    old.saturating_neg()
                }
                2 => 1,
                3 => old.saturating_add(1),
                4 => isize::MAX,
                5 => isize::MIN,
                _ => edge_i64(rng) as isize,
            };
            s.strides[d] = new;
            format!("{name}.strides[{d}] = {new} (offset {})", s.offset)
        }
        9 => {
            s.offset = match rng.random_range(0..4) {
                0 => s.offset.saturating_add(1),
                1 => s.memory_len(),
                _ => edge_usize(rng),
            };
            format!("{name}.offset = {}", s.offset)
        }
        10 => {
            let all = [DType::F32, DType::F16, DType::BF16, DType::I32, DType::I64, DType::Bool];
            s.dtype = all[rng.random_range(0..all.len())];
            if !recontiguous(s, rng) {
                let n = s.memory.len() / s.dtype.size();
                s.memory.truncate(n * s.dtype.size());
            }
            format!("{name}: dtype {}", s.dtype)
        }
        11 => {
            let es = s.dtype.size();
            let n = s.memory_len();
            let keep = match rng.random_range(0..3) {
                0 => n.saturating_sub(1),
                1 => n / 2,
                _ => 0,
            };
            s.memory.truncate(keep * es);
            format!("{name}: memory {n} -> {keep} elements")
        }
        12 => {
            if s.optional {
                s.present = false;
                format!("{name} dropped")
            } else {
                s.device = Device::Cuda(rng.random_range(0..2));
                format!("{name} on {}", s.device)
            }
        }
        _ => {
            let e = reached_element(s, rng)?;
            if s.is_integer() {
                return None;
            }
            let v = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e30, -1e30, 0.0][rng.random_range(0..6)];
            elem::write_f32(&mut s.memory, s.dtype, e, v);
            *nonfinite = true;
            format!("{name}[{e}] = {v}")
        }
    })
}
