"""Runtimes run the built parts (pearl/build.py) for N env steps, keeping the counters and calling
the hooks (pearl/runtime/counters.py). One module each, exposing `RUNTIME` (pearl.contracts.Runtime):
`sequential` is the reference every other runtime must match, `threaded` runs the learner on a
thread beside the actor, `processes` runs actor processes beside the learner, `ray` runs them on
the nodes of a Ray cluster, feeding a replay server. The schedule each
keeps, its lag bound and its model for the estimator are pearl.schedule's."""
from importlib import import_module

# a runtime has its lag bound and model there; the runtimes beyond one machine (ray) its model only
from pearl.schedule import CLUSTER_RUNTIMES, RUNTIMES  # noqa: F401


def get(name: str):
    """The Runtime of module pearl.runtime.`name` (a Plan's `runtime`)."""
    return import_module(f"pearl.runtime.{name}").RUNTIME
