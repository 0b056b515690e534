"""One CLI convention over every `winattn` subcommand, read from its `--help` (as a user meets it).

Repo-addressing commands take a positional REPO_ID defaulting to winattn/window-attention, `--version N` /
`--revision REV` spelled the same, `--endpoint` / `--token`; downloads go to `--local-dir`; help texts use user words
(no Python names, no argparse dest names); exit 1 for failures, 2 for usage.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from winattn.cli import main, make_parser

REPO_COMMANDS = ["publish", "vendor", "info", "verify"]  # commands that address a Hub repository
VERSIONED = ["vendor", "info", "verify"]  # publish's version is build.toml's
INTERNAL_WORDS = re.compile(r"register\(|subparsers|winattn\.\w+\.\w+_\w+|VariantAccepted|VariantRejected|"
                            r"hub_command|repo_root\b|_command\b")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Every (nested) subcommand parser, by its full name ("hub serve")."""
    out = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out[name] = sub
                out.update({f"{name} {k}": v for k, v in _subparsers(sub).items()})
    return out


SUBCOMMANDS = _subparsers(make_parser())


@pytest.fixture(autouse=True)
def _wide_help(monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps at hyphens ("window-\nattention") on narrow terminals


def _help(name: str) -> str:
    return SUBCOMMANDS[name].format_help()


def test_every_expected_subcommand_exists():
    assert {"build", "publish", "keygen", "vendor", "demo", "hub", "hub serve", "info", "verify"} <= set(SUBCOMMANDS)


@pytest.mark.parametrize("name", REPO_COMMANDS)
def test_repo_commands_take_a_positional_repo_id_with_the_default(name):
    text = _help(name)
    usage = text.split("\n\n")[0]
    assert re.search(r"\[REPO_ID(\|PATH)?\]\s*$", usage.strip()), usage
    assert "default: winattn/window-attention" in " ".join(text.split())
    assert "--repo " not in text and "--repo\n" not in text  # no second spelling in help
    assert "--endpoint URL" in text and "--token TOKEN" in text
    assert SUBCOMMANDS[name].parse_args([]).repo_id in (None, "winattn/window-attention")


@pytest.mark.parametrize("name", VERSIONED)
def test_version_and_revision_read_the_same_everywhere(name):
    text = _help(name)
    assert "--version N | --revision REV" in text
    assert "kernel major version, i.e. branch v<N> (default: 1)" in " ".join(text.split())
    args = SUBCOMMANDS[name].parse_args([])
    assert (args.version, args.revision) == (None, None)  # default resolved to 1 by winattn.cli_args


def test_downloads_go_to_local_dir():
    text = _help("vendor")
    assert "--local-dir DIR" in text and "--out" not in text


@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_help_is_in_user_words(name):
    text = _help(name)
    assert not INTERNAL_WORDS.search(text), INTERNAL_WORDS.search(text).group(0)
    sub = SUBCOMMANDS[name]
    for action in sub._actions:
        if action.help is argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
            continue
        assert action.help, f"winattn {name}: {action.dest} has no help"


def test_winattn_version_and_usage_exit_codes(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and re.fullmatch(r"winattn \S+\n", capsys.readouterr().out)
    for argv in ([], ["hub"], ["info", "--version", "x"], ["publish", "not a repo id"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2, argv
    err = capsys.readouterr().err
    assert "hub_command" not in err and "required: COMMAND" in err


def test_unreachable_hub_is_one_line_naming_the_endpoint_and_the_fix(tmp_path):
    """info, verify, vendor and publish with nothing listening: one line, exit 1, endpoint and what to do."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    url = f"http://127.0.0.1:{port}"
    for argv in (["info"], ["verify"], ["vendor", "--local-dir", str(tmp_path / "v")]):
        r = subprocess.run([sys.executable, "-m", "winattn", *argv, "--endpoint", url], capture_output=True,
                           text=True, timeout=120, env=_env(tmp_path))
        assert r.returncode == 1, (argv, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
        assert lines[0].startswith(f"winattn {argv[0]}: error: ") and url in lines[0]
        assert "winattn hub serve" in lines[0] and "--endpoint" in lines[0]
        if argv[0] != "vendor":
            assert "HF_HUB_OFFLINE=1" in lines[0]


def test_an_argument_that_is_neither_a_directory_nor_a_repo_id_is_one_line(tmp_path):
    for cmd in ("info", "verify"):
        r = subprocess.run([sys.executable, "-m", "winattn", cmd, "no-such-thing"], capture_output=True, text=True,
                           timeout=120, env=_env(tmp_path))
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.strip() == (f"winattn {cmd}: error: no-such-thing: no such directory, and not a Hub repo id "
                                    f"(ORG/NAME, e.g. winattn/window-attention)")


def _env(tmp_path):
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "KERNELS_"))}
    env["HF_HOME"] = str(tmp_path / "hf")
    return env


def test_hub_serve_with_a_port_out_of_range_is_a_usage_error(tmp_path):
    from winattn.errors import HubProtocolError
    from winattn.hub import HubServer

    r = subprocess.run([sys.executable, "-m", "winattn", "hub", "serve", "--port", "99999", "--root",
                        str(tmp_path / "store")], capture_output=True, text=True, timeout=120, env=_env(tmp_path))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "argument --port: '99999' is not a TCP port (0 to 65535" in r.stderr
    with pytest.raises(HubProtocolError, match="cannot listen on 127.0.0.1:99999"):
        HubServer(tmp_path / "store2", port=99999).start()


def test_a_reader_that_leaves_early_stops_the_command_quietly(tmp_path, built_variant):
    """`winattn verify DIR | head -1`: the pipe closes before the report is written; no BrokenPipeError traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "winattn", "verify", str(built_variant)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=_env(tmp_path))
    proc.stdout.close()  # the reader is gone before the command prints anything
    _, err = proc.communicate(timeout=120)
    assert "Traceback" not in err.decode() and "BrokenPipe" not in err.decode(), err.decode()
    assert proc.returncode == 141


def test_publish_says_where_its_version_comes_from(capsys):
    """publish takes no --version / --revision (build.toml names the version): said plainly, not misread as a
    REPO_ID ("'2' is not a Hub repo id")."""
    for argv in (["publish", "--version", "2"], ["publish", "--revision", "v2"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and "not a Hub repo id" not in err, err
        assert f"{argv[1]} is not an option of publish" in err and "build.toml" in err


_DOC_COMMAND = re.compile(r"\bwinattn ((?:hub )?[a-z]+)\b([^`#\n]*)")


def _doc_command_flags(text: str):
    """(subcommand, flag) for each `--flag` written after `winattn SUBCOMMAND` on one line of `text` (up to a
    backtick or a shell comment)."""
    for m in _DOC_COMMAND.finditer(text):
        if m.group(1) not in SUBCOMMANDS:
            continue
        for token in m.group(2).split():
            flag = token.strip("[](),.;").split("=")[0]
            if flag.startswith("--"):
                yield m.group(1), flag


def test_the_docs_and_the_card_use_only_flags_help_shows():
    """Every `winattn COMMAND --flag` the README, docs/ and the Hub card (CARD.md) write exists and is one `--help`
    shows: hidden spellings kept for old scripts (`vendor --out`, `--repo`) are not taught (the card used them)."""
    from docs.snippets import documents

    root = Path(__file__).resolve().parents[2]
    wrong = []
    for doc in [*documents(root), root / "CARD.md"]:
        for name, flag in _doc_command_flags(doc.read_text()):
            shown = {s for a in SUBCOMMANDS[name]._actions if a.help is not argparse.SUPPRESS for s in a.option_strings}
            if flag not in shown:
                wrong.append(f"{doc.name}: winattn {name} {flag}")
    assert not wrong, wrong


def test_hidden_flags_are_found_in_a_doc_line():
    """The scan above sees a hidden flag where a doc would write it (so that its passing means something)."""
    line = "winattn vendor {{repo_id}} --out vendor/ --repo=a/b   # --local-dir in a comment is not read"
    assert list(_doc_command_flags(line)) == [("vendor", "--out"), ("vendor", "--repo")]
