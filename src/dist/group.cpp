#include "ltrain/dist/group.h"

#include <chrono>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if LTRAIN_WITH_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#if LTRAIN_WITH_NCCL
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL
#endif
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "ltrain/core/errors.h"
#include "ltrain/core/torch_compat.h"

namespace ltrain::dist {

namespace {

/// An environment variable as an integer in [lo, hi]; ConfigError naming it otherwise.
int64_t integer_variable(const char* name, const char* text, int64_t lo, int64_t hi) {
  char* end = nullptr;
  const long long value = std::strtoll(text, &end, 10);
  if (end == text || *end != '\0' || value < lo || value > hi)
    throw ConfigError(fmt::format("environment variable {}=\"{}\" is not an integer in {}..{}; launch with torchrun "
                                  "or `ltrain launch -n N -- train ...`, which set it",
                                  name, text, lo, hi));
  return value;
}

PeerError peer_error(int64_t rank, const std::string& what, const std::exception& error) {
  return PeerError(fmt::format("rank {}: {} failed ({}): another process stopped, hung past distributed.timeout_s, or "
                               "cannot be reached; its own log says why",
                               rank, what, compat::first_line(error.what())));
}

/// TORCHELASTIC_USE_AGENT_STORE as torchrun writes it (Python's str of a bool); ConfigError otherwise.
bool boolean_variable(const char* name, const char* text) {
  const std::string value = text;
  if (value == "True" || value == "true" || value == "1") return true;
  if (value == "False" || value == "false" || value == "0" || value.empty()) return false;
  throw ConfigError(fmt::format("environment variable {}=\"{}\" is neither True nor False; torchrun sets it, or "
                                "leave it unset",
                                name, text));
}

}  // namespace

std::optional<Environment> read_environment() {
  const char* world = std::getenv("WORLD_SIZE");
  if (!world) return std::nullopt;
  Environment e;
  e.world_size = integer_variable("WORLD_SIZE", world, 1, 1 << 16);
  const char* rank = std::getenv("RANK");
  if (!rank) throw ConfigError("WORLD_SIZE is set but RANK is not; launch with torchrun or `ltrain launch`, which set both");
  e.rank = integer_variable("RANK", rank, 0, e.world_size - 1);
  e.local_world_size = e.world_size;
  if (const char* local_size = std::getenv("LOCAL_WORLD_SIZE"))
    e.local_world_size = integer_variable("LOCAL_WORLD_SIZE", local_size, 1, e.world_size);
  // Without LOCAL_RANK, processes started by hand on one machine: one GPU each, by rank.
  e.local_rank = e.rank;
  if (const char* local = std::getenv("LOCAL_RANK"))
    e.local_rank = integer_variable("LOCAL_RANK", local, 0, e.local_world_size - 1);
  if (e.local_rank >= e.local_world_size)
    throw ConfigError(fmt::format("RANK {} without LOCAL_RANK, but LOCAL_WORLD_SIZE is {}; launch with torchrun or "
                                  "`ltrain launch`, which set both",
                                  e.rank, e.local_world_size));
  for (const char* name : {"GROUP_RANK", "NODE_RANK"})
    if (const char* node = std::getenv(name)) {
      e.node_rank = integer_variable(name, node, 0, e.world_size - 1);
      break;
    }
  if (const char* addr = std::getenv("MASTER_ADDR")) e.master_addr = addr;
  if (const char* port = std::getenv("MASTER_PORT")) e.master_port = integer_variable("MASTER_PORT", port, 1, 65535);
  if (const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE"))
    e.agent_store = boolean_variable("TORCHELASTIC_USE_AGENT_STORE", agent);
  if (const char* restarts = std::getenv("TORCHELASTIC_RESTART_COUNT"))
    e.restart_count = integer_variable("TORCHELASTIC_RESTART_COUNT", restarts, 0, std::numeric_limits<int32_t>::max());
  return e;
}

// ---- Pending ------------------------------------------------------------------------------------

struct Pending::Work {
  c10::intrusive_ptr<c10d::Work> work;
};

void Pending::wait() {
  if (!work_) return;
  try {
    work_->work->wait();
  } catch (const std::exception& error) {
    work_.reset();
    throw peer_error(rank_, "a collective with the other processes", error);
  }
  work_.reset();
}

// ---- Group --------------------------------------------------------------------------------------

struct Group::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<compat::CollectiveBackend> backend;
};

Group::Group(const Environment& environment, const GroupOptions& options, const torch::Device& device)
    : environment_(environment), impl_(std::make_unique<Impl>()) {
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(options.timeout_s * 1000.0));
  config::DistBackend backend = options.backend;
  if (backend == config::DistBackend::automatic)
    backend = device.is_cuda() ? config::DistBackend::nccl : config::DistBackend::gloo;
  if (backend == config::DistBackend::nccl && !device.is_cuda())
    throw ConfigError(fmt::format("distributed.backend \"nccl\" needs CUDA devices and run.device is {}; use \"gloo\" "
                                  "or \"auto\"",
                                  device.str()));
  backend_name_ = config::to_string(backend);

  // Rank 0 serves the rendezvous's TCPStore and the others connect to it; under torchrun with its
  // agent's store (which already listens at MASTER_PORT) every rank connects to that one.
  serves_store_ = environment.rank == 0 && !environment.agent_store;
  c10::intrusive_ptr<c10d::TCPStore> store;
  try {
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<std::uint16_t>(environment.master_port);
    store_options.isServer = serves_store_;
    store_options.numWorkers = static_cast<std::size_t>(environment.world_size);
    store_options.waitWorkers = false;  // below, with a message of its own
    store_options.timeout = timeout;
    store = c10::make_intrusive<c10d::TCPStore>(environment.master_addr, store_options);
  } catch (const std::exception& error) {
    if (serves_store_)
      throw PeerError(fmt::format("rank 0: cannot serve the rendezvous at port {} ({}): another program, or another "
                                  "run, uses it; choose another port (ltrain launch --master-port, or MASTER_PORT)",
                                  environment.master_port, compat::first_line(error.what())));
    throw PeerError(fmt::format("rank {}: cannot reach the rendezvous at {}:{} within distributed.timeout_s ({:g} s) "
                                "({}): start {} and check that MASTER_ADDR and MASTER_PORT (ltrain launch "
                                "--master-addr, --master-port) name its machine and port, open to this one",
                                environment.rank, environment.master_addr, environment.master_port,
                                options.timeout_s, compat::first_line(error.what()),
                                environment.agent_store ? "torchrun on the first node" : "the process of rank 0"));
  }
  // The server counts the ranks that connected and waits for all; the agent's store keeps its own
  // count, left alone.
  if (!environment.agent_store) {
    try {
      store->waitForWorkers();
    } catch (const std::exception& error) {
      throw peer_error(environment.rank,
                       fmt::format("waiting for all {} processes at the rendezvous at {}:{}", environment.world_size,
                                   environment.master_addr, environment.master_port),
                       error);
    }
  }
  // The agent's store outlives a restart of the workers: each start's keys under a prefix of its own.
  if (environment.agent_store)
    impl_->store = c10::make_intrusive<c10d::PrefixStore>(fmt::format("ltrain/start-{}", environment.restart_count),
                                                          store);
  else
    impl_->store = store;

  const int rank = static_cast<int>(environment.rank);
  const int size = static_cast<int>(environment.world_size);
  try {
    if (backend == config::DistBackend::gloo) {
#if LTRAIN_WITH_GLOO
      auto gloo_options = c10d::ProcessGroupGloo::Options::create(timeout);
      // On one host the loopback interface always works; elsewhere, GLOO_SOCKET_IFNAME or the
      // interface the host name resolves to, as torch.distributed does.
      if (const char* interface = std::getenv("GLOO_SOCKET_IFNAME")) {
        gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(interface));
      } else if (environment.master_addr == "127.0.0.1" || environment.master_addr == "localhost") {
        gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      } else {
        gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      }
      impl_->backend = c10::make_intrusive<c10d::ProcessGroupGloo>(impl_->store, rank, size, gloo_options);
#else
      throw ConfigError("distributed.backend \"gloo\": this ltrain was built without gloo's headers; install "
                        "libgloo-dev (Debian) and build again");
#endif
    } else {
#if LTRAIN_WITH_NCCL
      c10::cuda::set_device(device.index());
      auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
      nccl_options->timeout = timeout;
      impl_->backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(impl_->store, rank, size, nccl_options);
#else
      throw ConfigError("distributed.backend \"nccl\": this ltrain was built without NCCL (a CPU-only LibTorch, or "
                        "nccl.h not found at build time); use \"gloo\"");
#endif
    }
  } catch (const UserError&) {
    throw;
  } catch (const std::exception& error) {
    throw peer_error(environment.rank, fmt::format("creating the {} process group", backend_name_), error);
  }
}

Group::~Group() {
  if (impl_->backend) compat::abort_backend(*impl_->backend);
}

template <class Issue>
Pending Group::start(const char* what, Issue&& issue) {
  if (!impl_->backend) throw std::logic_error(fmt::format("{} after the process group was closed", what));
  try {
    return Pending(std::make_shared<Pending::Work>(Pending::Work{issue()}), environment_.rank);
  } catch (const std::exception& error) {
    throw peer_error(environment_.rank, what, error);
  }
}

Pending Group::all_reduce_sum(std::vector<torch::Tensor> tensors) {
  return start("a collective with the other processes", [&] {
    c10d::AllreduceOptions options;
    options.reduceOp = c10d::ReduceOp::SUM;
    return impl_->backend->allreduce(tensors, options);
  });
}

void Group::broadcast_from_main(std::vector<torch::Tensor> tensors) {
  try {
    c10d::BroadcastOptions options;
    options.rootRank = 0;
    // One tensor per call: Gloo broadcasts a list as if each tensor lived on a separate device.
    // Collectives need dense tensors: channels_last weights travel through a contiguous copy.
    torch::NoGradGuard no_grad;
    for (const auto& tensor : tensors) {
      const torch::Tensor target = tensor.detach();
      std::vector<torch::Tensor> one{target.is_contiguous() ? target : target.contiguous()};
      start("a broadcast from rank 0", [&] { return impl_->backend->broadcast(one, options); }).wait();
      if (!one[0].is_same(target)) target.copy_(one[0]);
    }
  } catch (const PeerError&) {
    throw;
  } catch (const std::exception& error) {
    throw peer_error(environment_.rank, "a broadcast from rank 0", error);
  }
}

void Group::barrier() {
  start("a barrier", [&] { return impl_->backend->barrier(); }).wait();
}

void Group::close() {
  barrier();
  try {
    // Shut down before destroyed: NCCL's destructor would otherwise abort the communicators,
    // after a warning that destroy_process_group() was not called. Any CUDA graph that captured
    // this group's collectives must be gone first: with one alive, the NCCL teardown does not
    // return, so the trainer destroys its graphs before calling close().
    compat::shut_down_backend(*impl_->backend);
    impl_->backend.reset();
    if (environment_.agent_store) return;  // torchrun's agent keeps its store to the end
    const std::string closed = "ltrain/closed";
    if (!is_main()) {
      impl_->store->add(closed, 1);
      return;
    }
    // Bounded: a rank that died after the barrier must not keep rank 0 from exiting.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (impl_->store->add(closed, 0) < size() - 1 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  } catch (const std::exception& error) {
    throw peer_error(environment_.rank, "closing the process group", error);
  }
}

std::vector<std::string> Group::all_gather_text(const std::string& key, const std::string& text) {
  std::vector<std::string> texts(static_cast<size_t>(size()));
  try {
    impl_->store->set(fmt::format("ltrain/{}/{}", key, rank()), std::vector<uint8_t>(text.begin(), text.end()));
    for (int64_t r = 0; r < size(); ++r) {
      const std::vector<uint8_t> bytes = impl_->store->get(fmt::format("ltrain/{}/{}", key, r));
      texts[static_cast<size_t>(r)].assign(bytes.begin(), bytes.end());
    }
  } catch (const std::exception& error) {
    throw peer_error(environment_.rank, fmt::format("exchanging \"{}\" through the store", key), error);
  }
  return texts;
}

// ---- Differentiable all-reduce -------------------------------------------------------------------

namespace {

struct AllReduceSum : public torch::autograd::Function<AllReduceSum> {
  static torch::Tensor forward(torch::autograd::AutogradContext* context, const torch::Tensor& values, Group* group) {
    context->saved_data["group"] = reinterpret_cast<int64_t>(group);
    torch::Tensor summed = values.clone();
    group->all_reduce_sum({summed}).wait();
    return summed;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* context,
                                                 torch::autograd::variable_list gradients) {
    auto* group = reinterpret_cast<Group*>(context->saved_data["group"].toInt());
    torch::Tensor summed = gradients[0].clone();
    group->all_reduce_sum({summed}).wait();
    return {summed, torch::Tensor()};
  }
};

}  // namespace

torch::Tensor all_reduce_sum_differentiable(Group& group, const torch::Tensor& values) {
  return AllReduceSum::apply(values, &group);
}

}  // namespace ltrain::dist
