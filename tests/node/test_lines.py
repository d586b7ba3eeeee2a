"""The line a rank is still writing, kept as a terminal shows it and bounded in size."""

from __future__ import annotations

from jupyter_mn.node.lines import LineBuffer


def test_a_carriage_return_redraws_the_line_and_later_text_overwrites_earlier():
    line = LineBuffer(100)
    line.write("\r 10%|#         |")
    line.write("\r 50%|#####     |")
    assert line.visible() == " 50%|#####     |"
    line.write("\rdone")
    assert line.visible() == "done|#####     |"  # a terminal keeps what was not overwritten
    line.write("\r" + " " * 20 + "\r")  # tqdm(leave=False) clears its bar
    assert line.visible() == "" and line.take() == ""


def test_a_crlf_line_keeps_its_text():
    line = LineBuffer(100)
    line.write("windows line\r")
    assert line.take() == "windows line"
    assert line.empty


def test_a_line_without_a_newline_keeps_its_head_and_says_what_was_cut():
    line = LineBuffer(10)
    for _ in range(1000):
        line.write("y" * 1000)
    assert line.visible() == "y" * 10
    assert line.cut == 999_990
    text = line.take()
    assert text.startswith("y" * 10 + " … [jupyter_mn: 999,990 more characters")
    assert "a line keeps its first 10]" in text
    assert line.empty and line.take() == ""


def test_a_redraw_after_the_cap_overwrites_the_kept_head():
    line = LineBuffer(5)
    line.write("abcdefgh\rXY")
    assert line.visible() == "XYcde"
    assert line.take().startswith("XYcde … [jupyter_mn: 3 more")


def test_backspaces_move_the_cursor_back_as_keras_redraws_its_bar():
    line = LineBuffer(100)
    line.write("1/4 [=====>....]")
    line.write("\b" * 16 + "\r2/4 [==========]")
    assert line.take() == "2/4 [==========]"
