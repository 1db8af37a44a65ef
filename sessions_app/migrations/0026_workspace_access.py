"""Membership is explicit, folders named from a shell are marked, and private workspaces move under the data
folder's ``people``.

Before, a workspace with no members was open to everyone: such shared workspaces are opened to everyone on
purpose now (``open_to_everyone``), so that nobody loses one on upgrading; staff can close them in the admin. A
shared workspace outside ``CACHET_WORKSPACE_ROOTS`` can only have come from ``ask --workspace`` (or an older
rule): it is marked as named from a shell. A private workspace's folder moves to ``DATA/people/ID`` (renamed on
one file system, copied across two), where no shared workspace can lie.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import migrations, models


def _inside(folder: Path, root: Path) -> bool:
    return folder == root or folder.is_relative_to(root)


def forwards(apps: Any, schema_editor: Any) -> None:
    workspace_model = apps.get_model("sessions_app", "Workspace")
    through = workspace_model.members.through
    roots = [Path(os.path.realpath(root)) for root in settings.CACHET_WORKSPACE_ROOTS]
    people = Path(os.path.realpath(settings.CACHET_DATA)) / "people"
    for workspace in workspace_model.objects.all():
        folder = Path(workspace.folder)
        if workspace.owner_id is None:
            workspace.open_to_everyone = not through.objects.filter(workspace_id=workspace.pk).exists()
            workspace.from_shell = not any(_inside(folder, root) for root in roots)
            workspace.save(update_fields=["open_to_everyone", "from_shell"])
            continue
        wanted = people / str(workspace.owner_id)
        if folder == wanted:
            continue
        if folder.is_dir() and not wanted.exists():
            people.mkdir(parents=True, exist_ok=True)
            shutil.move(str(folder), str(wanted))
        workspace.folder = str(wanted)
        workspace.save(update_fields=["folder"])


class Migration(migrations.Migration):
    dependencies = [
        ("sessions_app", "0025_session_settings_checks"),
    ]

    operations = [
        migrations.AddField(
            model_name="workspace",
            name="open_to_everyone",
            field=models.BooleanField(
                default=False,
                help_text=(
                    "Every person may use it (and run commands in it where they are allowed), members or not. Off: "
                    "only its members may, and where it has none, only staff."
                ),
            ),
        ),
        migrations.AddField(
            model_name="workspace",
            name="from_shell",
            field=models.BooleanField(default=False, editable=False),
        ),
        migrations.RunPython(forwards, migrations.RunPython.noop),
    ]
