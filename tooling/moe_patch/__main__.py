"""``python -m moe_patch``: the ``moe-patch`` command."""

from .cli import main

if __name__ == "__main__":
    main(prog_name="moe-patch")
