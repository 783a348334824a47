"""A usage error is one line and exit 2, and names the help of the command that was given, whose
``--help`` lists what it takes (not the top-level help, which lists only the commands)."""

from __future__ import annotations

import pytest

from headwise.cli import main


@pytest.mark.parametrize("argv, prog", [
    (["heads", "score", "runs/x", "--bogus"], "headwise heads"),
    (["study", "progression", "--nope", "1"], "headwise study"),
    (["train", "configs/lm-tiny.toml", "--out", "o", "extra"], "headwise train"),
])
def test_an_unknown_argument_names_its_command_s_help(argv, prog, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"{prog}: error: unrecognized arguments: ") and f"(see {prog} --help)" in err, err
