from __future__ import annotations

from sessions_app.hygiene.paths import bracket_path, table_path


def test_a_bracket_path_escapes_line_breaks_and_keeps_everything_else() -> None:
    assert bracket_path("src/app.ts") == "src/app.ts"
    assert bracket_path("a\nb.txt") == "a\\nb.txt"
    assert bracket_path("a\r\nb\r.txt") == "a\\r\\nb\\r.txt"
    assert bracket_path("a|b \\n é\t.txt") == "a|b \\n é\t.txt", "| only matters in a table; \\ and tabs stay"


def test_a_table_path_escapes_the_column_bar_too() -> None:
    assert table_path("a|b\n.txt") == "a\\|b\\n.txt"
    assert table_path("./src/app.ts") == "./src/app.ts"
