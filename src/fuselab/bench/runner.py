"""The harness: for each op, case and provider: check correctness, then time, then report.

Data flow (one direction): options -> suites' cases -> per provider: build, check against the
float64 reference, time on fresh inputs, peak memory -> figures against the ceilings ->
table, JSON, CSV, plots. A provider that is missing, skipped, wrong or raising never stops the run.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import torch

from fuselab.backend import forced
from fuselab.envinfo import enable_interpreter_if_no_cuda, environment, triton_mode

from . import ceilings as _ceilings
from . import results as R
from . import stream as _stream
from .check import as_tuple, check, make_grad_outputs, prepare_args
from .options import BenchOptions
from .spec import DTYPES, GRAD_MODES, MODES, BenchCase, Fn, OpSpec, Provider, dtype_name, select_cases
from .suites import get_spec, op_names
from .timing import Timer, TimingJob, default_timer, peak_memory_delta, peak_memory_start

MAX_ROTATION_SETS = 64
Progress = Callable[[str], None]  # called with a description before each case × provider


def resolve_ops(options: BenchOptions) -> list[str]:
    """The op names to run (all registered ops when none given); ``ValueError`` listing valid ones."""
    valid = op_names()
    ops = list(options.ops) or valid
    for op in ops:
        if op not in valid:
            raise ValueError(f"unknown op {op!r}; valid ops: {', '.join(valid)}")
    return ops


def validate(options: BenchOptions) -> list[str]:
    """Check every name in ``options`` (ops, providers, dtypes, modes) before anything runs.

    Raises ``ValueError`` naming the bad value and listing the valid choices."""
    ops = resolve_ops(options)
    for name in options.dtypes or ():
        if name not in DTYPES:
            raise ValueError(f"unknown dtype {name!r}; valid dtypes: {', '.join(DTYPES)}")
    for name in options.modes or ():
        if name not in MODES:
            raise ValueError(f"unknown mode {name!r}; valid modes: {', '.join(MODES)}")
    if options.providers:
        known: list[str] = []
        for op in ops:
            with contextlib.suppress(Exception):  # a suite that does not import is reported at run time
                known += [p.name for p in get_spec(op).providers if p.name not in known]
        for name in options.providers:
            if known and name not in known:
                raise ValueError(f"unknown provider {name!r} for {', '.join(ops)}; valid providers: {', '.join(known)}")
    if options.cases:
        _validate_cases(ops, options)
    return ops


def _validate_cases(ops: Sequence[str], options: BenchOptions) -> None:
    """``ValueError`` for a ``--case`` name that selects no case of ``ops`` on this device, listing the labels."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cases: list[BenchCase] = []
    for op in ops:
        with contextlib.suppress(Exception):  # a suite that does not load is reported at run time
            cases += get_spec(op).cases(spec_query(device, options))
    for name in options.cases:
        if cases and not select_cases(cases, [name]):
            labels = ", ".join(dict.fromkeys(c.label for c in cases))
            raise ValueError(f"no case {name!r} of {', '.join(ops)}; cases: {labels}")


def _rotation_sets(case: BenchCase, device: torch.device, options: BenchOptions) -> int:
    """How many input sets to rotate through so that together they exceed 2× the L2 cache."""
    if not (options.l2_cold and case.l2_cold and device.type == "cuda"):
        return 1
    props = torch.cuda.get_device_properties(device)
    l2 = getattr(props, "L2_cache_size", 0) or 50 * 2**20
    return max(2, min(MAX_ROTATION_SETS, math.ceil(2 * l2 / max(case.bytes, 1))))


#: modes that ``--cuda-graph`` captures: the whole step, forward (and backward) launched inside the capture
GRAPH_MODES = ("fwd", "fwd+bwd")


def _captured(case: BenchCase, device: torch.device, options: BenchOptions) -> bool:
    """Whether ``case`` is timed as a CUDA graph replay: ``--cuda-graph`` on a GPU, in a mode of :data:`GRAPH_MODES`
    (not bwd: its forward ran outside the capture, so its backward would launch on that forward's stream)."""
    return options.cuda_graph and device.type == "cuda" and case.mode in GRAPH_MODES


def make_step(fn: Fn, args: Sequence[Any], case: BenchCase, grad_args: Sequence[int]
              ) -> tuple[Callable[[], Any], list[torch.Tensor]]:
    """One timed step for ``case.mode`` and the tensors whose grads are reset between steps.

    fwd: ``fn(*args)`` under ``no_grad``. bwd: the forward runs once here, the step is
    ``autograd.backward(outputs, grad_outputs, retain_graph=True)``. fwd+bwd: both in the step. step: ``fn(*args)``
    as it is (the provider's own training step).
    """
    if case.mode == "fwd":
        def fwd() -> Any:
            with torch.no_grad():
                return fn(*args)
        return fwd, []
    if case.mode not in GRAD_MODES:
        return (lambda: fn(*args)), []
    leaves = [args[i] for i in grad_args if isinstance(args[i], torch.Tensor)]
    outputs = as_tuple(fn(*args))
    grad_outputs = make_grad_outputs(outputs, case.dtype)
    pairs = [(o, g) for o, g in zip(outputs, grad_outputs) if o is not None and o.requires_grad]
    if not pairs:
        raise RuntimeError("no output of the provider requires grad in a backward mode")
    gos = [g.to(o.dtype) for o, g in pairs]
    if case.mode == "bwd":
        outs = [o for o, _ in pairs]
        return (lambda: torch.autograd.backward(outs, gos, retain_graph=True)), leaves
    keep = [i for i, o in enumerate(outputs) if o is not None and o.requires_grad]
    del outputs, pairs

    def fwd_bwd() -> None:
        outs = as_tuple(fn(*args))
        torch.autograd.backward([outs[i] for i in keep], gos)

    return fwd_bwd, leaves


def time_provider(spec: OpSpec, case: BenchCase, fn: Fn, device: torch.device, timer: Timer,
                  options: BenchOptions, provider: str = "") -> tuple[Any, int | None, list[str]]:
    """Time ``fn`` on fresh inputs: (TimingStats, peak memory delta of one step, notes)."""
    notes = []
    n_sets = _rotation_sets(case, device, options)
    grad_args = spec.grad_args(case)
    needs_grad = case.mode in GRAD_MODES
    steps, leaves = [], []
    for _ in range(n_sets):
        args = prepare_args(spec.make_inputs(case, device), grad_args, needs_grad)
        step, grads = make_step(fn, args, case, grad_args)
        steps.append(step)
        leaves += grads
    if n_sets > 1:
        notes.append(f"L2-cold: {n_sets} rotating input sets")
    graph = _captured(case, device, options)
    if graph:
        notes.append("CUDA graph replay")
    elif options.cuda_graph and device.type == "cuda":
        notes.append(f"not captured: --cuda-graph applies to {' and '.join(GRAPH_MODES)}")
    start = peak_memory_start(device)
    steps[0]()  # untimed: compiles (torch.compile, TorchScript, Triton) happen here, never inside a timed sample
    # a whole step's peak counts what it keeps (model, optimizer state) too: the memory it needs
    peak = peak_memory_delta(device, 0 if case.mode == "step" and start is not None else start)
    for t in leaves:
        t.grad = None
    job = TimingJob(steps=steps, grad_to_none=leaves, provider=provider, case_key=case.key, cuda_graph=graph)
    return timer.measure(job), peak, notes


def run_case(spec: OpSpec, case: BenchCase, provider: Provider, device: torch.device, timer: Timer,
             options: BenchOptions, triton_ok: bool = True) -> R.Result:
    """Check then time one provider on one case; never raises (failures become a status)."""
    r = R.Result(op=spec.name, case=case.label, dtype=dtype_name(case.dtype), mode=case.mode, provider=provider.name,
                 numel=case.numel, bytes=case.bytes, flops=case.flops, l2_cold=case.l2_cold, samples=case.samples,
                 group=case.group)
    missing = provider.missing()
    if missing:
        r.status, r.detail = R.NOT_INSTALLED, f"needs {missing}"
        return r
    reason = provider.skip_reason(case)
    if reason is None and provider.cuda_only and device.type != "cuda":
        reason = "needs CUDA"
    interpreted = provider.triton and device.type != "cuda"
    if reason is None and interpreted and not triton_ok:
        reason = "Triton needs a GPU or TRITON_INTERPRET=1 set before triton is imported"
    if reason is not None:
        r.status, r.detail = R.SKIPPED, reason
        return r
    with forced("triton") if interpreted else contextlib.nullcontext():
        stage = "build"
        try:
            fn = provider.build(case)
            stage = "check"
            result = check(spec, case, fn, device=device)
        except Exception as e:
            r.status, r.detail = R.FAILED, f"{stage}: {R.short_error(e)}"
            return r
    r.rel_error, r.tolerance = result.error, result.tolerance
    if not result.ok:
        r.status, r.detail = R.WRONG, f"rel error {result.error:.2e} > tolerance {result.tolerance:.0e}"
    if interpreted:
        if result.ok:
            r.status = R.CORRECTNESS_ONLY
        return r
    try:
        stats, r.peak_mem_bytes, notes = time_provider(spec, case, fn, device, timer, options, provider.name)
    except Exception as e:
        r.status, r.detail = R.FAILED, f"timing: {R.short_error(e)}"
        return r
    r.median_ms, r.p20_ms, r.p80_ms, r.timer = stats.median_ms, stats.p20_ms, stats.p80_ms, timer.kind
    if notes:
        r.detail = "; ".join([d for d in (r.detail, *notes) if d])
    return r


def timer_description(timer: Timer) -> str:
    if timer.kind == "cuda":
        return "CUDA events via triton.testing.do_bench (median, p20, p80 per call)"
    return "host clock: CPU timings (median, p20, p80 per call)"


def run_op(op: str, options: BenchOptions, device: torch.device, timer: Timer, ceilings: R.Ceilings | None,
           env: dict[str, Any], progress: Progress | None = None) -> R.OpRun:
    """All cases × providers of registered op ``op``; a suite that fails to load gives a run with ``error``."""
    try:
        spec = get_spec(op)
    except Exception as e:
        run = _new_run(op, options, timer, ceilings, env)
        run.error = f"suite failed: {R.short_error(e)}"
        return run
    return run_spec(spec, options, device, timer, ceilings, env, progress)


def _new_run(op: str, options: BenchOptions, timer: Timer, ceilings: R.Ceilings | None,
             env: dict[str, Any]) -> R.OpRun:
    return R.OpRun(op=op, summary="", command=options.command, env=env, ceilings=ceilings,
                   timer=timer_description(timer), options=_options_dict(options),
                   created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))


def run_spec(spec: OpSpec, options: BenchOptions, device: torch.device, timer: Timer,
             ceilings: R.Ceilings | None, env: dict[str, Any], progress: Progress | None = None) -> R.OpRun:
    """All cases × providers of ``spec`` (any OpSpec, registered or not: the tests use toy specs)."""
    run = _new_run(spec.name, options, timer, ceilings, env)
    run.summary = spec.summary
    try:
        cases = select_cases(spec.cases(spec_query(device, options)), options.cases)
    except Exception as e:
        run.error = f"cases failed: {R.short_error(e)}"
        return run
    wanted = set(options.providers or ())
    chosen = [p for p in spec.providers if not wanted or p.name in wanted]
    triton_ok = triton_mode() != "unavailable"
    for case in cases:
        for provider in chosen:
            if progress is not None:
                progress(f"{spec.name} {case.label} {dtype_name(case.dtype)} {case.mode} {provider.name}")
            run.results.append(run_case(spec, case, provider, device, timer, options, triton_ok))
        if _wants_stream(case, device, options):
            if progress is not None:
                progress(f"{spec.name} {case.label} {dtype_name(case.dtype)} {case.mode} {_stream.NAME}")
            run.results.append(_stream.measure(case, device, timer, _rotation_sets(case, device, options),
                                               _captured(case, device, options)))
    R.derive_figures(run.results, ceilings, spec.baseline)
    return run


def _wants_stream(case: BenchCase, device: torch.device, options: BenchOptions) -> bool:
    """The stream bound is measured on GPUs, for cases that declare their read bytes, unless ``--no-stream``."""
    return options.stream and device.type == "cuda" and case.read_bytes is not None


def spec_query(device: torch.device, options: BenchOptions):
    from .spec import CaseQuery

    dtypes = tuple(DTYPES[d] for d in options.dtypes) if options.dtypes else None
    return CaseQuery(device_type=device.type, quick=options.quick, dtypes=dtypes,
                     modes=tuple(options.modes) if options.modes else None)


def _options_dict(options: BenchOptions) -> dict[str, Any]:
    d = asdict(options)
    d["out"] = str(options.out_dir())
    return d


def count_jobs(ops: Sequence[str], options: BenchOptions, device: torch.device) -> int:
    """Number of case × provider pairs (for the progress bar); suites that fail count as zero."""
    total = 0
    for op in ops:
        with contextlib.suppress(Exception):
            spec = get_spec(op)
            wanted = set(options.providers or ())
            n = sum(1 for p in spec.providers if not wanted or p.name in wanted)
            cases = select_cases(spec.cases(spec_query(device, options)), options.cases)
            total += n * len(cases) + sum(_wants_stream(c, device, options) for c in cases)
    return total


def in_process_compiles() -> int:
    """Make torch.compile providers compile in this process (Inductor's ``compile_threads = 1``); returns it.

    With the default (one worker per core), the first compile starts a pool of subprocesses that each import
    torch for seconds after it returns, and the next providers' timings share the host with them
    (``benchmarks/notes/lab.md#what-moves-a-measurement``). On a CPU the pool competes with the timed code for the same
    cores. The lab times devices, not compile pools; compiling serially only makes the torch.compile providers' build
    slower."""
    import torch._inductor.config as inductor_config

    inductor_config.compile_threads = 1
    return inductor_config.compile_threads


def prepare(device: torch.device | None = None, timer: Timer | None = None, ceilings: R.Ceilings | None = None,
            quick: bool = False) -> tuple[torch.device, Timer, R.Ceilings | None, dict[str, Any]]:
    """The device, timer, ceilings (measured unless given) and environment of a run."""
    enable_interpreter_if_no_cuda()
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    timer = timer or default_timer(device, quick=quick)
    env = environment()
    env["inductor_compile_threads"] = in_process_compiles()  # on a CPU the compile pool shares the timed cores
    if ceilings is None:
        try:
            ceilings = _ceilings.measure(device, timer, quick=quick)
        except Exception as e:  # the run still reports times, without fractions
            env["ceilings_error"] = R.short_error(e)
    return device, timer, ceilings, env
