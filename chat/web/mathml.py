"""TeX math in markdown as MathML, made on the server: the page needs no script and the CSP stays strict.

``$…$`` and ``\\(…\\)`` are inline math, ``$$…$$`` and ``\\[…\\]`` display math (on lines of their own they are a
block). The markdown parser finds them, so code spans and code blocks are never touched. A ``$`` opens math only
when a non-space follows it, and closes it only when a non-space precedes it and no digit follows, as pandoc
reads them: ``$5 and $10`` stays text. TeX that ``latex2mathml`` cannot read is shown as its source, in code.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.utils.html import escape
from latex2mathml.converter import convert
from markdown_it import MarkdownIt
from markdown_it.renderer import RendererHTML
from markdown_it.rules_block import StateBlock
from markdown_it.rules_inline import StateInline
from markdown_it.token import Token
from markdown_it.utils import EnvType, OptionsDict

MAX_MATH_CHARS = 4000

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

_DELIMITERS = {"$": ("$", False), "$$": ("$$", True), "\\(": ("\\)", False), "\\[": ("\\]", True)}


def latex_to_mathml(source: str, *, display: bool) -> str | None:
    """``source`` as a ``<math>`` element, or ``None`` where it is not TeX that can be shown."""
    if not source.strip() or len(source) > MAX_MATH_CHARS:
        return None
    try:
        return str(convert(source, display="block" if display else "inline"))
    except Exception:  # latex2mathml raises many kinds (and IndexError, RecursionError) on bad TeX
        return None


def _dollar_closes(src: str, at: int) -> bool:
    return not src[at - 1].isspace() and not (at + 1 < len(src) and src[at + 1].isdigit())


def _find_close(src: str, start: int, end: int, opening: str) -> int:
    """Where the math opened by ``opening`` closes in ``src[start:end]``, or -1."""
    closing = _DELIMITERS[opening][0]
    at = start
    while at < end:
        at = src.find(closing, at, end)
        if at < 0:
            return -1
        if src[at - 1] == "\\" and closing.startswith("$"):
            at += 1
            continue
        if opening != "$" or _dollar_closes(src, at):
            return at
        at += 1
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
    close = _find_close(src, start, end, opening)
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
    line, parts = start_line, []
    if rest.endswith(closing):
        body = rest[: -len(closing)]
        if not body.strip() or closing in body:
            return False
        parts.append(body)
    else:
        if closing in rest:
            return False
        parts.append(rest)
        while True:
            line += 1
            if line >= end_line or state.isEmpty(line):
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
