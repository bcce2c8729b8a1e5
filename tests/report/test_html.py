"""report.html as a reader sees it: a wide table of params stays readable."""

from __future__ import annotations

from dinox.report.html import render_html


def test_a_param_s_column_head_breaks_at_its_dots_and_a_wide_table_scrolls_in_its_box(tmp_path):
    """The ladder's report (`dinox decide --shrunk` on specs/resnet50_ladder.yaml, seven params varied): the
    unbroken heads (`loader.persistent_workers`) took the width, and the note column beside them wrapped one
    word a line, rows hundreds of pixels tall (seen in headless Chromium, 2026-12-01)."""
    md = "# x\n\n| `loader.persistent_workers` | `a<b>.c` | note |\n|---|---|---|\n| True | 1 | tied, leads |\n"
    page = render_html(md, "GO", tmp_path)
    assert "<th><code>loader.<wbr>persistent_<wbr>workers</code></th>" in page
    assert "<th><code>a&lt;b&gt;.<wbr>c</code></th>" in page  # escaped first: a name's markup stays text
    assert "overflow-x: auto" in page and "td:last-child { min-width: 16em; }" in page
