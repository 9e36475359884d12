use half::{bf16, f16};

/// Element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16.
    BF16,
    /// 16-bit signed integer (a block-scaled state: FlashInfer's int16 `state` with `state_scale`).
    I16,
    /// 8-bit signed integer (a block-scaled 8-bit state: `state` with `state_scale`, as for `I16`).
    I8,
    /// 32-bit signed integer.
    I32,
    /// 64-bit signed integer.
    I64,
    /// One byte, 0 or 1 (`torch.bool`).
    Bool,
}

impl DType {
    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 | DType::I16 => 2,
            DType::I64 => 8,
            DType::I8 | DType::Bool => 1,
        }
    }

    /// Whether this is one of the floating-point types.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// Whether this is one of the index types (`I32`, `I64`).
    pub const fn is_index(self) -> bool {
        matches!(self, DType::I32 | DType::I64)
    }

    /// The lower-case name PyTorch users know (`f32`, `bf16`, …).
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I16 => "i16",
            DType::I8 => "i8",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::Bool => "bool",
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A plain-old-data element type with a [`DType`] tag.
pub trait Element: bytemuck::Pod + Send + Sync + 'static {
    /// The tag of this type.
    const DTYPE: DType;
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => {$(
        impl Element for $t {
            const DTYPE: DType = DType::$d;
        }
    )*};
}
element!(f32 => F32, f16 => F16, bf16 => BF16, i16 => I16, i8 => I8, i32 => I32, i64 => I64, u8 => Bool);
