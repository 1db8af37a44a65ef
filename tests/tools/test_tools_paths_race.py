"""The tools racing an attacker who keeps swapping a workspace folder with a symlink to an outside
folder (``renameat2(RENAME_EXCHANGE)``, in its own process): nothing outside is read, listed or changed.

The harness is ``bench/path_race.py``; run against the confinement by ``realpath`` that this replaced,
the same run let about 3 % of the operations reach outside."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.path_race import OutsideChanges, can_exchange, race, renameat2_number

OPERATIONS = 15_000


@pytest.mark.stress
@pytest.mark.timeout(240)
def test_tools_racing_a_swapped_folder_never_reach_outside(tmp_path: Path) -> None:
    base = tmp_path.resolve()
    if renameat2_number() is None or not can_exchange(base):
        pytest.skip("renameat2(RENAME_EXCHANGE) is not available here")
    tally, changes, swaps = race(base, OPERATIONS, "process")
    assert tally.total == OPERATIONS
    assert set(tally.operations) == {"read", "write", "edit", "list", "glob", "apply_patch"}
    assert swaps > OPERATIONS
    assert tally.refused > OPERATIONS // 20
    assert tally.total - tally.failed > OPERATIONS // 20
    assert tally.leaked == []
    assert changes == OutsideChanges(created=[], changed=[], deleted=[])
