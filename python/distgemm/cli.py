"""What distgemm's command-line tools share: bad input ends with exit code 2 and one line naming
the constraint and the value, ``--help`` shows the tool's whole docstring, and a reader that goes
away (``| head``) ends the tool quietly."""

from __future__ import annotations

import argparse
import functools
import os
import sys

from . import _core

# The bounds of a problem, from C++ (schedule/plan_types.hpp), where every plan is checked
# against them: int32 extents, and operands whose byte counts fit 64 bits.
MAX_EXTENT = int(_core.MAX_EXTENT)
MAX_OPERAND_ELEMENTS = int(_core.MAX_OPERAND_ELEMENTS)


class ArgumentParser(argparse.ArgumentParser):
    """argparse with the module docstring as the description, kept as written, and errors in one
    line (the usage is what --help prints)."""

    def __init__(self, prog: str, doc: str, **kw):
        super().__init__(
            prog=prog,
            description=doc.replace("``", "`"),
            formatter_class=argparse.RawDescriptionHelpFormatter,
            **kw,
        )

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def int_in(lo: int, hi: int | None = None, why: str = ""):
    """An argparse type: an integer in lo..hi (no upper bound for hi=None); the error names the
    value and the range, and ``why`` the range's reason."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < lo or (hi is not None and value > hi):
            bound = f"is not in {lo}..{hi}" if hi is not None else f"is below {lo}"
            raise argparse.ArgumentTypeError(f"{value} {bound}{why}")
        return value

    return parse


def positive_float(text: str) -> float:
    """An argparse type: a finite float above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number above 0")
    return value


# A problem extent (M, N, K or L).
extent = int_in(1, MAX_EXTENT, " (2**31-1: distgemm's GEMMs take int32 extents)")


def operand_size_problem(m: int, n: int, k: int, l: int = 1) -> str:
    """Empty when each operand of an M x N x K GEMM of batch L has at most MAX_OPERAND_ELEMENTS
    elements; otherwise which one does not, with its count."""
    for name, rows, cols, count in (
        ("A", "M", "K", m * k * l),
        ("B", "N", "K", n * k * l),
        ("D", "M", "N", m * n * l),
    ):
        if count > MAX_OPERAND_ELEMENTS:
            return (
                f"{name} holds {rows}*{cols}*L = {count} elements (M={m} N={n} K={k} L={l}), "
                "above 2**60: its byte count overflows 64 bits"
            )
    return ""


def quiet_on_broken_pipe(main):
    """Wraps a tool's ``main``: when the reader of stdout goes away, it ends with exit code 1 and
    no traceback (stdout is pointed at /dev/null, so the interpreter's last flush is silent)."""

    @functools.wraps(main)
    def run(*args, **kw):
        try:
            rc = main(*args, **kw)
            sys.stdout.flush()
            return rc
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1

    return run
