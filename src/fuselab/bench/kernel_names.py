"""Short, readable names of the kernels a profile lists (``fuselab profile``, ``fuselab dlrm train --profile``).

A demangled CUDA kernel name from PyTorch or cuBLAS runs to hundreds of characters of template arguments
(``void at::native::reduce_kernel<128, 4, at::native::ReduceOp<c10::BFloat16, at::native::func_wrapper_t<...``).
:func:`short_kernel_name` keeps what tells kernels apart at a glance, on one line:
``at::native::reduce_kernel<sum, bf16>``. The full name stays in the trace and in the JSON of the table.
"""

from __future__ import annotations

import re

#: the longest short kernel name (:func:`short_kernel_name`) a table shows
SHORT_NAME_LIMIT = 72
#: element types a kernel's template arguments name, the first of this list that appears wins (a bf16 kernel
#: accumulating in fp32 is a bf16 kernel)
_DTYPES = (("bf16", r"c10::BFloat16|__nv_bfloat16"), ("fp16", r"c10::Half|__half"), ("fp32", r"float"),
           ("fp64", r"double"), ("u64", r"unsigned long long|unsigned long|uint64_t"),
           ("i64", r"long long|long|int64_t"), ("u8", r"unsigned char|uint8_t"), ("i32", r"int|int32_t"),
           ("bool", r"bool"))
#: what names the work a templated kernel does: a functor, a kernel function, a std:: operation (first group wins)
_OPS = re.compile(r"\blaunch_(\w+?)_kernel\b|\b(\w+?)_kernel_(?:cuda|impl)\b|\b(\w+?)_functor\b"
                  r"|\bstd::(?!array\b)(\w+)<|\bCUDAFunctor_(\w+)\b|\b(\w+?)Functor\b|\b(\w+?)Ops<"
                  r"|\bnative::([A-Z][a-z]+)<")
_GENERIC_FUNCTOR = re.compile(r"(B?Unary|Binary|Pointwise)\w*")


def _template_args(text: str) -> str:
    """The text inside the first balanced ``<...>`` at the start of ``text`` ("" when it does not start so)."""
    if not text.startswith("<"):
        return ""
    depth = 0
    for i, ch in enumerate(text):
        depth += {"<": 1, ">": -1}.get(ch, 0)
        if depth == 0:
            return text[1:i]
    return text[1:]


def _scope(name: str) -> str:
    """``name`` without CUDA's detail namespaces: at most its first and last two parts (``a::b::c`` stays)."""
    parts = [p for p in name.split("::") if p and p not in ("at_cuda_detail", "detail")]
    return "::".join(parts if len(parts) <= 3 else [parts[0], *parts[-2:]])


def short_kernel_name(name: str, limit: int = SHORT_NAME_LIMIT) -> str:
    """A demangled C++ kernel name as ``scope::kernel<op, dtype>``: the function's name (without ``void``,
    anonymous and detail namespaces), then the operation its template arguments name (a functor such as
    ``sum_functor``, a kernel function such as ``threshold_kernel_impl``, ``std::divides``) and their element
    type (bf16, fp16 before fp32, ...); names without templates (Triton, cuBLAS ``nvjet_*``, ``aten::`` ops) are
    kept. At most ``limit`` characters (cut with "…")."""
    text = re.sub(r"^void\s+", "", " ".join(name.split())).replace("(anonymous namespace)::", "")
    match = re.match(r"[\w:~]+", text)
    if match is None or not text[match.end():].startswith(("<", "(")):  # no template, no arguments: as it is
        return text if len(text) <= limit else text[: limit - 1] + "…"
    base, args = _scope(match.group(0)), _template_args(text[match.end():])
    ops: list[str] = []
    for found in _OPS.finditer(args):
        word = next(g for g in found.groups() if g)
        if found.group(6) and _GENERIC_FUNCTOR.fullmatch(word):
            continue
        word = word.lower() if found.group(6) or found.group(7) or found.group(8) else word
        if word not in ops:
            ops.append(word)
    hits = [(rank, m.start()) for rank, (_, pattern) in enumerate(_DTYPES)
            for m in [re.search(rf"\b(?:{pattern})\b", args)] if m]
    dtype = [_DTYPES[min(hits)[0]][0]] if hits else []
    short = f"{base}<{', '.join(ops[:2] + dtype)}>" if ops or dtype else base
    return short if len(short) <= limit else short[: limit - 1] + "…"
