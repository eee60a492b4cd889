"""The command line's arguments, checked before any command runs (no torch unless a check needs
the model catalogue).

Every mistake is one line on stderr and exit status 2, before anything is planned, compiled,
measured or written: :class:`Parser` makes argparse say it in one line, the ``type=`` functions
here check each value as it is read (a budget remat cannot read, a negative count, a time
limit that is not a number), and :func:`check` checks what needs the catalogue or the solvers
(a zoo model, a benchmark method, a demo example, a size).
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import NoReturn

SIZES = ("tiny", "small", "full")
DEVICES = ("cpu", "cuda")


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (``remat plan: error: ...``) and exit 2."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _number(text: str, kind, ok, must: str):
    """``kind(text)`` if it parses and ``ok`` holds for it, else argparse's error: ``must`` says
    what it must be."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {'a whole number' if kind is int else 'a number'}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"{text} must be {must}")
    return value


def positive_int(text: str) -> int:
    """A whole number >= 1 (a count of steps, repeats, elements, threads, points)."""
    return _number(text, int, lambda v: v >= 1, "at least 1")


def elements(text: str) -> int:
    """Elements per input tensor of the demo: 1 to 2**30 (4 GiB of float32 each)."""
    return _number(text, int, lambda v: 1 <= v <= 1 << 30, "from 1 to 1073741824 (2**30)")


def seconds(text: str) -> float:
    """Seconds >= 0 (``inf``: no limit)."""
    return _number(text, float, lambda v: not math.isnan(v) and v >= 0, "a number of seconds >= 0")


def positive_number(text: str) -> float:
    """A finite number > 0 (a bandwidth)."""
    return _number(text, float, lambda v: math.isfinite(v) and v > 0, "a finite number > 0")


def share(text: str) -> float:
    """A share of extra step time (``--max-overhead 0.10``): finite, >= 0."""
    return _number(text, float, lambda v: math.isfinite(v) and v >= 0, "a share of the step time >= 0, such as 0.10")


def budget(text: str):
    """A budget remat reads (:meth:`remat.plans.budget.Budget.parse`)."""
    from ..errors import BudgetError
    from ..plans.budget import Budget

    try:
        return Budget.parse(text)
    except BudgetError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def budgets(text: str) -> str:
    """A comma-separated list of budgets, each one remat reads."""
    for item in text.split(","):
        budget(item.strip())
    return text


def solver(text: str) -> str:
    """A registered solver's name."""
    from ..errors import OptionError
    from ..solvers import info

    try:
        info(text)
    except OptionError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def solvers(text: str) -> str:
    for item in text.split(","):
        solver(item.strip())
    return text


def check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What the ``type=`` functions cannot check alone: names from the model catalogue and the
    benchmark's methods, lists of sizes. Calls ``parser.error`` (one line, exit 2)."""
    command = args.command
    try:
        if command == "bench":
            _check_list("size", args.size, SIZES)
            if args.device.split(":")[0] not in DEVICES:
                raise ValueError(f"--device {args.device!r}: use cpu or cuda")
            if args.device.startswith("cuda"):
                import torch

                if not torch.cuda.is_available():
                    raise ValueError(f"--device {args.device}: torch sees no CUDA GPU here; use --device cpu")
            _check_models(args.models)
            _check_methods(args.methods)
            from ..errors import OptionError
            from .bench import resolve

            try:
                args.compiler_chosen = resolve(args)  # and the results to resume from, readable
            except OptionError as e:
                raise ValueError(str(e)) from None
        elif command == "capture":
            _check_models(args.model, many=False)
        elif command == "demo":
            from ..zoo.patterns import SEED_EXAMPLES

            unknown = [e for e in args.examples if e not in SEED_EXAMPLES]
            if unknown:
                raise ValueError(f"unknown example {unknown[0]!r}; examples: {', '.join(SEED_EXAMPLES)}")
    except ValueError as e:
        print(f"{parser.prog} {command}: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def _check_list(what: str, text: str, allowed) -> None:
    items = [x.strip() for x in text.split(",")]
    bad = [x for x in items if x not in allowed]
    if bad or not items:
        raise ValueError(f"--{what} {text!r}: use one or more of {', '.join(allowed)}, comma-separated")


def _check_models(text: str, many: bool = True) -> None:
    from .. import zoo

    known = zoo.names()
    items = [x.strip() for x in text.split(",")] if many else [text]
    if many and items == ["all"]:
        return
    bad = [x for x in items if x not in known]
    if bad:
        flag = "--models" if many else "--model"
        raise ValueError(f"{flag}: unknown model {bad[0]!r}; models: {'all, ' if many else ''}{', '.join(known)}")


def _check_methods(text: str) -> None:
    from ..bench.methods import parse_method, split_methods

    if text.strip() == "all":
        return
    for item in split_methods(text):
        parse_method(item)  # ValueError naming the method and what would work
