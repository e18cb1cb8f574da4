"""One ``params`` entry, in Hydra's override sweep syntax, as an Optuna distribution:

=====================================  ===============================================
``choice(a, b)`` or ``a,b``            categorical
``range(16, 129, step=16)``            int (float if any bound is a float) with step;
                                       the stop is excluded, as in Hydra
``interval(1e-4, 1e-1)``               float; int when the config's value is an int or
                                       the sweep is tagged ``int``
``tag(log, interval(...))``            the same on a log scale
a plain value                          fixed for every trial
=====================================  ===============================================

and hydra-optuna-sweeper 1.1's ``search_space`` entries (``legacy_distribution``). What
cannot be searched raises ValueError; ``_space`` turns it into one line naming the entry.
"""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any, TypeGuard

from hydra.core.override_parser.types import (
    ChoiceSweep,
    IntervalSweep,
    Override,
    QuotedString,
    RangeSweep,
)
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

# Values of one categorical parameter (a shuffled range() is one): Optuna lists them.
MAX_CHOICES = 100_000
# What an entry may be, as the lines refusing one say it.
SYNTAX = "interval(a, b), tag(log, interval(a, b)), range(a, b, step=s), choice(x, y) or x,y"


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def choice_value(element: Any) -> tuple[Any, str]:
    """A choice element as (Optuna categorical value, override text)."""
    text = Override._get_value_element_as_str(element)
    if element is None or isinstance(element, (bool, int, float, str)):
        return element, text
    if isinstance(element, QuotedString):
        return element.text, text
    return text, text  # lists and dicts: their override text is the category


def distribution(override: Override, current: Any) -> BaseDistribution | None:
    """The distribution a sweep override describes; None for a plain (fixed) value."""
    if not override.is_sweep_override():
        return None
    sweep = override.value()
    tags: set[str] = getattr(sweep, "tags", set())
    unknown = sorted(set(tags) - {"log", "int"})
    if unknown:
        raise ValueError(f"unknown tag '{unknown[0]}': the tags Optuna's space reads are log, int")
    log = "log" in tags
    if isinstance(sweep, RangeSweep):
        count, low, high = _range_size(sweep)
        if count == 0:
            raise ValueError("the range is empty")
        if sweep.shuffle and count > MAX_CHOICES:
            raise ValueError(f"a shuffled range is a choice of at most {MAX_CHOICES:,} values")
    if isinstance(sweep, ChoiceSweep) or (isinstance(sweep, RangeSweep) and sweep.shuffle):
        values = list(override.sweep_iterator()) if isinstance(sweep, RangeSweep) else sweep.list
        return CategoricalDistribution([choice_value(v)[0] for v in values])
    if isinstance(sweep, RangeSweep):
        step = abs(sweep.step)
        if _is_int(sweep.start) and _is_int(sweep.stop) and _is_int(sweep.step):
            if log and step != 1:
                raise ValueError("a log scale needs step 1")
            return IntDistribution(low, high, step=abs(sweep.step), log=log)
        if log:
            raise ValueError("a log scale cannot have a step: use tag(log, interval(a, b))")
        return FloatDistribution(float(low), float(high), step=float(step))
    if isinstance(sweep, IntervalSweep):
        low, high = sweep.start, sweep.end
        assert low is not None and high is not None  # a parsed interval() has both
        integral = float(low).is_integer() and float(high).is_integer()
        if integral and ("int" in tags or _is_int(current)):
            return IntDistribution(int(low), int(high), log=log)
        return FloatDistribution(float(low), float(high), log=log)
    raise ValueError("not a sweep Optuna can sample")


def _range_size(sweep: RangeSweep) -> tuple[int, Any, Any]:
    """How many values a range() has, its least and its greatest: computed, not listed
    (range(0, 10**10) would take all memory)."""
    values = sweep.range()
    ends: tuple[Any, Any]
    if isinstance(values, range):
        count, ends = len(values), (values[0], values[-1]) if values else (0, 0)
    else:  # Hydra's FloatRange: start, start + step, ... before stop, in decimals
        start, stop, step = (Decimal(x) for x in (values.start, values.stop, values.step))
        count = max(0, math.ceil((stop - start) / step)) if step else 0
        ends = (float(start), float(start + (count - 1) * step))
    return count, min(ends), max(ends)


def legacy_distribution(spec: Any) -> BaseDistribution:
    """hydra-optuna-sweeper 1.1's ``search_space`` entry: {type, low, high, step, log, choices}."""
    spec = dict(spec)
    kind = spec.pop("type", None)
    if kind == "categorical":
        return CategoricalDistribution(list(spec["choices"]))
    if kind == "int":
        step = int(spec.get("step") or 1)
        return IntDistribution(
            int(spec["low"]), int(spec["high"]), step=step, log=bool(spec.get("log"))
        )
    if kind == "float":
        step = spec.get("step")
        return FloatDistribution(
            float(spec["low"]),
            float(spec["high"]),
            step=None if step is None else float(step),
            log=bool(spec.get("log")),
        )
    raise ValueError(f"type must be float, int or categorical, not {kind!r}")
