"""The docs-example parser (tests/docs_blocks.py) that tests/integration/test_docs_examples.py runs on."""

from __future__ import annotations

from pathlib import Path

from tests.docs_blocks import (
    MAX_SKIPPED,
    all_blocks,
    commands,
    parse,
    shape_mismatches,
    shown_shape,
    top_level_print_labels,
)


def test_the_docs_markers_hold() -> None:
    blocks = all_blocks()
    assert not [(b.where, b.bad_markers) for b in blocks if b.bad_markers]
    skipped = [b for b in blocks if b.skip is not None]
    assert all(b.skip for b in skipped)  # a reason each
    assert len(skipped) <= MAX_SKIPPED
    assert len([b for b in blocks if b.kind and b.skip is None]) >= 15


def test_markers_and_output_blocks(tmp_path: Path) -> None:
    doc = tmp_path / "x.md"
    doc.write_text("\n".join([
        "<!-- docs-test: skip (needs a cluster manager) -->", "```bash", "spark-submit job.py", "```", "",
        "<!-- docs-test: setup adopt -->", "", "```sh", "offset-ledger pipelines", "```",
        "<!-- docs-test: output -->", "```", "PIPELINE  STATE", "orders    stopped", "```",
        "<!-- docs-test: skip -->", "```python", "pass", "```",
        "```sql", "SELECT 1;", "```",
    ]))
    a, b, out, c, d = parse(doc)
    assert a.skip == "needs a cluster manager" and a.kind == "shell"
    assert b.skip is None and b.setup == "adopt" and b.output_header == ["PIPELINE", "STATE"]
    assert out.kind is None
    assert c.skip is None and c.bad_markers == ["skip"]  # a skip without a reason is refused
    assert d.kind is None  # SQL is not run here


def test_commands_split_continuations_quotes_and_comments() -> None:
    cmds = commands("\n".join([
        "API=http://127.0.0.1:9090",
        "curl -s \"$API/x\"            # {\"orders\": {\"0\": 873340, ...}, \"name\": \"orders\"}",
        "curl -s -X POST \"$API/y\" \\",
        "     -d '{\"a\": 1,",
        "          \"b\": \"# not a comment\"}'   # exit 22: refused",
        "offset-ledger resolve orders",
        "# stdout: {\"orders\":{\"0\":5}}   stderr: one line per finding",
        "echo \"$(python3 -c 'print(1)')\" # x",
    ]))
    assert [c.text.split()[0] for c in cmds] == ["API=http://127.0.0.1:9090", "curl", "curl", "offset-ledger", "echo"]
    assert cmds[2].exit_code == 22 and "# not a comment" in cmds[2].text
    assert shown_shape(cmds[1].shown_json or "") == {"orders": {"0": 873340}, "name": "orders"}
    assert shown_shape(cmds[3].shown_json or "") == {"orders": {"0": 5}}
    assert shape_mismatches({"orders": {"0": 5}, "name": "orders"}, {"orders": {"0": 7}, "name": "orders"}) == []
    assert shape_mismatches({"orders": {"1": 5}, "name": "x"}, {"orders": {"0": 7}, "name": "y"}) == [
        ".orders.1: missing", ".name: 'y' != 'x'"]


def test_top_level_print_labels() -> None:
    src = 'print("plan:", p)\nfor f in fs:\n    print("finding:", f)\nprint(x)\n'
    assert top_level_print_labels(src) == ["plan:"]


def test_console_blocks_split_prompts_from_output() -> None:
    from tests.docs_blocks import console_commands, label_lines

    cmds = console_commands("$ offset-ledger pipelines --no-lag\nPIPELINE  STATE\norders    stopped 3\n$ echo hi\nhi\n")
    assert [c.text for c in cmds] == ["offset-ledger pipelines --no-lag", "echo hi"]
    assert cmds[0].shown_lines == ["PIPELINE  STATE", "orders    stopped 3"]
    assert label_lines(cmds[0].shown_lines) == [["PIPELINE", "STATE"]]  # lines with numbers vary
