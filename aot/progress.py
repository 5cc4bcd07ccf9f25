"""`aotc build`'s progress on stderr: a bar redrawn in place on a terminal; elsewhere (a log, CI)
whole lines, one each time another 5% is done or 30 s have passed, never a carriage return."""
from __future__ import annotations

import sys
import time

LINE_STEP = 0.05  # a line each time this fraction more is done ...
LINE_EVERY_S = 30.0  # ... or this long after the previous line


class Progress:
    def __init__(self, total: int, enabled: bool, stream=None):
        self.stream = stream or sys.stderr
        self.total, self.done, self.enabled = total, 0, enabled and total > 0
        self.tty = self.enabled and _isatty(self.stream)
        self.start = self.last_time = time.perf_counter()
        self.last_done = 0
        if self.tty:
            self._draw()

    def update(self, n: int) -> None:
        self.done += n
        if self.tty:
            self._draw()
        elif self.enabled:
            now = time.perf_counter()
            step = max(1, int(self.total * LINE_STEP))
            if self.done - self.last_done >= step or now - self.last_time >= LINE_EVERY_S or \
                    (self.done == self.total and self.last_done != self.total):
                self._line(now)

    def tick(self) -> None:
        """Called while waiting: a line if LINE_EVERY_S passed with nothing done (off a terminal)."""
        if self.enabled and not self.tty and time.perf_counter() - self.last_time >= LINE_EVERY_S:
            self._line(time.perf_counter())

    def _line(self, now: float) -> None:
        self.last_done, self.last_time = self.done, now
        self.stream.write(f"compiling {self.done}/{self.total} ({100 * self.done // self.total}%) "
                          f"{now - self.start:.0f}s\n")
        self.stream.flush()

    def _draw(self) -> None:
        width = 30
        filled = width * self.done // max(1, self.total)
        elapsed = time.perf_counter() - self.start
        self.stream.write(f"\rcompiling [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
                          f"{elapsed:5.0f}s")
        self.stream.flush()

    def interrupt(self) -> None:
        """End the bar's line before a message (on a terminal)."""
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
            self.tty = self.enabled = False

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
