#include "dist/counting_backend.hpp"

namespace kiln::dist {

CountingBackend::CountingBackend(c10::intrusive_ptr<c10d::Backend> inner)
    : c10d::Backend(inner->getRank(), inner->getSize()), inner_(std::move(inner)) {}

void CountingBackend::count() { calls_.fetch_add(1, std::memory_order_relaxed); }

const std::string CountingBackend::getBackendName() const { return inner_->getBackendName(); }

void CountingBackend::setTimeout(std::chrono::milliseconds timeout) { inner_->setTimeout(timeout); }

c10::intrusive_ptr<c10d::Work> CountingBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceOptions& opts) {
  count();
  return inner_->allreduce(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> CountingBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  count();
  return inner_->allreduce_coalesced(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> CountingBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  return inner_->broadcast(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> CountingBackend::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return inner_->allgather(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> CountingBackend::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  return inner_->_allgather_base(output, input, opts);
}

c10::intrusive_ptr<c10d::Work> CountingBackend::barrier(const c10d::BarrierOptions& opts) {
  return inner_->barrier(opts);
}

void CountingBackend::setSequenceNumberForGroup() { inner_->setSequenceNumberForGroup(); }

uint64_t CountingBackend::getSequenceNumberForGroup() {
  return inner_->getSequenceNumberForGroup();
}

}  // namespace kiln::dist
