"""Mutation check: plant known faults in a scratch copy of the package and require the tests to catch each one.

Run as ``python tests/mutations.py [-j WORKERS] [-k NAME ...]`` from anywhere. For every fault in :data:`FAULTS`:
copy ``src/`` to a temporary directory, find the one file under ``fuselab/`` holding the fault's exact snippet
(searched recursively, so files that move keep working), replace it, and run the fault's test selection under
the Triton interpreter with ``PYTHONPATH`` pointing at the copy. A fault is caught when pytest fails (or the
process dies); it survives when the selection passes. The check fails when a fault survives, when a snippet is
missing or ambiguous (the code changed: update the fault), or when the unmodified copy fails a selection.
Prints one line per fault and ``mutations: N caught, M survived``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

IND = "tests/ops/test_independent_refs.py"
ROPE = "tests/ops/test_rope.py"
BIAS = "tests/ops/test_bias_act.py"
INTER = "tests/ops/test_interaction.py"
EMB = "tests/ops/test_embedding.py"
REDUCE = "tests/ops/test_reduce.py"
KEPT_OPS = "tests/ops/test_embedding_interaction_op.py"
NN = "tests/test_nn.py"
OPDEF = "tests/ops/test_opdef.py"


@dataclass(frozen=True)
class Fault:
    name: str
    edits: tuple[tuple[str, str], ...]  # (exact snippet, replacement); every occurrence in its one file
    tests: tuple[str, ...]  # pytest arguments: files, -k expressions


def fault(name: str, snippet: str, replacement: str, *tests: str) -> Fault:
    return Fault(name, ((snippet, replacement),), tests)


FAULTS: tuple[Fault, ...] = (
    # ---------------------------------------------------------------- rope
    fault("rope: wrong sign of the first element of each pair", "rounded(x1 * c - x2 * s, o_ptr",
          "rounded(x1 * c + x2 * s, o_ptr", IND, "-k", "rope_plain"),
    fault("rope: wrong sign of the second element of each pair", "rounded(x2 * c + x1 * s, o_ptr",
          "rounded(x2 * c - x1 * s, o_ptr", IND, "-k", "rope_plain"),
    fault("rope: halves paired as neighbours (wrong pair order)", "x2 = tl.load(px + HALF * sxd,",
          "x2 = tl.load(px + 1 * sxd,", IND, "-k", "rope_plain"),
    fault("rope: interleaved pair swapped", "x1, x2 = tl.split(tl.reshape(x, (BLOCK_T, BLOCK_H, BLOCK_HALF, 2)))",
          "x2, x1 = tl.split(tl.reshape(x, (BLOCK_T, BLOCK_H, BLOCK_HALF, 2)))", IND, "-k", "rope_plain"),
    Fault("rope: cos/sin rounded to the output dtype in the kernel",
          (("    c = c[:, None, :]\n    sn = sn[:, None, :]\n",
            "    c = c.to(qo_ptr.dtype.element_ty).to(ct)[:, None, :]\n"
            "    sn = sn.to(qo_ptr.dtype.element_ty).to(ct)[:, None, :]\n"),),
          (IND, "-k", "rope_low_precision")),
    fault("rope: backward rotates forward (conjugate dropped)", "        sn = -sn\n", "        sn = sn\n",
          IND, "-k", "rope_plain and triton and halves"),
    fault("rope: int offset off by one", "    else:\n        pos = pos + offset\n",
          "    else:\n        pos = pos + offset + 1\n",
          IND, "-k", "rope_plain and int"),
    fault("rope: tensor offset ignored", "        pos = pos + tl.load(off_ptr + seq * so, mask=tmask, other=0)",
          "        pos = pos + 0 * tl.load(off_ptr + seq * so, mask=tmask, other=0)",
          IND, "-k", "rope_plain and tensor"),
    fault("rope: varlen sequence search off by one", "below = start <= tok", "below = start < tok",
          IND, "-k", "rope_thd"),
    fault("rope: k addressed with q's strides", "b * skb + s * sks, b * sokb + s * soks",
          "b * sqb + s * sqs, b * sokb + s * soks", IND, "-k", "rope_plain and bshd and zero"),
    fault("rope: last table row unreachable", "pos = tl.minimum(tl.maximum(pos, 0), n_rows - 1)",
          "pos = tl.minimum(tl.maximum(pos, 0), n_rows - 2)", IND, "-k", "rope_positions"),
    fault("rope: in-kernel angle frequencies off by one", "freq = tl.load(freq_ptr + jj, mask=jj < HALF, other=0.0)",
          "freq = tl.load(freq_ptr + jj + 1, mask=jj + 1 < HALF, other=0.0)", IND, "-k", "rope_in_kernel"),
    # ---------------------------------------------------------------- bias_act
    fault("bias_act: pre-activation rounded to bf16 before the activation", "_act(z, ACTIVATION)",
          "_act(z.to(tl.bfloat16).to(tl.float32), ACTIVATION)", IND, "-k", "bias_act_bf16"),
    fault("bias_act: sigmoid of -z", "y = 1.0 / (1.0 + tl.exp(-z))", "y = 1.0 / (1.0 + tl.exp(z))",
          IND, "-k", "bias_act_vs_functional and sigmoid"),
    fault("bias_act: gelu_tanh cubic coefficient", "u2 = 1.5957691216057308 * (z + 0.044715 * z * z * z)",
          "u2 = 1.5957691216057308 * (z + 0.04 * z * z * z)", IND, "-k", "bias_act_vs_functional and gelu_tanh"),
    fault("bias_act: relu2 gradient missing its factor 2", "d = 2.0 * tl.sqrt(s)", "d = tl.sqrt(s)",
          IND, "-k", "bias_act_vs_functional and relu2"),
    fault("bias_act: silu gradient formula", "d = sig * (1.0 + s * (1.0 - sig))", "d = sig * (1.0 + s * sig)",
          IND, "-k", "bias_act_vs_functional and silu"),
    fault("bias_act: residual gradient not scaled by alpha", "tl.store(DR + offs, rounded(alpha * dz,",
          "tl.store(DR + offs, rounded(dz,", IND, "-k", "bias_act_vs_functional and relu"),
    fault("bias_act: bias column off by one (flat path)", "B + (offs % N) * stride_b",
          "B + ((offs + 1) % N) * stride_b", IND, "-k", "bias_act_vs_functional and none"),
    fault("bias_act: relu turns NaN into 0", "y = tl.where(z < 0.0, 0.0, z)", "y = tl.maximum(z, 0.0)",
          BIAS, "-k", "nan"),
    fault("bias_act: backward forgets the bias when rebuilding z", "s = s + shift[None, :]", "s = s",
          IND, "-k", "bias_act_bias_only"),
    fault("bias_act: bias gradient sums the wrong sign", "acc += tl.where(mask, dz, 0.0)",
          "acc += tl.where(mask, -dz, 0.0)", IND, "-k", "bias_act_vs_functional and none"),
    # ---------------------------------------------------------------- dot interaction
    fault("interaction: pair column off by one", "        col = dim + i * (i - 1) // 2 + j\n",
          "        col = dim + i * (i - 1) // 2 + j + 1\n", INTER, "-k", "forward_backward and triton and strict"),
    fault("interaction: backward pair index transposed", "                pair = hi * (hi - 1) // 2 + lo\n",
          "                pair = lo * (lo - 1) // 2 + hi\n", INTER, "-k", "forward_backward and triton and strict"),
    # ---------------------------------------------------------------- embedding collection
    fault("embedding: negative ids not wrapped into the table", "r = tl.where(r < 0, r + n, r)", "r = r", EMB, "-k",
          "lookup_one_id and triton"),
    fault("embedding: ids outside their table read without the remainder",
          "if tl.max(((r < 0) | (r >= n)).to(tl.int32)) > 0:", "if tl.max(((r < 0) | (r >= n)).to(tl.int32)) > 1:",
          EMB, "-k", "lookup_bags and triton"),
    fault("embedding: row-wise Adagrad state not averaged over D", "tl.div_rn(sq, tl.zeros_like(sq) + D)",
          "tl.div_rn(sq, tl.zeros_like(sq) + 1)", EMB, "-k", "fused_update and triton and rowwise"),
    fault("embedding: duplicate rows not summed (an item keeps only its last gathered step)",
          "acc += tl.sum(g, axis=1)", "acc = tl.sum(g, axis=1)", EMB, "-k", "fused_update and triton and sgd"),
    fault("embedding: the pieces of a segment longer than a chunk not added together",
          "total += tl.sum(part, axis=0)[None, :]", "total += 0.0 * tl.sum(part, axis=0)[None, :]", EMB, "-k",
          "long_runs or fused_update and triton and sgd"),
    fault("embedding: the segment kernel drops the run sum carried from the last step",
          "run_sum += tl.where(row == carry_row, carry, 0.0)",
          "run_sum += 0.0 * tl.where(row == carry_row, carry, 0.0)",
          EMB, "-k", "fused_update and triton and sgd and one_id"),
    fault("embedding: the segment kernel also applies a run that began in the chunk before",
          "_apply_update(w_ptr, s_ptr, lr, row, run_sum, ends & (row != before), eps, seed, D, BLOCK_D, OPTIMIZER)",
          "_apply_update(w_ptr, s_ptr, lr, row, run_sum, ends, eps, seed, D, BLOCK_D, OPTIMIZER)",
          EMB, "-k", "long_runs and segments"),
    fault("embedding: half-precision weights rounded to nearest (small updates lost)",
          "tl.store(w_ptr + at, stochastically_rounded(w, w_ptr.dtype.element_ty, seed, at), mask=m2)",
          "tl.store(w_ptr + at, w.to(w_ptr.dtype.element_ty), mask=m2)", "tests/ops/test_embedding_half.py",
          "-k", "unbiased"),
    fault("embedding: lookup of bags reads the table sizes as offsets",
          "table_sizes if offsets is None else offsets", "table_sizes", EMB, "-k", "lookup_bags and triton"),
    # ---------------------------------------------------------------- cached plans of both
    fault("interaction: cached backward plan not keyed by the gradient's layout",
          'signature = ("bwd", call.signature, tensor_signature(grad))', 'signature = ("bwd", call.signature)',
          KEPT_OPS, "-k", "gradient_layout"),
    fault("embedding: cached update plan not keyed by the gradient's layout",
          'signature = ("update", call.signature, tensor_signature(grad))', 'signature = ("update", call.signature)',
          KEPT_OPS, "-k", "gradient_layout"),
    fault("embedding: a cached update skips the overlap of what it writes",
          '        checks.check_writes(weight, state, seed, {"lr": lr, "grad": grad, "ids": ids, "offsets": offsets,',
          '        (weight, state, seed, {"lr": lr, "grad": grad, "ids": ids, "offsets": offsets,',
          "tests/ops/test_embedding_errors.py", "-k", "overlapping and triton"),
    # ---------------------------------------------------------------- reduce
    fault("reduce: mean divides by n + 1", "total = total / n_reduced", "total = total / (n_reduced + 1)",
          IND, "-k", "reduce_vs_torch and mean and float32"),
    fault("reduce: bf16 output truncated instead of rounded", "bits = bits + 0x7FFF + ((bits >> 16) & 1)",
          "bits = bits", IND, "-k", "reduce_vs_torch and bfloat16"),
    fault("reduce: rows kernel tail mask dropped", "mask = row_mask[:, None] & (r < r_end)[None, :]",
          "mask = row_mask[:, None]", IND, "-k", "reduce_vs_torch and float32"),
    fault("reduce: cols kernel tail mask off by one", "mask = (r < r_end)[:, None] & col_mask[None, :]",
          "mask = (r < r_end - 1)[:, None] & col_mask[None, :]", IND, "-k", "reduce_vs_torch and float32"),
    fault("reduce: mean gradient not divided by n", "grad = (grad.to(ref.accumulate_dtype(grad.dtype, x_dtype)) / n)",
          "grad = (grad.to(ref.accumulate_dtype(grad.dtype, x_dtype)) / 1)", "tests/test_fuzz.py", "-k",
          "fuzz_reduce"),
    # ---------------------------------------------------------------- nn layers
    fault("FusedLinear: weight gradient ignores the activation",
          "grad_w = dz.t().mm(x if x.dim() == 2 else x.flatten(0, -2)) if want_w else None",
          "grad_w = g.t().mm(x if x.dim() == 2 else x.flatten(0, -2)) if want_w else None",
          NN, "-k", "fused_linear_matches_linear and fp32"),
    fault("FusedLinear: input gradient ignores the activation", "        grad_x = dz.mm(weight)\n",
          "        grad_x = g.mm(weight)\n", NN, "-k", "fused_linear_matches_linear and fp32"),
    fault("op helper: eager node zero-fills the gradient of a non-differentiable output",
          "ctx.set_materialize_grads(False)", "ctx.set_materialize_grads(True)",
          OPDEF, "-k", "zero_gradient"),
    fault("LoRALinear: scaling not divided by the rank", "self.scaling = self.alpha / rank",
          "self.scaling = self.alpha", NN, "-k", "lora_linear_matches_formula and fp32"),
)

#: errors that mean a planted edit does not compile or run (names that moved, a bad replacement), not a catch
BROKEN = ("CompilationError", "NameError", "SyntaxError", "IndentationError", "UnboundLocalError")


def scratch_copy(dest: Path) -> Path:
    src = dest / "src"
    shutil.copytree(ROOT / "src", src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return src


def apply(f: Fault, src: Path) -> str | None:
    """Apply ``f``'s edits under ``src/fuselab``; an error message when a snippet is missing or ambiguous."""
    for snippet, replacement in f.edits:
        hits = [p for p in sorted((src / "fuselab").rglob("*.py")) if snippet in p.read_text()]
        if not hits:
            return f"snippet not found under src/fuselab: {snippet!r} (the code changed: update this fault)"
        if len(hits) > 1:
            return f"snippet in {len(hits)} files ({', '.join(str(h.relative_to(src)) for h in hits)}): {snippet!r}"
        text = hits[0].read_text()
        hits[0].write_text(text.replace(snippet, replacement))
    return None


def run_tests(src: Path, tests: tuple[str, ...], timeout: float) -> tuple[int, str, str]:
    """(exit code, last output line, whole output) of pytest on ``tests`` with ``src`` first on the path."""
    env = {**os.environ, "PYTHONPATH": str(src), "TRITON_INTERPRET": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("FUSELAB_BACKEND", None)
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *tests]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return -1, "timed out", ""
    output = proc.stdout + proc.stderr
    lines = [ln for ln in output.splitlines() if ln.strip()]
    return proc.returncode, lines[-1] if lines else "", output


def check_fault(f: Fault, timeout: float) -> tuple[str, str]:
    """(status, detail): status is caught, survived or error."""
    with tempfile.TemporaryDirectory(prefix="fuselab-mutation-") as tmp:
        src = scratch_copy(Path(tmp))
        problem = apply(f, src)
        if problem:
            return "error", problem
        rc, last, output = run_tests(src, f.tests, timeout)
    if rc == 0:
        return "survived", last
    broken = next((e for e in BROKEN if e in output), None)
    if broken:  # the edit no longer fits the code around it: not a verdict on the tests
        return "error", f"the faulty code does not run ({broken}): update this fault"
    if rc in (2, 3, 4, 5):  # interrupted, internal error, usage error, no tests collected: not a verdict
        return "error", f"pytest exit {rc}: {last}"
    return "caught", last if rc > 0 else f"process died ({rc}): {last}"


def baseline(faults: tuple[Fault, ...], timeout: float) -> tuple[str, str]:
    """The unmodified copy must pass every selection (else a 'caught' fault proves nothing)."""
    with tempfile.TemporaryDirectory(prefix="fuselab-mutation-") as tmp:
        src = scratch_copy(Path(tmp))
        groups: dict[tuple[str, ...], list[str]] = {}
        for f in faults:
            files = tuple(a for a in f.tests if a.startswith("tests/"))
            k = f.tests[f.tests.index("-k") + 1] if "-k" in f.tests else None
            groups.setdefault(files, []).append(k or "")
        for files, ks in groups.items():
            expr = [] if "" in ks else ["-k", " or ".join(f"({k})" for k in ks)]
            rc, last, _ = run_tests(src, (*files, *expr), timeout)
            if rc != 0:
                return "error", f"{' '.join(files)} {' '.join(expr)}: exit {rc}: {last}"
    return "ok", ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-j", "--workers", type=int, default=2, help="faults checked in parallel (default 2)")
    parser.add_argument("-k", dest="select", action="append", default=[],
                        help="only faults whose name contains this text (repeatable)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per test run (default 300)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the run on the unmodified copy")
    args = parser.parse_args(argv)
    faults = tuple(f for f in FAULTS if not args.select or any(k in f.name for k in args.select))
    start = time.monotonic()
    failed = False
    with ThreadPoolExecutor(max_workers=max(1, args.workers)) as pool:
        base = None if args.no_baseline else pool.submit(baseline, faults, args.timeout)
        results = list(pool.map(lambda f: (f, check_fault(f, args.timeout)), faults))
        if base is not None:
            status, detail = base.result()
            print(f"baseline: {status} {detail}".rstrip())
            failed |= status != "ok"
    counts = {"caught": 0, "survived": 0, "error": 0}
    for f, (status, detail) in results:
        counts[status] += 1
        print(f"{status:8s} {f.name}" + (f"  [{detail}]" if status != "caught" else ""))
    print(f"mutations: {counts['caught']} caught, {counts['survived']} survived"
          + (f", {counts['error']} errors" if counts["error"] else "") + f" ({time.monotonic() - start:.0f}s)")
    failed |= counts["survived"] > 0 or counts["error"] > 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
