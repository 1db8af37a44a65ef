"""SIGTERM as Ctrl-C, for the benchmarks and scripts that start servers, workers or an embedded Postgres."""

from __future__ import annotations

import signal


def sigterm_as_interrupt() -> None:
    """Make SIGTERM (``kill``, ``timeout``) stop this process as Ctrl-C does: its ``finally`` blocks and exit hooks
    run, so what it started (servers, workers, the embedded Postgres) stops and its temporary folders go; killed
    outright, it left them running."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)
