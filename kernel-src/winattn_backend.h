// The entry points every backend implements (kernel-src/cpu or kernel-src/cuda; one per variant).
// The binding allocates `*_workspace_bytes` of scratch memory on the operands' device (through torch's allocator,
// so CUDA memory comes from the caching allocator) and passes it in. `stream` is the current cudaStream_t on CUDA
// and nullptr on CPU.
#pragma once
#include "winattn_params.h"

namespace winattn {

int64_t fwd_workspace_bytes(const FwdParams& params);
void fwd(const FwdParams& params, void* workspace, void* stream);

// How the caller allocates dbias (asked before bwd, with `params.dbias` still nullptr). The default, which every
// backend supports, is float32 zero-filled. A backend whose kernel writes each dbias element exactly once may ask
// for the bias's own dtype instead: no zero-fill pass and no float32 -> bias-dtype conversion afterwards (for a
// [1, 16, 4096, 4096] bias that is 1 GB of memset and 1.5 GB of conversion traffic). zero_fill stays true when some
// tiles are never visited (masked out) and must read 0.
struct DbiasLayout {
  bool in_bias_dtype = false;
  bool zero_fill = true;
};
DbiasLayout bwd_dbias_layout(const BwdParams& params);

int64_t bwd_workspace_bytes(const BwdParams& params);
void bwd(const BwdParams& params, void* workspace, void* stream);

}  // namespace winattn
