"""What the management commands ask of the database before they use it."""

from __future__ import annotations

from django.db import connection
from django.db.migrations.executor import MigrationExecutor


def unapplied_migrations() -> int:
    """How many of Cachet's migrations the database lacks (all of them on a fresh data folder)."""
    executor = MigrationExecutor(connection)
    return len(executor.migration_plan(executor.loader.graph.leaf_nodes()))
