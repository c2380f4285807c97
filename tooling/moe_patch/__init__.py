"""moe-patch: a versioned patch series for vLLM's FP8 fused-MoE path on Hopper."""

import os

__version__ = "0.4.0"

# GitPython runs ``git version`` when it is first imported and raises ImportError if there is
# no git: --help and --version must work without git, and the commands that need it say so in
# one line (moe_patch.gitutil).
os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")
