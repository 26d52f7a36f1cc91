"""Reading a family's build options (``omni serve --option KEY=VALUE``): a key the family does
not declare is refused (a typo would otherwise serve as if the option were absent); numbers that
size a batch or a chunk must be positive, or the stage would wait forever (a batch of 0 rows
admits nothing) or loop (a chunk of 0 s never advances). A bad value fails the build with a
message naming the option; so does a flag that is not plainly true or false."""

from __future__ import annotations

import math
from typing import Any


def number_option(options: dict[str, Any], name: str, default: float, kind: type = int, allow_zero: bool = False):
    """``options[name]`` (else ``default``) as a finite ``kind`` above 0 (or at least 0)."""
    raw = options.get(name, default)
    try:
        value = kind(raw)
    except (TypeError, ValueError, OverflowError):
        value = None
    fits = value is not None and math.isfinite(value) and (value >= 0 if allow_zero else value > 0)
    if isinstance(raw, bool) or not fits or (kind is int and isinstance(raw, float) and not raw.is_integer()):
        what = "an integer" if kind is int else "a number"
        raise ValueError(f"option {name}={raw!r}: expected {what} {'of at least 0' if allow_zero else 'above 0'}")
    return value


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def flag_option(options: dict[str, Any], name: str, default: bool) -> bool:
    """``options[name]`` (else ``default``) as a boolean: true/false (any case), yes/no, on/off,
    1/0; anything else is refused (``bool("False")`` would be True)."""
    raw = options.get(name, default)
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise ValueError(f"option {name}={raw!r}: expected true or false")


def choice_option(options: dict[str, Any], name: str, choices: tuple[str, ...]) -> str:
    """``options[name]`` (else the first of ``choices``, the default), one of ``choices`` (any case)."""
    raw = options.get(name, choices[0])
    value = str(raw).strip().lower()
    if value not in choices:
        raise ValueError(f"option {name}={raw!r}: expected {' or '.join(repr(c) for c in choices)}")
    return value


def ar_stream_help(stage: str) -> str:
    """The help of an option that sets an AR stage's ``EngineConfig.stream``."""
    return (f"the {stage}'s steps on the GPU: shared (default: the device's default stream) | own (a stream of its own) | "
            f"high (a stream of its own whose kernels the device starts ahead of other stages' waiting ones)")


PREFILL_GRAPHS_HELP = "on CUDA, prefills of short prompts in CUDA graphs (true; cuda_graphs=false turns them off too)"


def engine_graph_options(options: dict[str, Any]) -> dict[str, Any]:
    """EngineConfig's CUDA-graph fields from the options ``cuda_graphs`` (every graph, true) and
    ``prefill_graphs`` (prefills of short prompts, true)."""
    out: dict[str, Any] = {"cuda_graphs": flag_option(options, "cuda_graphs", True)}
    if not flag_option(options, "prefill_graphs", True):
        out["cuda_graph_prefill_tokens"] = ()
    return out


def check_option_names(spec, options: dict[str, Any]) -> None:
    """Raises ValueError naming the keys of ``options`` that the family ``spec`` (a FamilySpec)
    does not declare, and listing the ones it does; nothing for a family that declares none."""
    if spec.options is None:
        return
    unknown = sorted(set(options) - set(spec.options))
    if unknown:
        raise ValueError(
            f"family {spec.name!r} has no option {', '.join(repr(k) for k in unknown)}; its options: "
            f"{', '.join(sorted(spec.options))} (`omni families {spec.name}` says what each does)"
        )
