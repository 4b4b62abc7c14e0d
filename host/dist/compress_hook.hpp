// Gradient compression for the Reducer (what torch's fp16_compress_hook / bf16_compress_hook
// do): each bucket is cast to a 16-bit type, divided by the world size, all-reduced at half the
// bytes, and cast back into the bucket.
#pragma once

#include <c10/core/ScalarType.h>

#include <torch/csrc/distributed/c10d/comm.hpp>

namespace kiln::dist {

class CompressHook : public c10d::CppCommHookInterface<c10::intrusive_ptr<c10d::ProcessGroup>> {
 public:
  CompressHook(const c10::intrusive_ptr<c10d::ProcessGroup>& group, c10::ScalarType wire_dtype);
  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override;

 private:
  c10::ScalarType wire_dtype_;
};

}  // namespace kiln::dist
