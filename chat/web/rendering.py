"""Markdown to HTML that is safe to put in a page: markdown-it (no raw HTML), pygments, then nh3.

Everything a person or a model wrote goes through :func:`markdown_html`. markdown-it's ``js-default``
preset escapes raw HTML and refuses ``javascript:`` links; nh3 then keeps only the tags, attributes,
classes and URL schemes listed here, whatever the markdown produced. Images are never shown: an image
becomes a plain link to its address, so a page never loads a picture from another host. TeX math becomes
MathML (``chat.web.mathml``), and each code block gets a **Copy** button (``static/cachet/copy.js``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import cache
from typing import Any

import nh3
from django.core.cache import cache as rendered_cache
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe
from markdown_it import MarkdownIt
from markdown_it.renderer import RendererHTML
from markdown_it.token import Token
from markdown_it.utils import EnvType, OptionsDict
from pygments import highlight as pygments_highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.token import STANDARD_TYPES
from pygments.util import ClassNotFound

from chat.web.mathml import MATHML_ATTRIBUTES, MATHML_TAGS, math_plugin

ALLOWED_TAGS = frozenset(
    {
        "a",
        "blockquote",
        "br",
        "code",
        "del",
        "em",
        "h1",
        "h2",
        "h3",
        "h4",
        "h5",
        "h6",
        "hr",
        "li",
        "ol",
        "p",
        "pre",
        "s",
        "span",
        "strong",
        "table",
        "tbody",
        "td",
        "th",
        "thead",
        "tr",
        "ul",
    }
    | MATHML_TAGS
)
ALLOWED_ATTRIBUTES: dict[str, set[str]] = {"a": {"href", "title"}, "ol": {"start"}} | {
    tag: set(MATHML_ATTRIBUTES) for tag in MATHML_TAGS
}
URL_SCHEMES = frozenset({"http", "https", "mailto"})
CODE_CLASSES = frozenset(name for name in STANDARD_TYPES.values() if name)
MAX_HIGHLIGHT_CHARS = 200_000


def _highlight(code: str, lang: str, _attrs: str) -> str:
    """Pygments spans for a fenced block with a known language; ``""`` lets markdown-it escape it."""
    if not lang or len(code) > MAX_HIGHLIGHT_CHARS:
        return ""
    try:
        lexer = get_lexer_by_name(lang.strip().lower())
    except ClassNotFound:
        return ""
    return str(pygments_highlight(code, lexer, HtmlFormatter(nowrap=True)))


def _image_as_link(
    renderer: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
    token = tokens[idx]
    alt = renderer.renderInlineAsText(token.children or [], options, env) or "image"
    src = str(token.attrGet("src") or "")
    return f'<a href="{escape(src)}">[image: {escape(alt)}]</a>'


@cache
def _parser(*, breaks: bool = False, highlight: bool = True) -> MarkdownIt:
    """The model's markdown; with ``breaks``, a person's, where each line break they typed stays one.
    Without ``highlight``, code blocks are plain (a stream's unfinished block, re-rendered often)."""
    options: dict[str, Any] = {"breaks": breaks}
    if highlight:
        options["highlight"] = _highlight
    parser = MarkdownIt("js-default", options)
    parser.enable("table").enable("strikethrough").use(math_plugin)
    parser.add_render_rule("image", _image_as_link)
    return parser


_PRE = "<pre>"
_CODE_BLOCK = '<div class="code-block"><button type="button" class="copy copy-code">Copy</button><pre>'


def _with_copy_buttons(html: str) -> str:
    """Each sanitized ``<pre>`` (nh3 leaves it without attributes) in a box with its Copy button."""
    if _PRE not in html:
        return html
    return html.replace(_PRE, _CODE_BLOCK).replace("</pre>", "</pre></div>")


def sanitize(html: str) -> str:
    """Keep only the listed tags, attributes, pygments classes and URL schemes."""
    return str(
        nh3.clean(
            html,
            tags=set(ALLOWED_TAGS),
            clean_content_tags={"script", "style"},
            attributes={tag: set(names) for tag, names in ALLOWED_ATTRIBUTES.items()},
            allowed_classes={"span": set(CODE_CLASSES)},
            url_schemes=set(URL_SCHEMES),
            link_rel="noopener noreferrer nofollow",
            strip_comments=True,
        )
    )


def block_starts(text: str) -> list[int]:
    """Where each top-level block of ``text`` starts, as offsets into it (for rendering a stream block by block)."""
    tokens: list[Token] = []
    _parser().block.parse(text, _parser(), {}, tokens)
    lines = [token.map[0] for token in tokens if token.level == 0 and token.nesting >= 0 and token.map]
    line_starts = [0]
    at = text.find("\n")
    while at >= 0:
        line_starts.append(at + 1)
        at = text.find("\n", at + 1)
    return [line_starts[line] for line in lines]


RENDERING_VERSION = 3


def render_markdown(text: str, *, breaks: bool = False, highlight: bool = True) -> str:
    """``text`` as sanitized HTML, rendered now (no cache)."""
    return _with_copy_buttons(sanitize(_parser(breaks=breaks, highlight=highlight).render(text)))


def markdown_html(text: str, *, breaks: bool = False) -> SafeString:
    """``text`` as sanitized HTML: safe to mark safe and put inside an ``hx-disable`` element.

    A text is rendered once: the HTML is kept in the cache under the renderer's version and the text's hash,
    for every view after. ``breaks`` keeps every line break (a person's message).
    """
    if not text:
        return mark_safe("")
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    key = f"md:{RENDERING_VERSION}:{'br' if breaks else 'p'}:{digest}"
    html = rendered_cache.get(key)
    if not isinstance(html, str):
        html = render_markdown(text, breaks=breaks)
        rendered_cache.set(key, html, timeout=None)
    return mark_safe(html)


def _style_rules(style: str, selector: str) -> list[str]:
    formatter: Any = HtmlFormatter(style=style)
    return [line for line in formatter.get_style_defs(selector).splitlines() if line.startswith(selector)]


DARK_CHOSEN = ':root[data-theme="dark"]'
DARK_BY_SYSTEM = ':root:not([data-theme="light"])'


def pygments_css(selector: str = ".md pre") -> str:
    """The stylesheet for highlighted code, as ``static/cachet/pygments.css`` holds it: pygments' default style,
    and its github-dark style where the person chose Dark mode or the system prefers dark and they chose none."""
    light = _style_rules("default", selector)

    def dark(scope: str) -> list[str]:
        reset = f"{scope} {selector} span {{ color: inherit; background: none; border: 0; font: inherit }}"
        return [reset] + [f"{scope} {rule}" for rule in _style_rules("github-dark", selector)]

    by_system = ["@media (prefers-color-scheme: dark) {", *("  " + rule for rule in dark(DARK_BY_SYSTEM)), "}"]
    return "\n".join([*light, *dark(DARK_CHOSEN), *by_system]) + "\n"
