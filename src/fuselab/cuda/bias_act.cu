// fuselab CUDA backend of the fused epilogue y = act(x + alpha * residual + bias), forward and backward.
//
// Tensors are 2-D [M, N] with a unit inner stride and any row stride (the Python wrapper guarantees it);
// residual, bias and the saved tensor have x's dtype (float32, float16 or bfloat16). Math in float.
// Vector path: 16-byte loads/stores (8 bf16/fp16, 4 fp32 per access) when N, every row stride and
// every base pointer allow it; otherwise the same kernels with one element per access.
//
// forward : read x, residual (M*N), bias (N); write y (M*N) [+ pre-activation z (M*N) for the backward]
// backward: read grad, saved (M*N); write grad_x, grad_residual (M*N, those wanted) + per-block column
//           partial sums [grid_m, N] of dz (fixed-order reduction in shared memory, no atomics), then a second
//           small kernel sums the partial rows in order: the bias gradient is deterministic.

#include <torch/extension.h>

#include <ATen/OpMathType.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <type_traits>
#include <vector>

namespace {

constexpr int kNone = 0, kRelu = 1, kRelu2 = 2, kSigmoid = 3, kSilu = 4, kGelu = 5, kGeluTanh = 6;

template <typename T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

template <typename T, int V>
__device__ __forceinline__ Vec<T, V> load_vec(const T* p) {
  return *reinterpret_cast<const Vec<T, V>*>(p);
}

template <typename T, int V>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, V>& v) {
  *reinterpret_cast<Vec<T, V>*>(p) = v;
}

// Vectors of T to floats and back. Conversion instructions (cvt.f32.bf16, cvt.rn.bf16.f32) issue at a quarter of
// the arithmetic rate, on the pipe that also runs ex2 and rcp: at five per element (x, residual, bias in; y, z out)
// they bound the bf16 forward (the Triton kernel packs them). So bf16 widens by a shift (its bits are a float's upper
// half), and pairs narrow in one cvt.rn.bf16x2.f32 / cvt.rn.f16x2.f32, rounding to nearest even as the scalar
// conversion does.
template <typename T, int V>
__device__ __forceinline__ void to_float(const Vec<T, V>& in, at::opmath_type<T> (&out)[V]) {
#pragma unroll
  for (int k = 0; k < V; ++k) {
    if constexpr (std::is_same_v<T, c10::BFloat16>) {
      out[k] = __uint_as_float(static_cast<uint32_t>(in.v[k].x) << 16);
    } else {
      out[k] = static_cast<at::opmath_type<T>>(in.v[k]);
    }
  }
}

template <typename T, int V>
__device__ __forceinline__ Vec<T, V> from_float(const at::opmath_type<T> (&in)[V]) {
  Vec<T, V> out;
  if constexpr (V % 2 == 0 && std::is_same_v<T, c10::BFloat16>) {
#pragma unroll
    for (int k = 0; k < V; k += 2) {
      const __nv_bfloat162 pair = __floats2bfloat162_rn(in[k], in[k + 1]);
      out.v[k].x = __bfloat16_as_ushort(pair.x);
      out.v[k + 1].x = __bfloat16_as_ushort(pair.y);
    }
  } else if constexpr (V % 2 == 0 && std::is_same_v<T, c10::Half>) {
#pragma unroll
    for (int k = 0; k < V; k += 2) {
      const __half2 pair = __floats2half2_rn(in[k], in[k + 1]);
      out.v[k].x = __half_as_ushort(pair.x);
      out.v[k + 1].x = __half_as_ushort(pair.y);
    }
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) out.v[k] = static_cast<T>(in[k]);
  }
  return out;
}

// 1 / (1 + e^-z) with the fast intrinsics (ex2.approx and div.approx: a few ulp, like Triton's exp and fp32
// division; IEEE expf and division made gelu_tanh's forward compute-bound at bf16). e^-z overflows to inf for
// z < -88 and the quotient is then 0.
__device__ __forceinline__ float sigmoid(float z) { return __fdividef(1.0f, 1.0f + __expf(-z)); }

// act(z); tanh(u) = 2 sigmoid(2u) - 1, so gelu_tanh(z) = z * sigmoid(2u), u = sqrt(2/pi) (z + 0.044715 z^3).
// relu keeps NaN, as torch.relu does (z > 0 ? z : 0 would turn it into 0)
template <int ACT, typename A>
__device__ __forceinline__ A act_fwd(A z) {
  if constexpr (ACT == kNone) {
    return z;
  } else if constexpr (ACT == kRelu) {
    return z < A(0) ? A(0) : z;
  } else if constexpr (ACT == kRelu2) {
    A r = z < A(0) ? A(0) : z;
    return r * r;
  } else if constexpr (ACT == kSigmoid) {
    return sigmoid(z);
  } else if constexpr (ACT == kSilu) {
    return z * sigmoid(z);
  } else if constexpr (ACT == kGelu) {
    return A(0.5) * z * (A(1) + erf(z * A(0.7071067811865476)));
  } else {
    return z * sigmoid(A(1.5957691216057308) * (z + A(0.044715) * z * z * z));
  }
}

// act'(z) from the saved tensor s: the output y for relu/relu2/sigmoid, the pre-activation z otherwise (relu passes
// the gradient where y is NaN, as torch's threshold_backward does)
template <int ACT, typename A>
__device__ __forceinline__ A act_grad(A s) {
  if constexpr (ACT == kNone) {
    return A(1);
  } else if constexpr (ACT == kRelu) {
    return s <= A(0) ? A(0) : A(1);
  } else if constexpr (ACT == kRelu2) {
    return A(2) * sqrt(s < A(0) ? A(0) : s);
  } else if constexpr (ACT == kSigmoid) {
    return s * (A(1) - s);
  } else if constexpr (ACT == kSilu) {
    A sg = sigmoid(s);
    return sg * (A(1) + s * (A(1) - sg));
  } else if constexpr (ACT == kGelu) {
    return A(0.5) * (A(1) + erf(s * A(0.7071067811865476))) + s * __expf(A(-0.5) * s * s) * A(0.3989422804014327);
  } else {
    A sg = sigmoid(A(1.5957691216057308) * (s + A(0.044715) * s * s * s));
    return sg + s * sg * (A(1) - sg) * (A(1.5957691216057308) * (A(1) + A(0.134145) * s * s));
  }
}

// rows of the forward tile each thread loads before it computes (their loads are in flight together), by element
// size. 16-bit types carry twice the elements per 16-byte vector, so a thread's compute between two batches of loads
// takes twice as long, and more rows leave too few resident warps (benchmarks/notes/bias_act.md#design-that-holds)
constexpr int kFwdRows32 = 4, kFwdRows16 = 1;
template <typename T>
constexpr int fwd_rows() {
  return sizeof(T) >= 4 ? kFwdRows32 : kFwdRows16;
}

// block (TX, TY), TX * TY = 256: thread (tx, ty) owns column vector blockIdx.x * TX + tx and rows
// row0 + k, k < kFwdRows, row0 = (blockIdx.y * TY + ty) * kFwdRows, striding over the rows by the grid.
// No index division; a warp spans several rows when N / V < 32.
template <typename T, int ACT, int V>
__global__ void bias_act_fwd_kernel(const T* __restrict__ x,     // [M, N], row stride sxm
                                    const T* __restrict__ res,   // [M, N], row stride srm, or nullptr
                                    const T* __restrict__ bias,  // [N], or nullptr
                                    T* __restrict__ y,           // [M, N], row stride sym (may be x itself)
                                    T* __restrict__ pre,         // [M, N] contiguous, or nullptr
                                    int64_t M, int64_t N, int64_t sxm, int64_t srm, int64_t sym,
                                    at::opmath_type<T> alpha) {
  using A = at::opmath_type<T>;
  const int64_t cv = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (cv >= N / V) return;
  const int64_t col = cv * V;
  A bf[V];  // the thread's bias columns, widened once
  if (bias != nullptr) to_float<T, V>(load_vec<T, V>(bias + col), bf);
  constexpr int kFwdRows = fwd_rows<T>();
  const int64_t row_step = static_cast<int64_t>(gridDim.y) * blockDim.y * kFwdRows;
  for (int64_t row0 = (static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y) * kFwdRows; row0 < M;
       row0 += row_step) {
    Vec<T, V> xv[kFwdRows], rv[kFwdRows];
#pragma unroll
    for (int r = 0; r < kFwdRows; ++r) {
      if (row0 + r < M) {
        xv[r] = load_vec<T, V>(x + (row0 + r) * sxm + col);
        if (res != nullptr) rv[r] = load_vec<T, V>(res + (row0 + r) * srm + col);
      }
    }
#pragma unroll
    for (int r = 0; r < kFwdRows; ++r) {
      if (row0 + r >= M) break;
      A z[V], yf[V], rf[V];
      to_float<T, V>(xv[r], z);
      if (res != nullptr) to_float<T, V>(rv[r], rf);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        if (res != nullptr) z[k] += alpha * rf[k];
        if (bias != nullptr) z[k] += bf[k];
        yf[k] = act_fwd<ACT>(z[k]);
      }
      store_vec<T, V>(y + (row0 + r) * sym + col, from_float<T, V>(yf));
      if (pre != nullptr) store_vec<T, V>(pre + (row0 + r) * N + col, from_float<T, V>(z));
    }
  }
}

// block (TX, TY): thread (tx, ty) owns column vector blockIdx.y * TX + tx and walks rows
// blockIdx.x * TY + ty, stepping gridDim.x * TY; its dz column sums stay in registers, then the block
// reduces over ty in a fixed order into partial[blockIdx.x, :]
template <typename T, int ACT, int V>
__global__ void bias_act_bwd_kernel(const T* __restrict__ g,      // [M, N], row stride sgm
                                    const T* __restrict__ s,      // [M, N], row stride ssm, or nullptr (none)
                                    const T* __restrict__ shift,  // [N] added to s (z = h + bias), or nullptr
                                    T* __restrict__ dx,           // [M, N] contiguous, or nullptr
                                    T* __restrict__ dr,           // [M, N] contiguous, or nullptr
                                    at::opmath_type<T>* __restrict__ partial,  // [gridDim.x, N], or nullptr
                                    int64_t M, int64_t N, int64_t sgm, int64_t ssm, at::opmath_type<T> alpha) {
  using A = at::opmath_type<T>;
  extern __shared__ unsigned char smem_raw[];
  A* smem = reinterpret_cast<A*>(smem_raw);  // [TY, TX * V]
  const int64_t nvec = N / V;
  const int64_t cv = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  const bool active = cv < nvec;
  const int64_t col = cv * V;
  A acc[V];
#pragma unroll
  for (int k = 0; k < V; ++k) acc[k] = A(0);
  if (active) {
    A shf[V];  // the thread's columns are fixed: one load of the shift, widened once
    if (shift != nullptr) to_float<T, V>(load_vec<T, V>(shift + col), shf);
    const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.y;
    for (int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; row < M; row += step) {
      A dz[V], sf[V], rf[V];
      to_float<T, V>(load_vec<T, V>(g + row * sgm + col), dz);
      if (ACT != kNone) to_float<T, V>(load_vec<T, V>(s + row * ssm + col), sf);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        if (ACT != kNone) {
          if (shift != nullptr) sf[k] += shf[k];  // z = h + bias in float, as the forward had it
          dz[k] *= act_grad<ACT>(sf[k]);
        }
        rf[k] = alpha * dz[k];
        acc[k] += dz[k];
      }
      if (dx != nullptr) store_vec<T, V>(dx + row * N + col, from_float<T, V>(dz));
      if (dr != nullptr) store_vec<T, V>(dr + row * N + col, from_float<T, V>(rf));
    }
  }
  if (partial == nullptr) return;
  const int width = blockDim.x * V;
#pragma unroll
  for (int k = 0; k < V; ++k) smem[threadIdx.y * width + threadIdx.x * V + k] = acc[k];
  __syncthreads();
  if (threadIdx.y == 0 && active) {
#pragma unroll
    for (int k = 0; k < V; ++k) {
      A sum = A(0);
      for (int ty = 0; ty < static_cast<int>(blockDim.y); ++ty) sum += smem[ty * width + threadIdx.x * V + k];
      partial[static_cast<int64_t>(blockIdx.x) * N + col + k] = sum;
    }
  }
}

// out[n] = sum over r of partial[r, n], cast to T. Block (32, 8): 32 columns, 8 row lanes; lane ty sums rows
// ty, ty + 8, ... in order, then lane 0 adds the 8 lane sums in order: the same bits on every run.
template <typename T>
__global__ void column_sum_kernel(const at::opmath_type<T>* __restrict__ partial,  // [R, N] contiguous
                                  T* __restrict__ out,                              // [N]
                                  int64_t R, int64_t N) {
  using A = at::opmath_type<T>;
  __shared__ A lanes[8][32];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  A acc = A(0);
  if (col < N) {
#pragma unroll 4
    for (int64_t r = threadIdx.y; r < R; r += 8) acc += partial[r * N + col];
  }
  lanes[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < N) {
    A total = A(0);
#pragma unroll
    for (int ty = 0; ty < 8; ++ty) total += lanes[ty][threadIdx.x];
    out[col] = static_cast<T>(total);
  }
}

#define FUSELAB_DISPATCH_ACT(act, ...)                              \
  switch (act) {                                                    \
    case kNone: { constexpr int ACT = kNone; __VA_ARGS__ break; }   \
    case kRelu: { constexpr int ACT = kRelu; __VA_ARGS__ break; }   \
    case kRelu2: { constexpr int ACT = kRelu2; __VA_ARGS__ break; } \
    case kSigmoid: { constexpr int ACT = kSigmoid; __VA_ARGS__ break; } \
    case kSilu: { constexpr int ACT = kSilu; __VA_ARGS__ break; }   \
    case kGelu: { constexpr int ACT = kGelu; __VA_ARGS__ break; }   \
    case kGeluTanh: { constexpr int ACT = kGeluTanh; __VA_ARGS__ break; } \
    default: TORCH_CHECK(false, "bias_act: unknown activation id"); \
  }

// float32, float16, bfloat16 (float64 is not built: it would add a third of the compile time for no user)
#define FUSELAB_DISPATCH_FLOATS(dtype, name, ...)                                        \
  AT_DISPATCH_SWITCH(dtype, name, AT_DISPATCH_CASE(at::kFloat, __VA_ARGS__)              \
                                      AT_DISPATCH_CASE(at::kHalf, __VA_ARGS__)           \
                                          AT_DISPATCH_CASE(at::kBFloat16, __VA_ARGS__))

int64_t next_pow2(int64_t n) {
  int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

bool aligned16(const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Error messages in these sources are single string literals: a message TORCH_CHECK assembles from several
// parts (c10::str) crashed the process, instead of raising, in extensions built on the GPU machine.
#define FUSELAB_CHECK_ROWS(t, x, NAME)                                                                  \
  TORCH_CHECK((t).dim() == 2 && (t).sizes() == (x).sizes(), NAME " must be [M, N] like x");            \
  TORCH_CHECK((t).size(1) <= 1 || (t).stride(1) == 1, NAME " must have a unit inner stride");          \
  TORCH_CHECK((t).scalar_type() == (x).scalar_type(), NAME " must have x's dtype");                    \
  TORCH_CHECK((t).device() == (x).device(), NAME " must be on x's device")

// multiprocessors of a device, asked once per device (every launch plans its grid with it)
int num_sms(int device) {
  static std::atomic<int> cached[64];
  if (device >= 0 && device < 64) {
    const int sms = cached[device].load(std::memory_order_relaxed);
    if (sms > 0) return sms;
  }
  int sms = 0;
  TORCH_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess,
              "bias_act: cudaDeviceGetAttribute failed");
  if (device >= 0 && device < 64) cached[device].store(sms, std::memory_order_relaxed);
  return sms;
}

void check_launch() {
  const cudaError_t err = cudaGetLastError();
  TORCH_CHECK(err == cudaSuccess, cudaGetErrorString(err));  // one message part (see FUSELAB_CHECK_ROWS)
}

}  // namespace

// returns {y, pre}; pre is undefined (None) unless save_pre. out (optional, [M, N] with a unit inner stride, any row stride)
// receives y; it may be x itself (each element is read, then written, by one thread)
std::vector<torch::Tensor> bias_act_forward(torch::Tensor x, std::optional<torch::Tensor> bias,
                                            std::optional<torch::Tensor> residual, double alpha,
                                            int64_t activation, bool save_pre, std::optional<torch::Tensor> out,
                                            int64_t stream_handle) {
  // the caller (fuselab.cuda.bias_act) sets the current device and passes torch's current stream
  const cudaStream_t stream = reinterpret_cast<cudaStream_t>(stream_handle);
  TORCH_CHECK(x.is_cuda() && x.dim() == 2, "x must be a 2-D CUDA tensor");
  TORCH_CHECK(x.size(1) <= 1 || x.stride(1) == 1, "x must have a unit inner stride");
  if (residual) {
    FUSELAB_CHECK_ROWS(*residual, x, "residual");
  }
  if (out) {
    FUSELAB_CHECK_ROWS(*out, x, "out");
  }
  if (bias) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == x.size(1) && bias->is_contiguous(),
                "bias must be a contiguous [N] tensor");
    TORCH_CHECK(bias->scalar_type() == x.scalar_type() && bias->device() == x.device(),
                "bias must have x's dtype and device");
  }
  const int64_t M = x.size(0), N = x.size(1);
  auto y = out ? *out : torch::empty({M, N}, x.options());
  auto pre = save_pre ? torch::empty({M, N}, x.options()) : torch::Tensor();  // undefined (None) unless asked
  if (M == 0 || N == 0) return {y, pre};
  FUSELAB_DISPATCH_FLOATS(x.scalar_type(), "bias_act_forward", [&] {
    using A = at::opmath_type<scalar_t>;
    constexpr int VW = 16 / sizeof(scalar_t);
    const scalar_t* xp = x.data_ptr<scalar_t>();
    const scalar_t* rp = residual ? residual->data_ptr<scalar_t>() : nullptr;
    const scalar_t* bp = bias ? bias->data_ptr<scalar_t>() : nullptr;
    scalar_t* yp = y.data_ptr<scalar_t>();
    scalar_t* pp = save_pre ? pre.data_ptr<scalar_t>() : nullptr;
    const int64_t srm = residual ? residual->stride(0) : 0;
    const int64_t sym = y.stride(0);
    const bool vec = N % VW == 0 && x.stride(0) % VW == 0 && srm % VW == 0 && sym % VW == 0 && aligned16(xp) &&
                     aligned16(rp) && aligned16(bp) && aligned16(yp) && aligned16(pp);
    const int64_t nvec = vec ? N / VW : N;
    const int tx = static_cast<int>(std::min<int64_t>(256, next_pow2(nvec)));
    const int ty = 256 / tx;
    constexpr int kFwdRows = fwd_rows<scalar_t>();
    const int64_t row_blocks = (M + int64_t(ty) * kFwdRows - 1) / (int64_t(ty) * kFwdRows);
    const dim3 grid(static_cast<unsigned>((nvec + tx - 1) / tx), static_cast<unsigned>(std::min<int64_t>(row_blocks, 65535)));
    const dim3 block(tx, ty);
    FUSELAB_DISPATCH_ACT(activation, {
      if (vec) {
        bias_act_fwd_kernel<scalar_t, ACT, VW><<<grid, block, 0, stream>>>(
            xp, rp, bp, yp, pp, M, N, x.stride(0), srm, sym, static_cast<A>(alpha));
      } else {
        bias_act_fwd_kernel<scalar_t, ACT, 1><<<grid, block, 0, stream>>>(
            xp, rp, bp, yp, pp, M, N, x.stride(0), srm, sym, static_cast<A>(alpha));
      }
    })
    check_launch();
  });
  return {y, pre};
}

template <typename scalar_t, int ACT, int V>
static void launch_bwd(const torch::Tensor& grad, const scalar_t* sp, int64_t ssm, const scalar_t* shp, scalar_t* dxp,
                       scalar_t* drp, torch::Tensor* partial, bool want_bias, double alpha, cudaStream_t stream) {
  using A = at::opmath_type<scalar_t>;
  const int64_t M = grad.size(0), N = grad.size(1);
  const int64_t nvec = N / V;
  const int tx = static_cast<int>(std::min<int64_t>(256, ((nvec + 31) / 32) * 32));
  const int ty = 256 / tx;
  const int64_t grid_n = (nvec + tx - 1) / tx;
  const int64_t grid_m =
      std::max<int64_t>(1, std::min<int64_t>((M + ty - 1) / ty, std::max<int64_t>(1, num_sms(grad.get_device()) * 4 / grid_n)));
  A* pp = nullptr;
  if (want_bias) {
    *partial = torch::empty({grid_m, N}, grad.options().dtype(c10::CppTypeToScalarType<A>::value));
    pp = partial->data_ptr<A>();
  }
  const dim3 grid(static_cast<unsigned>(grid_m), static_cast<unsigned>(grid_n));
  const dim3 block(tx, ty);
  const size_t smem = want_bias ? sizeof(A) * tx * ty * V : 0;
  bias_act_bwd_kernel<scalar_t, ACT, V><<<grid, block, smem, stream>>>(
      grad.data_ptr<scalar_t>(), sp, shp, dxp, drp, pp, M, N, grad.stride(0), ssm, static_cast<A>(alpha));
  check_launch();
}

// returns {grad_x, grad_residual, grad_bias}; each undefined (None) unless wanted. shift (optional, [N]): the saved
// tensor is the pre-activation less this vector (FusedLinear saves the matmul output h and its bias: z = h + bias)
std::vector<torch::Tensor> bias_act_backward(torch::Tensor grad, std::optional<torch::Tensor> saved,
                                             std::optional<torch::Tensor> shift, double alpha,
                                             int64_t activation, bool want_x, bool want_residual, bool want_bias,
                                             int64_t stream_handle) {
  const cudaStream_t stream = reinterpret_cast<cudaStream_t>(stream_handle);
  TORCH_CHECK(grad.is_cuda() && grad.dim() == 2, "grad must be a 2-D CUDA tensor");
  TORCH_CHECK(grad.size(1) <= 1 || grad.stride(1) == 1, "grad must have a unit inner stride");
  TORCH_CHECK(activation == kNone || saved.has_value(), "bias_act_backward: this activation needs the saved tensor");
  if (saved) {
    FUSELAB_CHECK_ROWS(*saved, grad, "saved");
  }
  if (shift) {
    TORCH_CHECK(saved && shift->dim() == 1 && shift->size(0) == grad.size(1) && shift->is_contiguous(),
                "shift must be a contiguous [N] tensor, given with saved");
    TORCH_CHECK(shift->scalar_type() == grad.scalar_type() && shift->device() == grad.device(),
                "shift must have grad's dtype and device");
  }
  const int64_t M = grad.size(0), N = grad.size(1);
  // outputs not wanted stay undefined (None in Python): no allocation, no host time
  auto gx = want_x ? torch::empty({M, N}, grad.options()) : torch::Tensor();
  auto gr = want_residual ? torch::empty({M, N}, grad.options()) : torch::Tensor();
  torch::Tensor gb;
  if (M == 0 || N == 0) {
    if (want_bias) gb = torch::zeros({N}, grad.options());
    return {gx, gr, gb};
  }
  torch::Tensor partial;
  FUSELAB_DISPATCH_FLOATS(grad.scalar_type(), "bias_act_backward", [&] {
    constexpr int VW = 16 / sizeof(scalar_t);
    const scalar_t* sp = saved ? saved->data_ptr<scalar_t>() : nullptr;
    const int64_t ssm = saved ? saved->stride(0) : 0;
    const scalar_t* shp = shift ? shift->data_ptr<scalar_t>() : nullptr;
    scalar_t* dxp = want_x ? gx.data_ptr<scalar_t>() : nullptr;
    scalar_t* drp = want_residual ? gr.data_ptr<scalar_t>() : nullptr;
    const bool vec = N % VW == 0 && grad.stride(0) % VW == 0 && ssm % VW == 0 && aligned16(grad.data_ptr()) &&
                     aligned16(sp) && aligned16(shp) && aligned16(dxp) && aligned16(drp);
    FUSELAB_DISPATCH_ACT(activation, {
      if (vec) {
        launch_bwd<scalar_t, ACT, VW>(grad, sp, ssm, shp, dxp, drp, &partial, want_bias, alpha, stream);
      } else {
        launch_bwd<scalar_t, ACT, 1>(grad, sp, ssm, shp, dxp, drp, &partial, want_bias, alpha, stream);
      }
    })
    if (want_bias) {  // one launch instead of partial.sum(0).to(dtype)'s two ATen ops (host time per call)
      gb = torch::empty({N}, grad.options());
      const dim3 block(32, 8);
      column_sum_kernel<scalar_t><<<static_cast<unsigned>((N + 31) / 32), block, 0, stream>>>(
          partial.data_ptr<at::opmath_type<scalar_t>>(), gb.data_ptr<scalar_t>(), partial.size(0), N);
      check_launch();
    }
  });
  return {gx, gr, gb};
}
