"""``moe-patch`` and ``python -m moe_patch``: the command, started so that even an interrupt
while its modules load is one line and exit 130, not a traceback."""

import sys


def run() -> None:
    try:
        from .cli import main
    except KeyboardInterrupt:
        sys.stderr.write("moe-patch: interrupted while starting; nothing was changed\n")
        sys.exit(130)
    main(prog_name="moe-patch")


if __name__ == "__main__":
    run()
