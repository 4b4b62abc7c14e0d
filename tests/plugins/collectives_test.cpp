// The host collectives plugins call (kiln_host_api.allreduce/broadcast/allgather) on a real c10d
// Gloo process group of 2 ranks (two threads of this process over loopback), and their
// single-process behaviour.
#include <ATen/Context.h>
#include <ATen/Functions.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <thread>

#include "dist/process_group.hpp"
#include "kiln/torch.hpp"
#include "plugin/host_api.hpp"
#include "plugin/status.hpp"

namespace {

const kiln_host_api* host() { return kiln::plugin::host_api(); }

void expect_ok(kiln_status* status) {
  EXPECT_EQ(status, nullptr) << kiln::plugin::take_message(status);
}

TEST(Collectives, TwoGlooRanksReduceBroadcastAndGather) {
  const int port = 20000 + static_cast<int>(::getpid() % 20000);
  std::vector<at::Tensor> sums(2), maxes(2), broadcasts(2), gathers(2);
  auto rank_main = [&](int rank) {
    kiln::dist::GroupOptions options;
    options.backend = "gloo";
    options.port = port;
    options.rank = rank;
    options.world_size = 2;
    options.timeout = std::chrono::seconds(60);
    kiln::dist::ProcessGroup group(options);
    kiln_call_context ctx;
    ctx.group = &group;
    EXPECT_EQ(host()->rank(&ctx), rank);
    EXPECT_EQ(host()->world_size(&ctx), 2);

    sums[rank] = at::full({3}, static_cast<float>(rank + 1));
    DLTensor s = kiln::as_dltensor(sums[rank]);
    expect_ok(host()->allreduce(&ctx, &s, KILN_REDUCE_SUM));

    maxes[rank] = at::tensor({static_cast<float>(rank), static_cast<float>(5 - rank)});
    DLTensor m = kiln::as_dltensor(maxes[rank]);
    expect_ok(host()->allreduce(&ctx, &m, KILN_REDUCE_MAX));

    broadcasts[rank] = at::full({2, 2}, static_cast<float>(10 * rank));
    DLTensor b = kiln::as_dltensor(broadcasts[rank]);
    expect_ok(host()->broadcast(&ctx, &b, 1));

    at::Tensor in = at::full({2}, static_cast<float>(rank + 7));
    gathers[rank] = at::zeros({4});
    DLTensor gi = kiln::as_dltensor(in), go = kiln::as_dltensor(gathers[rank]);
    expect_ok(host()->allgather(&ctx, &gi, &go));
  };
  std::thread other(rank_main, 1);
  rank_main(0);
  other.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(at::equal(sums[r], at::full({3}, 3.0f))) << sums[r];
    EXPECT_TRUE(at::equal(maxes[r], at::tensor({1.0f, 5.0f}))) << maxes[r];
    EXPECT_TRUE(at::equal(broadcasts[r], at::full({2, 2}, 10.0f))) << broadcasts[r];
    EXPECT_TRUE(at::equal(gathers[r], at::tensor({7.0f, 7.0f, 8.0f, 8.0f}))) << gathers[r];
  }
}

// NCCL moves CUDA tensors only: the host's own CPU tensors (the ranks' vote, evaluation sums, a
// plugin's statistics) travel through the rank's device and come back in place.
TEST(Collectives, OneNcclRankTakesCpuAndCudaTensorsCuda) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  kiln::dist::GroupOptions options;
  options.backend = "nccl";
  options.port = 20000 + static_cast<int>((::getpid() + 7919) % 20000);
  options.timeout = std::chrono::seconds(60);
  kiln::dist::ProcessGroup group(options);
  kiln_call_context ctx;
  ctx.group = &group;

  at::Tensor sum = at::full({3}, 2.0f);
  DLTensor s = kiln::as_dltensor(sum);
  expect_ok(host()->allreduce(&ctx, &s, KILN_REDUCE_SUM));
  EXPECT_TRUE(sum.device().is_cpu());
  EXPECT_TRUE(at::equal(sum, at::full({3}, 2.0f))) << sum;

  at::Tensor strided = at::arange(6, at::kFloat).view({2, 3}).t();  // not contiguous
  group.allreduce(strided, "max");
  EXPECT_TRUE(at::equal(strided, at::arange(6, at::kFloat).view({2, 3}).t())) << strided;

  at::Tensor b = at::full({2, 2}, 4.0f);
  group.broadcast(b, 0);
  EXPECT_TRUE(at::equal(b, at::full({2, 2}, 4.0f))) << b;

  at::Tensor in = at::full({2}, 7.0f), out = at::zeros({2});
  group.allgather(in, out);
  EXPECT_TRUE(at::equal(out, in)) << out;

  at::Tensor on_device = at::full({4}, 3.0f, at::TensorOptions().device(at::kCUDA));
  group.allreduce(on_device, "sum");
  EXPECT_TRUE(at::equal(on_device.cpu(), at::full({4}, 3.0f)));

  // A plugin's host memory marked CUDA is refused before NCCL sees it (it would fault there).
  at::Tensor host_memory = at::full({4}, 1.0f);
  DLTensor mislabelled = kiln::as_dltensor(host_memory);
  mislabelled.device = {kDLCUDA, 0};
  kiln_status* refused = host()->allreduce(&ctx, &mislabelled, KILN_REDUCE_SUM);
  EXPECT_EQ(kiln::plugin::status_code(refused), KILN_ERR_INVALID_ARGUMENT);
  EXPECT_NE(kiln::plugin::take_message(refused).find("host memory"), std::string::npos);
  EXPECT_TRUE(at::equal(host_memory, at::full({4}, 1.0f)));
}

TEST(Collectives, SingleProcessIsTheIdentityAndChecksArguments) {
  kiln_call_context ctx;
  at::Tensor t = at::arange(4, at::kFloat);
  DLTensor v = kiln::as_dltensor(t);
  expect_ok(host()->allreduce(&ctx, &v, KILN_REDUCE_SUM));
  EXPECT_TRUE(at::equal(t, at::arange(4, at::kFloat)));
  expect_ok(host()->broadcast(&ctx, &v, 0));
  kiln_status* bad_root = host()->broadcast(&ctx, &v, 1);
  EXPECT_EQ(kiln::plugin::take_message(bad_root), "broadcast: root 1 is not a rank");
  at::Tensor out = at::zeros({4});
  DLTensor o = kiln::as_dltensor(out);
  expect_ok(host()->allgather(&ctx, &v, &o));
  EXPECT_TRUE(at::equal(out, t));
  at::Tensor small = at::zeros({3});
  DLTensor so = kiln::as_dltensor(small);
  EXPECT_EQ(kiln::plugin::take_message(host()->allgather(&ctx, &v, &so)),
            "allgather: output has 3 elements, expected 4");
  EXPECT_EQ(kiln::plugin::take_message(host()->allreduce(&ctx, &v, 9)),
            "allreduce: unknown reduction 9");
}

TEST(Collectives, AnUnreachableGroupFailsWithinItsTimeoutNamingTheAddress) {
  kiln::dist::GroupOptions options;
  options.port = 20000 + static_cast<int>((::getpid() + 7) % 20000);
  options.rank = 1;  // a client whose server never comes
  options.world_size = 2;
  options.timeout = std::chrono::seconds(2);
  try {
    kiln::dist::ProcessGroup group(options);
    ADD_FAILURE() << "joined a group that does not exist";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("cannot join the gloo process group at 127.0.0.1:" +
                                              std::to_string(options.port) + " (rank 1 of 2): ",
                                          0),
              0u)
        << e.what();
  }
}

}  // namespace
