"""Turns form a tree: every branch is kept, the live one is the path of turns not taken back."""

import django.db.models.deletion
from django.db import migrations, models

TAKEN_BACK = "taken_back"


def live_at_creation(earlier, later):
    """Whether turn ``earlier`` was live when ``later`` was made.

    Before branches no turn came back once taken back, and taking back took a suffix of the live turns,
    stamping them with the revision of the action. So a turn live now was live when any later turn was
    made; a taken-back turn was not, if the later turn is live now (it would have been taken back with it);
    and of two taken-back turns, the earlier was live when the later was made unless it was taken back first
    (a lower revision). Turns taken back before revisions were kept (revision 0) tie, and count as live.
    """
    if earlier.status != TAKEN_BACK:
        return True
    if later.status != TAKEN_BACK:
        return False
    return earlier.revision >= later.revision


def live_status_of(turn):
    """The status a taken-back turn had while live, from what it kept: an error means it failed or stopped."""
    if not turn.error:
        return "done"
    if turn.error.startswith("Stopped") or "server running it stopped" in turn.error:
        return "interrupted"
    return "failed"


def set_parents(apps, schema_editor):
    """Each turn's parent is the live turn before it when it was made (see ``live_at_creation``)."""
    Turn = apps.get_model("sessions_app", "Turn")
    session_ids = Turn.objects.values_list("session_id", flat=True).distinct().order_by("session_id")
    for session_id in session_ids.iterator():
        turns = list(
            Turn.objects.filter(session_id=session_id)
            .only("id", "number", "status", "revision", "error", "parent", "position", "live_status", "taken_back_in")
            .order_by("number")
        )
        for index, turn in enumerate(turns):
            parent = None
            for earlier in reversed(turns[:index]):
                if live_at_creation(earlier, turn):
                    parent = earlier
                    break
            turn.parent = parent
            turn.position = parent.position + 1 if parent is not None else 1
            if turn.status == TAKEN_BACK:
                turn.live_status = live_status_of(turn)
                turn.taken_back_in = turn.revision
        Turn.objects.bulk_update(turns, ["parent", "position", "live_status", "taken_back_in"], batch_size=500)


class Migration(migrations.Migration):

    dependencies = [
        ('sessions_app', '0005_session_owner_protect'),
    ]

    operations = [
        migrations.AddField(
            model_name='turn',
            name='live_status',
            field=models.CharField(blank=True, choices=[('open', 'open'), ('done', 'done'), ('failed', 'failed'), ('interrupted', 'interrupted'), ('taken_back', 'taken back')], max_length=12),
        ),
        migrations.AddField(
            model_name='turn',
            name='parent',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='children', to='sessions_app.turn'),
        ),
        migrations.AddField(
            model_name='turn',
            name='position',
            field=models.PositiveIntegerField(default=1),
        ),
        migrations.AddField(
            model_name='turn',
            name='taken_back_in',
            field=models.PositiveBigIntegerField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name='modelrequest',
            name='break_cause',
            field=models.CharField(blank=True, choices=[('first', 'first request'), ('new_turn', 'new turn'), ('undo', 'undo'), ('rewind', 'rewind'), ('regenerate', 'regenerate'), ('branch', 'branch'), ('compaction', 'compaction'), ('model_change', 'model change'), ('unexpected', 'unexpected')], max_length=14),
        ),
        migrations.RunPython(set_parents, migrations.RunPython.noop),
    ]
