"""The installed Hugging Face transformers for the tests that compare fuselab with the library itself.

The project's venv holds transformers 5.x (the ``hf`` extra); ``.ci/run`` also installs a transformers 4.x into
:data:`HF4_DIR` (``pip install --target``), which ``tests/test_hf.py::test_transformers_4x_in_a_subprocess`` puts
first on ``sys.path`` of one pytest subprocess that runs the library tests of ``tests/test_hf.py`` and
``tests/test_rope_scaling.py`` (:func:`run_under_transformers_4`): two versions of one package cannot share a
process.

Without the library the tests skip, saying how to install it, unless ``FUSELAB_REQUIRE_TRANSFORMERS=1`` (set by
``.ci/run`` and for the subprocess), where they fail. ``FUSELAB_EXPECT_TRANSFORMERS=4`` (set for the subprocess)
makes them fail unless the imported library is a 4.x.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import fuselab

ROOT = Path(__file__).resolve().parents[1]
#: the folder that holds a transformers 4.x (``pip install --target``), first on the subprocess's sys.path
HF4_DIR = Path(os.environ.get("FUSELAB_TRANSFORMERS4_DIR", ROOT / ".venv" / "hf4"))
REQUIRED = os.environ.get("FUSELAB_REQUIRE_TRANSFORMERS") == "1"
EXPECTED_MAJOR = os.environ.get("FUSELAB_EXPECT_TRANSFORMERS")
#: set inside the subprocess, so that its module does not start another one
INNER = "FUSELAB_HF_SUBPROCESS"


def _missing(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"{reason} (FUSELAB_REQUIRE_TRANSFORMERS=1)")
    pytest.skip(reason)


def transformers() -> ModuleType:
    """The importable transformers (skips, or fails where it is required, without it); checks the expected major."""
    try:
        import transformers as library
        from transformers.models.llama import modeling_llama  # noqa: F401  (the functions compared)
    except ImportError as exc:
        _missing(f"transformers is not importable ({exc}); install it with `pip install -e .[hf]`")
    if EXPECTED_MAJOR is not None and library.__version__.split(".")[0] != EXPECTED_MAJOR:
        pytest.fail(f"expected transformers {EXPECTED_MAJOR}.x, imported {library.__version__} from "
                    f"{library.__file__}")
    return library


def major(library: ModuleType) -> int:
    return int(library.__version__.split(".")[0])


def run_under_transformers_4(test_files: list[str], select: str) -> None:
    """Run ``select`` (a ``-k`` expression) of ``test_files`` (under ``tests/``) in one pytest subprocess with
    :data:`HF4_DIR` first on sys.path; fail with its output unless it passed at least one test and skipped or failed
    none."""
    if os.environ.get(INNER):
        pytest.skip("already inside the transformers 4.x subprocess")
    if not (HF4_DIR / "transformers").is_dir():
        _missing(f"no transformers 4.x in {HF4_DIR} (FUSELAB_TRANSFORMERS4_DIR); install one with "
                 f"`pip install --no-deps --no-compile --target {HF4_DIR} 'transformers>=4.45,<5' 'huggingface-hub<1' "
                 f"'tokenizers<=0.23.0' requests urllib3 charset-normalizer certifi idna`")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    src = Path(fuselab.__file__).resolve().parents[1]  # the fuselab this process tests (a scratch copy's too)
    env.update({INNER: "1", "FUSELAB_REQUIRE_TRANSFORMERS": "1", "FUSELAB_EXPECT_TRANSFORMERS": "4",
                "PYTHONPATH": os.pathsep.join(p for p in (str(HF4_DIR), str(src), env.get("PYTHONPATH", "")) if p)})
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-k", select,
           *(str(ROOT / "tests" / name) for name in test_files)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=540)
    out = proc.stdout + proc.stderr
    summary = out.strip().splitlines()[-1] if out.strip() else ""
    passed = re.search(r"(\d+) passed", summary)
    if proc.returncode != 0 or not passed or re.search(r"skipped|failed|error", summary):
        pytest.fail(f"under transformers 4.x ({HF4_DIR}): exit {proc.returncode}, {summary!r}\n{out[-6000:]}")
