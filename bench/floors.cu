// The floors of one GPU that symm's small collectives are measured against (docs/perf.md):
//   1. an empty kernel launched eagerly, back to back on one stream (us per launch);
//   2. the same kernel inside a CUDA graph (us per kernel of a replayed graph);
//   3. a flag bounced between two kernels running at once on two streams of this GPU (half a
//      round trip: the one-way latency a signal between two ranks sharing the GPU cannot beat).
// Build and run on a GPU machine (no multicast, no NCCL, no torch in this process):
//   nvcc -O2 -arch=sm_90 -o /tmp/floors bench/floors.cu && /tmp/floors
#include <cstdio>
#include <cuda_runtime.h>

#define CHECK(x)                                                                   \
  do {                                                                             \
    cudaError_t e_ = (x);                                                          \
    if (e_ != cudaSuccess) {                                                       \
      std::printf("%s failed: %s\n", #x, cudaGetErrorString(e_));                  \
      return 1;                                                                    \
    }                                                                              \
  } while (0)

__global__ void nothing() {}

// Round `i` of `n`: the opener writes i into `out` and waits for i in `in`; the answerer waits
// for i in `in` and writes it back into `out`.
__global__ void bounce(volatile unsigned long long* in, volatile unsigned long long* out, int n, int opener) {
  for (unsigned long long i = 1; i <= (unsigned long long)n; i++) {
    if (opener) {
      *out = i;
      __threadfence_system();
      while (*in < i) {
      }
    } else {
      while (*in < i) {
      }
      *out = i;
      __threadfence_system();
    }
  }
}

int main() {
  cudaStream_t s1, s2;
  CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  float ms = 0;

  // 1. Eager launches.
  const int launches = 20000;
  for (int i = 0; i < 200; i++) nothing<<<1, 32, 0, s1>>>();
  CHECK(cudaStreamSynchronize(s1));
  CHECK(cudaEventRecord(a, s1));
  for (int i = 0; i < launches; i++) nothing<<<1, 32, 0, s1>>>();
  CHECK(cudaEventRecord(b, s1));
  CHECK(cudaEventSynchronize(b));
  CHECK(cudaEventElapsedTime(&ms, a, b));
  const double eager = ms * 1000.0 / launches;

  // 2. Kernels of a replayed graph.
  const int per_graph = 1000, replays = 20;
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CHECK(cudaStreamBeginCapture(s1, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < per_graph; i++) nothing<<<1, 32, 0, s1>>>();
  CHECK(cudaStreamEndCapture(s1, &g));
  CHECK(cudaGraphInstantiate(&ge, g, 0));
  CHECK(cudaGraphLaunch(ge, s1));
  CHECK(cudaStreamSynchronize(s1));
  CHECK(cudaEventRecord(a, s1));
  for (int i = 0; i < replays; i++) CHECK(cudaGraphLaunch(ge, s1));
  CHECK(cudaEventRecord(b, s1));
  CHECK(cudaEventSynchronize(b));
  CHECK(cudaEventElapsedTime(&ms, a, b));
  const double graphed = ms * 1000.0 / (per_graph * replays);

  // 3. A flag between two kernels of this GPU.
  unsigned long long* flags = nullptr;
  CHECK(cudaMalloc(&flags, 256));
  const int rounds = 20000;
  double one_way = 0;
  for (int rep = 0; rep < 2; rep++) {  // the first pass warms up
    CHECK(cudaMemset(flags, 0, 256));
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaEventRecord(a, s1));
    bounce<<<1, 1, 0, s2>>>(flags, flags + 16, rounds, 0);
    bounce<<<1, 1, 0, s1>>>(flags + 16, flags, rounds, 1);
    CHECK(cudaEventRecord(b, s1));
    CHECK(cudaEventSynchronize(b));
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaEventElapsedTime(&ms, a, b));
    one_way = ms * 1000.0 / rounds / 2.0;
  }
  CHECK(cudaGetLastError());

  std::printf("| floor | us |\n|---|---|\n");
  std::printf("| empty kernel, eager launch | %.3f |\n", eager);
  std::printf("| empty kernel in a CUDA graph | %.3f |\n", graphed);
  std::printf("| flag one way between two kernels of this GPU | %.3f |\n", one_way);
  return 0;
}
