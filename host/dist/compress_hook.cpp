#include "dist/compress_hook.hpp"

#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

namespace kiln::dist {

CompressHook::CompressHook(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                           c10::ScalarType wire_dtype)
    : CppCommHookInterface(group), wire_dtype_(wire_dtype) {}

c10::intrusive_ptr<c10::ivalue::Future> CompressHook::runHook(c10d::GradBucket& bucket) {
  at::Tensor buffer = bucket.getBufferRef();
  // Divide before the sum, in the wire type: the sum of W averaged shares cannot overflow where
  // the sum of W full gradients might.
  std::vector<at::Tensor> wire{buffer.to(wire_dtype_).div_(state_->getSize())};
  auto future = state_->allreduce(wire)->getFuture();
  return future->then(
      [buffer, wire](c10::ivalue::Future& done) {
        done.value();  // rethrows a failed all-reduce
        buffer.copy_(wire[0]);
        return c10::IValue(buffer);
      },
      c10::TensorType::get());
}

}  // namespace kiln::dist
