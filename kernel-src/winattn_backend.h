// The four entry points every backend implements (kernel-src/cpu or kernel-src/cuda; one per variant).
// The binding allocates `*_workspace_bytes` of scratch memory on the operands' device (through torch's allocator,
// so CUDA memory comes from the caching allocator) and passes it in. `stream` is the current cudaStream_t on CUDA
// and nullptr on CPU.
#pragma once
#include "winattn_params.h"

namespace winattn {

int64_t fwd_workspace_bytes(const FwdParams& params);
void fwd(const FwdParams& params, void* workspace, void* stream);

int64_t bwd_workspace_bytes(const BwdParams& params);
void bwd(const BwdParams& params, void* workspace, void* stream);

}  // namespace winattn
