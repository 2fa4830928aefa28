"""Runtimes execute a Plan. `sequential` is the reference every parallel runtime must match;
`threaded` runs the learner on a thread beside the actor; `processes` runs actor processes beside
the learner."""
from pearl.runtime import processes, sequential, threaded

RUNTIMES = {"sequential": sequential.run, "threaded": threaded.run, "processes": processes.run}


def run(name: str, agent, steps: int, on_progress=None, time_tasks: bool = False) -> None:
    """Advances `agent` by `steps` env steps with the runtime `name` (the Plan's `runtime`)."""
    RUNTIMES[name](agent, steps, on_progress, time_tasks)
