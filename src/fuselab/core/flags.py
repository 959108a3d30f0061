"""The values a command-line flag or a config field may take, checked where they are parsed.

A rule has ``check(value)`` (a typed value: returns it, or raises ``ValueError`` saying what is expected) and
``parse(text)`` (argparse's ``type=``: the text converted and checked, or ``argparse.ArgumentTypeError``, which
argparse reports as ``argument --flag: ...`` with exit status 2). One rule serves the flag, the config field of the
same name (``--set key=value``, a config file) and the API, so they cannot disagree.

* :class:`Number`: an integer or a finite float within bounds (``Number(int, 1)``: a positive integer).
* :class:`DeviceName`: ``cpu``, ``cuda`` or ``cuda:N``.
* :class:`OneOf`: one of a fixed set of words, or (``suffixes``) a file name with one of those endings.
"""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass
from typing import Any


def _argument_error(rule: Any, text: str) -> Any:
    """``text`` converted and checked by ``rule``, or ``ArgumentTypeError`` quoting the text as given."""
    try:
        return rule.check(rule.convert(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {rule.describe()}, got {text!r}") from None


@dataclass(frozen=True)
class Number:
    """An ``int`` or a finite ``float`` in ``[low, high]`` (``low_open``/``high_open``: that bound itself excluded;
    None: no bound)."""

    kind: type = int
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def _text(self, bound: float) -> str:
        return str(int(bound)) if self.kind is int else f"{bound:g}"

    def describe(self) -> str:
        what = "an integer" if self.kind is int else "a finite number"
        if self.low is not None and self.high is not None:
            return (f"{what} in {'(' if self.low_open else '['}{self._text(self.low)}, {self._text(self.high)}"
                    f"{')' if self.high_open else ']'}")
        bounds = []
        if self.low is not None:
            bounds.append(f"{'>' if self.low_open else '>='} {self._text(self.low)}")
        if self.high is not None:
            bounds.append(f"{'<' if self.high_open else '<='} {self._text(self.high)}")
        return what + (" " + " and ".join(bounds) if bounds else "")

    def convert(self, text: str) -> int | float:
        try:
            return int(text) if self.kind is int else float(text)
        except ValueError:
            raise ValueError(f"expected {self.describe()}, got {text!r}") from None

    def check(self, value: Any) -> int | float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                self.kind is int and isinstance(value, float)):
            raise ValueError(f"expected {self.describe()}, got {value!r}")
        inside = math.isfinite(value)
        if inside and self.low is not None:
            inside = value > self.low if self.low_open else value >= self.low
        if inside and self.high is not None:
            inside = value < self.high if self.high_open else value <= self.high
        if not inside:
            raise ValueError(f"expected {self.describe()}, got {value!r}")
        return value

    def parse(self, text: str) -> int | float:
        return _argument_error(self, text)


_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")


@dataclass(frozen=True)
class DeviceName:
    """A torch device this project runs on: ``cpu``, ``cuda`` or ``cuda:N`` (whether CUDA is there is checked
    when the device is used)."""

    def describe(self) -> str:
        return "cpu, cuda or cuda:N"

    def convert(self, text: str) -> str:
        return text

    def check(self, value: Any) -> str:
        if not isinstance(value, str) or not _DEVICE.match(value):
            raise ValueError(f"expected {self.describe()}, got {value!r}")
        return value

    def parse(self, text: str) -> str:
        return _argument_error(self, text)


@dataclass(frozen=True)
class OneOf:
    """One of ``words``, or a name ending in one of ``suffixes`` (a file: whether it exists is checked on use)."""

    words: tuple[str, ...]
    suffixes: tuple[str, ...] = ()

    def describe(self) -> str:
        files = f", or a {'/'.join(self.suffixes)} file" if self.suffixes else ""
        return f"one of {', '.join(self.words)}{files}"

    def convert(self, text: str) -> str:
        return text

    def check(self, value: Any) -> str:
        if not isinstance(value, str) or not (value in self.words or (self.suffixes and value.endswith(
                self.suffixes))):
            raise ValueError(f"expected {self.describe()}, got {value!r}")
        return value

    def parse(self, text: str) -> str:
        return _argument_error(self, text)


#: the rules most flags use
POSITIVE_INT = Number(int, 1)
COUNT = Number(int, 0)  # 0 allowed: "none", "never" or "all", as each flag's help says
SECONDS = Number(float, 0, low_open=True)
DEVICE = DeviceName()
