"""The HLS kernels' host-visible signatures: argument names and kinds in call order.

Drivers use them to lay out a call: PYNQ writes each argument into the kernel's AXI-Lite
register map, XRT passes them to `kernel(...)`, the simulation to the C function.

Register offsets follow the Vitis HLS s_axilite control register map (UG1399, "S_AXILITE Control
Register Map"): 0x00 control (bit 0 ap_start, bit 1 ap_done, bit 2 ap_idle), 0x04-0x0c interrupt
registers, arguments from 0x10 in declaration order; a 32-bit scalar takes 8 bytes (data +
reserved word), a 64-bit pointer 12 bytes (low word, high word, reserved). The `x<kernel>_hw.h`
header that `make csynth` generates lists the same offsets.
"""
from __future__ import annotations

SCALAR, POINTER = "scalar", "pointer"

SIGNATURES: dict[str, tuple[tuple[str, str], ...]] = {
    "pearl_sumtree": (("op", SCALAR), ("n", SCALAR), ("indices", POINTER), ("values", POINTER),
                      ("out_indices", POINTER), ("out_values", POINTER)),
    "pearl_mlp_forward": (("load_weights", SCALAR), ("n_layers", SCALAR), ("batch", SCALAR),
                          ("sizes", POINTER), ("params", POINTER), ("obs", POINTER), ("q", POINTER)),
    "pearl_mlp_train_step": (("n_layers", SCALAR), ("batch", SCALAR), ("sizes", POINTER),
                             ("hyper", POINTER), ("params", POINTER), ("exp_avg", POINTER),
                             ("exp_avg_sq", POINTER), ("obs", POINTER), ("actions", POINTER),
                             ("targets", POINTER), ("weights", POINTER), ("abs_td", POINTER)),
}

CONTROL = 0x00
AP_START, AP_DONE, AP_IDLE = 0x1, 0x2, 0x4
FIRST_ARGUMENT = 0x10


def register_offsets(kernel: str) -> dict[str, int]:
    """AXI-Lite offset of each argument of `kernel`."""
    offsets, offset = {}, FIRST_ARGUMENT
    for name, kind in SIGNATURES[kernel]:
        offsets[name] = offset
        offset += 12 if kind == POINTER else 8
    return offsets
