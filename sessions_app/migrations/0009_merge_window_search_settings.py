from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("sessions_app", "0008_endpoint_window_resumed_reply"),
        ("sessions_app", "0008_search_indexes"),
        ("sessions_app", "0008_user_setting"),
    ]

    operations = []
