// fuselab CUDA backend of FusedLinear: y = act(x @ W^T + b) as one C++ autograd node.
//
// forward : h = x2 @ W^T (cuBLAS, no bias), then the fused epilogue kernel of bias_act.cu: y = act(h + b), in place
//           on h (a fresh y where the backward keeps h: silu, gelu, gelu_tanh).
//           read x (M*K), W (N*K), b (N); write h (M*N); read h, write y (M*N).
// backward: the fused backward kernel of bias_act.cu (dz = grad * act'(saved), and the bias gradient as
//           per-block column partial sums, one pass over grad), then grad_x = dz @ W and grad_W = dz^T @ x2.
//           read grad, saved (M*N); write dz (M*N); the two matmuls.
// Saved for the backward: x (when W needs grad), W (when x needs grad), and per activation the output y
// (relu, relu2, sigmoid), the matmul output h with the bias as a shift that rebuilds z = h + b (silu, gelu,
// gelu_tanh), or nothing (none).
//
// Why C++: the Triton FusedLinear's backward is a Python function, which the autograd engine calls on its device
// thread; on a small layer that host time exceeds the GPU time. This node runs no Python in the backward, and
// its forward is one call from Python.

#include <torch/extension.h>

// device-agnostic c10 headers: the CPU torch wheel (CI's nvcc check) ships no c10/cuda build config
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <optional>
#include <vector>

// defined in bias_act.cu (load_inline builds both sources into one extension)
std::vector<torch::Tensor> bias_act_forward(torch::Tensor x, std::optional<torch::Tensor> bias,
                                            std::optional<torch::Tensor> residual, double alpha,
                                            int64_t activation, bool save_pre, std::optional<torch::Tensor> out,
                                            int64_t stream_handle);
std::vector<torch::Tensor> bias_act_backward(torch::Tensor grad, std::optional<torch::Tensor> saved,
                                             std::optional<torch::Tensor> shift, double alpha, int64_t activation,
                                             bool want_x, bool want_residual, bool want_bias,
                                             int64_t stream_handle);

// a named namespace: load_inline concatenates bias_act.cu (whose anonymous namespace has its own kNone, ...)
// and this file into one translation unit
namespace fused_linear_impl {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// activation ids of fuselab.ops.bias_act.launch.ACT_IDS
constexpr int64_t kNone = 0, kRelu = 1, kRelu2 = 2, kSigmoid = 3, kGeluTanh = 6;

bool saves_output(int64_t activation) {
  return activation == kRelu || activation == kRelu2 || activation == kSigmoid;
}

// torch's current stream on device, as the cudaStream_t handle the launchers take
int64_t current_stream(const c10::Device& device) {
  return reinterpret_cast<int64_t>(c10::impl::getDeviceGuardImpl(device.type())->getStream(device).native_handle());
}

std::optional<torch::Tensor> maybe(const torch::Tensor& t) {
  return t.defined() ? std::optional<torch::Tensor>(t) : std::nullopt;
}

// rows [M, K] of x: a view when the leading dims merge (always for a contiguous x)
torch::Tensor rows(const torch::Tensor& t) { return t.dim() == 2 ? t : t.reshape({-1, t.size(-1)}); }

// the kernels take a unit inner stride (any row stride)
torch::Tensor unit_rows(const torch::Tensor& t) {
  torch::Tensor t2 = rows(t);
  return t2.size(1) > 1 && t2.stride(1) != 1 ? t2.contiguous() : t2;
}

struct FusedLinearFunction : public torch::autograd::Function<FusedLinearFunction> {
  // bias: an optional, not an undefined tensor (apply records a tensor argument's device, dtype, ...)
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight,
                               const std::optional<torch::Tensor>& bias, int64_t activation) {
    const c10::DeviceGuard guard(x.device());
    const torch::Tensor x2 = rows(x);
    // the epilogue runs in place on the matmul output unless the backward needs it (silu, gelu, gelu_tanh)
    const bool keep_h = activation != kNone && !saves_output(activation);
    const bool epilogue = activation != kNone || bias.has_value();
    const int64_t stream = current_stream(x.device());
    torch::Tensor h, y;
    if (x.dim() == 2) {  // the common case: y is the matmul output itself (or the epilogue's fresh output)
      h = at::mm(x2, weight.t());
      y = keep_h ? bias_act_forward(h, bias, std::nullopt, 1.0, activation, false, std::nullopt, stream)[0] : h;
      if (epilogue && !keep_h) bias_act_forward(h, bias, std::nullopt, 1.0, activation, false, h, stream);
    } else {  // y in x's leading shape, not a view made here: a Function's view output forbids in-place ops
      std::vector<int64_t> out_sizes = x.sizes().vec();
      out_sizes.back() = weight.size(0);
      y = at::empty(out_sizes, x.options());
      torch::Tensor y2 = y.view({x2.size(0), weight.size(0)});
      h = keep_h ? at::mm(x2, weight.t()) : at::mm_out(y2, x2, weight.t());
      if (epilogue) bias_act_forward(h, bias, std::nullopt, 1.0, activation, false, y2, stream);
    }
    torch::Tensor saved, shift;
    if (saves_output(activation)) {
      saved = y;  // the output itself: a view of it made here would fail autograd's view checks in the backward
    } else if (keep_h) {
      saved = h;
      shift = bias.value_or(torch::Tensor());
    }
    const bool want_x = x.requires_grad(), want_w = weight.requires_grad();
    ctx->save_for_backward({want_w ? x : torch::Tensor(), want_x ? weight : torch::Tensor(), saved, shift});
    ctx->saved_data["activation"] = activation;
    ctx->saved_data["has_bias"] = bias.has_value();
    ctx->saved_data["x_sizes"] = x.sizes().vec();
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &weight = saved[1], &s = saved[2], &shift = saved[3];
    const int64_t activation = ctx->saved_data["activation"].toInt();
    // edges: x, weight, and bias when given (a None bias is no edge)
    const bool want_x = ctx->needs_input_grad(0), want_w = ctx->needs_input_grad(1);
    const bool want_b = ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2);
    const torch::Tensor g = unit_rows(grads[0]);
    const c10::DeviceGuard guard(g.device());
    torch::Tensor dz = g, grad_b, grad_x, grad_w;
    const bool want_dz = activation != kNone && (want_x || want_w);
    if (want_dz || want_b) {
      const torch::Tensor s2 = s.defined() ? unit_rows(s) : s;  // the output y is saved in its own shape
      std::vector<torch::Tensor> out = bias_act_backward(g, maybe(s2), maybe(shift), 1.0, activation, want_dz, false,
                                                         want_b, current_stream(g.device()));
      if (want_dz) dz = out[0];
      if (want_b) grad_b = out[2];
    }
    if (want_x) grad_x = dz.mm(weight).view(ctx->saved_data["x_sizes"].toIntVector());
    if (want_w) grad_w = dz.t().mm(rows(x));
    return {grad_x, grad_w, grad_b, torch::Tensor()};
  }
};

}  // namespace fused_linear_impl

// y = act(x @ weight^T + bias); bias may be None. Validated here (cheap); on a failed check the Python wrapper
// (fuselab.cuda.fused_linear) names the argument in a TypeError/ValueError.
torch::Tensor fused_linear(torch::Tensor x, torch::Tensor weight, std::optional<torch::Tensor> bias,
                           int64_t activation) {
  namespace impl = fused_linear_impl;
  // single-literal messages: see FUSELAB_CHECK_ROWS in bias_act.cu
  TORCH_CHECK(activation >= impl::kNone && activation <= impl::kGeluTanh, "fused_linear: unknown activation id");
  const auto dtype = x.scalar_type();
  TORCH_CHECK(x.is_cuda() && (dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16),
              "fused_linear: x must be a float32/float16/bfloat16 CUDA tensor");
  TORCH_CHECK(x.dim() >= 1 && weight.dim() == 2 && x.size(-1) == weight.size(1) && weight.scalar_type() == dtype &&
                  weight.device() == x.device(),
              "fused_linear: weight must be (out_features, in_features) with x's dtype and device");
  TORCH_CHECK(!bias || (bias->dim() == 1 && bias->size(0) == weight.size(0) && bias->scalar_type() == dtype &&
                        bias->device() == x.device()),
              "fused_linear: bias must be (out_features,) with x's dtype and device");
  if (bias && !bias->defined()) bias.reset();
  return impl::FusedLinearFunction::apply(x, weight, bias, activation);
}
