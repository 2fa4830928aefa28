"""The hardware-agnostic training protocol: tasks, their cost signatures, and the Plan."""
from pearl.protocol.plan import Plan, load_plan  # noqa: F401
from pearl.protocol.tasks import TASK_NAMES, Task, build_tasks  # noqa: F401
