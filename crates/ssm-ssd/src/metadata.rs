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
    /// The chunk ending on each sequence's prefix-caching checkpoint, `[batch]`, -1 where it
    /// has none (all -1 from [`compute_chunk_metadata`]): the SSD call's
    /// `checkpoint_chunk_indices`.
    pub checkpoint_chunk_indices: Vec<i32>,
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
/// may be short too. Chunks never span two sequences; an empty sequence has none (its last
/// chunk is -1).
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
    compute_chunk_metadata_with_checkpoints(query_start_loc, num_computed_tokens, chunk_size, &[])
}

/// [`compute_chunk_metadata`] with prefix-caching checkpoints, as vLLM 0.33's builder makes
/// them (`_compute_chunk_metadata(..., checkpoint_offsets_p)`, semantics/ssd_mamba2.md §4).
///
/// `checkpoint_offsets[b]` tokens into sequence `b`'s new tokens (vLLM's
/// `MambaPrefillCheckpointMetadata.offsets`; 0, or an entry past the slice's end: none) the
/// sequence is split: its first part chunks as a sequence resumed at `num_computed_tokens[b]`
/// and its second as one resumed at `num_computed_tokens[b] + checkpoint_offsets[b]`, so a
/// chunk ends exactly on the checkpoint. `checkpoint_chunk_indices[b]` names that chunk (its
/// end state is the checkpoint's state), -1 where `b` has none.
///
/// Example (chunk 256): resumed at 300 with 700 new tokens and a checkpoint 500 tokens in:
/// `cu_chunk_seqlens = [0, 212, 468, 500, 700]`, `checkpoint_chunk_indices = [2]` (its end
/// state is the state after absolute position 800), `last_chunk_indices = [3]`.
///
/// # Panics
/// As [`compute_chunk_metadata`], and where an offset is negative or not below its
/// sequence's new tokens (vLLM never places one there; [`try_compute_chunk_metadata`]
/// refuses it).
pub fn compute_chunk_metadata_with_checkpoints(
    query_start_loc: &[i64],
    num_computed_tokens: &[i64],
    chunk_size: usize,
    checkpoint_offsets: &[i64],
) -> ChunkMetadata {
    assert!(chunk_size > 0, "chunk_size must be positive");
    let q = chunk_size as i64;
    let batch = query_start_loc.len().saturating_sub(1);
    let mut cu = Vec::new();
    let mut seq_idx = Vec::new();
    let mut last = Vec::with_capacity(batch);
    let mut checkpoint = vec![-1i32; batch];
    let mut pos = 0i64;
    // Chunks of `new_tokens` tokens of sequence `req` resumed at `computed`.
    let mut segment = |req: usize, computed: i64, mut new_tokens: i64, cu: &mut Vec<i32>| {
        // A resumed sequence whose computed tokens are not chunk-aligned first finishes its chunk.
        if computed % q != 0 && new_tokens > 0 {
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
    };
    for req in 0..batch {
        let computed = num_computed_tokens[req];
        let new_tokens = query_start_loc[req + 1] - query_start_loc[req];
        let at = checkpoint_offsets.get(req).copied().unwrap_or(0);
        let before = cu.len();
        assert!(
            (0..new_tokens.max(1)).contains(&at),
            "checkpoint offset {at} of sequence {req} outside 0..{new_tokens}"
        );
        if at > 0 {
            segment(req, computed, at, &mut cu);
            checkpoint[req] = cu.len() as i32 - 1;
        }
        segment(req, computed + at, new_tokens - at, &mut cu);
        // An empty sequence has no chunk (-1, as vLLM's `compute_varlen_chunk_metadata` says).
        last.push(if cu.len() == before { -1 } else { cu.len() as i32 - 1 });
    }
    cu.push(pos as i32);
    ChunkMetadata { cu_chunk_seqlens: cu, seq_idx, last_chunk_indices: last, checkpoint_chunk_indices: checkpoint }
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
    try_compute_chunk_metadata_with_checkpoints(query_start_loc, num_computed_tokens, chunk_size, &[])
}

/// [`compute_chunk_metadata_with_checkpoints`] for values from outside the process: refuses
/// what [`try_compute_chunk_metadata`] refuses, more `checkpoint_offsets` than sequences, and
/// an offset that is negative or not below its sequence's new tokens.
pub fn try_compute_chunk_metadata_with_checkpoints(
    query_start_loc: &[i64],
    num_computed_tokens: &[i64],
    chunk_size: usize,
    checkpoint_offsets: &[i64],
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
    if checkpoint_offsets.len() > batch {
        return Err(ssm_tensor::ArgError::Shape {
            arg: "checkpoint_offsets",
            expected: format!("[<= batch={batch}]"),
            actual: vec![checkpoint_offsets.len()],
        }
        .into());
    }
    for (seq, &value) in checkpoint_offsets.iter().enumerate() {
        let tokens = query_start_loc[seq + 1] - query_start_loc[seq];
        if value < 0 || (value > 0 && value >= tokens) {
            return Err(crate::SsdError::CheckpointOffset { seq, value, tokens });
        }
    }
    Ok(compute_chunk_metadata_with_checkpoints(query_start_loc, num_computed_tokens, chunk_size, checkpoint_offsets))
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
mod checkpoint_tests {
    use super::*;

    #[test]
    fn a_checkpoint_ends_a_chunk_and_the_rest_resumes_after_it() {
        // The doc example: resumed at 300, 700 new tokens, checkpoint 500 tokens in.
        let m = compute_chunk_metadata_with_checkpoints(&[0, 700], &[300], 256, &[500]);
        assert_eq!(m.cu_chunk_seqlens, vec![0, 212, 468, 500, 700]);
        assert_eq!(m.seq_idx, vec![0, 0, 0, 0]);
        assert_eq!((m.checkpoint_chunk_indices, m.last_chunk_indices), (vec![2], vec![3]));
        // A checkpoint on a chunk boundary adds no chunk; none (0) changes nothing; a fresh
        // sequence after one with a checkpoint keeps its own alignment.
        let m = compute_chunk_metadata_with_checkpoints(&[0, 600, 600, 700], &[0, 0, 64], 256, &[256, 0, 0]);
        assert_eq!(m.cu_chunk_seqlens, vec![0, 256, 512, 600, 700]);
        assert_eq!(m.seq_idx, vec![0, 0, 0, 2]);
        assert_eq!(m.checkpoint_chunk_indices, vec![0, -1, -1]);
        assert_eq!(m.last_chunk_indices, vec![2, -1, 3]);
        let plain = compute_chunk_metadata(&[0, 600, 600, 700], &[0, 0, 64], 256);
        assert_eq!((plain.cu_chunk_seqlens, plain.checkpoint_chunk_indices), (m.cu_chunk_seqlens, vec![-1; 3]));
        // A checkpoint one token in.
        let m = compute_chunk_metadata_with_checkpoints(&[0, 5], &[3], 4, &[1]);
        assert_eq!(m.cu_chunk_seqlens, vec![0, 1, 5]);
        assert_eq!((m.checkpoint_chunk_indices, m.last_chunk_indices), (vec![0], vec![1]));
    }

    #[test]
    fn checked_checkpoints_refuse_offsets_outside_their_sequence() {
        let ok = try_compute_chunk_metadata_with_checkpoints(&[0, 5, 9], &[0, 3], 4, &[3, 0]).unwrap();
        assert_eq!(ok, compute_chunk_metadata_with_checkpoints(&[0, 5, 9], &[0, 3], 4, &[3, 0]));
        for (offsets, seq) in [(&[5i64, 0][..], 0), (&[0, -1][..], 1), (&[0, 4][..], 1)] {
            assert!(
                matches!(
                    try_compute_chunk_metadata_with_checkpoints(&[0, 5, 9], &[0, 3], 4, offsets),
                    Err(crate::SsdError::CheckpointOffset { seq: s, .. }) if s == seq
                ),
                "{offsets:?}"
            );
        }
        assert!(try_compute_chunk_metadata_with_checkpoints(&[0, 5], &[0], 4, &[1, 1]).is_err(), "one offset too many");
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
