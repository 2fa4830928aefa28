"""Runtimes execute a Plan. `sequential` is the reference every parallel runtime must match."""
from pearl.runtime import sequential  # noqa: F401
