"""The one way a count is written with its noun."""

from jupyter_mn.wire.plural import counted


def test_a_count_takes_the_plural_unless_it_is_one():
    assert [counted(n, "rank") for n in (0, 1, 2)] == ["0 ranks", "1 rank", "2 ranks"]
    assert counted(1, "other rank") == "1 other rank" and counted(3, "line") == "3 lines"
