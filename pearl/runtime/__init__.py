"""Runtimes run the built parts (pearl/build.py) for N env steps, keeping the counters and calling
the hooks (pearl/runtime/counters.py). One module each, exposing `RUNTIME` (pearl.contracts.Runtime):
`sequential` is the reference every other runtime must match, `threaded` runs the learner on a
thread beside the actor, `processes` runs actor processes beside the learner. The schedule each
keeps, its lag bound and its model for the estimator are pearl.schedule's."""
from importlib import import_module

from pearl.schedule import RUNTIMES  # noqa: F401  (a runtime has its lag bound and model there)


def get(name: str):
    """The Runtime of module pearl.runtime.`name` (a Plan's `runtime`)."""
    return import_module(f"pearl.runtime.{name}").RUNTIME
