//! Shared pieces of the CPU property tests: the backends under test and what runs a step.
#![allow(dead_code, unreachable_pub)]

use ssm_cpu::{CpuBackend, Par};

/// The CPU backends under test: sequential and two threads.
pub fn backends() -> Vec<CpuBackend> {
    vec![CpuBackend::new(Par::Seq).unwrap(), CpuBackend::new(Par::Threads(2.try_into().unwrap())).unwrap()]
}

/// What runs a step: the op crate's f32 or f64 reference, or `backends()[k]`.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Engine {
    Ref32,
    Ref64,
    Cpu(usize),
}
