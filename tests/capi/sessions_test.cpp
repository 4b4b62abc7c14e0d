// Sessions of the C API as a program (a Python process, say) holds them: two one-process
// sessions in one process are independent, stepped in turn each ending with the very weights it
// ends with alone; and a session changes nothing process-wide (c10's CPU allocator, torch's
// threads, the SIGINT handler, the program's random generator) unless its options ask.
#include <ATen/Context.h>
#include <ATen/Functions.h>
#include <ATen/Parallel.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <kiln/kiln.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

namespace {

const kiln_api* api() {
  static const kiln_api* table = kiln_get_api(1);
  return table;
}

// The status's message, the status released; "" for success.
std::string message(kiln_status* status) {
  if (status == nullptr) return "";
  std::string text = std::string("error ") + std::to_string(api()->status_code(status)) + ": " +
                     api()->status_message(status);
  api()->status_release(status);
  return text;
}

std::string work_dir() {
  static const std::string dir = [] {
    char pattern[] = "/tmp/kiln-sessions.XXXXXX";
    const char* made = mkdtemp(pattern);
    return std::string(made != nullptr ? made : "/tmp");
  }();
  return dir;
}

// An MLP with batch-norm layers (the pipeline's norm plugin, reached through the model's create
// call) and dropout (the CPU generator), on synthetic data; `name` picks the output folder.
std::string pipeline(const std::string& name, int seed, double momentum, double lr,
                     const std::string& run_extra = "") {
  return "[run]\nepochs = 1\nseed = " + std::to_string(seed) +
         "\ncheckpoints = false\ntensorboard = false\neval = false\noutput_dir = \"" + work_dir() +
         "/" + name + "\"\n" + run_extra +
         "[data]\ndataset = \"synthetic\"\nsynthetic_train = 256\nsynthetic_test = 64\n"
         "synthetic_classes = 4\nchannels = 1\nheight = 6\nwidth = 6\nbatch_size = 32\n"
         "workers = 0\n"
         "[model]\nname = \"mlp\"\nhidden = [24, 16]\nnorm_layers = true\ndropout = 0.2\n"
         "[norm]\nname = \"batchnorm\"\nmomentum = " +
         std::to_string(momentum) + "\n[optimizer]\nname = \"sgd\"\nlr = " + std::to_string(lr) +
         "\nmomentum = 0.9\n[lr_policy]\nname = \"constant\"\n";
}

kiln_session_options options(uint32_t process_settings = 0) {
  kiln_session_options o{};
  o.struct_size = sizeof o;
  o.log_level = KILN_SESSION_LOG_WARN;
  o.process_settings = process_settings;
  return o;
}

kiln_session* create(const std::string& toml, const std::string& name,
                     uint32_t process_settings = 0) {
  const kiln_session_options o = options(process_settings);
  kiln_session* s = nullptr;
  EXPECT_EQ(message(api()->session_create_from_string(toml.c_str(), name.c_str(), &o, &s)), "");
  return s;
}

bool ready(kiln_session* s) {
  kiln_progress p{};
  p.struct_size = sizeof p;
  EXPECT_EQ(message(api()->session_progress(s, &p)), "");
  return p.state == KILN_SESSION_READY;
}

// The bytes of the session's model weights now (model.safetensors of a checkpoint: the tensors
// and the step, nothing that differs between two equal runs).
std::string weights(kiln_session* s) {
  const char* folder = nullptr;
  EXPECT_EQ(message(api()->session_save_checkpoint(s, &folder)), "");
  if (folder == nullptr) return "";
  std::ifstream in(std::string(folder) + "/model.safetensors", std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string alone(const std::string& toml, const std::string& name) {
  kiln_session* s = create(toml, name);
  if (s == nullptr) return "";
  int steps = 0;
  while (ready(s)) {
    EXPECT_EQ(message(api()->session_step(s)), "");
    ++steps;
  }
  EXPECT_EQ(steps, 8);
  std::string w = weights(s);
  api()->session_destroy(s);
  return w;
}

TEST(Sessions, TwoSessionsSteppedInTurnEachEndWithTheWeightsTheyGetAlone) {
  const std::string a_toml = pipeline("a", 3, 0.1, 0.05);
  const std::string b_toml = pipeline("b", 11, 0.3, 0.2);
  const std::string a_alone = alone(a_toml, "a_alone");
  const std::string b_alone = alone(b_toml, "b_alone");
  ASSERT_FALSE(a_alone.empty());
  ASSERT_FALSE(b_alone.empty());
  ASSERT_NE(a_alone, b_alone);

  kiln_session* a = create(a_toml, "a_turns");
  kiln_session* b = create(b_toml, "b_turns");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  // The program draws from the generator between the steps too, as a Python loop may.
  while (ready(a) || ready(b)) {
    if (ready(a)) {
      ASSERT_EQ(message(api()->session_step(a)), "");
    }
    (void)at::rand({5});
    if (at::hasCUDA()) (void)at::rand({5}, at::Device(at::kCUDA));
    if (ready(b)) {
      ASSERT_EQ(message(api()->session_step(b)), "");
    }
  }
  EXPECT_TRUE(weights(a) == a_alone) << "session a's weights changed with b beside it";
  EXPECT_TRUE(weights(b) == b_alone) << "session b's weights changed with a beside it";
  api()->session_destroy(a);
  api()->session_destroy(b);
}

void on_sigint(int) {}

TEST(Sessions, ASessionChangesNothingProcessWideUnlessAsked) {
  struct sigaction mine {};
  mine.sa_handler = on_sigint;
  sigemptyset(&mine.sa_mask);
  ASSERT_EQ(sigaction(SIGINT, &mine, nullptr), 0);
  at::set_num_threads(3);
  c10::Allocator* allocator = c10::GetCPUAllocator();
  at::manual_seed(42);
  const at::Tensor expected = at::rand({4});
  at::manual_seed(42);

  // threads = 1 and tf32: what the pipeline asks, left alone without the opt-in. On the CPU,
  // whose tensor memory only the counting allocator knows (a GPU's caching allocator counts
  // its own without any process-wide change).
  kiln_session* s = create(
      pipeline("quiet", 3, 0.1, 0.05, "device = \"cpu\"\nthreads = 1\ntf32 = \"on\"\n"), "quiet");
  ASSERT_NE(s, nullptr);
  ASSERT_EQ(message(api()->session_step(s)), "");
  EXPECT_EQ(c10::GetCPUAllocator(), allocator);
  EXPECT_EQ(at::get_num_threads(), 3);
  EXPECT_FALSE(at::globalContext().allowTF32CuBLAS());
  struct sigaction now {};
  ASSERT_EQ(sigaction(SIGINT, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, &on_sigint);
  EXPECT_TRUE(at::equal(at::rand({4}), expected))
      << "the session drew from the program's generator";
  // The CPU's tensor memory is unknown without the counting allocator: NaN, not 0.
  kiln_metrics m{};
  m.struct_size = sizeof m;
  ASSERT_EQ(message(api()->session_last_metrics(s, KILN_METRICS_STEP, &m)), "");
  EXPECT_TRUE(std::isnan(m.tensor_mb) && std::isnan(m.tensor_peak_mb) &&
              std::isnan(m.activation_mb));
  EXPECT_TRUE(std::isfinite(m.loss));
  api()->session_destroy(s);
  EXPECT_EQ(c10::GetCPUAllocator(), allocator);

  // Asked, the session makes them all, as `kiln run` does; its handlers go with it.
  s = create(pipeline("asked", 3, 0.1, 0.05, "threads = 1\n"), "asked", KILN_PROCESS_ALL);
  ASSERT_NE(s, nullptr);
  ASSERT_EQ(sigaction(SIGINT, nullptr, &now), 0);
  EXPECT_NE(now.sa_handler, &on_sigint);
  // One session at a time holds the signals.
  kiln_session* second = nullptr;
  const kiln_session_options o = options(KILN_PROCESS_SIGNALS);
  kiln_status* refused = api()->session_create_from_string(pipeline("second", 3, 0.1, 0.05).c_str(),
                                                           "second", &o, &second);
  const int32_t refused_code = api()->status_code(refused);
  EXPECT_EQ(refused_code, KILN_ERR_FAILED_PRECONDITION) << message(refused);
  EXPECT_EQ(second, nullptr);
  ASSERT_EQ(message(api()->session_step(s)), "");
  EXPECT_NE(c10::GetCPUAllocator(), allocator);
  EXPECT_EQ(at::get_num_threads(), 1);
  ASSERT_EQ(message(api()->session_last_metrics(s, KILN_METRICS_STEP, &m)), "");
  EXPECT_TRUE(std::isfinite(m.tensor_mb) && m.tensor_mb > 0.0);
  api()->session_destroy(s);
  ASSERT_EQ(sigaction(SIGINT, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, &on_sigint);

  // Unknown bits are the caller's mistake.
  const kiln_session_options bad = options(1u << 20);
  kiln_status* st = api()->session_create_from_string(pipeline("bad", 3, 0.1, 0.05).c_str(), "bad",
                                                      &bad, &second);
  const int32_t code = api()->status_code(st);
  EXPECT_EQ(code, KILN_ERR_INVALID_ARGUMENT) << message(st);
}

}  // namespace
