//! Quick CPU measurement of the GDN decode (Qwen3-Next shapes) against a memcpy of the same
//! bytes with the same thread count, and of the chunked prefill.
//!
//! `cargo run --release -p ssm-gdn --example gdn_bench -- [batch] [threads]`

use std::time::Instant;

use half::bf16;
use ssm_cpu::{CpuBackend, Par};
use ssm_gdn::{ChunkGatedDeltaRuleArgs, DeltaRuleArgs, FusedSigmoidGatingDeltaRuleUpdateArgs, GateInputs, StateLayout};
use ssm_tensor::{Run, TensorMut, TensorRef};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let batch: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(64);
    let threads: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2);
    let par = if threads <= 1 { Par::Seq } else { Par::Threads(threads.try_into().unwrap()) };
    let be = CpuBackend::new(par).unwrap();
    let (h, hv, k, v) = (16usize, 32usize, 128usize, 128usize);
    let slots = batch + 1;
    let per_slot = hv * k * v;
    let mut state = vec![0.01f32; slots * per_slot];
    let q = vec![bf16::from_f32(0.1); batch * h * k];
    let kk = vec![bf16::from_f32(0.05); batch * h * k];
    let vv = vec![bf16::from_f32(0.2); batch * hv * v];
    let a = vec![bf16::from_f32(0.3); batch * hv];
    let b = vec![bf16::from_f32(0.4); batch * hv];
    let a_log = vec![0.5f32; hv];
    let dt_bias = vec![bf16::from_f32(0.1); hv];
    let cu: Vec<i32> = (0..=batch as i32).collect();
    let ix: Vec<i32> = (1..=batch as i32).collect();
    let mut o = vec![bf16::ZERO; batch * hv * v];
    let bytes = (batch * per_slot * 4) as f64;
    for layout in [StateLayout::VK, StateLayout::KV] {
        let mut times = Vec::new();
        for _ in 0..15 {
            let args = FusedSigmoidGatingDeltaRuleUpdateArgs {
                gates: GateInputs::new(
                    TensorRef::from_slice(&a_log, &[hv]).unwrap(),
                    TensorRef::from_slice(&a, &[batch, hv]).unwrap(),
                    TensorRef::from_slice(&b, &[batch, hv]).unwrap(),
                    TensorRef::from_slice(&dt_bias, &[hv]).unwrap(),
                ),
                rule: DeltaRuleArgs {
                    q: TensorRef::from_slice(&q, &[1, batch, h, k]).unwrap(),
                    k: TensorRef::from_slice(&kk, &[1, batch, h, k]).unwrap(),
                    v: TensorRef::from_slice(&vv, &[1, batch, hv, v]).unwrap(),
                    scale: None,
                    initial_state: Some(TensorMut::from_slice(&mut state, &[slots, hv, v, k]).unwrap()),
                    final_state: None,
                    cu_seqlens: Some(TensorRef::from_slice(&cu, &[batch + 1]).unwrap()),
                    ssm_state_indices: Some(TensorRef::from_slice(&ix, &[batch]).unwrap()),
                    num_accepted_tokens: None,
                    use_qk_l2norm_in_kernel: true,
                    eps: 1e-6,
                    state_layout: layout,
                    o: TensorMut::from_slice(&mut o, &[1, batch, hv, v]).unwrap(),
                },
            };
            let t0 = Instant::now();
            be.run(ssm_tensor::Planned::new(args).unwrap()).unwrap();
            times.push(t0.elapsed().as_secs_f64());
        }
        let t = median(times);
        println!("decode {layout:?} batch {batch}: {:.3} ms, {:.2} GB/s (read+write)", t * 1e3, 2.0 * bytes / t / 1e9);
    }
    // memcpy of the same bytes, same threads.
    let src = vec![0.5f32; batch * per_slot];
    let mut dst = vec![0.0f32; batch * per_slot];
    let mut times = Vec::new();
    for _ in 0..15 {
        let chunks = threads.max(1) * 8;
        let len = src.len().div_ceil(chunks);
        let dptr = dst.as_mut_ptr() as usize;
        let t0 = Instant::now();
        be.for_each(chunks, |c| {
            let lo = c * len;
            let hi = ((c + 1) * len).min(src.len());
            // SAFETY: chunks are disjoint ranges of `dst`, each written by one item.
            let d = unsafe { std::slice::from_raw_parts_mut((dptr as *mut f32).add(lo), hi - lo) };
            d.copy_from_slice(&src[lo..hi]);
        });
        times.push(t0.elapsed().as_secs_f64());
    }
    let t = median(times);
    println!("memcpy {:.0} MiB: {:.3} ms, {:.2} GB/s (read+write)", bytes / 1048576.0, t * 1e3, 2.0 * bytes / t / 1e9);

    // chunked prefill, 4k tokens, one sequence.
    let tokens = 4096;
    let q = vec![bf16::from_f32(0.1); tokens * h * k];
    let kk = vec![bf16::from_f32(0.05); tokens * h * k];
    let vv = vec![bf16::from_f32(0.2); tokens * hv * v];
    let g = vec![-0.1f32; tokens * hv];
    let beta = vec![bf16::from_f32(0.5); tokens * hv];
    let mut o = vec![bf16::ZERO; tokens * hv * v];
    let cu = [0i32, tokens as i32];
    let ix = [1i32];
    for layout in [StateLayout::VK, StateLayout::KV] {
        let mut times = Vec::new();
        for _ in 0..3 {
            let args = ChunkGatedDeltaRuleArgs {
                q: TensorRef::from_slice(&q, &[1, tokens, h, k]).unwrap(),
                k: TensorRef::from_slice(&kk, &[1, tokens, h, k]).unwrap(),
                v: TensorRef::from_slice(&vv, &[1, tokens, hv, v]).unwrap(),
                g: TensorRef::from_slice(&g, &[1, tokens, hv]).unwrap(),
                beta: TensorRef::from_slice(&beta, &[1, tokens, hv]).unwrap(),
                scale: None,
                initial_state: Some(TensorMut::from_slice(&mut state, &[slots, hv, v, k]).unwrap()),
                initial_state_indices: Some(TensorRef::from_slice(&ix, &[1]).unwrap()),
                has_initial_state: None,
                pad_slot_id: Some(0),
                inplace_final_state: true,
                final_state: None,
                cu_seqlens: Some(TensorRef::from_slice(&cu, &[2]).unwrap()),
                use_qk_l2norm_in_kernel: true,
                eps: 1e-6,
                state_layout: layout,
                o: TensorMut::from_slice(&mut o, &[1, tokens, hv, v]).unwrap(),
                scratch: None,
            };
            let t0 = Instant::now();
            be.run(ssm_tensor::Planned::new(args).unwrap()).unwrap();
            times.push(t0.elapsed().as_secs_f64());
        }
        let t = median(times);
        println!("chunk prefill {layout:?} {tokens} tokens: {:.1} ms, {:.0} tokens/s", t * 1e3, tokens as f64 / t);
    }
}
