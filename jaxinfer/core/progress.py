"""A transient terminal progress bar (rich): the shape plan's compilation at start, ``generate(use_tqdm=True)``."""

from __future__ import annotations


class ProgressBar:
    """``total`` steps under ``description``; gone from the terminal once closed."""

    def __init__(self, description: str, total: int):
        from rich.progress import Progress

        self._progress = Progress(transient=True)
        self._task = self._progress.add_task(description, total=total)
        self._progress.start()

    def advance(self) -> None:
        self._progress.advance(self._task)

    def close(self) -> None:
        self._progress.stop()
