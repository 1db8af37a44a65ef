from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("sessions_app", "0008_request_cache_miss"),
        ("sessions_app", "0009_merge_window_search_settings"),
    ]

    operations = []
