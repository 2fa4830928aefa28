"""Runtimes run the built parts (pearl/build.py) for N env steps, keeping the counters and calling
the hooks (pearl/runtime/counters.py). One module each, exposing `RUNTIME` (pearl.contracts.Runtime):
`sequential` is the reference every other runtime must match, `threaded` runs the learner on a
thread beside the actor, `processes` runs actor processes beside the learner. The schedule each
keeps, its lag bound and its model for the estimator are pearl.schedule's."""
from importlib import import_module

from pearl.schedule import MAX_LAG

RUNTIMES = tuple(MAX_LAG)  # a runtime has a lag bound (and a schedule model) in pearl.schedule


def get(name: str):
    """The Runtime of module pearl.runtime.`name` (a Plan's `runtime`)."""
    return import_module(f"pearl.runtime.{name}").RUNTIME
