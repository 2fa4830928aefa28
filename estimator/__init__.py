"""Cost arithmetic for the estimator: FLOPs and bytes of each task's kernels.

Importable as `pearl.estimator`. The algorithms' cost specs (pearl/algos/*.py) and the replay
tasks' costs (estimator/costs.py) are written with these functions; device models (roofline,
FPGA cycles, measured profiles) turn the signatures into time.
"""
from pearl.estimator.signatures import (  # noqa: F401
    Cost,
    adam_cost,
    mlp_backward_cost,
    mlp_forward_cost,
    mlp_parameter_count,
    sum_tree_cost,
)
