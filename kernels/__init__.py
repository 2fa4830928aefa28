"""Backend kernels, importable as `pearl.kernels`: one subpackage per device kind, same interface.

- `cpu`: numpy kernels (MLP inference, a fused Q-learning step, the sum tree of prioritized replay).
"""
