"""Progress output, one mechanism for the converter and the trainer.

On a terminal, Keras' ``Progbar`` redrawn in place on the given stream: keras is already a dependency and its bar
is the one Keras users know from ``model.fit`` (tqdm is installed only as another package's dependency). Elsewhere
(a log file, a pipe), one plain line per update, at most every ``interval`` seconds:
``<label>N/TOTAL [k=v ...] [<unit>s_per_sec=R] elapsed=T eta=T``.

While a bar is drawn its line is open (no newline until the bar reaches its total); ``break_line`` ends it, so
what is written next starts on its own line and the bar redraws below it. ``runtime.logs``' handler calls it
before every log line: a dictionary look-up when no bar is open.
"""
import contextlib
import sys
import time

_open = None  # the stream a bar is drawn on while its line is not ended, else None


def break_line() -> None:
    """Ends an open bar's line, so that what is written next starts on a line of its own."""
    global _open
    if _open is not None:
        stream, _open = _open, None
        stream.write("\n")
        stream.flush()


class Progress:
    """Progress toward ``total`` (steps, images): a bar on a terminal, plain lines otherwise."""

    def __init__(self, total: int, stream=None, *, bar: bool | None = None, label: str = "", unit: str = "step",
                 interval: float = 0.0, start: int = 0, stateful=(), rate: bool = False):
        """``bar``: draw a bar (default: when ``stream`` is a terminal); ``label`` starts a plain line; ``unit``
        names what is counted; ``interval``: the least seconds between plain lines; ``start``: where it starts
        (a resumed run); ``stateful``: values the bar shows as given rather than averaged; ``rate``: plain lines
        show units per second."""
        self.total, self.stream = total, stream or sys.stdout
        self.label, self.unit, self.interval, self.rate = label, unit, interval, rate
        self.started = time.monotonic()
        self._start = start
        self._first = None  # (done, time) of the first update past the start: rates leave start-up out
        self._held = None  # the plain line of the last update when it was held back (interval)
        self._last_line = None
        self.done = start
        if bar is None:
            bar = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.bar = None
        if bar:
            import keras

            self.bar = keras.utils.Progbar(total, stateful_metrics=stateful, unit_name=unit)
            self._draw(start, [])

    def eta(self, done: int, now: float) -> float:
        """Seconds left to ``total`` at the rate since the first update (since the start until there is one)."""
        since_done, since = self._first if self._first and done > self._first[0] else (self._start, self.started)
        if done <= since_done:
            return float("nan")
        return (now - since) / (done - since_done) * max(0, self.total - done)

    def update(self, done: int, values=(), force: bool = False) -> None:
        """``done`` of ``total``; ``values``: (name, value) pairs to show."""
        now = time.monotonic()
        eta = self.eta(done, now)
        if self._first is None and done > self._start:
            self._first = (done, now)
        self.done, values = done, list(values)
        if self.bar is not None:
            self._draw(done, values)
        elif force or self._last_line is None or now - self._last_line >= self.interval:
            self._last_line, self._held = now, None
            print(self._line(done, values, now, eta), file=self.stream, flush=True)
        else:
            self._held = self._line(done, values, now, eta)

    def close(self) -> None:
        """Ends the output: a bar's open line, or the plain line of the last update when it was not written."""
        if self.bar is not None:
            if _open is self.stream:
                break_line()
        elif self._held is not None:
            print(self._held, file=self.stream, flush=True)
            self._held = None

    def _draw(self, done: int, values: list) -> None:
        global _open
        written = _Written(self.stream)
        with contextlib.redirect_stdout(written):  # Progbar writes to sys.stdout
            self.bar.update(done, values)
        if written.any:  # Progbar skips updates closer than 0.05 s; it ends its line at its total
            _open = self.stream if done < self.total else None

    def _line(self, done: int, values: list, now: float, eta: float) -> str:
        parts = [f"{self.label}{done}/{self.total}", *(f"{k}={v:.4g}" for k, v in values)]
        if self.rate:
            since_done, since = self._first if self._first and now - self._first[1] > 0.05 else (self._start,
                                                                                                 self.started)
            seconds = now - since
            parts.append(f"{self.unit}s_per_sec={(done - since_done) / seconds if seconds > 0 else 0.0:.1f}")
        parts += [f"elapsed={duration(now - self.started)}", f"eta={duration(eta)}"]
        return " ".join(parts)


class _Written:
    """``stream``, noting whether anything was written to it."""

    def __init__(self, stream):
        self.stream, self.any = stream, False

    def write(self, text: str) -> int:
        self.any = True
        return self.stream.write(text)

    def __getattr__(self, name):
        return getattr(self.stream, name)


def duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h01m``; ``?`` when unknown."""
    if seconds != seconds or seconds < 0:
        return "?"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
