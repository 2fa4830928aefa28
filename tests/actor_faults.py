"""An actor that fails on purpose, importable by the actor processes the tests start (the learner
hands them its sys.path, which holds this directory under pytest)."""
import os

from pearl.runtime import processes
from pearl.runtime.actor import Actor
from pearl.runtime.processes import ActorRecipe


class ActorThatRaises(Actor):
    FAIL_AT_STEP = 300

    def step(self, epsilon: float):
        self.steps_taken = getattr(self, "steps_taken", 0) + 1
        if self.steps_taken == self.FAIL_AT_STEP:
            raise ValueError("the environment's simulator lost its licence")
        return super().step(epsilon)


class ActorThatCannotStart(Actor):
    """Builds in the learner's process, fails in an actor process."""

    def __init__(self, *args, **kwargs):
        if processes.IN_ACTOR:
            raise RuntimeError("the environment's simulator found no licence server")
        super().__init__(*args, **kwargs)


class SecondActorSlowToStart(ActorRecipe):
    """In an actor process, actor 1 takes a second longer than actor 0 to start."""

    def build(self, seed: int, policy=None, index: int = 0):
        import time

        if processes.IN_ACTOR and index == 1:
            time.sleep(1.0)
        return super().build(seed, policy, index)


class ExitsBeforeReporting(ActorRecipe):
    """In an actor process, exits with code 1 before the actor is built (as an interpreter that
    cannot start does): nothing is reported on its ring."""

    def build(self, seed: int, policy=None, index: int = 0):
        if processes.IN_ACTOR:
            os._exit(1)
        return super().build(seed, policy, index)
