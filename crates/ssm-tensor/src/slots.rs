//! Slot tables (`state_batch_indices`, `conv_state_indices`, `ssm_state_indices`, …): an
//! integer table `[rows, width]` whose entries name rows ("slots") of a state pool, with
//! SEMANTICS.md rule 3's pad value, and the one aliasing rule every family applies to host
//! tables (see [`first_slot_conflict`]).

use crate::{DType, Strided, TensorRef, elem};

/// A slot table as plans hold it and kernels read it: entry `[b, col]` is at
/// `strides.at([b, col])` (a 1-D table has width 1 and column stride 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotTable {
    /// Addressing of entry `[b, col]`.
    pub strides: Strided<2>,
    /// Rows (at least the number of sequences).
    pub rows: usize,
    /// Columns (1 for a 1-D table).
    pub width: usize,
    /// I32 or I64 (Bool where a family admits boolean tables).
    pub dtype: DType,
}

/// What one slot-table entry means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// The pad value: the sequence reads and writes nothing through this entry.
    Pad,
    /// A row of the pool, inside `[0, slots)`.
    Row(usize),
    /// Neither the pad nor a row: plans refuse it in host tables; device kernels skip it.
    OutOfRange,
}

impl Slot {
    /// Resolves `value` against the pad and a pool of `slots` rows (SEMANTICS.md rule 3):
    /// the pad wins over everything, then `[0, slots)` is a row, anything else is out of range.
    #[inline]
    pub fn resolve(value: i64, pad: Option<i64>, slots: usize) -> Slot {
        if pad == Some(value) {
            Slot::Pad
        } else if value >= 0 && (value as u64) < slots as u64 {
            Slot::Row(value as usize)
        } else {
            Slot::OutOfRange
        }
    }
}

impl SlotTable {
    /// The table of a rank-1 (`[rows]`) or rank-2 (`[rows, width]`) view; `None` for any other
    /// rank (the caller reports it with its own argument name).
    pub fn of(t: &TensorRef<'_>) -> Option<SlotTable> {
        let (rows, width, strides) = match t.rank() {
            1 => (t.shape()[0], 1, [t.strides()[0], 0]),
            2 => (t.shape()[0], t.shape()[1], [t.strides()[0], t.strides()[1]]),
            _ => return None,
        };
        Some(SlotTable { strides: Strided::new(t.layout().offset(), strides), rows, width, dtype: t.dtype() })
    }

    /// Entry `[b, col]` of the host bytes `bytes` (the whole borrowed memory of the view the
    /// plan saw).
    ///
    /// # Panics
    /// If the entry lies outside `bytes` (a plan's bounds guarantee it does not).
    #[inline(always)]
    pub fn get(&self, bytes: &[u8], b: usize, col: usize) -> i64 {
        elem::read_i64(bytes, self.dtype, self.strides.at([b, col]))
    }

    /// Entry `[b, col]` of the host view `t` (the view the plan saw).
    ///
    /// # Panics
    /// On a device view.
    #[inline]
    pub fn read(&self, t: &TensorRef<'_>, b: usize, col: usize) -> i64 {
        self.get(t.host_bytes().expect("slot tables are read on the host"), b, col)
    }
}

/// One sequence's use of one slot, for the aliasing check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct SlotUse {
    /// The slot (pads are never recorded).
    pub slot: usize,
    /// Whether the sequence writes it (`false`: reads only).
    pub written: bool,
    /// The sequence.
    pub seq: usize,
}

/// Two sequences of one call that touch one slot, at least one of them writing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotConflict {
    /// The slot.
    pub slot: usize,
    /// The use with the lower sequence number.
    pub first: SlotUse,
    /// The use with the higher sequence number.
    pub second: SlotUse,
}

impl SlotConflict {
    /// The writing use (the first one when both write).
    pub fn writer(&self) -> SlotUse {
        if self.first.written { self.first } else { self.second }
    }

    /// The other use.
    pub fn other(&self) -> SlotUse {
        if self.first.written { self.second } else { self.first }
    }
}

/// The aliasing rule of every family (docs/CONVENTIONS.md, "Pads and indices"): within one
/// call, a slot written by one sequence is read or written by no other sequence. A sequence
/// may read and write its own slot; pads are not slots and are never recorded.
///
/// Sorts `uses` and returns the conflict on the lowest slot that has one (the lowest-numbered
/// writer, and the lowest-numbered other sequence, readers before writers), or `None`.
pub fn first_slot_conflict(uses: &mut [SlotUse]) -> Option<SlotConflict> {
    uses.sort_unstable();
    for group in uses.chunk_by(|a, b| a.slot == b.slot) {
        if let Some(w) = group.iter().find(|u| u.written)
            && let Some(o) = group.iter().find(|u| u.seq != w.seq)
        {
            let (first, second) = if o.seq < w.seq { (*o, *w) } else { (*w, *o) };
            return Some(SlotConflict { slot: w.slot, first, second });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u(slot: usize, written: bool, seq: usize) -> SlotUse {
        SlotUse { slot, written, seq }
    }

    #[test]
    fn resolve_pads_first() {
        assert_eq!(Slot::resolve(-1, Some(-1), 4), Slot::Pad);
        assert_eq!(Slot::resolve(3, Some(3), 4), Slot::Pad);
        assert_eq!(Slot::resolve(3, None, 4), Slot::Row(3));
        assert_eq!(Slot::resolve(4, None, 4), Slot::OutOfRange);
        assert_eq!(Slot::resolve(-1, None, 4), Slot::OutOfRange);
    }

    #[test]
    fn own_slot_is_no_conflict_shared_writes_are() {
        assert_eq!(first_slot_conflict(&mut [u(2, false, 0), u(2, true, 0), u(3, false, 1), u(3, false, 2)]), None);
        let c = first_slot_conflict(&mut [u(5, true, 2), u(5, false, 1), u(1, true, 0)]).unwrap();
        assert_eq!((c.slot, c.writer().seq, c.other().seq, c.other().written), (5, 2, 1, false));
        assert_eq!((c.first.seq, c.second.seq), (1, 2));
    }

    #[test]
    fn table_reads_entries() {
        let v = [7i64, 8, 9, 10];
        let t = TensorRef::from_slice(&v, &[2, 2]).unwrap();
        let tab = SlotTable::of(&t).unwrap();
        assert_eq!((tab.rows, tab.width), (2, 2));
        assert_eq!(tab.read(&t, 1, 0), 9);
        let col = TensorRef::from_slice(&v, &[4]).unwrap();
        assert_eq!(SlotTable::of(&col).unwrap().read(&col, 3, 0), 10);
    }
}
