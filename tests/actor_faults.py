"""An actor that fails on purpose, importable by the actor processes the tests start (the learner
hands them its sys.path, which holds this directory under pytest)."""
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
    """Builds in the learner's process, fails in an actor process (isolated interpreters, `-I`)."""

    def __init__(self, *args, **kwargs):
        import sys

        if sys.flags.isolated:
            raise RuntimeError("the environment's simulator found no licence server")
        super().__init__(*args, **kwargs)


class SecondActorSlowToStart(ActorRecipe):
    """In an actor process, actor 1 takes a second longer than actor 0 to start."""

    def build(self, seed: int, policy=None, index: int = 0):
        import sys
        import time

        if sys.flags.isolated and index == 1:
            time.sleep(1.0)
        return super().build(seed, policy, index)
