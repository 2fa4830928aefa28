"""Runtimes execute a Plan. `sequential` is the reference every parallel runtime must match;
`threaded` runs the learner on a thread beside the actor; `processes` runs actor processes beside
the learner."""
from importlib import import_module

RUNTIMES = ("sequential", "threaded", "processes")  # modules of this package, each with a `run`


def run(name: str, agent, steps: int, on_progress=None, time_tasks: bool = False) -> None:
    """Advances `agent` by `steps` env steps with the runtime `name` (the Plan's `runtime`)."""
    import_module(f"pearl.runtime.{name}").run(agent, steps, on_progress, time_tasks)


def crossed(previous: int, current: int, interval: int) -> bool:
    """Whether going from `previous` to `current` env steps passed a multiple of `interval` (0: never)."""
    return bool(interval) and current // interval > previous // interval
