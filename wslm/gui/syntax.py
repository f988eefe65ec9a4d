"""Simple syntax highlighting for chat code blocks: keywords, strings, comments, numbers and called function
names, for the languages models write most (Python, JS/TS, shell, JSON, C/C++, Rust, Go).

One regex pass over the whole block (so block comments and triple-quoted strings span lines); the output is
escaped HTML with <span style="color:…"> around the tokens. An unknown language, or a string still being
written (no closing quote yet), is left plain: never wrong colours on half a token."""

from __future__ import annotations

import html
import re

from wslm.gui.theme import SYNTAX

_PY_KW = ("False None True and as assert async await break class continue def del elif else except finally "
          "for from global if import in is lambda nonlocal not or pass raise return try while with yield match "
          "case self")
_JS_KW = ("break case catch class const continue debugger default delete do else export extends finally for "
          "function if import in instanceof let new return super switch this throw try typeof var void while "
          "with yield async await of true false null undefined interface type enum implements readonly "
          "public private protected as from static get set number string boolean any unknown never")
_SH_KW = ("if then else elif fi for while until do done case esac in function return local export echo cd "
          "sudo apt pip python source exit set unset readonly shift true false")
_C_KW = ("auto break case char const continue default do double else enum extern float for goto if inline int "
         "long register return short signed sizeof static struct switch typedef union unsigned void volatile "
         "while bool true false nullptr class public private protected virtual override template typename "
         "namespace using new delete this const_cast static_cast include define ifdef ifndef endif pragma std "
         "size_t auto constexpr noexcept")
_RS_KW = ("as async await break const continue crate dyn else enum extern false fn for if impl in let loop "
          "match mod move mut pub ref return self Self static struct super trait true type unsafe use where "
          "while Some None Ok Err String Vec Box Option Result i32 i64 u8 u32 u64 usize f32 f64 bool str")
_GO_KW = ("break case chan const continue default defer else fallthrough for func go goto if import interface "
          "map package range return select struct switch type var true false nil iota string int int64 "
          "float64 bool byte rune error make len append new")

_DQ = r'"(?:[^"\\\n]|\\.)*"'
_SQ = r"'(?:[^'\\\n]|\\.)*'"
_NUM = r"\b(?:0[xX][0-9a-fA-F_]+|\d[\d_]*(?:\.\d+)?(?:[eE][+-]?\d+)?)\b"

# language -> (comment patterns, string patterns, keywords)
_LANGS: dict[str, tuple[list[str], list[str], str]] = {
    "python": ([r"#[^\n]*"], [r'"""[\s\S]*?"""', r"'''[\s\S]*?'''", r'[rbfRBF]{0,2}' + _DQ, r'[rbfRBF]{0,2}' + _SQ],
               _PY_KW),
    "js": ([r"//[^\n]*", r"/\*[\s\S]*?\*/"], [_DQ, _SQ, r"`(?:[^`\\]|\\.)*`"], _JS_KW),
    "bash": ([r"(?<![\w$])#[^\n]*"], [_DQ, r"'[^'\n]*'"], _SH_KW),
    "json": ([], [_DQ], "true false null"),
    "c": ([r"//[^\n]*", r"/\*[\s\S]*?\*/"], [_DQ, _SQ], _C_KW),
    "rust": ([r"//[^\n]*", r"/\*[\s\S]*?\*/"], [_DQ], _RS_KW),
    "go": ([r"//[^\n]*", r"/\*[\s\S]*?\*/"], [_DQ, r"`[^`]*`", _SQ], _GO_KW),
}
_ALIASES = {"py": "python", "python3": "python", "javascript": "js", "ts": "js", "typescript": "js", "jsx": "js",
            "tsx": "js", "node": "js", "sh": "bash", "shell": "bash", "zsh": "bash", "console": "bash",
            "cpp": "c", "c++": "c", "cc": "c", "h": "c", "hpp": "c", "cxx": "c", "rs": "rust", "golang": "go",
            "jsonc": "json"}
_COMPILED: dict[str, tuple[re.Pattern, set[str]]] = {}


def language(lang: str) -> str | None:
    """The highlighter for a fence's language tag ("py", "TypeScript", "c++"), None when there is none."""
    key = lang.strip().lower()
    key = _ALIASES.get(key, key)
    return key if key in _LANGS else None


def _pattern(lang: str) -> tuple[re.Pattern, set[str]]:
    if lang not in _COMPILED:
        comments, strings, keywords = _LANGS[lang]
        parts = []
        if comments:
            parts.append(f"(?P<comment>{'|'.join(comments)})")
        parts.append(f"(?P<string>{'|'.join(strings)})")
        parts.append(f"(?P<number>{_NUM})")
        parts.append(r"(?P<word>[A-Za-z_$][\w$]*)(?P<call>(?=\s*\())?")
        _COMPILED[lang] = (re.compile("|".join(parts)), set(keywords.split()))
    return _COMPILED[lang]


def _span(kind: str, text: str) -> str:
    style = f"color:{SYNTAX[kind]};" + (" font-style:italic;" if kind == "comment" else "")
    return f'<span style="{style}">{html.escape(text)}</span>'


def highlight(code: str, lang: str) -> str:
    """`code` as escaped HTML, its tokens coloured for `lang` (plain escaped text for other languages)."""
    key = language(lang)
    if key is None:
        return html.escape(code)
    pattern, keywords = _pattern(key)
    out, pos = [], 0
    for m in pattern.finditer(code):
        out.append(html.escape(code[pos:m.start()]))
        pos = m.end()
        kind = m.lastgroup
        if kind in ("word", "call"):
            word = m.group("word")
            if word in keywords:
                out.append(_span("keyword", word))
            elif m.group("call") is not None and key != "json":
                out.append(_span("function", word))
            else:
                out.append(html.escape(word))
        else:
            out.append(_span(kind, m.group(kind)))
    out.append(html.escape(code[pos:]))
    return "".join(out)
