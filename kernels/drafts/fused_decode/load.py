"""Load a vLLM-form module (``from vllm.triton_utils import tl, triton``) without vLLM."""

import hashlib
import importlib.util
import sys
import tempfile
from pathlib import Path


def load_module(path: Path, name: str = "fused_moe_decode_dev"):
    src = Path(path).read_text()
    src = src.replace(
        "from vllm.triton_utils import tl, triton", "import triton; import triton.language as tl"
    )
    digest = hashlib.sha256(src.encode()).hexdigest()[:16]
    out = Path(tempfile.gettempdir()) / f"fmd-{digest}.py"
    if not out.exists():
        out.write_text(src)
    spec = importlib.util.spec_from_file_location(f"{name}_{digest}", out)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod
