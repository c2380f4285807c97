"""Make Triton 3.6's CPU interpreter work with NumPy >= 2.4.

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
