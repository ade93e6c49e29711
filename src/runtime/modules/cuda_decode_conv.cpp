// Owns the recurrent mixers' in_proj with the decode conv in its epilogue (see cuda_modules.h).
#include "device/cuda_check.h"
#include "kernels/cuda/skinny_gemm.h"
#include "runtime/modules/cuda_modules.h"

namespace ssmserve::cuda {

bool in_proj_with_decode_conv(const CudaRunnerContext& ctx, const CudaStep& st, const void* normed, int64_t hidden,
                              const DevWeight& in_proj, float* proj, int64_t PW, int64_t nd, int64_t conv_col0,
                              const ConvParams& conv, float* conv_out, int64_t conv_out_stride) {
  const int64_t T = st.T;
  const DType sd = conv.conv_states.dtype;
  const bool fused = ctx.opt.decode_conv_epilogue && nd > 0 && st.meta.spec_cols == 1 &&
                     ctx.gemm->takes_skinny(in_proj.dtype, T) &&
                     (sd == DType::F32 || sd == DType::BF16 || sd == DType::F16);
  if (!fused) {
    ctx.gemm_run(normed, T, hidden, in_proj, proj, PW);
    return false;
  }
  ProfileSpan span(ctx.profile, "gemm", st.stream);
  SkinnyExtras ex;
  ex.conv.rows = static_cast<int>(nd), ex.conv.col0 = conv_col0, ex.conv.conv = conv;
  ex.conv.state_indices = st.meta.state_indices_d, ex.conv.out = conv_out, ex.conv.out_stride = conv_out_stride;
  ctx.gemm->run({T, in_proj.rows, in_proj.cols, normed, hidden, in_proj.buf.data(), in_proj.cols, in_proj.dtype, proj, PW,
                 DType::F32},
                st.stream, nullptr, 0, &ex);
  return true;
}

}  // namespace ssmserve::cuda
