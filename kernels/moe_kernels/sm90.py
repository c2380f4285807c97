"""A Triton kernel built for an H100 or H200 (SM90) without a GPU.

Triton's own ``ptxas`` builds the cubin and its ``cuobjdump`` reads back what one program
claims of an SM (registers per thread, shared memory), so occupancy and the pipeliner's
buffers can be checked on any machine, CI included.  The specialisations are the ones a
launch makes: pass every argument a launch would see as 16-divisible in ``divisible``.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from moe_kernels.launch import SHARED_MEMORY_RESERVED_PER_PROGRAM, SM90_SHARED_MEMORY_PER_SM

REGISTERS_PER_SM = 65536
THREADS_PER_SM = 2048


@dataclass(frozen=True)
class Build:
    registers: int  # per thread
    shared: int  # bytes per program
    ttgir: str  # the kernel after Triton's GPU passes (pipelining included)


def build(
    kernel, signature: dict, constants: dict, divisible: set[str], num_warps: int, num_stages: int
) -> Build:
    """``kernel`` (a ``JITFunction``) compiled for sm_90a: ``signature`` maps each
    non-constant parameter to its Triton type, ``constants`` each constexpr (or specialised)
    parameter to its value."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    order = {name: i for i, name in enumerate(kernel.arg_names)}
    unknown = sorted((set(signature) | set(constants)) - set(order))
    if unknown:
        raise TypeError(f"{kernel.fn.__name__} has no parameter {', '.join(unknown)}")
    types = {n: ("constexpr" if n in constants else signature[n]) for n in kernel.arg_names}
    constexprs = {(order[n],): v for n, v in constants.items()}
    attrs = {(order[n],): [["tt.divisibility", 16]] for n in divisible}
    compiled = triton.compile(
        ASTSource(kernel, types, constexprs, attrs),
        target=GPUTarget("cuda", 90, 64),
        options={"num_warps": num_warps, "num_stages": num_stages},
    )
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as scratch:
        cubin = Path(scratch) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        usage = subprocess.run(
            [str(cuobjdump), "--dump-resource-usage", str(cubin)],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
    registers = int(re.search(r"REG:(\d+)", usage).group(1))
    return Build(registers, compiled.metadata.shared, compiled.asm["ttgir"])


def programs_per_sm(shared_bytes: int, registers: int = 0, num_warps: int = 4) -> int:
    """Programs of one launch an SM90 SM holds at once."""
    threads = num_warps * 32
    by_shared = SM90_SHARED_MEMORY_PER_SM // (shared_bytes + SHARED_MEMORY_RESERVED_PER_PROGRAM)
    by_registers = REGISTERS_PER_SM // (registers * threads) if registers else by_shared
    return min(by_shared, by_registers, THREADS_PER_SM // threads)
