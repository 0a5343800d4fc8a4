// Note [Gradient buckets] and the differentiable sum over processes (Note [Batch statistics over
// processes]), with the two ranks of one world on two threads of this process (Gloo on
// localhost): every rank ends with the gradients of both ranks' losses, as computed in one
// place, whatever bucket a tensor lands in. (Whole runs over processes: tests/distributed/.)

#include "sparsebit/core/gradient_sync.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <thread>

#include "sparsebit/core/distributed.h"

namespace sparsebit {
namespace {

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw std::runtime_error("no free port");
  ::close(fd);
  return ntohs(a.sin_port);
}

/// Runs body(group, rank) for ranks 0 and 1 of a world of two, each on its own thread.
template <class Body>
void on_two_ranks(Body&& body) {
  const int port = free_port();
  std::array<std::string, 2> errors;
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      try {
        DistributedSettings s;
        s.rank = r;
        s.world_size = 2;
        s.master_port = port;
        s.timeout = std::chrono::seconds(60);
        Distributed group(s, "cpu");
        body(group, r);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

// Tensors of 2.8 MB, 1.6 MB, 1.2 MB and two small ones (one never used): several buckets.
std::vector<at::Tensor> initial_params() {
  at::manual_seed(3);
  return {at::randn({700000}), at::randn({400000}), at::randn({300, 1000}), at::randn({10}), at::randn({5})};
}

at::Tensor loss_of(const std::vector<at::Tensor>& p, const std::vector<at::Tensor>& x) {
  return (p[0] * x[0]).sin().sum() + (p[1] * x[1]).sum().pow(2) * 1e-6 + (p[2] * x[2]).tanh().sum() +
         (p[3] * x[3]).exp().sum();  // p[4] gets no gradient
}

// Drawn before the ranks' threads start: the generator is shared.
const std::vector<at::Tensor>& data_of(int rank, int step) {
  static const auto all = [] {
    std::vector<std::vector<at::Tensor>> out;
    at::manual_seed(100);
    for (int i = 0; i < 8; ++i)
      out.push_back({at::randn({700000}), at::randn({400000}), at::randn({300, 1000}), at::randn({10})});
    return out;
  }();
  return all.at(static_cast<std::size_t>(4 * rank + step));
}

std::vector<at::Tensor> trainable(const std::vector<at::Tensor>& values) {
  std::vector<at::Tensor> out;
  for (const auto& v : values) out.push_back(v.clone().set_requires_grad(true));
  return out;
}

TEST(GradientSync, EveryRankGetsTheGradientOfAllRanksLossesInEveryBucket) {
  const auto start = initial_params();
  constexpr int kSteps = 3;
  // One place: the gradient of rank 0's loss plus rank 1's, step by step (parameters fixed).
  std::vector<std::vector<at::Tensor>> expected;
  for (int step = 0; step < kSteps; ++step) {
    auto p = trainable(start);
    (loss_of(p, data_of(0, step)) + loss_of(p, data_of(1, step))).backward();
    std::vector<at::Tensor> grads;
    for (auto& t : p) grads.push_back(t.grad().defined() ? t.grad().clone() : at::zeros_like(t));
    expected.push_back(grads);
  }
  std::array<std::size_t, 2> buckets{};
  on_two_ranks([&](Distributed& group, int rank) {
    auto p = trainable(start);
    GradientSync sync(group, p);
    for (int step = 0; step < kSteps; ++step) {
      for (auto& t : p) t.mutable_grad() = at::Tensor();
      sync.begin_step("step " + std::to_string(step));
      loss_of(p, data_of(rank, step)).backward();
      sync.finish_step();
      for (std::size_t i = 0; i < p.size(); ++i) {
        ASSERT_TRUE(p[i].grad().defined()) << "rank " << rank << " step " << step << " tensor " << i;
        EXPECT_TRUE(at::allclose(p[i].grad(), expected[static_cast<std::size_t>(step)][i], 1e-5, 1e-6))
            << "rank " << rank << " step " << step << " tensor " << i;
      }
    }
    buckets[static_cast<std::size_t>(rank)] = sync.buckets();
  });
  // The first bucket (about 1 MiB) takes the first tensor to arrive alone; the rest share one.
  EXPECT_GE(buckets[0], 2u);
  EXPECT_EQ(buckets[0], buckets[1]);
}

TEST(GradientSync, ARankWithoutBackwardStillSumsZeros) {
  const auto start = initial_params();
  std::vector<at::Tensor> expected;
  {
    auto p = trainable(start);
    loss_of(p, data_of(0, 1)).backward();
    for (auto& t : p) expected.push_back(t.grad().defined() ? t.grad().clone() : at::zeros_like(t));
  }
  on_two_ranks([&](Distributed& group, int rank) {
    auto p = trainable(start);
    GradientSync sync(group, p);
    for (int step = 0; step < 2; ++step) {  // step 1: buckets in use; rank 1 had no samples
      for (auto& t : p) t.mutable_grad() = at::Tensor();
      sync.begin_step("step " + std::to_string(step));
      if (rank == 0) loss_of(p, data_of(0, 1)).backward();
      sync.finish_step();
      for (std::size_t i = 0; i < p.size(); ++i)
        EXPECT_TRUE(at::allclose(p[i].grad(), expected[i], 1e-5, 1e-6)) << "rank " << rank << " tensor " << i;
    }
  });
}

TEST(GradientSync, TheSumOverProcessesIsDifferentiable) {
  // y = sum over ranks of x_r w; rank r's loss is sum(y c_r). The gradient of w on rank r is
  // x_r (c_0 + c_1): every rank's loss depends on every rank's input.
  at::manual_seed(9);
  const at::Tensor w0 = at::randn({6});
  const std::array<at::Tensor, 2> x{at::randn({6}), at::randn({6})}, c{at::randn({6}), at::randn({6})};
  on_two_ranks([&](Distributed& group, int rank) {
    const auto r = static_cast<std::size_t>(rank);
    at::Tensor w = w0.clone().set_requires_grad(true);
    at::Tensor y = group.sum_with_gradient(x[r] * w, "test");
    EXPECT_TRUE(at::allclose(y, (x[0] + x[1]) * w0, 1e-6, 1e-7)) << "rank " << rank;
    (y * c[r]).sum().backward();
    EXPECT_TRUE(at::allclose(w.grad(), x[r] * (c[0] + c[1]), 1e-6, 1e-7)) << "rank " << rank;
  });
}

}  // namespace
}  // namespace sparsebit
