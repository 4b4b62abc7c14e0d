#include "dist/process_group.hpp"

#include <ATen/ops/empty.h>

#include <cstdlib>
#include <stdexcept>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "dist/attempt_store.hpp"
#include "dist/counting_backend.hpp"
#include "dist/listen_socket.hpp"

namespace kiln::dist {
namespace {

std::shared_ptr<::gloo::transport::Device> gloo_device(const std::string& master_addr) {
  // Same rule as torch.distributed: an explicit interface wins; a loopback rendezvous stays on
  // loopback; otherwise bind to the address this host's name resolves to.
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME")) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  }
  if (is_loopback(master_addr)) return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

// The launcher's store, or a client of rank 0's (which rank 0 starts).
c10::intrusive_ptr<c10d::Store> connect_store(const GroupOptions& options) {
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<uint16_t>(options.port);
  store_options.timeout = options.timeout;
  store_options.isServer = options.rank == 0 && !options.agent_store;
  // Rank 0's store waits for every rank to connect; an agent's store is not ours to count in.
  if (!options.agent_store) store_options.numWorkers = options.world_size;
  if (store_options.isServer && is_loopback(options.master_addr)) {
    // c10d would listen on every interface; the store takes over this socket instead. (Should
    // the store fail to start, the socket is left open rather than risk closing it twice: the
    // rank is about to exit.)
    store_options.masterListenFd = listen_on_loopback(options.master_addr, options.port);
  }
  return c10::make_intrusive<c10d::TCPStore>(options.master_addr, store_options);
}

c10d::ReduceOp reduce_op(const std::string& op) {
  if (op == "sum") return c10d::ReduceOp::SUM;
  if (op == "max") return c10d::ReduceOp::MAX;
  if (op == "min") return c10d::ReduceOp::MIN;
  throw std::invalid_argument("unknown reduction '" + op + "'");
}

}  // namespace

ProcessGroup::ProcessGroup(const GroupOptions& options) : options_(options) {
  std::string where = options.backend + " process group at " + options.master_addr + ":" +
                      std::to_string(options.port) + " (rank " + std::to_string(options.rank) +
                      " of " + std::to_string(options.world_size);
  if (options.restart_count > 0) where += ", restart " + std::to_string(options.restart_count);
  where += ")";
  try {
    store_ = attempt_store(connect_store(options), options.run_id, options.rank, options.world_size,
                           options.timeout);
    if (options.backend == "gloo") {
      auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.timeout);
      gloo_options->devices.push_back(gloo_device(options.master_addr));
      backend_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store_, options.rank,
                                                             options.world_size, gloo_options);
    } else if (options.backend == "nccl") {
      auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
      nccl_options->timeout = options.timeout;
      backend_ = c10::make_intrusive<c10d::ProcessGroupNCCL>(store_, options.rank,
                                                             options.world_size, nccl_options);
    } else {
      throw std::invalid_argument("unknown backend '" + options.backend + "' (gloo or nccl)");
    }
    const auto type = options.backend == "gloo" ? c10d::ProcessGroup::BackendType::GLOO
                                                : c10d::ProcessGroup::BackendType::NCCL;
    counting_ = c10::make_intrusive<CountingBackend>(backend_);
    counted_group_ =
        c10::make_intrusive<c10d::ProcessGroup>(store_, options.rank, options.world_size);
    counted_group_->setBackend(
        options.backend == "gloo" ? c10::DeviceType::CPU : c10::DeviceType::CUDA, type, counting_);
    counted_group_->setDefaultBackend(type);
  } catch (const std::exception& e) {
    throw std::runtime_error("cannot join the " + where + ": " + e.what());
  }
}

ProcessGroup::~ProcessGroup() = default;

int64_t ProcessGroup::counted_allreduces() const { return counting_->allreduce_calls(); }

at::Tensor ProcessGroup::on_wire(const at::Tensor& tensor) const {
  if (options_.backend != "nccl" || tensor.is_cuda()) return tensor.contiguous();
  // One dense copy on the rank's device: to()'s default keeps a strided tensor's strides,
  // which NCCL refuses.
  const at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(options_.device_index));
  return tensor.to(tensor.options().device(device), /*non_blocking=*/false, /*copy=*/false,
                   at::MemoryFormat::Contiguous);
}

void ProcessGroup::allreduce(at::Tensor& tensor, const std::string& op) {
  std::vector<at::Tensor> tensors{on_wire(tensor)};
  c10d::AllreduceOptions o;
  o.reduceOp = reduce_op(op);
  backend_->allreduce(tensors, o)->wait();
  if (!tensors[0].is_same(tensor)) tensor.copy_(tensors[0]);
}

void ProcessGroup::broadcast(at::Tensor& tensor, int root) {
  std::vector<at::Tensor> tensors{on_wire(tensor)};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  backend_->broadcast(tensors, o)->wait();
  if (!tensors[0].is_same(tensor)) tensor.copy_(tensors[0]);
}

void ProcessGroup::allgather(const at::Tensor& in, at::Tensor& out) {
  std::vector<at::Tensor> inputs{on_wire(in)};
  at::Tensor gathered = on_wire(out);
  std::vector<std::vector<at::Tensor>> outputs(1);
  at::Tensor flat = gathered.view({options_.world_size, in.numel()});
  for (int r = 0; r < options_.world_size; ++r) outputs[0].push_back(flat[r].view(in.sizes()));
  backend_->allgather(outputs, inputs)->wait();
  if (!gathered.is_same(out)) out.copy_(gathered);
}

}  // namespace kiln::dist
