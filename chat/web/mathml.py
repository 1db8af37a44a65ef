"""TeX math in markdown as MathML, made on the server: the page needs no script and the CSP stays strict.

``$…$`` and ``\\(…\\)`` are inline math, ``$$…$$`` and ``\\[…\\]`` display math (on lines of their own they are a
block). The markdown parser finds them, so code spans and code blocks are never touched. A ``$`` opens math only
when a non-space follows it, and closes it only when a non-space precedes it and no digit follows, as pandoc
reads them: ``$5 and $10`` stays text. TeX that ``latex2mathml`` cannot read is shown as its source, in code.

What TeX passes through as text (``\\text{…}``, ``\\mbox``, ``\\tag``…) is text in the MathML, escaped like any
other: ``\\text{<b>x</b>}`` shows ``<b>x</b>``. Every length (``\\rule``, ``\\hspace``, ``\\kern``, ``\\raise``, font
sizes…) is at most ``MAX_LENGTH_EM`` em at the size it is drawn, and sizes compound to at most ``MAX_FONT_SCALE``;
TeX past them, or with a length that cannot be read, is shown as its source.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from xml.etree.ElementTree import Element, tostring

from django.utils.html import escape
from latex2mathml.converter import convert_to_element
from markdown_it import MarkdownIt
from markdown_it.renderer import RendererHTML
from markdown_it.rules_block import StateBlock
from markdown_it.rules_inline import StateInline
from markdown_it.token import Token
from markdown_it.utils import EnvType, OptionsDict

MAX_MATH_CHARS = 4000
MAX_LENGTH_EM = 10.0
MAX_FONT_SCALE = 3.0

MATHML_TAGS = frozenset(
    {
        "math",
        "menclose",
        "mfrac",
        "mi",
        "mn",
        "mo",
        "mover",
        "mpadded",
        "mphantom",
        "mroot",
        "mrow",
        "mspace",
        "msqrt",
        "mstyle",
        "msub",
        "msubsup",
        "msup",
        "mtable",
        "mtd",
        "mtext",
        "mtr",
        "munder",
        "munderover",
        "none",
    }
)
MATHML_ATTRIBUTES = frozenset(
    {
        "accent",
        "columnalign",
        "columnlines",
        "columnspacing",
        "depth",
        "display",
        "displaystyle",
        "fence",
        "form",
        "height",
        "largeop",
        "linebreak",
        "linethickness",
        "lspace",
        "mathsize",
        "mathvariant",
        "maxsize",
        "minsize",
        "movablelimits",
        "notation",
        "rowalign",
        "rowlines",
        "rowspacing",
        "rspace",
        "scriptlevel",
        "separator",
        "stretchy",
        "symmetric",
        "voffset",
        "width",
    }
)

SEARCHED = "cachet_math_searched"
_DELIMITERS = {"$": ("$", False), "$$": ("$$", True), "\\(": ("\\)", False), "\\[": ("\\]", True)}


# The attributes that hold lengths, and what one length is worth in em (TeX's: 1em = 10pt); ``width``, ``height``
# and ``depth`` are ``mpadded``'s multiples of its content's own size.
LENGTH_ATTRIBUTES = (
    "columnspacing",
    "depth",
    "height",
    "linethickness",
    "lspace",
    "maxsize",
    "minsize",
    "rowspacing",
    "rspace",
    "voffset",
    "width",
)
_EM_PER_UNIT = {
    "": 1.0,
    "em": 1.0,
    "ex": 0.5,
    "mu": 1 / 18,
    "pt": 0.1,
    "bp": 72.27 / 72 / 10,
    "dd": 1238 / 1157 / 10,
    "pc": 1.2,
    "cc": 12 * 1238 / 1157 / 10,
    "sp": 1 / 655360,
    "px": 1 / 16,
    "in": 7.227,
    "cm": 7.227 / 2.54,
    "mm": 7.227 / 25.4,
    "%": 0.01,
    "width": 1.0,
    "height": 1.0,
    "depth": 1.0,
}
_LENGTH = re.compile(r"([+-]?)(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*|%)", re.IGNORECASE)
_NAMED_SPACES = frozenset(
    f"{sign}{size}mathspace"
    for sign in ("", "negative")
    for size in ("veryverythin", "verythin", "thin", "medium", "thick", "verythick", "veryverythick")
)
# latex2mathml writes the characters it makes (symbols, the spaces of text) as hexadecimal references.
_REFERENCE = re.compile(r"&#x([0-9A-Fa-f]{1,6});")


def _em(length: str) -> float | None:
    """``length`` in em, or ``None`` where it is not a length Cachet reads."""
    if length in _NAMED_SPACES:
        return 0.0
    match = _LENGTH.fullmatch(length.strip())
    factor = _EM_PER_UNIT.get(match[3].lower()) if match else None
    if match is None or factor is None:
        return None
    return float(match[2]) * factor * (-1 if match[1] == "-" else 1)


def _sized_sanely(math: Element) -> bool:
    """Every length of ``math`` is at most ``MAX_LENGTH_EM`` at the size it is drawn, and no font grows past
    ``MAX_FONT_SCALE``; nothing unread passes."""
    stack = [(math, 1.0)]
    while stack:
        element, scale = stack.pop()
        size = element.get("mathsize")
        if size is not None:
            factor = _em(size)
            if factor is None or factor < 0 or scale * factor > MAX_FONT_SCALE:
                return False
            scale *= factor
        for name in LENGTH_ATTRIBUTES:
            for length in element.get(name, "").split():
                em = _em(length)
                if em is None or abs(em) * scale > MAX_LENGTH_EM:
                    return False
        stack.extend((child, scale) for child in element)
    return True


def _character(reference: re.Match[str]) -> str:
    code = int(reference[1], 16)
    return chr(code) if 0 < code <= 0x10FFFF and not 0xD800 <= code <= 0xDFFF else reference[0]


def _as_text(math: Element) -> None:
    """latex2mathml's references as the characters they stand for, so that serializing escapes the rest."""
    for element in math.iter():
        if element.text:
            element.text = _REFERENCE.sub(_character, element.text)
        if element.tail:
            element.tail = _REFERENCE.sub(_character, element.tail)


def latex_to_mathml(source: str, *, display: bool) -> str | None:
    """``source`` as a ``<math>`` element, or ``None`` where it is not TeX that can be shown."""
    if not source.strip() or len(source) > MAX_MATH_CHARS:
        return None
    try:
        # Not latex2mathml's ``convert``: it unescapes its whole output, so text would pass through as HTML.
        math = convert_to_element(source, display="block" if display else "inline")
        if not _sized_sanely(math):
            return None
        _as_text(math)
        return tostring(math, encoding="unicode")
    except Exception:  # latex2mathml raises many kinds (and IndexError, RecursionError) on bad TeX
        return None


def _dollar_closes(src: str, at: int) -> bool:
    return not src[at - 1].isspace() and not (at + 1 < len(src) and src[at + 1].isdigit())


@dataclass
class _Searched:
    """What one parse already searched: where no closer is (per closer and text), and how much it read."""

    src: str = ""
    closer_free: dict[str, tuple[int, int]] = field(default_factory=dict)
    no_block_close_before: int = -1
    chars: int = 0


def _searched(env: EnvType) -> _Searched:
    searched = env.get(SEARCHED)
    if not isinstance(searched, _Searched):
        searched = env[SEARCHED] = _Searched()
    return searched


def _find_close(src: str, start: int, end: int, opening: str, searched: _Searched) -> int:
    """Where the math opened by ``opening`` closes in ``src[start:end]``, or -1.

    No search goes further than ``MAX_MATH_CHARS``, none reads again a stretch an earlier one found without a
    closer, and a lone ``$`` gives up at the first ``$`` that cannot close it (no TeX holds one): text full
    of openers is read about once.
    """
    closing = _DELIMITERS[opening][0]
    end = min(end, start + MAX_MATH_CHARS + len(closing))
    if searched.src is not src:
        searched.src, searched.closer_free = src, {}
    at = start
    free_from, free_to = searched.closer_free.get(closing, (-1, -1))
    if free_from <= start < free_to:
        at = max(start, free_to - len(closing) + 1)
    while at < end:
        found = src.find(closing, at, end)
        searched.chars += (found if found >= 0 else end) - at
        if found < 0:
            break
        if src[found - 1] == "\\" and closing.startswith("$"):
            at = found + 1
            continue
        if opening != "$" or _dollar_closes(src, found):
            return found
        return -1
    if opening != "$":
        searched.closer_free[closing] = (start, end)
    return -1


def _inline_math(state: StateInline, silent: bool) -> bool:
    src, pos, end = state.src, state.pos, state.posMax
    if src.startswith("$$", pos):
        opening = "$$"
    elif src[pos] == "$":
        opening = "$"
        if pos + 1 >= end or src[pos + 1].isspace():
            return False
    elif src.startswith(("\\(", "\\["), pos):
        opening = src[pos : pos + 2]
    else:
        return False
    start = pos + len(opening)
    close = _find_close(src, start, end, opening, _searched(state.env))
    if close <= start or "`" in src[start:close]:
        return False
    if not silent:
        token = state.push("math_inline", "math", 0)
        token.content = src[start:close]
        token.markup = opening
        token.info = "display" if _DELIMITERS[opening][1] else ""
    state.pos = close + len(_DELIMITERS[opening][0])
    return True


def _block_math(state: StateBlock, start_line: int, end_line: int, silent: bool) -> bool:
    if state.sCount[start_line] - state.blkIndent >= 4:
        return False
    begin = state.bMarks[start_line] + state.tShift[start_line]
    first = state.src[begin : state.eMarks[start_line]]
    opening = "$$" if first.startswith("$$") else first[:2] if first.startswith("\\[") else ""
    if not opening:
        return False
    closing = _DELIMITERS[opening][0]
    rest = first[2:].rstrip()
    line, parts, size = start_line, [], 0
    if rest.endswith(closing):
        body = rest[: -len(closing)]
        if not body.strip() or closing in body:
            return False
        parts.append(body)
    else:
        if closing in rest:
            return False
        searched = _searched(state.env)
        if start_line < searched.no_block_close_before:
            return False  # an opener above already read these lines and found no closer
        parts.append(rest)
        while True:
            line += 1
            size += len(parts[-1]) + 1
            searched.chars += len(parts[-1]) + 1
            if line >= end_line or state.isEmpty(line) or size > MAX_MATH_CHARS:
                searched.no_block_close_before = line
                return False
            text = state.src[state.bMarks[line] + state.tShift[line] : state.eMarks[line]].rstrip()
            if text.endswith(closing):
                if closing in text[: -len(closing)]:
                    return False
                parts.append(text[: -len(closing)])
                break
            if closing in text:
                return False
            parts.append(text)
    if silent:
        return True
    token = state.push("math_block", "math", 0)
    token.block = True
    token.content = "\n".join(parts).strip()
    token.markup = opening
    token.map = [start_line, line + 1]
    state.line = line + 1
    return True


def _source_as_code(token: Token) -> str:
    return f"<code>{escape(token.markup + token.content + _DELIMITERS[token.markup][0])}</code>"


def _render_inline(
    renderer: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
    token = tokens[idx]
    return latex_to_mathml(token.content, display=token.info == "display") or _source_as_code(token)


def _render_block(renderer: RendererHTML, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType) -> str:
    token = tokens[idx]
    mathml = latex_to_mathml(token.content, display=True)
    return f"{mathml}\n" if mathml else f"<pre>{_source_as_code(token)}</pre>\n"


def math_plugin(parser: MarkdownIt) -> None:
    """Teach ``parser`` the four math delimiters and to render them as MathML."""
    parser.inline.ruler.before("escape", "math_inline", _inline_math)
    parser.block.ruler.before(
        "fence", "math_block", _block_math, {"alt": ["paragraph", "reference", "blockquote", "list"]}
    )
    parser.add_render_rule("math_inline", _render_inline)
    parser.add_render_rule("math_block", _render_block)
