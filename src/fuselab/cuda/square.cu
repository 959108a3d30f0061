// Elementwise square y = x * x, the lab's CUDA C++ example (built by fuselab/cuda/_square.py).
// Bytes moved: read N elements, write N elements. One multiply per element.
// Vectorized: each thread moves 16 bytes per load/store (4 fp32 or 8 bf16/fp16), grid-stride
// loop with 64-bit indices; a scalar loop handles the tail and misaligned pointers.
// Only torch/types.h and the CUDA runtime are included (no c10/cuda), so the file also compiles
// against the CPU torch wheel's headers in CI; the caller passes the current stream and device.
#include <torch/types.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <algorithm>
#include <cstdint>

namespace {

// Explicit conversions: PyTorch builds extensions with -D__CUDA_NO_HALF_CONVERSIONS__ and
// -D__CUDA_NO_BFLOAT16_CONVERSIONS__, which remove the implicit __half/__nv_bfloat16 <-> float casts.
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_float(float f);
template <> __device__ __forceinline__ float from_float<float>(float f) { return f; }
template <> __device__ __forceinline__ __half from_float<__half>(float f) { return __float2half_rn(f); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float f) { return __float2bfloat16_rn(f); }

template <typename T>
__device__ __forceinline__ T square_one(T v) {
  const float f = to_float(v);  // compute in fp32, round once on store (matches torch.square)
  return from_float<T>(f * f);
}

template <typename T>
struct alignas(16) Pack {
  static constexpr int kSize = 16 / sizeof(T);
  T v[kSize];
};

// x: (n,) contiguous input; y: (n,) contiguous output; both 16-byte aligned when vectorized
template <typename T>
__global__ void square_vec_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  using P = Pack<T>;
  const int64_t n_vec = n / P::kSize;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t start = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const P* xv = reinterpret_cast<const P*>(x);
  P* yv = reinterpret_cast<P*>(y);
  for (int64_t i = start; i < n_vec; i += stride) {
    P p = xv[i];
#pragma unroll
    for (int k = 0; k < P::kSize; ++k) p.v[k] = square_one(p.v[k]);
    yv[i] = p;
  }
  for (int64_t i = n_vec * P::kSize + start; i < n; i += stride) y[i] = square_one(x[i]);
}

// x: (n,) input; y: (n,) output; any alignment
template <typename T>
__global__ void square_scalar_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    y[i] = square_one(x[i]);
  }
}

template <typename T>
void launch(const torch::Tensor& x, torch::Tensor& y, cudaStream_t stream) {
  const int64_t n = x.numel();
  if (n == 0) return;
  constexpr int kThreads = 256;
  const T* xp = reinterpret_cast<const T*>(x.data_ptr());
  T* yp = reinterpret_cast<T*>(y.data_ptr());
  const bool aligned = (reinterpret_cast<uintptr_t>(xp) % 16 == 0) && (reinterpret_cast<uintptr_t>(yp) % 16 == 0);
  const int64_t work = aligned ? (n + Pack<T>::kSize - 1) / Pack<T>::kSize : n;
  int sms = 0;
  TORCH_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, x.get_device()) == cudaSuccess,
              "square_out: cannot read the SM count");
  // enough blocks to fill the chip several times over, never more than the work needs
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>((work + kThreads - 1) / kThreads, sms * 16));
  if (aligned) {
    square_vec_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(xp, yp, n);
  } else {
    square_scalar_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(xp, yp, n);
  }
  const cudaError_t err = cudaGetLastError();
  TORCH_CHECK(err == cudaSuccess, cudaGetErrorString(err));  // one message part (see bias_act.cu)
}

}  // namespace

// y = x * x into a preallocated y (same shape and dtype, both contiguous, same CUDA device).
// stream: the cudaStream_t to launch on, as an integer (torch.cuda.current_stream().cuda_stream);
// the caller makes x's device current.
void square_out(torch::Tensor x, torch::Tensor y, int64_t stream) {
  TORCH_CHECK(x.is_cuda() && y.is_cuda(), "square_out: x and y must be CUDA tensors");
  TORCH_CHECK(x.is_contiguous() && y.is_contiguous(), "square_out: x and y must be contiguous");
  TORCH_CHECK(x.sizes() == y.sizes() && x.scalar_type() == y.scalar_type(), "square_out: y must match x");
  TORCH_CHECK(x.get_device() == y.get_device(), "square_out: x and y must be on the same device");
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  switch (x.scalar_type()) {
    case torch::kFloat: launch<float>(x, y, s); break;
    case torch::kHalf: launch<__half>(x, y, s); break;
    case torch::kBFloat16: launch<__nv_bfloat16>(x, y, s); break;
    default: TORCH_CHECK(false, "square_out: dtype must be float32, float16 or bfloat16");
  }
}
