"""The accurate activation kernel compiled for this CPU with LLVM: one fused loop per function.

onnxruntime runs the accurate graphs (``service.activations``) one op at a time, each op a pass
over the whole array in float64: about 30 passes. Here the same formulas, written once against
``Formula``, become one loop that loads a float32, computes in float64 in registers, and stores
a float32, compiled at start-up by llvmlite (numba's LLVM binding) for the CPU the process runs
on, vectorized to its widest registers. Only ``Exp`` and ``Tanh`` are ours (LLVM would call
libm's scalar functions): Cody-Waite range reduction and Taylor polynomials, accurate to about
1e-13 relative, far below float32's 6e-8.

Ops follow ONNX's semantics, NaN included (``Min`` and ``Relu`` keep a NaN, as onnxruntime's
do). The compiled functions release the GIL while they run (ctypes).
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from service.formula import EXP_HIGHEST, EXP_LOWEST, Builder, Formula

try:
    import llvmlite.binding as llvm
    from llvmlite import ir
except ImportError:  # the `cpu` extra installs it; without it the graphs run on onnxruntime
    llvm = None

_SIGNATURE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
Kernel = Callable[[int, int, int], None]

# exp(x) = 2^k exp(r), k = rint(x / ln 2), r = x - k ln 2 split in two (Cody-Waite: k * LN2_HI
# is exact for |k| < 2^11), |r| <= ln(2)/2; the Taylor polynomial to r^10 is within 2.2e-13.
LOG2_E = 1.4426950408889634
LN2_HI = 6.93147180369123816490e-01
LN2_LO = 1.90821492927058770002e-10
EXP_TERMS = 11
SHIFTER = 1.5 * 2.0**52  # k + SHIFTER holds k + 2^51 in its low 52 bits, for |k| < 2^51
# tanh(u) for |u| < 1/4: its odd Taylor series to u^15 (within 2e-13 relative); above, from
# exp(-2|u|), where 1 - e loses at most 2 bits.
TANH_SERIES = (
    1.0,
    -1 / 3,
    2 / 15,
    -17 / 315,
    62 / 2835,
    -1382 / 155925,
    21844 / 6081075,
    -929569 / 638512875,
)
TANH_SERIES_BELOW = 0.25
# The loop's software prefetch (see ``_define``): blocks of 64 values (4 cache lines of x and 4
# of y), each prefetching 2048 values (8 KB) ahead; 1024-4096 ahead and blocks of 64-256 timed
# the same.
BLOCK = 64
AHEAD = 2048
LINE_VALUES = 16  # float32s in a 64-byte cache line


def unavailable() -> str | None:
    """Why the kernel cannot be compiled here, or None."""
    return "llvmlite is not installed" if llvm is None else None


class _Loop(Formula[Any]):
    """Emits a formula as LLVM IR inside the body of an elementwise loop; values are doubles."""

    def __init__(self, module: ir.Module, builder: ir.IRBuilder) -> None:
        self.module = module
        self.b = builder
        self.double = ir.DoubleType()

    def const(self, value: float) -> ir.Constant:
        return ir.Constant(self.double, float(value))

    def _intrinsic(self, name: str, *args: ir.Value) -> ir.Value:
        signature = ir.FunctionType(self.double, [self.double] * len(args))
        return self.b.call(self.module.declare_intrinsic(name, [self.double], signature), args)

    def _above(self, a: ir.Value, k: float) -> ir.Value:
        return self.b.fcmp_ordered(">", a, self.const(k))

    def _below(self, a: ir.Value, k: float) -> ir.Value:
        return self.b.fcmp_ordered("<", a, self.const(k))

    def op(self, op_type: str, *inputs: ir.Value, **attrs: Any) -> ir.Value:
        b, zero = self.b, self.const(0.0)
        # contract: LLVM may fuse a multiply and an add into one FMA (one rounding, not two).
        arithmetic = {"Add": b.fadd, "Sub": b.fsub, "Mul": b.fmul, "Div": b.fdiv}
        if op_type in arithmetic:
            return arithmetic[op_type](*inputs, flags=("contract",))
        (x, *rest) = inputs
        if op_type == "Min":  # x when x <= k or NaN
            (k,) = rest
            return b.select(b.fcmp_ordered(">", x, k), k, x)
        if op_type == "Relu":  # max(x, 0): x when not below 0 (NaN and -0 included)
            return b.select(self._below(x, 0.0), zero, x)
        if op_type == "IsNaN":
            return b.fcmp_unordered("uno", x, x)
        if op_type == "Greater":
            return b.fcmp_ordered(">", x, *rest)
        if op_type == "Where":
            return b.select(x, *rest)
        if op_type == "Abs":
            return self._intrinsic("llvm.fabs", x)
        if op_type == "Neg":
            return b.fneg(x)
        if op_type == "Exp":
            return self._exp(x)
        if op_type == "Tanh":
            return self._tanh(x)
        if op_type in ("Cast", "Identity"):  # every value is a double until the store
            return x
        raise ValueError(f"no compiled form of the op {op_type}")

    def exp(self, a: ir.Value) -> ir.Value:  # _exp holds its argument itself
        return self._exp(a)

    def _exp(self, x: ir.Value) -> ir.Value:
        b = self.b
        x = b.select(self._below(x, EXP_LOWEST), self.const(EXP_LOWEST), x)
        x = b.select(self._above(x, EXP_HIGHEST), self.const(EXP_HIGHEST), x)
        # k = rint(x / ln 2) as SHIFTER + x / ln 2 - SHIFTER: the sum's low bits hold k, so
        # 2^k is built from them with integer vector ops (AVX2 has no double -> int64 convert:
        # LLVM would convert lane by lane). A NaN x gives a NaN r, and the result is NaN.
        shifted = self.shift(self.scale(x, LOG2_E), SHIFTER)
        k = self.sub(shifted, self.const(SHIFTER))
        r = self.sub(self.sub(x, self.scale(k, LN2_HI)), self.scale(k, LN2_LO))
        taylor = self.polynomial(r, tuple(1.0 / math.factorial(n) for n in range(EXP_TERMS)))
        int64 = ir.IntType(64)
        exponent = b.add(b.bitcast(shifted, int64), ir.Constant(int64, 1023))
        power = b.bitcast(b.shl(exponent, ir.Constant(int64, 52)), self.double)
        return self.mul(taylor, power)

    def _tanh(self, u: ir.Value) -> ir.Value:
        a = self._intrinsic("llvm.fabs", u)
        e = self._exp(self.scale(a, -2.0))
        large = self._intrinsic(
            "llvm.copysign", self.div(self.sub(self.const(1.0), e), self.shift(e, 1.0)), u
        )
        small = self.mul(u, self.polynomial(self.mul(u, u), TANH_SERIES))
        return self.b.select(self._below(a, TANH_SERIES_BELOW), small, large)


def _define(module: ir.Module, symbol: str, formula: Builder) -> None:
    """void symbol(const float *x, float *y, int64 n): y[i] = formula(x[i]) in float64.

    The loop runs in blocks of ``BLOCK`` values; each block first prefetches the lines of x and
    y ``AHEAD`` values on. The hardware's prefetchers do not keep this loop fed where the
    arrays are not in cache, as a request's body and the fresh array for its answer often are
    not in a server at concurrency. On this project's host (Intel Xeon, rocketlake; 2 MB of L2
    per core), 1e6 values took 1.0 ms in cache and 2.1-2.8 ms on arrays not in cache; with the
    prefetches, 1.1 ms either way (`make bench`'s table of the kernels in process).
    """
    f32, i64, i32 = ir.FloatType(), ir.IntType(64), ir.IntType(32)
    function = ir.Function(
        module, ir.FunctionType(ir.VoidType(), [f32.as_pointer(), f32.as_pointer(), i64]), symbol
    )
    source, target, n = function.args
    for pointer in (source, target):
        pointer.add_attribute("noalias")
    blocks = ("entry", "block", "loop", "next", "done")
    entry, block, loop, following_block, done = (function.append_basic_block(s) for s in blocks)
    b = ir.IRBuilder(entry)
    b.cbranch(b.icmp_signed(">", n, ir.Constant(i64, 0)), block, done)

    # A block: prefetch ahead (a hint: an address past the arrays' ends is never touched).
    b.position_at_end(block)
    start = b.phi(i64)
    start.add_incoming(ir.Constant(i64, 0), entry)
    byte_pointer = ir.IntType(8).as_pointer()
    prefetch_type = ir.FunctionType(ir.VoidType(), [byte_pointer, i32, i32, i32])
    prefetch = module.declare_intrinsic("llvm.prefetch", [byte_pointer], prefetch_type)
    for line in range(0, BLOCK, LINE_VALUES):
        ahead = b.add(start, ir.Constant(i64, AHEAD + line))
        for pointer, write in ((source, 0), (target, 1)):
            address = b.bitcast(b.gep(pointer, [ahead]), byte_pointer)  # not inbounds: a hint
            # (address, write, locality 3: keep in every cache level, data rather than code)
            b.call(prefetch, [address, *(ir.Constant(i32, v) for v in (write, 3, 1))])
    after = b.add(start, ir.Constant(i64, BLOCK))
    end = b.select(b.icmp_signed("<", after, n), after, n)
    b.branch(loop)

    # Its values, one by one (LLVM vectorizes this loop).
    b.position_at_end(loop)
    i = b.phi(i64)
    i.add_incoming(start, block)
    x = b.fpext(b.load(b.gep(source, [i], inbounds=True)), ir.DoubleType())
    y = formula(_Loop(module, b), x)
    b.store(b.fptrunc(y, f32), b.gep(target, [i], inbounds=True))
    following = b.add(i, ir.Constant(i64, 1))
    i.add_incoming(following, loop)
    b.cbranch(b.icmp_signed("<", following, end), loop, following_block)

    b.position_at_end(following_block)
    start.add_incoming(end, following_block)
    b.cbranch(b.icmp_signed("<", end, n), block, done)
    b.position_at_end(done)
    b.ret_void()


class CompiledKernels:
    """Compiles ``formulas`` ({key: formula}) for this CPU; ``evaluate(key, x)`` runs one."""

    def __init__(self, formulas: dict[Any, Builder]) -> None:
        if llvm is None:
            raise RuntimeError(unavailable())
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        module = ir.Module("activations")
        module.triple = llvm.get_process_triple()
        symbols = {key: f"f{index}" for index, key in enumerate(formulas)}
        for key, formula in formulas.items():
            _define(module, symbols[key], formula)
        self.cpu = llvm.get_host_cpu_name()
        machine = llvm.Target.from_triple(module.triple).create_target_machine(
            cpu=self.cpu, features=llvm.get_host_cpu_features().flatten(), opt=3
        )
        compiled = llvm.parse_assembly(str(module))
        compiled.verify()
        tuning = llvm.create_pipeline_tuning_options(speed_level=3)
        tuning.loop_vectorization = tuning.slp_vectorization = True
        passes = llvm.create_pass_builder(machine, tuning)
        passes.getModulePassManager().run(compiled, passes)
        # The engine owns the machine code: it lives as long as this object.
        self._engine = llvm.create_mcjit_compiler(compiled, machine)
        self._engine.finalize_object()
        self._kernels: dict[Any, Kernel] = {
            key: _SIGNATURE(self._engine.get_function_address(symbol))
            for key, symbol in symbols.items()
        }
        self.description = f"compiled for {self.cpu} (LLVM {llvm.llvm_version_info[0]})"

    def evaluate(self, key: Any, x: np.ndarray) -> np.ndarray:
        """f(x) elementwise for a contiguous float32 ``x`` of any shape."""
        y = np.empty_like(x)
        self._kernels[key](x.ctypes.data, y.ctypes.data, x.size)
        return y
