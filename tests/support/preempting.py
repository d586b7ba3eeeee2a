"""An ``on_event`` for preemption tests: it keeps what a cell's run produced and preempts the
gang, once, when rank 0 prints a given line."""

from __future__ import annotations

import time

from jupyter_mn.wire.events import LogLines, Note, Preemption


class PreemptAt:
    """Keeps the notices (and the grace left when each reached the kernel), notes and lines;
    calls ``preempt`` once ``line`` was printed and ``first_notice`` at the first notice."""

    def __init__(self, line: str) -> None:
        self.line, self.sent_at = line, 0.0
        self.notices: list[Preemption] = []
        self.left: list[float] = []
        self.notes: list[str] = []
        self.lines: list[str] = []

    def preempt(self) -> None:
        raise NotImplementedError

    def first_notice(self) -> None:
        """What a test looks at the moment the first notice arrives (nothing by default)."""

    def __call__(self, event: object) -> None:
        if isinstance(event, Preemption):
            self.notices.append(event)
            self.left.append(event.left())
            if len(self.notices) == 1:
                self.first_notice()
        elif isinstance(event, Note):
            self.notes.append(event.text)
        elif isinstance(event, LogLines):
            for _, _, texts in event.items:
                self.lines.extend(texts)
                if not self.sent_at and self.line in texts:
                    self.preempt()
                    self.sent_at = time.monotonic()
