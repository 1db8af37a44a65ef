"""Markdown is rendered, highlighted and sanitized; the chart and the tool rows say what they should."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from chat.web.chart import bar_html, bars_of, chart_html, ttft_y
from chat.web.display import call_target, result_status
from chat.web.rendering import ALLOWED_ATTRIBUTES, ALLOWED_TAGS, CODE_CLASSES, markdown_html, pygments_css
from sessions_app.models import BreakCause, ModelRequest, RequestStatus, Result, ResultKind, Turn


class Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))


def parsed(html: str) -> list[tuple[str, list[tuple[str, str | None]]]]:
    collector = Collect()
    collector.feed(html)
    return collector.tags


XSS = [
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    '<a href="javascript:alert(1)">x</a>',
    "[x](javascript:alert(1))",
    "[x](JaVaScRiPt:alert(1))",
    "[x](vbscript:msgbox(1))",
    "[x](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
    "![x](javascript:alert(1))",
    '<iframe src="http://evil.example/"></iframe>',
    '<div hx-get="/sessions/1/delete" hx-trigger="load">x</div>',
    "<svg onload=alert(1)>",
    "<style>body{display:none}</style>",
    '[x](http://example.com "title\\" onmouseover=\\"alert(1)")',
    "```html\n<script>alert(1)</script>\n```",
    "`<script>`",
    "<a href='http://x' onclick='alert(1)'>x</a>",
    "[x](</sessions/1/delete>)",
    "<<script>script>alert(1)<</script>/script>",
    "&lt;script&gt;alert(1)&lt;/script&gt;",
    "$\\href{javascript:alert(1)}{x}$",
    "$\\style{color:red}{x}$ and $\\color{red}{y}$",
    "$\\text{<script>alert(1)</script>}$",
    "$$\n<img src=x onerror=alert(1)>\n$$",
    "\\(<svg onload=alert(1)>\\)",
]
COPY_BUTTON = [("div", [("class", "code-block")]), ("button", [("type", "button"), ("class", "copy copy-code")])]


@pytest.mark.parametrize("payload", XSS)
def test_nothing_but_the_allowed_tags_attributes_and_schemes_comes_out(payload: str) -> None:
    html = str(markdown_html(payload))
    for tag, attrs in parsed(html):
        if (tag, attrs) in COPY_BUTTON:
            continue
        assert tag in ALLOWED_TAGS
        for name, value in attrs:
            if tag == "a" and name == "rel":
                continue
            if tag == "span" and name == "class":
                assert set((value or "").split()) <= CODE_CLASSES
                continue
            assert name in ALLOWED_ATTRIBUTES.get(tag, set()), (tag, name)
            if name == "href":
                assert value is not None
                assert value.startswith(("http://", "https://", "mailto:", "/")), value
    names = [name for _, attrs in parsed(html) for name, _ in attrs]
    assert not any(name.startswith(("on", "hx-", "data-", "style", "src")) for name in names)
    assert "<script" not in html.lower() and "<img" not in html.lower()


def test_raw_html_is_shown_as_text() -> None:
    html = str(markdown_html("Use <b>bold</b> & <script>x</script>"))
    assert "&lt;b&gt;bold&lt;/b&gt;" in html
    assert "&lt;script&gt;" in html
    assert "<b>" not in html


def test_markdown_renders_emphasis_lists_tables_and_links() -> None:
    html = str(
        markdown_html(
            "**b** *i* ~~s~~ `c`\n\n1. one\n2. two\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n[site](https://example.com)"
        )
    )
    assert "<strong>b</strong>" in html and "<em>i</em>" in html and "<s>s</s>" in html
    assert "<code>c</code>" in html
    assert "<ol>" in html and "<table>" in html and "<td>2</td>" in html
    assert '<a href="https://example.com" rel="noopener noreferrer nofollow">site</a>' in html


def test_code_blocks_are_highlighted_and_escaped() -> None:
    html = str(markdown_html('```python\ndef f():\n    return "<b>"\n```'))
    assert '<span class="k">def</span>' in html
    assert "&lt;b&gt;" in html
    plain = str(markdown_html("```\n<b>x</b>\n```"))
    assert (
        '<div class="code-block"><button type="button" class="copy copy-code">Copy</button>'
        "<pre><code>&lt;b&gt;x&lt;/b&gt;\n</code></pre></div>"
    ) in plain
    unknown = str(markdown_html("```no-such-language\n<b>x</b>\n```"))
    assert "&lt;b&gt;x&lt;/b&gt;" in unknown


def test_images_become_links_and_are_never_loaded() -> None:
    html = str(markdown_html("![a cat](https://cats.example/cat.png)"))
    assert "<img" not in html
    assert '<a href="https://cats.example/cat.png" rel="noopener noreferrer nofollow">[image: a cat]</a>' in html


def test_empty_text_renders_nothing() -> None:
    assert markdown_html("") == ""


def make_request(pk: int, **fields: object) -> ModelRequest:
    defaults: dict[str, object] = {
        "pk": pk,
        "session_id": 1,
        "kind": "reply",
        "status": RequestStatus.DONE,
        "bytes_sent": 1000,
        "shared_prefix_bytes": 900,
        "prompt_tokens": 1200,
        "cached_tokens": 1000,
        "completion_tokens": 30,
        "time_to_first_token": 0.25,
        "total_time": 1.5,
        "break_cause": "",
    }
    defaults.update(fields)
    return ModelRequest(**defaults)


def chart_of(requests: list[ModelRequest], *, window: int = 2400) -> str:
    return str(chart_html(bars_of(requests), window=window, auto_at=0.8))


def test_the_chart_has_one_bar_per_finished_request_with_tooltips_and_causes() -> None:
    requests = [
        make_request(1, break_cause=BreakCause.FIRST, cached_tokens=0),
        make_request(2),
        make_request(3, break_cause=BreakCause.UNEXPECTED),
        make_request(4, status=RequestStatus.FAILED, prompt_tokens=None, cached_tokens=None, error="<boom>"),
        make_request(5, status=RequestStatus.SENDING),
        make_request(6, cached_tokens=None, time_to_first_token=None),
    ]
    html = chart_of(requests)
    tags = parsed(html)
    bars = [attrs for tag, attrs in tags if tag == "g" and ("class", "bar") in attrs]
    assert len(bars) == 5
    assert 'data-bars="5"' in html
    assert "prompt tokens: 1,200" in html and "cached tokens: 1,000" in html, "counts with thousands separators"
    assert "uncached tokens: 200" in html
    assert "completion tokens: 30" in html
    assert "time to first token: 0.250 s" in html and "total time: 1.500 s" in html
    assert "bytes sent: 1,000" in html and "bytes shared with the request before: 900" in html
    assert 'title="first request" aria-label="first request">1</span>' in html
    assert 'title="unexpected" aria-label="unexpected">!</span>' in html
    assert "cached tokens: not reported" in html
    assert "failed: &lt;boom&gt;" in html and "<boom>" not in html
    assert html.count('class="cause cause-') == 2
    assert html.count('class="ttft"') == 3, "a segment from each timed bar to the timed bar before it"
    assert "<script" not in html and "style=" not in html
    assert '<span class="tick" data-at="100">100 %</span>' in html, "the axes are markup, not text"
    assert "<span>prompt, share of the 2,400 token window</span>" in html
    assert '<span class="mark cause-model_change">M</span> model change' in html, "every mark in the legend"
    assert "&lt;span" not in html


def test_a_bars_tooltip_names_the_cache_miss_class_and_the_tokens_lost() -> None:
    requests = [
        make_request(1, expected_cached_tokens=1000, cache_miss=""),
        make_request(2, expected_cached_tokens=1000, cached_tokens=0, cache_miss="server", cache_miss_tokens=1000),
        make_request(3, expected_cached_tokens=900, cache_miss="template", cache_miss_tokens=80, cache_miss_message=4),
        make_request(4),
    ]
    html = chart_of(requests)
    tooltips = re.findall(r'data-figures="(.*?)"', html, flags=re.S)
    assert len(tooltips) == 4 and "<title>" not in html, "a card, not a second native tooltip"
    assert sum("expected cached: " in tooltip for tooltip in tooltips) == 3, "no check, no figure: no tokenizer"
    assert "cache miss: not checked (the server offers no template and tokenizer to check with)" in tooltips[3]
    assert "cache miss: none" in html
    assert "cache miss: server, 1,000 tokens lost" in html
    assert "cache miss: template, 80 tokens lost from message 4" in html
    assert 'data-miss="server"' in html and 'data-miss="template"' in html
    assert ">unexpected</span>" not in html, "a template or server miss is no prefix break"


def test_a_bars_card_numbers_its_turn_as_the_page_does() -> None:
    same = make_request(1, turn=Turn(number=3, position=3), step_number=1)
    moved = make_request(2, turn=Turn(number=5, position=2), step_number=2)
    first_lines = [
        tooltip.splitlines()[0]
        for tooltip in re.findall(r"data-figures=\"(.*?)\"", chart_of([same, moved]), flags=re.S)
    ]
    assert first_lines == ["Request 1 · reply · turn 3 · step 1", "Request 2 · reply · turn 2 (stored 5) · step 2"]


def test_a_bar_is_its_prompt_as_a_share_of_the_window() -> None:
    half = str(bar_html(bars_of([make_request(7, prompt_tokens=1200, cached_tokens=300)])[0], window=2400, auto_at=0.8))
    rects = {attrs[0][1]: dict(attrs) for tag, attrs in parsed(half) if tag == "rect" and attrs[0][0] == "class"}
    assert rects["cached"]["y"] == "87.50" and rects["cached"]["height"] == "12.50"
    assert rects["uncached"]["y"] == "50.00" and rects["uncached"]["height"] == "37.50"
    over = str(bar_html(bars_of([make_request(8, prompt_tokens=9000)])[0], window=2400, auto_at=0.8))
    assert 'class="uncached" x="3" y="0.00"' in over, "a prompt past the window fills the bar, no more"


def test_the_time_to_first_token_scale_is_fixed_and_logarithmic() -> None:
    assert [ttft_y(seconds) for seconds in (0.001, 0.01, 0.1, 1, 10, 100, 1000)] == [100, 100, 75, 50, 25, 0, 0]


def test_an_empty_chart_says_so() -> None:
    html = chart_of([])
    assert "No model requests yet." in html
    assert 'data-bars="0"' in html


def make_result(kind: str, inserted: str, full: str = "", **fields: object) -> Result:
    return Result(number=3, kind=kind, inserted_text=inserted, full_text=full, tool="read", **fields)


def test_tool_rows_say_how_each_call_went() -> None:
    read = make_result(
        ResultKind.READ, "[#0003 a.py lines 1-200 of 340 sha 1]\n1: x", first_line=1, last_line=200, total_lines=340
    )
    assert result_status(read) == "lines 1-200 of 340"
    error = make_result(ResultKind.ERROR, "[#0003] No such file or folder: /w/b.py")
    assert result_status(error) == "No such file or folder: /w/b.py"
    stub = make_result(ResultKind.STUB, "[#0003] Unchanged since #0001, which already shows lines 1-2.")
    assert result_status(stub) == "Unchanged since #0001, which already shows lines 1-2."
    listing = make_result(ResultKind.LISTING, "[#0003]\n/w/a\n/w/b", "/w/a\n/w/b")
    assert result_status(listing) == "2 lines"
    one = make_result(ResultKind.LISTING, "[#0003]\nNo matches.", "No matches.")
    assert result_status(one) == "No matches."
    output = make_result(ResultKind.OUTPUT, "[#0003]\nx\n[exit 2]", "x\n[exit 2]")
    assert result_status(output) == "2 lines, [exit 2]"
    edit = make_result(
        ResultKind.EDIT,
        "[#0003 a.py sha 1]\n@@ -1 +1 @@\n-a\n+b",
        changed_files=[{"path": "a.py", "action": "update", "diff": "@@ -1 +1 @@\n-a\n+b", "lines": 1}],
        stale=[1],
    )
    assert result_status(edit) == "+1 −1; stale: #0001"
    recall = make_result(ResultKind.RECALL, "[#0003 recall #0001 lines 1-2 of 2]\na\nb")
    assert result_status(recall) == "recall #0001 lines 1-2 of 2"


def test_call_targets() -> None:
    assert call_target("read", '{"path": "src/app.ts", "offset": 3}') == "src/app.ts"
    assert call_target("grep", '{"pattern": "TODO", "path": "src"}') == "TODO in src"
    assert call_target("run", '{"command": "ls -la"}') == "ls -la"
    assert call_target("recall", '{"id": "#0001"}') == "#0001"
    patch = "*** Begin Patch\n*** Add File: a.txt\n+x\n*** Delete File: b.txt\n*** End Patch"
    assert call_target("apply_patch", '{"patch": ' + __import__("json").dumps(patch) + "}") == "a.txt, b.txt"
    assert call_target("read", "not json") == "not json"
    assert call_target("list", "") == ""
    assert call_target("wiki__search", '{"query": "release", "limit": 5}') == "query: release, limit: 5"
    assert call_target("wiki__search", '{"path": "docs"}') == "docs"  # a path is a path, whoever's tool


def test_the_highlighting_stylesheet_is_what_pygments_css_makes_with_dark_colours_scoped() -> None:
    stylesheet = Path(__file__).resolve().parents[2] / "static" / "cachet" / "pygments.css"
    header, _, rules = stylesheet.read_text().partition("\n")
    assert header.startswith("/* Generated by chat.web.rendering.pygments_css()")
    assert rules == pygments_css(), "regenerate static/cachet/pygments.css from pygments_css()"
    assert ".md pre .k { color: #008000; font-weight: bold }" in rules
    assert ':root[data-theme="dark"] .md pre .k { color: #FF7B72 }' in rules
    assert '@media (prefers-color-scheme: dark) {\n  :root:not([data-theme="light"]) .md pre span' in rules


def test_a_request_the_person_stopped_is_not_drawn_as_failed() -> None:
    """A Stop is the person's, not a fault: its bar has no red mark and its card says it was stopped."""
    stopped = bar_html(
        bars_of([make_request(9, status=RequestStatus.FAILED, error="Stopped.")])[0], window=2400, auto_at=0.8
    )
    failed = bar_html(
        bars_of([make_request(10, status=RequestStatus.FAILED, error="Cannot reach the model server.")])[0],
        window=2400,
        auto_at=0.8,
    )
    assert 'class="stopped"' in stopped and 'class="failed"' not in stopped
    assert "stopped: the person stopped the reply" in stopped and "failed:" not in stopped
    assert 'class="failed"' in failed and "failed: Cannot reach the model server." in failed
