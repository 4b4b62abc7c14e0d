// A c10d Backend that forwards every collective to another one and counts the all-reduces it
// forwards, so a run can report how much gradient communication each optimizer step caused
// (accumulation micro-steps must cause none).
#pragma once

#include <atomic>
#include <cstdint>
#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace kiln::dist {

class CountingBackend : public c10d::Backend {
 public:
  explicit CountingBackend(c10::intrusive_ptr<c10d::Backend> inner);

  int64_t allreduce_calls() const { return calls_.load(std::memory_order_relaxed); }

  const std::string getBackendName() const override;
  void setTimeout(std::chrono::milliseconds timeout) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  void setSequenceNumberForGroup() override;
  uint64_t getSequenceNumberForGroup() override;

 private:
  void count();

  c10::intrusive_ptr<c10d::Backend> inner_;
  std::atomic<int64_t> calls_{0};
};

}  // namespace kiln::dist
