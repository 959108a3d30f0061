"""The CUDA extensions' build plan (no GPU needed): what CI's nvcc check compiles is what load_inline builds."""

from __future__ import annotations

import subprocess
import sys

from fuselab.cuda import _build


def test_every_source_belongs_to_one_extension():
    listed = [source for sources in _build.EXTENSIONS.values() for source in sources]
    on_disk = sorted(p.name for p in _build.SOURCE_DIR.glob("*.cu"))
    assert sorted(listed) == on_disk and len(set(listed)) == len(listed)


def test_translation_units_are_written_for_ci(tmp_path):
    out = subprocess.run([sys.executable, "-m", "fuselab.cuda._build", str(tmp_path)], capture_output=True,
                         text=True, check=True).stdout.split()
    assert sorted(out) == sorted(str(tmp_path / f"{name}.cu") for name in _build.EXTENSIONS)
    unit = (tmp_path / "fuselab_bias_act.cu").read_text()
    assert unit == _build.translation_unit("fuselab_bias_act")
    assert unit.startswith("#include <torch/types.h>")
    for source in _build.EXTENSIONS["fuselab_bias_act"]:  # every source, in order
        assert (_build.SOURCE_DIR / source).read_text() in unit
    assert unit.index("bias_act_fwd_kernel") < unit.index("FusedLinearFunction")


def test_public_functions_stay_functions():
    """``fuselab.cuda.bias_act`` & co. are functions on every access, also after their modules (and the other
    backends') were imported: a submodule of the same name used to replace the function on the package."""
    import fuselab.cuda as cuda
    from fuselab.cuda import _bias_act, _fused_linear, _square  # noqa: F401 (imported for the side effect)

    for _ in range(2):
        for name in ("bias_act", "square", "fused_linear"):
            assert callable(getattr(cuda, name)) and not isinstance(getattr(cuda, name), type(cuda)), name
    assert {"bias_act", "square", "fused_linear"} <= set(dir(cuda))


def test_usage_error_without_a_folder():
    assert _build.main([]) == 2
