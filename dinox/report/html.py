"""report.html: the decision's report.md as one self-contained page (plots embedded), for MLflow's artifact
view and for mail. Python-Markdown renders the Markdown; the PNGs become data: URIs so the file stands
alone."""

from __future__ import annotations

import base64
import html
import re
import urllib.parse
from pathlib import Path

import markdown
from markdown.treeprocessors import Treeprocessor

_STYLE = """
body { font: 15px/1.5 system-ui, -apple-system, Segoe UI, sans-serif; max-width: 1100px; margin: 2em auto;
       padding: 0 1em; color: #1a1a1a; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ddd; padding-bottom: .2em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: .8em 0; font-size: 13px; display: block; overflow-x: auto; }
th, td { border: 1px solid #d0d0d0; padding: 4px 8px; text-align: left; vertical-align: top; }
td:last-child { min-width: 16em; }
th { background: #f3f3f3; } tr:nth-child(even) td { background: #fafafa; }
code { background: #f3f3f3; padding: 1px 4px; border-radius: 3px; }
blockquote { border-left: 4px solid #e0a800; background: #fff8e1; margin: 1em 0; padding: .4em 1em; }
img { max-width: 100%; border: 1px solid #eee; }
.verdict-GO { color: #1b7f3b; } .verdict-NO-GO { color: #b3261e; } .verdict-UNSETTLED { color: #b26a00; }
"""


class _DataOnly(Treeprocessor):
    """Links and images only to what a report names itself: a run's name that spells [x](javascript:...) is
    text, not a link."""

    def run(self, root):  # noqa: ANN001, ANN201 - Python-Markdown's interface
        for a in root.iter("a"):
            if urllib.parse.urlsplit(a.get("href", "")).scheme not in ("", "http", "https"):
                a.attrib.pop("href", None)
        for img in root.iter("img"):
            if not re.fullmatch(r"[\w.-]+\.png", img.get("src", "")):
                img.attrib.pop("src", None)


def _to_html(report_md: str) -> str:
    """Python-Markdown without raw HTML: what a store's names carry (<script>, <img onerror=...>) is shown as
    text. Python-Markdown 3 has no safe mode; its HTML preprocessor and inline pattern are taken out instead."""
    md = markdown.Markdown(extensions=["tables", "fenced_code"], output_format="html")
    md.preprocessors.deregister("html_block")
    md.inlinePatterns.deregister("html")
    md.treeprocessors.register(_DataOnly(md), "data_only", 0)
    return md.convert(report_md)


def render_html(report_md: str, verdict: str, folder: Path) -> str:
    """report.md as a page; images named in it are read from `folder` and embedded."""
    body = _to_html(report_md)
    body = re.sub(r'<img alt="([^"]*)" src="([^"]+\.png)"', lambda m: _embedded(m, folder), body)
    body = body.replace("<h1>", f'<h1 class="verdict-{html.escape(verdict)}">', 1)
    # A param's name as a column head may break after its dots and underscores: seven unbroken names
    # (`loader.persistent_workers`) took the width, and the note column beside them wrapped a word a line.
    body = re.sub(r"<th><code>([^<]*)</code></th>", lambda m: f"<th><code>{_breakable(m.group(1))}</code></th>", body)
    head = f'<meta charset="utf-8"><title>dinox decision: {html.escape(verdict)}</title><style>{_STYLE}</style>'
    return f'<!DOCTYPE html>\n<html lang="en"><head>{head}</head>\n<body>\n{body}\n</body></html>\n'


def _breakable(name: str) -> str:
    """An escaped name with a break opportunity after each dot and underscore."""
    return re.sub(r"([._])", r"\1<wbr>", name)


def _embedded(match: re.Match, folder: Path) -> str:
    alt, name = match.group(1), match.group(2)
    path = folder / Path(name).name
    if not path.is_file():
        return match.group(0)
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{alt}" src="data:image/png;base64,{data}"'
