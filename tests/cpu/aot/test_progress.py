"""`aotc build`'s progress (issue 36, item 8): a bar redrawn with carriage returns on a terminal
only; into a log or a pipe, whole lines, at most one per 5% done plus one per 30 s waited."""
import io

from aotc.aot import progress as progress_module
from aotc.aot.progress import Progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_off_a_terminal_a_line_every_5_percent_and_no_carriage_return(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(progress_module.time, "perf_counter", clock)
    log = io.StringIO()
    bar = Progress(1000, True, stream=log)
    for _ in range(1000):
        clock.now += 0.01
        bar.update(1)
    bar.close()
    text = log.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert len(lines) == 20 and lines[-1].startswith("compiling 1000/1000 (100%)"), lines
    assert lines[0].startswith("compiling 50/1000 (5%)")


def test_off_a_terminal_a_slow_build_says_something_every_30_s(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(progress_module.time, "perf_counter", clock)
    log = io.StringIO()
    bar = Progress(588, True, stream=log)
    for _ in range(120):  # ten minutes of five-second waits; one variant done after one minute
        clock.now += 5
        bar.tick()
        if clock.now == 60:
            bar.update(1)
    lines = log.getvalue().splitlines()
    assert len(lines) == 20, lines  # one a 30 s, never one a wait
    assert all(line.startswith("compiling ") for line in lines)


def test_a_small_build_prints_its_end_once():
    log = io.StringIO()
    bar = Progress(3, True, stream=log)
    for _ in range(3):
        bar.update(1)
    bar.close()
    assert log.getvalue().splitlines() == ["compiling 1/3 (33%) 0s", "compiling 2/3 (66%) 0s", "compiling 3/3 (100%) 0s"]


def test_on_a_terminal_the_bar_is_redrawn_in_place():
    term = Terminal()
    bar = Progress(4, True, stream=term)
    for _ in range(4):
        bar.update(1)
    bar.close()
    text = term.getvalue()
    assert text.count("\r") == 5 and text.endswith("\n") and text.count("\n") == 1


def test_quiet_prints_nothing():
    for stream in (io.StringIO(), Terminal()):
        bar = Progress(10, False, stream=stream)
        bar.update(10)
        bar.tick()
        bar.close()
        assert stream.getvalue() == ""
