"""What the supervisor says about its workers' LLM endpoint: waiting, refused, serving again.

Workers publish their endpoint state (``arena.llm.outage``); the supervisor reads it each tick.
An outage is reported once when it starts and once when it ends. An endpoint that refuses the
request itself (HTTP 401/403: credentials; 404: URL or model) will not heal by waiting for a
batch run: ``--until-drained`` stops with that one clear error instead of waiting for its timeout.
Nothing is dead-lettered either way: the records stay in their topics for the next run.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from arena.llm.outage import EndpointState, read_states


class EndpointWatch:
    """Reads the workers' endpoint states; prints changes once."""

    def __init__(self, home: Path, console: Console) -> None:
        self.home = home
        self.console = console
        self._reported: dict[int, str] = {}
        """Per worker pid: the state last printed ('waiting' or 'up')."""

    def waiting(self) -> list[EndpointState]:
        """Workers waiting for their endpoint now (each change printed once)."""
        states = read_states(self.home)
        for state in states:
            if self._reported.get(state.pid, "up") == state.state:
                continue
            self._reported[state.pid] = state.state
            if state.state == "waiting":
                self.console.print(
                    f"[yellow]{state.stage}: waiting for LLM endpoint {state.endpoint}[/yellow] ({state.reason}); "
                    "nothing is dead-lettered, it resumes when the endpoint answers"
                )
            else:
                self.console.print(
                    f"[green]{state.stage}: LLM endpoint {state.endpoint} answers again[/green]"
                )
        return [s for s in states if s.state == "waiting"]

    @staticmethod
    def refused(waiting: list[EndpointState]) -> EndpointState | None:
        """A waiting worker whose endpoint refuses the requests themselves (will not heal by waiting)."""
        return next((s for s in waiting if s.rejected), None)
