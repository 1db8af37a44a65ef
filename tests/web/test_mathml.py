"""TeX in markdown becomes MathML on the server; code, prices and bad TeX stay as they were written."""

from __future__ import annotations

import re
from html import unescape
from xml.etree import ElementTree

import pytest
from django.utils.html import escape
from hypothesis import given, settings
from hypothesis import strategies as st

from chat.web import mathml, rendering
from chat.web import mathml as mathml_module
from chat.web.mathml import latex_to_mathml
from chat.web.rendering import markdown_html, render_markdown, sanitize


def test_inline_dollars_become_inline_math() -> None:
    html = render_markdown("Einstein: $E = mc^2$.")
    assert html.startswith('<p>Einstein: <math display="inline">')
    assert "<msup><mi>c</mi><mn>2</mn></msup>" in html
    assert "$" not in html


def test_parentheses_are_inline_and_brackets_display() -> None:
    html = render_markdown("so \\(a+b\\) and \\[\\frac{1}{2}\\] here")
    assert '<math display="inline"><mrow><mi>a</mi><mo>+</mo><mi>b</mi></mrow></math>' in html
    assert '<math display="block"><mrow><mfrac>' in html
    assert "\\(" not in html and "\\[" not in html


@pytest.mark.parametrize(
    "text",
    ["$$\n\\sum_{i=1}^n i\n$$", "$$\\sum_{i=1}^n i$$", "\\[\n\\sum_{i=1}^n i\n\\]", "  $$\n  \\sum_{i=1}^n i\n  $$"],
)
def test_display_math_on_lines_of_its_own_is_a_block(text: str) -> None:
    html = render_markdown(text)
    assert html.startswith('<math display="block">'), html
    assert "<munderover><mo>∑</mo>" in html


def test_display_math_may_interrupt_a_paragraph() -> None:
    html = render_markdown("The sum:\n$$\nx^2\n$$\nis squared.")
    assert html.startswith('<p>The sum:</p>\n<math display="block">')
    assert "<p>is squared.</p>" in html


@pytest.mark.parametrize(
    "text",
    [
        "`$x$` and `\\(y\\)`",
        "```\n$x$ and $$y$$\n```",
        "```latex\n\\[ x \\]\n```",
        "    $x$ indented code",
        "``code $x$ with ` inside``",
    ],
)
def test_code_spans_and_code_blocks_are_never_touched(text: str) -> None:
    html = render_markdown(text)
    assert "<math" not in html
    assert "$x$" in html or "\\(y\\)" in html or "\\[ x \\]" in html or "\\[" in html


@pytest.mark.parametrize(
    "text",
    [
        "It costs $5 and $10.",
        "Between $5 and $10, or $20.",
        "US$5 and US$10",
        "I paid $ 5 and got $ 3 back",
        "from $5 to 6$10",
        "a lone $ sign",
        "escaped \\$x\\$ dollars",
        "$$ no closing",
        "empty $$$$ pair",
    ],
)
def test_prices_and_lone_dollars_are_not_math(text: str) -> None:
    assert "<math" not in render_markdown(text)


def test_a_dollar_closes_only_before_a_non_digit_after_a_non_space() -> None:
    assert "<math" in render_markdown("$x$, then")
    assert "<math" not in render_markdown("$x $ then")
    assert "<math" in render_markdown("$x$ and $5 later")


@pytest.mark.parametrize("source", ["\\frac", "x^", "\\left( a", "\\begin{matrix} a", "\\sqrt"])
def test_bad_tex_shows_its_source_as_code(source: str) -> None:
    assert latex_to_mathml(source, display=False) is None
    inline = render_markdown(f"bad ${source}$ here")
    assert "<math" not in inline
    assert f"<code>${source.replace('<', '&lt;')}$</code>" in inline
    block = render_markdown(f"$$\n{source}\n$$")
    assert "<math" not in block
    assert f"$${source}$$</code></pre>" in block


def test_very_long_math_is_shown_as_source() -> None:
    source = "x+" * 3000 + "x"
    assert latex_to_mathml(source, display=False) is None
    assert render_markdown(f"${source}$") == f"<p>${source}$</p>\n"


@pytest.mark.parametrize(
    "text",
    ["$a " * 17_000, "$$a " * 12_000, "\\(a " * 12_000, "$$a\n" * 12_000, "\\[x\n" * 12_000, "> \\[x\n" * 9_000],
)
def test_text_full_of_openers_is_read_about_once(text: str) -> None:
    """No opener searches further than ``MAX_MATH_CHARS`` nor again where an earlier one found no closer."""
    env: dict[str, object] = {}
    rendering._parser().parse(text, env)
    searched = env[mathml.SEARCHED]
    assert isinstance(searched, mathml._Searched)
    assert searched.chars <= 3 * len(text)


def test_the_sanitizer_keeps_mathml_and_drops_what_is_not_listed() -> None:
    mathml = latex_to_mathml("\\left( R^{n} \\right) \\hspace{1em} \\frac{a}{b} \\displaystyle x", display=True)
    assert mathml is not None
    kept = sanitize(mathml)
    assert kept.startswith('<math display="block">')
    for element in (
        "<msup>",
        "<mfrac>",
        '<mstyle displaystyle="true" scriptlevel="0">',
        '<mo stretchy="true" fence="true" form="prefix">',
        '<mspace width="1em">',
    ):
        assert element in kept
    dirty = sanitize(
        '<math display="block"><mrow href="javascript:alert(1)" style="color:red" onclick="x">'
        "<mi>x</mi></mrow><script>alert(1)</script><annotation-xml>y</annotation-xml></math>"
    )
    assert dirty == '<math display="block"><mrow><mi>x</mi></mrow>y</math>'


def test_cached_html_is_rendered_again_when_the_renderer_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    text = "cached $y^2$ once"
    first = str(markdown_html(text))
    assert "<math" in first
    monkeypatch.setattr(sanitize.__globals__["rendered_cache"], "get", lambda key: f"<p>{key}</p>")
    old_key = str(markdown_html(text))
    monkeypatch.setattr(rendering, "RENDERING_VERSION", rendering.RENDERING_VERSION + 1)
    assert str(markdown_html(text)) != old_key
    assert str(markdown_html(text, breaks=True)) != str(markdown_html(text))


def test_a_persons_line_breaks_are_kept() -> None:
    assert str(markdown_html("one\ntwo", breaks=True)) == "<p>one<br>\ntwo</p>\n"
    assert str(markdown_html("one\ntwo")) == "<p>one\ntwo</p>\n"


TEXT_COMMANDS = ["\\text", "\\textbf", "\\textit", "\\textrm", "\\texttt", "\\mbox", "\\hbox", "\\fbox", "\\tag"]


@pytest.mark.parametrize("command", TEXT_COMMANDS)
@pytest.mark.parametrize("words", ["<b>x</b>", "</math><img src=x onerror=alert(1)>", "a &amp; b", 'say "hi"'])
def test_text_in_tex_is_text_whatever_it_holds(command: str, words: str) -> None:
    mathml = latex_to_mathml(f"{command}{{{words}}}", display=False)
    assert mathml is not None
    shown = "".join(ElementTree.fromstring(mathml).itertext()).replace("\xa0", " ")
    assert words in shown, "the characters as written, not markup"
    html = render_markdown(f"see ${command}{{{words}}}$ here")
    assert "<b>" not in html and "<img" not in html and html.count("</math>") == 1
    math = html[html.index("<math") : html.index("</math>")]
    assert words in unescape(re.sub(r"<[^>]*>", "", math)).replace("\xa0", " "), "what the page shows"


def test_what_latex2mathml_writes_as_references_is_still_the_character() -> None:
    html = render_markdown("$a < b \\leq c''$ and $\\text{two words}$")
    assert "<mo>&lt;</mo>" in html and "<mo>≤</mo>" in html and "″" in html
    assert "<mtext>two&nbsp;words</mtext>" in html


@pytest.mark.parametrize(
    "source",
    [
        "\\rule{1000em}{1000em}",
        "\\rule{1em}{1000em}",
        "\\rule[1000em]{1em}{1em}",
        "\\hspace{1000em}",
        "\\hspace{-50em}",
        "\\kern1000em",
        "\\mkern-500mu",
        "\\mspace{1000mu}",
        "\\hskip-1000pt",
        "\\hspace{20cm}",
        "\\raise{100em}{x}",
        "\\moveleft{100em}{x}",
        "\\skew{1000}{\\hat}{a}",
        "\\Huge\\Huge x",
        "{\\Huge {\\huge x}}",
        "\\Huge \\hspace{5em}",
    ],
)
def test_sizes_past_sane_are_shown_as_source(source: str) -> None:
    assert latex_to_mathml(source, display=False) is None
    assert render_markdown(f"${source}$") == f"<p><code>${escape(source)}$</code></p>\n"


@pytest.mark.parametrize(
    "source",
    [
        "\\rule{1em}{0.5em}",
        "\\hspace{1cm} x \\qquad y \\! z \\, w",
        "\\kern-0.5em x \\mkern18mu y",
        "\\Huge x",
        "\\Bigg( \\big[ x \\big] \\Bigg)",
        "\\binom{a}{b} \\xrightarrow{f} \\llap{x} \\skew{3}{\\hat}{a}",
        "\\begin{pmatrix} a & b \\\\ c & d \\end{pmatrix}",
    ],
)
def test_ordinary_sizes_still_render(source: str) -> None:
    assert latex_to_mathml(source, display=True) is not None


@pytest.mark.parametrize(
    "source",
    [
        "\\left(" * 300 + "x" + "\\right)" * 300,
        "\\big(" * 800,
        "\\Bigg(" * 600,
        "{" * 1999 + "x" + "}" * 1999,
        "\\sqrt{" * 600 + "x" + "}" * 600,
    ],
)
def test_deep_nesting_and_repetition_stay_bounded(source: str) -> None:
    """In size; in time, ``bench/bounds_bench.py`` measures it."""
    html = render_markdown(f"$${source}$$")
    assert len(html) < 30 * len(source)


TEX_PIECES = [
    "x",
    "1",
    " ",
    "<",
    ">",
    "&",
    '"',
    "&#x3C;",
    "</math>",
    "<b>",
    "\\text{",
    "\\mathrm{",
    "\\operatorname{",
    "\\rule{",
    "\\hspace{",
    "\\kern",
    "\\raise{",
    "\\Huge",
    "\\left(",
    "\\right)",
    "\\big(",
    "{",
    "}",
    "^",
    "_",
    "em",
    "pt",
    "mu",
    "-",
    "999",
    "\\frac{",
    "\\\\",
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(TEX_PIECES), max_size=30).map("".join))
def test_any_tex_gives_well_formed_mathml_of_sane_sizes_or_none(source: str) -> None:
    mathml = latex_to_mathml(source, display=False)
    if mathml is None:
        return
    root = ElementTree.fromstring(mathml)
    for element in root.iter():
        assert element.tag.rpartition("}")[2] in mathml_module.MATHML_TAGS, element.tag
        for name in mathml_module.LENGTH_ATTRIBUTES:
            for length in element.get(name, "").split():
                em = mathml_module._em(length)
                assert em is not None and abs(em) <= mathml_module.MAX_LENGTH_EM, (name, length)
    assert "<script" not in render_markdown(f"${source}$").lower()
