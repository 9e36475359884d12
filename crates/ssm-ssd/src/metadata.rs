//! Chunk metadata as vLLM's Mamba metadata builder makes it
//! (`BaseMambaAttentionMetadataBuilder._compute_chunk_metadata`, semantics/ssd_mamba2.md §3.1).

/// `cu_chunk_seqlens`, `seq_idx` and `last_chunk_indices` of one prefill batch (i32, as vLLM
/// uploads them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkMetadata {
    /// Chunk starts in the packed tokens, `[nchunks + 1]`.
    pub cu_chunk_seqlens: Vec<i32>,
    /// Sequence of each chunk, `[nchunks]`.
    pub seq_idx: Vec<i32>,
    /// Last chunk of each sequence, `[batch]`.
    pub last_chunk_indices: Vec<i32>,
}

fn cdiv(a: i64, b: i64) -> i64 {
    (a + b - 1) / b
}

/// Builds the chunk metadata of a prefill batch exactly as vLLM does.
///
/// `query_start_loc` `[batch + 1]` holds the sequences' starts in the packed prefill tokens
/// (vLLM's `query_start_loc_p`, re-based to 0) and `num_computed_tokens` `[batch]` the tokens
/// each sequence already has in its state. Chunk boundaries fall on multiples of
/// `chunk_size` of the **absolute** sequence position: a sequence resumed at a position that
/// is not a multiple of `chunk_size` starts with a short chunk that finishes the partial one
/// (so a state is available every `chunk_size` tokens, for prefix caching); its last chunk
/// may be short too. Chunks never span two sequences.
///
/// Example (chunk 256): resumed at 300 with 700 new tokens, then a fresh sequence of 100:
/// `cu_chunk_seqlens = [0, 212, 468, 700, 800]`, `seq_idx = [0, 0, 0, 1]`,
/// `last_chunk_indices = [2, 3]`.
///
/// # Panics
/// If `num_computed_tokens` is shorter than the batch or `chunk_size` is 0.
pub fn compute_chunk_metadata(
    query_start_loc: &[i64],
    num_computed_tokens: &[i64],
    chunk_size: usize,
) -> ChunkMetadata {
    assert!(chunk_size > 0, "chunk_size must be positive");
    let q = chunk_size as i64;
    let batch = query_start_loc.len().saturating_sub(1);
    let mut cu = Vec::new();
    let mut seq_idx = Vec::new();
    let mut last = Vec::with_capacity(batch);
    let mut pos = 0i64;
    for req in 0..batch {
        let computed = num_computed_tokens[req];
        let mut new_tokens = query_start_loc[req + 1] - query_start_loc[req];
        // A resumed sequence whose computed tokens are not chunk-aligned first finishes its chunk.
        if computed % q != 0 {
            seq_idx.push(req as i32);
            cu.push(pos as i32);
            let len = (cdiv(computed, q) * q - computed).min(new_tokens);
            pos += len;
            new_tokens -= len;
        }
        for _ in 0..cdiv(new_tokens, q) {
            seq_idx.push(req as i32);
            cu.push(pos as i32);
            let len = q.min(new_tokens);
            pos += len;
            new_tokens -= len;
        }
        last.push(cu.len() as i32 - 1);
    }
    cu.push(pos as i32);
    ChunkMetadata { cu_chunk_seqlens: cu, seq_idx, last_chunk_indices: last }
}

/// [`compute_chunk_metadata`] for values from outside the process (an engine's Python call):
/// refuses, with the typed error of the op's plan, what would panic or make meaningless chunks.
/// `chunk_size` must be a power of two, `query_start_loc` start at 0 and not decrease, and
/// `num_computed_tokens` hold one entry per sequence.
pub fn try_compute_chunk_metadata(
    query_start_loc: &[i64],
    num_computed_tokens: &[i64],
    chunk_size: usize,
) -> Result<ChunkMetadata, crate::SsdError> {
    if !chunk_size.is_power_of_two() {
        return Err(crate::SsdError::ChunkSize(chunk_size));
    }
    let tokens = query_start_loc.last().map_or(0, |&t| t.max(0) as usize);
    let mut prev = 0i64;
    for (at, &value) in query_start_loc.iter().enumerate() {
        if (at == 0 && value != 0) || value < prev {
            return Err(crate::SsdError::Offsets {
                arg: "query_start_loc",
                rule: "be non-decreasing",
                at,
                value,
                prev,
                tokens,
            });
        }
        prev = value;
    }
    let batch = query_start_loc.len().saturating_sub(1);
    if num_computed_tokens.len() < batch {
        return Err(ssm_tensor::ArgError::Shape {
            arg: "num_computed_tokens",
            expected: format!("[>= batch={batch}]"),
            actual: vec![num_computed_tokens.len()],
        }
        .into());
    }
    Ok(compute_chunk_metadata(query_start_loc, num_computed_tokens, chunk_size))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worked_example_of_the_spec() {
        let m = compute_chunk_metadata(&[0, 700, 800], &[300, 0], 256);
        assert_eq!(m.cu_chunk_seqlens, vec![0, 212, 468, 700, 800]);
        assert_eq!(m.seq_idx, vec![0, 0, 0, 1]);
        assert_eq!(m.last_chunk_indices, vec![2, 3]);
    }

    #[test]
    fn conformance_cases_metadata() {
        // The metadata recorded in the conformance vectors' notes (built by vLLM itself).
        let m = compute_chunk_metadata(&[0, 100, 137, 287], &[70, 0, 13], 64);
        assert_eq!(m.cu_chunk_seqlens, vec![0, 58, 100, 137, 188, 252, 287]);
        assert_eq!(m.seq_idx, vec![0, 0, 1, 2, 2, 2]);
        assert_eq!(m.last_chunk_indices, vec![1, 2, 5]);
        let m = compute_chunk_metadata(&[0, 260, 280, 320], &[100, 0, 256], 256);
        assert_eq!(m.cu_chunk_seqlens, vec![0, 156, 260, 280, 320]);
        assert_eq!(m.seq_idx, vec![0, 0, 1, 2]);
        assert_eq!(m.last_chunk_indices, vec![1, 2, 3]);
        let m = compute_chunk_metadata(&[0, 1, 66, 67], &[5, 0, 64], 64);
        assert_eq!(m.cu_chunk_seqlens, vec![0, 1, 65, 66, 67]);
        assert_eq!(m.seq_idx, vec![0, 1, 1, 2]);
        assert_eq!(m.last_chunk_indices, vec![0, 2, 3]);
        let m = compute_chunk_metadata(&[0, 50, 130], &[64, 5], 64);
        assert_eq!(m.cu_chunk_seqlens, vec![0, 50, 109, 130]);
        assert_eq!(m.last_chunk_indices, vec![0, 2]);
    }
}

#[cfg(test)]
mod checked_tests {
    use super::*;

    #[test]
    fn checked_metadata_refuses_what_the_plain_one_would_misread() {
        assert_eq!(
            try_compute_chunk_metadata(&[0, 5, 9], &[0, 3], 4).unwrap(),
            compute_chunk_metadata(&[0, 5, 9], &[0, 3], 4)
        );
        assert!(matches!(try_compute_chunk_metadata(&[0, 5], &[0], 0), Err(crate::SsdError::ChunkSize(0))));
        assert!(matches!(
            try_compute_chunk_metadata(&[0, 5, 3], &[0, 0], 4),
            Err(crate::SsdError::Offsets { at: 2, .. })
        ));
        assert!(matches!(try_compute_chunk_metadata(&[1, 5], &[0], 4), Err(crate::SsdError::Offsets { at: 0, .. })));
        assert!(try_compute_chunk_metadata(&[0, 5, 9], &[0], 4).is_err(), "one computed count short");
    }
}
