"""What to monitor and how: one :class:`Options` object, built by the magics,
the CLI and the seed APIs and carried unchanged down to either sampling
backend (the helper process gets it as JSON).

Every check raises ValueError with one sentence that names the bad value as
it was given.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass

DEFAULT_INTERVAL_S = 0.1
MIN_INTERVAL_S = 0.001       # below this the sampler would only spin
MAX_INTERVAL_S = 86400.0
DEFAULT_MAX_BYTES = 32 * 1024 * 1024
BACKENDS = ("thread", "process")
DEFAULT_MEMORY_WARNING_PERCENT = 90.0


def check_interval(value, name: str = "interval") -> float:
    """A finite positive number of seconds, or ValueError naming the bad value as given."""
    given = value
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number of seconds, got {given!r}")
    if not isinstance(value, (int, float)):
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be a number of seconds, got {given!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {given!r}")
    if value < MIN_INTERVAL_S:
        raise ValueError(f"{name} must be at least {MIN_INTERVAL_S:g} s, got {given!r}")
    if value > MAX_INTERVAL_S:
        raise ValueError(f"{name} must be at most a day ({MAX_INTERVAL_S:g} s), got {given!r}")
    return float(value)


def check_pid(pid) -> int:
    """A whole positive number naming a process that exists."""
    if isinstance(pid, bool) or not isinstance(pid, int):
        raise ValueError(f"pid must be a whole number, got {pid!r}")
    if pid <= 0:
        raise ValueError(f"pid must be a positive process id, got {pid!r}")
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        raise ValueError(f"no process with pid {pid} exists") from None
    except PermissionError:  # exists, owned by another user: /proc still reads it
        pass
    return pid


@dataclass(frozen=True, slots=True)
class Options:
    """How a monitor samples.

    ``interval`` seconds between samples; ``children``: the watched
    process's descendants too; ``system``: machine-wide and container
    (cgroup) figures; ``gpu``: GPUs (:mod:`nbmon.sources.gpus`); ``exact_peaks``:
    reset the kernel's high-water marks of the watched processes so that
    every interval's peak is exact (Linux) -- this changes what other tools
    read about those processes (VmHWM, ``getrusage``'s ``ru_maxrss``,
    ``/usr/bin/time -v``), so it is off unless asked for; ``backend``: sample
    from a ``"thread"`` in this process or from a helper ``"process"``;
    ``max_bytes``: the store's bound; ``adopt``: also count this process's
    other children, which are what the watched process orphaned when this
    process is their subreaper (``nbmon run``). ``memory_warning_percent``:
    the notebook tells the running cell once when the container's memory
    reaches this share of its limit (without a limit: when the machine's
    used memory does); None: never (:mod:`nbmon.memwarn`).
    """

    interval: float = DEFAULT_INTERVAL_S
    children: bool = True
    system: bool = True
    gpu: bool = True
    exact_peaks: bool = False
    backend: str = "thread"
    max_bytes: int = DEFAULT_MAX_BYTES
    adopt: bool = False
    memory_warning_percent: float | None = DEFAULT_MEMORY_WARNING_PERCENT

    def __post_init__(self):
        object.__setattr__(self, "interval", check_interval(self.interval))
        for name in ("children", "system", "gpu", "exact_peaks", "adopt"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, "
                             f"got {self.backend!r}")
        if isinstance(self.max_bytes, bool) or not isinstance(self.max_bytes, int) or self.max_bytes <= 0:
            raise ValueError(f"max_bytes must be a positive whole number of bytes, got {self.max_bytes!r}")
        percent = self.memory_warning_percent
        if percent is not None:
            if isinstance(percent, bool) or not isinstance(percent, (int, float)) \
                    or not 0 < percent < 100:  # NaN fails this too
                raise ValueError(f"memory_warning_percent must be a percentage between 0 and 100 "
                                 f"(None: no warning), got {percent!r}")
            object.__setattr__(self, "memory_warning_percent", float(percent))

    @classmethod
    def of(cls, options: "Options | None" = None, **changes) -> "Options":
        """``options`` (default: the defaults) with ``changes`` applied; an
        unknown name is a ValueError that names it."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"unknown option(s) {', '.join(map(repr, unknown))}")
        if options is not None and not isinstance(options, cls):
            # Monitor(pid, 0.5): the interval where Monitor takes its options.
            raise ValueError(f"options must be an Options or None, got {options!r}")
        base = options if options is not None else cls()
        return dataclasses.replace(base, **changes) if changes else base

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Options":
        return cls(**json.loads(text))
