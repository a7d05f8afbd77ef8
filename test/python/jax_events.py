"""JAX's monitoring events for the tests: compiles and traces counted."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import jax


def _unregister(listener: Callable) -> None:
  """jax.monitoring's unregister (jax >= 0.8) or its older private one."""
  unregister = getattr(jax.monitoring, "unregister_event_duration_listener",
                       None)
  if unregister is None:
    from jax._src import monitoring
    unregister = monitoring._unregister_event_duration_listener_by_callback
  unregister(listener)


@contextlib.contextmanager
def duration_events(listener: Callable) -> Iterator[None]:
  """`listener(event, seconds, **kwargs)` hears JAX's duration events
  (traces, lowerings, backend compiles) inside the block."""
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    yield
  finally:
    _unregister(listener)
