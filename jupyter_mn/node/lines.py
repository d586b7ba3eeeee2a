"""The line a rank is writing, as a terminal would show it: ``\\r`` redraws it, its size is capped.

Progress bars (tqdm, rich, Keras) redraw one line with ``\\r`` and end it with ``\\n`` only when
done, and a rank may write megabytes without any newline. So the unfinished line is kept the way
a terminal keeps it, as what is visible (a ``\\r`` moves the cursor back and later text overwrites
earlier text), never as everything written: its memory is bounded by ``limit`` characters, the
head of the line is kept, and what was cut is counted and said when the line ends
(docs/architecture.md, "Progress bars and live output").
"""

from __future__ import annotations


class LineBuffer:
    """One stream's unfinished line: ``write`` text without ``\\n``, ``take`` it when it ends."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._chars: list[str] = []
        self._col = 0
        #: characters written past ``limit`` on this line (not kept)
        self.cut = 0
        #: a ``\\r`` was written: the line was redrawn at least once
        self.redrawn = False

    def write(self, text: str) -> None:
        """Append ``text`` (no ``\\n`` in it) at the cursor; ``\\r`` returns the cursor home,
        ``\\b`` moves it back one (Keras's progress bar backs over its last one)."""
        first, *rest = text.split("\r")
        self._back(first)
        for piece in rest:
            self._col, self.redrawn = 0, True
            self._back(piece)

    def _back(self, piece: str) -> None:
        first, *rest = piece.split("\b")
        self._put(first)
        for part in rest:
            self._col, self.redrawn = max(0, self._col - 1), True
            self._put(part)

    def _put(self, piece: str) -> None:
        if not piece:
            return
        room = self.limit - self._col
        kept = piece[:room] if room > 0 else ""
        self.cut += len(piece) - len(kept)
        if kept:
            self._chars[self._col : self._col + len(kept)] = kept
            self._col += len(kept)

    @property
    def empty(self) -> bool:
        return not self._chars and not self.cut

    def visible(self) -> str:
        """What a terminal shows of the line now (a redrawn line without its trailing padding)."""
        text = "".join(self._chars)
        return text.rstrip() if self.redrawn else text

    def take(self) -> str:
        """The finished line (with a note of what was cut, if anything); the buffer starts over."""
        text = self.visible()
        if self.cut:
            text += (
                f" … [jupyter_mn: {self.cut:,} more characters of this line were cut; "
                f"a line keeps its first {self.limit:,}]"
            )
        self._chars, self._col, self.cut, self.redrawn = [], 0, 0, False
        return text
