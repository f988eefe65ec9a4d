"""A small Markdown to Qt-rich-text HTML converter for chat replies.

Why our own: it must render half-written Markdown while a reply streams (an open ``` fence is shown as
code at once), escape everything, and keep CJK text intact (no word-boundary rules that break on text
without spaces: *emphasis* needs its markers, `_` inside words stays literal)."""

from __future__ import annotations

import html
import re

from wslm.gui.syntax import highlight
from wslm.gui.theme import LINK

CODE_BG = "#15171c"
CODE_FG = "#e6e6e6"
INLINE_BG = "#2b2f38"
QUOTE_BAR = "#5c6373"  # a quote's left bar
QUOTE_FG = "#aab1bf"
MONO = "'Cascadia Mono', Consolas, 'DejaVu Sans Mono', 'Noto Sans Mono CJK SC', monospace"

_FENCE = re.compile(r"^\s*(```|~~~)\s*([\w+#.-]*)\s*$")
_HEADING = re.compile(r"^(#{1,6})\s+(.*)$")
_BULLET = re.compile(r"^(\s*)[-*+]\s+(.*)$")
_NUMBERED = re.compile(r"^(\s*)(\d+)[.)]\s+(.*)$")
_QUOTE = re.compile(r"^\s*>\s?(.*)$")
_RULE = re.compile(r"^\s*([-*_])(\s*\1){2,}\s*$")
_TABLE_SEP = re.compile(r"^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$")


# [text](url), or a bare URL (its trailing punctuation is the sentence's, not the link's).
_URL_CHAR = r"(?:(?!&(?:#x27|quot|lt|gt);)[^\s<>\"])"  # (the text is escaped: a quote is &#x27; here)
_LINKS = re.compile(r"\[([^\]]+)\]\((https?://[^)\s]+)\)|(https?://" + _URL_CHAR + r"*[^\s<>\".,;:!?)\]&])")
LINK_STYLE = f"color:{LINK}; text-decoration:underline;"


def _link(m: re.Match) -> str:
    url = m.group(2) or m.group(3)
    return f'<a href="{url}" style="{LINK_STYLE}">{m.group(1) or url}</a>'


def _inline(text: str) -> str:
    """Inline code, bold, italic, strike, links; code spans first so their contents stay literal."""
    parts = re.split(r"(`[^`]+`)", text)
    out = []
    for part in parts:
        if len(part) > 1 and part.startswith("`") and part.endswith("`"):
            code = html.escape(part[1:-1])
            out.append(f'<code style="background-color:{INLINE_BG}; font-family:{MONO};">&nbsp;{code}&nbsp;</code>')
            continue
        s = html.escape(part)
        s = _LINKS.sub(_link, s)
        s = re.sub(r"\*\*(?=\S)(.+?)(?<=\S)\*\*", r"<b>\1</b>", s)
        s = re.sub(r"(?<![\w*])__(?=\S)(.+?)(?<=\S)__(?![\w*])", r"<b>\1</b>", s)
        s = re.sub(r"(?<!\*)\*(?=[^\s*])(.+?)(?<=[^\s*])\*(?!\*)", r"<i>\1</i>", s)
        s = re.sub(r"(?<![\w_])_(?=[^\s_])(.+?)(?<=[^\s_])_(?![\w_])", r"<i>\1</i>", s)
        s = re.sub(r"~~(?=\S)(.+?)(?<=\S)~~", r"<s>\1</s>", s)
        out.append(s)
    return "".join(out)


def _code_block(lang: str, lines: list[str], open_fence: bool, copy_href: str = "") -> str:
    code = highlight("\n".join(lines), lang)
    label = html.escape(lang) if lang else "code"
    tail = " …" if open_fence else ""
    copy = (f'</td><td align="right" style="font-size:small;"><a href="{html.escape(copy_href)}" '
            f'style="color:#8a93a6;">Copy</a>') if copy_href and not open_fence else ""
    return (
        f'<table width="100%" cellspacing="0" cellpadding="8" style="background-color:{CODE_BG}; '
        f'margin-top:4px; margin-bottom:6px;">'
        f'<tr><td style="color:#8a93a6; font-size:small;">{label}{tail}{copy}</td></tr>'
        f'<tr><td colspan="2"><pre style="font-family:{MONO}; color:{CODE_FG}; white-space:pre-wrap;">{code}</pre></td></tr>'
        "</table>"
    )


def _table(rows: list[str]) -> str:
    def cells(row: str) -> list[str]:
        row = row.strip()
        if row.startswith("|"):
            row = row[1:]
        if row.endswith("|"):
            row = row[:-1]
        return [c.strip() for c in row.split("|")]

    head = cells(rows[0])
    body = [cells(r) for r in rows[2:]]
    out = ['<table cellspacing="0" cellpadding="4" border="1" style="border-color:#3a3f4b; border-style:solid;">']
    out.append("<tr>" + "".join(f"<th>{_inline(c)}</th>" for c in head) + "</tr>")
    for r in body:
        out.append("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>")
    out.append("</table>")
    return "".join(out)


def _quote(body: str) -> str:
    # Qt's rich text ignores border-left on <blockquote>: the bar is a narrow coloured table cell instead.
    return (f'<table width="100%" cellspacing="0" cellpadding="0" style="margin-top:2px; margin-bottom:6px;">'
            f'<tr><td width="3" style="background-color:{QUOTE_BAR};"></td>'
            f'<td style="padding-left:10px; color:{QUOTE_FG};">{body}</td></tr></table>')


def code_blocks(text: str) -> list[str]:
    """The contents of the fenced code blocks, in order (what the code blocks' Copy links copy)."""
    blocks, lines, i = [], text.replace("\r\n", "\n").split("\n"), 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence:
            body, i = [], i + 1
            while i < len(lines) and not lines[i].strip().startswith(fence.group(1)):
                body.append(lines[i])
                i += 1
            blocks.append("\n".join(body))
        i += 1
    return blocks


def render_markdown(text: str, copy_prefix: str = "") -> str:
    """HTML for QTextBrowser; safe for any input (all text is escaped). With `copy_prefix`, each closed
    code block gets a Copy link to `{copy_prefix}{index}`."""
    lines = text.replace("\r\n", "\n").split("\n")
    out: list[str] = []
    para: list[str] = []
    list_stack: list[str] = []  # "ul" / "ol"
    n_blocks = 0
    i = 0

    def flush_para() -> None:
        if para:
            out.append("<p>" + "<br>".join(_inline(p) for p in para) + "</p>")
            para.clear()

    def close_lists() -> None:
        while list_stack:
            out.append(f"</{list_stack.pop()}>")

    while i < len(lines):
        line = lines[i]
        fence = _FENCE.match(line)
        if fence:
            flush_para()
            close_lists()
            marker, lang = fence.group(1), fence.group(2)
            body = []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith(marker):
                body.append(lines[i])
                i += 1
            open_fence = i >= len(lines)
            href = f"{copy_prefix}{n_blocks}" if copy_prefix else ""
            n_blocks += 1
            out.append(_code_block(lang, body, open_fence, href))
            i += 1
            continue
        if not line.strip():
            flush_para()
            close_lists()
            i += 1
            continue
        if (
            "|" in line
            and i + 1 < len(lines)
            and _TABLE_SEP.match(lines[i + 1])
        ):
            flush_para()
            close_lists()
            rows = [line, lines[i + 1]]
            i += 2
            while i < len(lines) and "|" in lines[i] and lines[i].strip():
                rows.append(lines[i])
                i += 1
            out.append(_table(rows))
            continue
        heading = _HEADING.match(line)
        if heading:
            flush_para()
            close_lists()
            level = min(len(heading.group(1)) + 2, 6)  # chat headings stay modest
            out.append(f"<h{level}>{_inline(heading.group(2))}</h{level}>")
            i += 1
            continue
        if _RULE.match(line):
            flush_para()
            close_lists()
            out.append("<hr>")
            i += 1
            continue
        bullet, numbered = _BULLET.match(line), _NUMBERED.match(line)
        if bullet or numbered:
            flush_para()
            kind = "ul" if bullet else "ol"
            indent = len((bullet or numbered).group(1).expandtabs(4)) // 2
            depth = indent + 1
            while len(list_stack) > depth:
                out.append(f"</{list_stack.pop()}>")
            while len(list_stack) < depth:
                list_stack.append(kind)
                start = f' start="{numbered.group(2)}"' if numbered and len(list_stack) == depth else ""
                out.append(f"<{kind}{start}>")
            if list_stack[-1] != kind:
                out.append(f"</{list_stack.pop()}>")
                list_stack.append(kind)
                out.append(f"<{kind}>")
            item = bullet.group(2) if bullet else numbered.group(3)
            out.append(f"<li>{_inline(item)}</li>")
            i += 1
            continue
        quote = _QUOTE.match(line)
        if quote:
            flush_para()
            close_lists()
            quoted = []
            while i < len(lines) and _QUOTE.match(lines[i]):
                quoted.append(_inline(_QUOTE.match(lines[i]).group(1)))
                i += 1
            out.append(_quote("<br>".join(quoted)))
            continue
        if list_stack and line.startswith("  "):
            # continuation of a list item
            out.append(f"<p style='margin-left:0'>{_inline(line.strip())}</p>")
            i += 1
            continue
        close_lists()
        para.append(line)
        i += 1
    flush_para()
    close_lists()
    return "".join(out)
