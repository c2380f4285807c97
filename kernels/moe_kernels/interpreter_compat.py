"""Make Triton 3.6's CPU interpreter work with NumPy >= 2.4, and round to FP8 as a GPU does.

Cause: in interpreter mode Triton turns every Python ``int`` kernel argument
into a 1-element, 1-D numpy array (``_implicit_cvt`` builds
``np.array([arg])``), so ``tl.cdiv(K, BLOCK_SIZE_K)`` is a tensor whose data has
shape ``(1,)``.  ``for k in range(...)`` then calls ``tensor.__index__``, which
the interpreter patches to ``int(self.handle.data)``.  Converting an ``ndim > 0``
array to a Python scalar was deprecated in NumPy 1.25 and became a ``TypeError``
in NumPy 2.4.0 ("only 0-dimensional arrays can be converted to Python
scalars").  Passing ``K`` differently does not help: every int is converted.

Triton fixed it upstream (triton-lang/triton#9172, ``int(self.handle.data.squeeze())``),
released in 3.7.0.  For 3.6.x this module wraps the interpreter's
``_patch_lang_tensor`` so ``__index__`` uses ``.item()`` (which still refuses
tensors of more than one element).  It changes nothing when the installed
Triton already has the fix, and nothing on GPU (compiled) runs.

Second: the interpreter's float -> FP8 conversion (``_convert_float``) rounds the
mantissa without carrying into the exponent, so a value that rounds up to the next
power of two (1.9375 -> 2.0 in e4m3) comes out as the power below (1.0): about 2.5x
the rounding error of a GPU's ``cvt.rn.satfinite``.  Kernels that quantise to FP8
themselves (the fused decode path) are then checked against a wrong interpreter.
:func:`apply_fp8_rounding` converts such casts through torch instead (round to
nearest even, saturating at the format's largest value, as the GPU does), where a
probe shows the fault.
"""

from __future__ import annotations

import inspect

_APPLIED = False


def _needs_patch(fn) -> bool:
    try:
        src = inspect.getsource(fn)
    except (OSError, TypeError):
        return False
    return "int(self.handle.data))" in src


def apply() -> bool:
    """Install the fix if this Triton needs it; return whether it is installed."""
    global _APPLIED
    if _APPLIED:
        return True
    try:
        from triton.runtime import interpreter as interp
    except ImportError:
        return False
    orig = getattr(interp, "_patch_lang_tensor", None)
    if orig is None or not _needs_patch(orig):
        return False

    def _patch_lang_tensor(tensor, scope):
        orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    interp._patch_lang_tensor = _patch_lang_tensor
    _APPLIED = True
    return True


_FP8_FIXED = False


def _fp8_faulty(interp) -> bool:
    """Whether the interpreter turns 1.9375 into e4m3 as 1.0 (the missing carry)."""
    import numpy as np
    import triton.language as tl

    try:
        raw = interp._convert_float(
            np.array([1.9375], dtype=np.float32), tl.float32, tl.float8e4nv, None
        )
    except Exception:
        return False
    return int(np.asarray(raw).view(np.uint8)[0]) != 0x40  # 2.0 in e4m3


def apply_fp8_rounding() -> bool:
    """Install the FP8 rounding fix if this Triton needs it; return whether it is."""
    global _FP8_FIXED
    if _FP8_FIXED:
        return True
    try:
        from triton.runtime import interpreter as interp
    except ImportError:
        return False
    orig = getattr(interp, "_convert_float", None)
    if orig is None or not _fp8_faulty(interp):
        return False
    import numpy as np
    import torch

    formats = {"fp8e4nv": torch.float8_e4m3fn, "fp8e5": torch.float8_e5m2}

    def _convert_float(input, input_dtype, output_dtype, rounding_mode):
        target = formats.get(getattr(output_dtype, "name", ""))
        if target is None or input_dtype.primitive_bitwidth <= 8:
            return orig(input, input_dtype, output_dtype, rounding_mode)
        wide = torch.from_numpy(np.ascontiguousarray(input).astype(np.float32))
        largest = torch.finfo(target).max
        return wide.clamp(-largest, largest).to(target).view(torch.uint8).numpy()

    interp._convert_float = _convert_float
    _FP8_FIXED = True
    return True
