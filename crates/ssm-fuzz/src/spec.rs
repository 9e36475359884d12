//! A call's tensor arguments as plain data ([`TensorSpec`]), the owned buffers they become
//! ([`Buffers`]), and the views handed to the op ([`Views`]).

use ssm_tensor::{DType, Device, HostTensor, TensorError, TensorMut, TensorRef};

/// One tensor argument: its memory (a copy of the bytes) and the view of it the op gets.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSpec {
    /// The argument's path in the args struct (`x`, `rule.q`, `trackers.ring_start`).
    pub name: &'static str,
    /// Whether the op may write it (`TensorMut`).
    pub writable: bool,
    /// Whether the argument is optional (`Option<…>`).
    pub optional: bool,
    /// `false` for an absent optional argument.
    pub present: bool,
    /// Element type of the memory and the view.
    pub dtype: DType,
    /// Where the memory claims to live. Device memory is never materialised: a CPU runtime
    /// must refuse the call before it touches it.
    pub device: Device,
    /// Shape of the view.
    pub shape: Vec<usize>,
    /// Strides of the view, in elements.
    pub strides: Vec<isize>,
    /// Element offset of the view.
    pub offset: usize,
    /// The memory, little-endian bytes (a whole number of elements).
    pub memory: Vec<u8>,
}

impl TensorSpec {
    /// The spec of a present view (`None`: an absent optional argument).
    pub(crate) fn of(name: &'static str, writable: bool, optional: bool, view: Option<TensorRef<'_>>) -> Self {
        match view {
            Some(v) => TensorSpec {
                name,
                writable,
                optional,
                present: true,
                dtype: v.dtype(),
                device: v.device(),
                shape: v.shape().to_vec(),
                strides: v.strides().to_vec(),
                offset: v.layout().offset(),
                memory: v.host_bytes().map(<[u8]>::to_vec).unwrap_or_default(),
            },
            None => TensorSpec {
                name,
                writable,
                optional,
                present: false,
                dtype: DType::F32,
                device: Device::Cpu,
                shape: vec![],
                strides: vec![],
                offset: 0,
                memory: vec![],
            },
        }
    }

    /// Elements in the memory.
    pub fn memory_len(&self) -> usize {
        self.memory.len() / self.dtype.size()
    }

    /// Whether the elements are indices or flags rather than floats (or the integers of a
    /// block-scaled i16 / i8 state, compared as values).
    pub fn is_integer(&self) -> bool {
        !self.dtype.is_float() && ssm_ssu::quant::limit(self.dtype).is_none()
    }
}

/// The owned memory of every argument of one call (one [`HostTensor`] per spec, 64-byte
/// aligned; empty for absent and device arguments).
#[derive(Debug, Clone, PartialEq)]
pub struct Buffers(pub Vec<HostTensor>);

impl Buffers {
    /// The memory of each spec.
    pub fn new(specs: &[TensorSpec]) -> Self {
        Buffers(
            specs
                .iter()
                .map(|s| {
                    HostTensor::from_bytes(s.dtype, vec![s.memory_len()], &s.memory[..s.memory_len() * s.dtype.size()])
                })
                .collect(),
        )
    }
}

/// A view that a call takes (or `None` for an absent optional argument).
enum View<'s> {
    Ref(Option<TensorRef<'s>>),
    Mut(Option<TensorMut<'s>>),
}

/// The views of one call's arguments, taken by name while the args struct is built. Building
/// them can fail as a user's own view construction can ([`TensorError`]); that ends the case
/// before the op is called.
pub struct Views<'s> {
    views: Vec<(&'static str, Option<View<'s>>)>,
}

/// A device address that is never dereferenced: a CPU runtime refuses device tensors before
/// it runs anything (reaching it would be the defect under test, a crash the fuzzer reports).
const FAKE_DEVICE_ADDR: u64 = 0x7f00_0000_0000;

impl<'s> Views<'s> {
    /// The views of `specs` over `buffers` (same order), or the first view-construction error.
    pub fn new(specs: &[TensorSpec], buffers: &'s mut Buffers) -> Result<Self, (&'static str, TensorError)> {
        let mut views = Vec::with_capacity(specs.len());
        for (s, buf) in specs.iter().zip(buffers.0.iter_mut()) {
            let named = |e| (s.name, e);
            let view = if !s.present {
                if s.writable { View::Mut(None) } else { View::Ref(None) }
            } else if let Device::Cuda(_) = s.device {
                let len = s.memory_len().max(s.offset.saturating_add(1));
                if s.writable {
                    // SAFETY: the address is never dereferenced (see FAKE_DEVICE_ADDR).
                    let v =
                        unsafe { TensorMut::from_device_ptr(FAKE_DEVICE_ADDR, len, s.dtype, s.device, &[len], &[1]) }
                            .and_then(|v| v.with_layout(&s.shape, &s.strides, s.offset))
                            .map_err(named)?;
                    View::Mut(Some(v))
                } else {
                    // SAFETY: as above.
                    let v =
                        unsafe { TensorRef::from_device_ptr(FAKE_DEVICE_ADDR, len, s.dtype, s.device, &[len], &[1]) }
                            .and_then(|v| v.with_layout(&s.shape, &s.strides, s.offset))
                            .map_err(named)?;
                    View::Ref(Some(v))
                }
            } else if s.writable {
                View::Mut(Some(buf.view_mut().with_layout(&s.shape, &s.strides, s.offset).map_err(named)?))
            } else {
                View::Ref(Some(buf.view().with_layout(&s.shape, &s.strides, s.offset).map_err(named)?))
            };
            views.push((s.name, Some(view)));
        }
        Ok(Views { views })
    }

    fn take(&mut self, name: &str) -> View<'s> {
        let slot = self.views.iter_mut().find(|(n, _)| *n == name);
        let slot = slot.unwrap_or_else(|| panic!("fuzz harness: no argument {name}"));
        slot.1.take().unwrap_or_else(|| panic!("fuzz harness: argument {name} taken twice"))
    }

    /// A required read-only argument.
    pub fn r(&mut self, name: &str) -> TensorRef<'s> {
        self.opt_r(name).unwrap_or_else(|| panic!("fuzz harness: required {name} is absent"))
    }

    /// An optional read-only argument.
    pub fn opt_r(&mut self, name: &str) -> Option<TensorRef<'s>> {
        match self.take(name) {
            View::Ref(v) => v,
            View::Mut(_) => panic!("fuzz harness: {name} is writable"),
        }
    }

    /// A required written argument.
    pub fn m(&mut self, name: &str) -> TensorMut<'s> {
        self.opt_m(name).unwrap_or_else(|| panic!("fuzz harness: required {name} is absent"))
    }

    /// An optional written argument.
    pub fn opt_m(&mut self, name: &str) -> Option<TensorMut<'s>> {
        match self.take(name) {
            View::Mut(v) => v,
            View::Ref(_) => panic!("fuzz harness: {name} is read-only"),
        }
    }

    /// Panics unless every argument was taken (the op's field list and its builder agree).
    pub fn finish(self) {
        if let Some((n, _)) = self.views.iter().find(|(_, v)| v.is_some()) {
            panic!("fuzz harness: argument {n} was never taken");
        }
    }
}
