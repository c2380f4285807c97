"""The library API of the command line: ``commands/<command>.py`` for every ``moe-patch``
command, each a plain function that takes the command's options as keyword arguments and
returns its report (tests and other tools call it directly), and, where the report decides
the exit code, ``failure(report)``: the error the command ends with once it has printed it.
The engines (``applier``, ``rebase``, ``verify``, ``pr``, ``wheel``, ``installed``, …) do the
work."""
