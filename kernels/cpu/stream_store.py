"""Publishing a float32 vector that another core reads next, under a sequence lock, with
non-temporal stores (the processes runtime's weight board, pearl/runtime/shared.py).

Why: the learner overwrites the whole board at every sync, and the actor process has just read
every line of it. Ordinary stores must first take each line back from the actor's cache; on this
VM's 2 vCPUs that cost 2 us or 8 us for a 4-64-64-2 policy's 18 KB depending on where the host
placed them (a C++ probe, writer and reader on the two cores: the slow placement came and went
within minutes, and a CartPole processes run's sync_weights went 3 -> 9 us a publish with it).
Non-temporal stores write whole lines without fetching them: ~1 us in both placements; the
actor's copy then reads from memory (~1.4 us against 0.5-1.4). docs/BENCHMARKS.md issue 19, session 20.

On x86 a non-temporal store may become visible before an earlier ordinary store, so a store
fence goes after the odd version (a reader must not see new weights under the old even version)
and another before the even one. Elsewhere the stores are ordinary ones.
"""
from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from pearl.kernels.cpu import X86

LINE_FLOATS = 16  # float32 values in a 64-byte line


@intrinsic
def _stream_line(typingctx, dst, dst_index, src, src_index):
    """dst.flat[dst_index:dst_index + 16] = src.flat[src_index:src_index + 16] for C-contiguous
    float32 arrays: one load, one non-temporal 64-byte store (dst 64-byte aligned there)."""
    if not (isinstance(dst, types.Array) and isinstance(src, types.Array) and dst.layout == "C"
            and src.layout == "C" and dst.dtype == src.dtype == types.float32):
        return None

    def codegen(context, builder, signature, args):
        line = ir.VectorType(ir.FloatType(), LINE_FLOATS).as_pointer()
        target = context.make_array(signature.args[0])(context, builder, args[0])
        source = context.make_array(signature.args[2])(context, builder, args[2])
        value = builder.load(builder.bitcast(builder.gep(source.data, [args[3]]), line), align=4)
        store = builder.store(value, builder.bitcast(builder.gep(target.data, [args[1]]), line), align=64)
        store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()

    return types.void(dst, dst_index, src, src_index), codegen


@intrinsic
def _store_fence(typingctx):
    """x86's sfence: every earlier store is visible before any later one (a no-op elsewhere)."""
    def codegen(context, builder, signature, args):
        if X86:
            fence = builder.module.declare_intrinsic("llvm.x86.sse.sfence", fnty=ir.FunctionType(ir.VoidType(), []))
            builder.call(fence, [])
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def _address(typingctx, array):
    """The address of an array's first element."""
    if not isinstance(array, types.Array):
        return None

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        return builder.ptrtoint(data, ir.IntType(64))

    return types.uint64(array), codegen


@njit(cache=True, nogil=True, inline="always")
def _stream(dst, src):
    """dst[:] = src (float32, C-contiguous) by non-temporal stores, fenced on both sides. The
    elements before dst's first 64-byte boundary and after its last whole line are written by
    ordinary stores."""
    _store_fence()
    n = dst.shape[0]
    head = min(n, ((LINE_FLOATS * 4 - _address(dst) % (LINE_FLOATS * 4)) % (LINE_FLOATS * 4)) // 4)
    for i in range(head):
        dst[i] = src[i]
    end = head + (n - head) // LINE_FLOATS * LINE_FLOATS
    for i in range(head, end, LINE_FLOATS):
        _stream_line(dst, i, src, i)
    for i in range(end, n):
        dst[i] = src[i]
    _store_fence()


@njit(cache=True, nogil=True)
def publish_streamed(version, dst, src):
    """version[0] odd, dst[:] = src (float32, C-contiguous), version[0] even."""
    version[0] += 1
    _stream(dst, src)
    version[0] += 1


@njit(cache=True, nogil=True)
def publish_numbered(sequence, dst, src, number):
    """The same under a sequence word that names what it holds: 2 x number + 1 while dst is
    written, 2 x number + 2 once dst holds `number`'s values (a slot of the processes runtime's
    deterministic board, pearl/runtime/shared.py VersionBoard)."""
    sequence[0] = 2 * number + 1
    _stream(dst, src)
    sequence[0] = 2 * number + 2
