"""Per-kernel tables show a short readable name per kernel, on one line (the full demangled name stays in the
JSON and the trace). The names below are real: demangled CUDA kernel names of a DLRM training step on an H100
(`benchmarks/results/h100/dlrm_profile/kernels.txt`)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from fuselab.bench.kernel_names import short_kernel_name
from fuselab.profile import KernelRow, kernel_rows_json, render_kernel_table

REDUCE_SUM_BF16 = (
    "void at::native::reduce_kernel<128, 4, at::native::ReduceOp<c10::BFloat16, at::native::func_wrapper_t<"
    "c10::BFloat16, at::native::sum_functor<c10::BFloat16, float, c10::BFloat16>::operator()(at::TensorIterator&)"
    "::{lambda(float, float)#1}>, unsigned int, c10::BFloat16, 4, 8> >(at::native::ReduceOp<c10::BFloat16, "
    "at::native::func_wrapper_t<c10::BFloat16, at::native::sum_functor<c10::BFloat16, float, c10::BFloat16>::"
    "operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, c10::BFloat16, 4, 8>)")
REAL_NAMES = {
    REDUCE_SUM_BF16: "at::native::reduce_kernel<sum, bf16>",
    "void at::native::vectorized_elementwise_kernel<8, at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, "
    "c10::BFloat16, at::native::(anonymous namespace)::threshold_kernel_impl<c10::BFloat16>(at::TensorIteratorBase&, "
    "c10::BFloat16, c10::BFloat16)::{lambda(c10::BFloat16, c10::BFloat16)#1}>, std::array<char*, 3ul> >(int, "
    "at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, at::native::(anonymous namespace)::"
    "threshold_kernel_impl<c10::BFloat16>(at::TensorIteratorBase&, c10::BFloat16, c10::BFloat16)::{lambda("
    "c10::BFloat16, c10::BFloat16)#1}>, std::array<char*, 3ul>)":
        "at::native::vectorized_elementwise_kernel<threshold, bf16>",
    "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::"
    "{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul>, "
    "4, TrivialOffsetCalculator<1, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, "
    "at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1> >(int, "
    "at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::"
    "operator()() const::{lambda(float)#1}, std::array<char*, 2ul>, TrivialOffsetCalculator<1, unsigned int>, "
    "TrivialOffsetCalculator<1, unsigned int>, at::native::memory::LoadWithCast<1>, "
    "at::native::memory::StoreWithCast<1>)": "at::native::unrolled_elementwise_kernel<direct_copy, fp32>",
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
    "TensorListMetadata<3>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<float, 3, 2, 2>, "
    "std::divides<float>, float>(at::native::(anonymous namespace)::TensorListMetadata<3>, at::native::(anonymous "
    "namespace)::BinaryOpListAlphaFunctor<float, 3, 2, 2>, std::divides<float>, float)":
        "at::native::multi_tensor_apply_kernel<divides, fp32>",
    "void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, false, float, "
    "__nv_bfloat16, __nv_bfloat16, true, false, false, false>(cublasLt::cublasSplitKParams<float>, float const*, "
    "__nv_bfloat16 const*, float*, __nv_bfloat16*, float const*, float const*, __nv_bfloat16 const*, float const*, "
    "__nv_bfloat16*, void*, long, float*, int*, float*, float*, float const*, float const*, float const*, float "
    "const*, float const*)": "cublasLt::splitKreduce_kernel<bf16>",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, "
    "float>, unsigned int, float, 4, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, float, float, "
    "float>, unsigned int, float, 4, 4>)": "at::native::reduce_kernel<mean, fp32>",
    "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<float, "
    "float, float, at::native::binary_internal::MulFunctor<float> > >(at::TensorIteratorBase&, "
    "at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor<float> > const&)::"
    "{lambda(int)#1}>(int, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<float, float, float, "
    "at::native::binary_internal::MulFunctor<float> > >(at::TensorIteratorBase&, at::native::BinaryFunctor<float, "
    "float, float, at::native::binary_internal::MulFunctor<float> > const&)::{lambda(int)#1})":
        "at::native::elementwise_kernel<mul, fp32>",
    "at::native::(anonymous namespace)::fill_reverse_indices_kernel(long*, int, "
    "at::cuda::detail::IntDivider<unsigned int>)": "at::native::fill_reverse_indices_kernel",
    # names without templates stay as they are
    "nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_relubias_TNN":
        "nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_relubias_TNN",
    "Memcpy DtoD (Device -> Device)": "Memcpy DtoD (Device -> Device)",
    "segment_update_kernel": "segment_update_kernel",
    "aten::linear": "aten::linear",
}


@pytest.mark.parametrize("full, short", list(REAL_NAMES.items()), ids=[s for s in REAL_NAMES.values()])
def test_short_names_of_real_kernels(full, short):
    assert short_kernel_name(full) == short
    assert len(short_kernel_name(full, limit=20)) <= 20


def test_the_table_has_one_line_per_kernel_and_the_json_the_full_names():
    rows = [KernelRow(name, 2, 100.0 - i, 50.0, 10.0) for i, name in enumerate(REAL_NAMES)]
    rows.append(KernelRow(REDUCE_SUM_BF16.replace("<128, 4,", "<512, 1,"), 1, 1.0, 1.0, 0.1))  # same short name
    out = io.StringIO()
    Console(file=out, width=100).print(render_kernel_table(rows, title="t", steps=2, limit=None))
    body = [line for line in out.getvalue().splitlines() if line.startswith("│")]
    assert len(body) == len(rows)  # one line each: no name folded over several
    assert "at::native::reduce_kernel<sum, bf16> #2" in out.getvalue()
    assert all(len(line) <= 100 for line in out.getvalue().splitlines())
    records = kernel_rows_json(rows, steps=2)
    assert [r["name"] for r in records] == [r.name for r in rows]
    assert records[0]["short_name"] == "at::native::reduce_kernel<sum, bf16>" and records[0]["calls_per_unit"] == 1
