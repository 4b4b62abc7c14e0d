// A c10d process group (PyTorch's own distributed engine): Gloo for CPU tensors, NCCL for CUDA
// tensors, rendezvous through a TCP store. Host collectives offered to plugins run on it.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <string>

namespace c10d {
class Store;
class Backend;
class ProcessGroup;
}  // namespace c10d

namespace kiln::dist {

class CountingBackend;

struct GroupOptions {
  std::string backend = "gloo";  // "gloo" (CPU tensors) or "nccl" (CUDA tensors)
  std::string master_addr = "127.0.0.1";
  int port = 29500;
  int rank = 0;
  int world_size = 1;
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  int device_index = 0;  // NCCL: the CUDA device of this rank
  // The launcher hosts the store at master_addr:port (torchrun's agent) and keeps it across
  // restarts: every rank connects as a client. Otherwise rank 0 hosts it, on loopback alone when
  // master_addr is loopback, else on every interface (other hosts must reach it).
  bool agent_store = false;
  std::string run_id = "none";  // names the run's keys in a store several runs may share
  int restart_count = 0;        // for messages: restarts of the group so far
};

class ProcessGroup {
 public:
  // Joins the group. Every key it writes to the store goes under a prefix this attempt's ranks
  // agree on (dist/attempt_store.hpp), so keys a restarted group finds from an earlier attempt
  // are never read. Blocks until every rank has joined or the timeout passes; throws
  // std::runtime_error naming the backend and address on failure.
  explicit ProcessGroup(const GroupOptions& options);
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return options_.rank; }
  int world_size() const { return options_.world_size; }
  const std::string& backend() const { return options_.backend; }

  // In place; op is "sum", "max" or "min". Blocking. Under NCCL, which moves CUDA tensors only,
  // a CPU tensor (the host's votes and evaluation sums, a plugin's statistics) travels through
  // this rank's device and back.
  void allreduce(at::Tensor& tensor, const std::string& op);
  void broadcast(at::Tensor& tensor, int root);
  // `out` holds world_size × in.numel() elements, rank-major.
  void allgather(const at::Tensor& in, at::Tensor& out);

  // The same connections as a c10d::ProcessGroup for the DDP Reducer. Its all-reduces are
  // counted (counted_allreduces); the host's own collectives above are not, so the count is
  // gradient traffic only.
  const c10::intrusive_ptr<c10d::ProcessGroup>& counted_group() const { return counted_group_; }
  int64_t counted_allreduces() const;
  // The store under this attempt's prefix.
  const c10::intrusive_ptr<c10d::Store>& store() const { return store_; }

 private:
  // The tensor the backend can move: `tensor` itself when it can, else a copy.
  at::Tensor on_wire(const at::Tensor& tensor) const;

  GroupOptions options_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::Backend> backend_;
  c10::intrusive_ptr<CountingBackend> counting_;
  c10::intrusive_ptr<c10d::ProcessGroup> counted_group_;
};

}  // namespace kiln::dist
