//! Planned calls: an op's arguments and the plan checked from them, held together.
//!
//! Backends write through raw pointers at offsets the plan resolved, so a plan must never
//! meet arguments it was not built from. [`Planned`] makes that a property of the types:
//! its fields are private, and its only constructor, [`Planned::new`], builds the plan
//! from the very arguments it keeps (through the op crate's [`Op::plan`]). Backends take a
//! `Planned<A>` by value and nothing else, so safe code cannot reach a kernel with a plan
//! that does not describe its arguments.
//!
//! ```compile_fail,E0451
//! // A plan cannot be paired with other arguments: the fields are private.
//! fn forge<A: ssm_tensor::Op>(args: A, plan: A::Plan) -> ssm_tensor::Planned<A> {
//!     ssm_tensor::Planned { args, plan, device: ssm_tensor::Device::Cpu }
//! }
//! ```
//!
//! ```compile_fail,E0599
//! // ... nor swapped into a planned call after the fact: there is no mutable access.
//! fn swap<A: ssm_tensor::Op>(call: &mut ssm_tensor::Planned<A>, other: A) {
//!     *call.args_mut() = other;
//! }
//! ```

use crate::Device;

/// One op's arguments (`SelectiveStateUpdateArgs`, `CausalConv1dUpdateArgs`, …): how to plan
/// them. Implemented by the op crate that owns the arguments type, next to its `plan`.
pub trait Op: Sized {
    /// The op's name as vLLM spells it (`"selective_state_update"`), for errors and reports.
    const NAME: &'static str;
    /// What the checks resolve: sizes, addressing, route. Backends trust it.
    type Plan;
    /// The op crate's typed error.
    type Error;
    /// Every shape, dtype, stride, device and host-index check, once, before anything is
    /// written.
    fn plan(&self) -> Result<Self::Plan, Self::Error>;
    /// The device every tensor of the planned call lives on (the plan checked they agree).
    fn device(plan: &Self::Plan) -> Device;
}

/// Arguments together with the plan that [`Op::plan`] built from them.
///
/// The only way to make one is [`Planned::new`], which runs the checks on the arguments it
/// keeps; there is no way to reach the arguments mutably afterwards. A backend receives the
/// pair by value and can therefore trust the plan for exactly these arguments.
#[derive(Debug)]
pub struct Planned<A: Op> {
    args: A,
    plan: A::Plan,
    device: Device,
}

impl<A: Op> Planned<A> {
    /// Plans `args` (every check, once) and keeps both.
    ///
    /// Errors: whatever the op's plan refuses; nothing has been written then.
    pub fn new(args: A) -> Result<Self, A::Error> {
        let plan = args.plan()?;
        let device = A::device(&plan);
        Ok(Planned { args, plan, device })
    }

    /// The checked plan.
    pub fn plan(&self) -> &A::Plan {
        &self.plan
    }

    /// The arguments the plan was built from.
    pub fn args(&self) -> &A {
        &self.args
    }

    /// The device every tensor of the call lives on, recorded once by the plan.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The op's name as vLLM spells it.
    pub fn name(&self) -> &'static str {
        A::NAME
    }

    /// Takes the pair apart for a backend to run it. The parts cannot be put back together:
    /// a new `Planned` always plans its arguments again.
    pub fn into_parts(self) -> (A, A::Plan) {
        (self.args, self.plan)
    }
}

/// A backend runs one op's planned calls.
///
/// Every backend implements `Run<A>` for every op `A` that exists; a backend without a
/// kernel for `A` yet answers its typed "unsupported" error. The facade's single dispatch
/// path is generic over `A`, so adding an op is: its op crate (args, plan, reference), one
/// `Run` impl per backend, and one facade method.
pub trait Run<A: Op> {
    /// The backend's error type.
    type Error;
    /// Runs the call: writes the outputs and state slots its contract names, nothing else.
    fn run(&self, call: Planned<A>) -> Result<(), Self::Error>;
}

/// A backend's answer for an op it has no kernel for: which op, which backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the {backend} backend has no kernel for `{op}` yet")]
pub struct Unsupported {
    /// The op's name as vLLM spells it.
    pub op: &'static str,
    /// The backend's name (`cpu`, `cuda`).
    pub backend: &'static str,
}

/// Declares an op crate's calls, once: the [`Op`] impl of each arguments type, the crate's
/// `plan` (the only way to a [`Planned`] call of its ops) and its family backend trait (a
/// backend of every op of the family with one error type, what generic harnesses take).
///
/// ```text
/// ssm_tensor::op_family! {
///     /// A backend of both causal conv1d ops.
///     family ConvBackend, error ConvError;
///     CausalConv1dUpdateArgs => "causal_conv1d_update", ConvPlan, plan::plan_causal_conv1d_update;
///     CausalConv1dFnArgs => "causal_conv1d_fn", ConvPlan, plan::plan_causal_conv1d_fn;
/// }
/// ```
#[macro_export]
macro_rules! op_family {
    (
        $(#[$family_doc:meta])*
        family $family:ident, error $error:ty;
        $($args:ident => $name:literal, $plan:ty, $check:path;)+
    ) => {
        $(
            impl $crate::Op for $args<'_> {
                const NAME: &'static str = $name;
                type Plan = $plan;
                type Error = $error;
                fn plan(&self) -> Result<$plan, $error> {
                    $check(self)
                }
                fn device(plan: &$plan) -> $crate::Device {
                    plan.device
                }
            }
        )+

        $(#[$family_doc])*
        pub trait $family<E>: $(for<'a> $crate::Run<$args<'a>, Error = E> +)+ {}

        impl<E, B: $(for<'a> $crate::Run<$args<'a>, Error = E> +)+> $family<E> for B {}

        /// Checks every argument of one of this crate's calls (every shape, dtype, stride,
        /// device and host-index check, once, before anything is written) and keeps them with
        /// their plan: the only value a backend runs.
        ///
        /// Errors name the argument and what was expected; nothing is written by a failed call.
        pub fn plan<A: $crate::Op<Error = $error>>(args: A) -> Result<$crate::Planned<A>, $error> {
            $crate::Planned::new(args)
        }
    };
}
