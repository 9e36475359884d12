use ssm_tensor::CopyRowsArgs;

use crate::{Error, Runtime};

impl Runtime {
    /// `copy_rows`: moves whole rows between two row-major tensors through an index list
    /// (gather `dst[i] = src[index[i]]` or scatter `dst[index[i]] = src[i]`), what the GDN core
    /// runs for vLLM's `x[spec_token_indx]` and `out[spec_token_indx] = …`. Plans the call
    /// (host index values checked; nothing is written when it fails) and runs it where its
    /// tensors live; device index values are checked in the kernel (`check()` reports them).
    /// Writes the named rows of `dst`, nothing else ([`ssm_tensor::CopyRowsArgs`]).
    pub fn copy_rows(&self, args: CopyRowsArgs<'_>) -> Result<(), Error> {
        self.plan_and_run(args)
    }
}
