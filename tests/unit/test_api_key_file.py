"""The ``--api-key-file`` format the README documents: one key per line, whitespace around a key
dropped, blank lines skipped, every other line a key (no comments), a file without keys refused."""
from __future__ import annotations

import pytest

from orchestrator.deploy import args_from_cli, build_parser
from orchestrator.errors import ConfigError
from orchestrator.serve.router import hash_api_key


def _keys(tmp_path, text: str) -> list[str]:
    path = tmp_path / "keys.txt"
    path.write_text(text)
    ns = build_parser().parse_args(["--routing-table", "t.json", "--api-key-file", str(path)])
    return args_from_cli(ns)["api_key_sha256"]


def test_one_key_per_line_trimmed_and_blank_lines_skipped(tmp_path):
    assert _keys(tmp_path, "  sk-team-a \n\n\tsk-team-b\n") == [hash_api_key("sk-team-a"), hash_api_key("sk-team-b")]


def test_there_are_no_comments_every_line_is_a_key(tmp_path):
    assert _keys(tmp_path, "# not a comment\n") == [hash_api_key("# not a comment")]


def test_a_file_without_keys_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="holds no keys"):
        _keys(tmp_path, "\n  \n")
