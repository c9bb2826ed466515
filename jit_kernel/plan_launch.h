// flashcompress: the launch interface of the `plan` JIT family (host-includable, plain C++17).
//
// PlanLaunch<kRatio, kOnline> is declared here and defined in plan_builder.cuh; the kernel TU
// of a variant (templates/plan_kernel.cu.j2) is one explicit instantiation of it, and the
// binding TU (templates/plan_binding.cpp.j2, through plan_binding.h) calls its members. So a
// launcher signature is written once, here. Each member launches on `stream`, returns the
// launch status and never synchronises; empty work launches nothing.
//
//   kOnline = false (ratio 4 or 128)     kOnline = true (ratio 128)
//   decode:          DecodeArgs          OnlineDecodeArgs
//   prefill_stage1:  PrefillStage1Args   OnlinePrefillStage1Args
//   prefill_device:  PrefillDeviceArgs   OnlinePrefillDeviceArgs
// (the argument structs: jit_kernel/plan.cuh).
#pragma once

#include "gpu_runtime.h"
#include "plan.cuh"

namespace flashcompress {

template <bool kOnline>
struct PlanArgs {
  using Decode = DecodeArgsOf<kOnline>;
  using Stage1 = Stage1ArgsOf<kOnline>;
  using Device = DeviceArgsOf<kOnline>;
};

template <int kRatio, bool kOnline>
struct PlanLaunch {
  static_assert(kRatio == 4 || kRatio == 128, "compress ratio must be 4 or 128");
  static_assert(!kOnline || kRatio == 128, "online compression exists only for ratio 128");
  using Args = PlanArgs<kOnline>;
  static gpuError_t decode(const typename Args::Decode& args, gpuStream_t stream);
  static gpuError_t prefill_stage1(const typename Args::Stage1& args, gpuStream_t stream);
  static gpuError_t prefill_device(const typename Args::Device& args, gpuStream_t stream);
};

}  // namespace flashcompress
