"""Rank 0's value as the registry keeps it for a reloaded page (``gang.run.value_text``)."""

from __future__ import annotations

from jupyter_mn.gang.run import VALUE_TEXT_MAX, value_text


def test_a_value_is_kept_as_out_would_print_it_and_cut():
    assert value_text("done") == "'done'"
    assert value_text(None) == ""
    assert value_text(list(range(1000))).startswith("[0, 1, 2")
    assert len(value_text("x" * 10_000)) <= VALUE_TEXT_MAX


def test_a_credential_is_never_kept_as_text():
    token = "hf_" + "Qw3" * 12
    for value in (token, token.encode(), {"api_key": token}, ["postgres://me:hunter2@db/x"]):
        assert value_text(value) == "<hidden: it looks like a credential>"
        assert token not in value_text(value)
