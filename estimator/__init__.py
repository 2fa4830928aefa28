"""Cost arithmetic for the estimator: FLOPs and bytes of each protocol task's kernels.

Importable as `pearl.estimator`. The protocol asks these functions for each task's per-call cost
signature; device models (roofline, FPGA cycles, measured profiles) turn signatures into time.
"""
from pearl.estimator.signatures import (  # noqa: F401
    Cost,
    adam_cost,
    mlp_backward_cost,
    mlp_forward_cost,
    mlp_parameter_count,
    sum_tree_cost,
)
