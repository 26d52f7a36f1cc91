"""Ending a process whose work is done without the interpreter's finalization.

Once a stage process has stopped its stage, or ``omni serve`` has shut its pipeline down, what
Python does on its way out, after the atexit handlers, is free every module and object and run the
native libraries' destructors (torch's, the BLAS thread pools'). None of it is needed by anyone,
yet it costs 1-2 s of CPU per process with torch and a model loaded on a 2-core machine, and the
runtime waits for each stage process it stops: a server of four stage processes took 5-17 s to
exit on a busy 2-core machine (docs/runtime.md, "Shutdown").
"""

from __future__ import annotations

import atexit
import os
import sys


def exit_without_finalizing(code: int) -> None:
    """Run the atexit handlers (logging's flush, multiprocessing's and the transports' cleanup,
    whatever a family registered), flush the standard streams, and end the process with ``code``."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):  # closed or replaced: nothing to flush
            pass
    os._exit(code)
