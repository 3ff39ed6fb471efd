"""The second process of a search (`plan --jobs N`, N >= 2): in a big space it first bounds
half of the family groups (group_order.group_bounds_half, a pure function of the space), then
it prices candidates ahead of the search. Pricing is a pure function of a candidate
(pricing.priced_apart) and the search still decides everything in its own order, so plans and
counts are those of a serial search (docs/search.md)."""

from __future__ import annotations

import gc
import heapq
import multiprocessing
from typing import Callable, NamedTuple

from ..specs.cluster import ClusterSpec
from ..specs.model import ModelSpec
from ..strategy import Strategy
from .pricing import priced_apart
from .space import SearchOptions

# Seconds the helper is given to stop after being told to (it reads the message at once).
HELPER_STOP_S = 1.0


def start_method() -> str:
    """fork where the platform has it (the child starts at once, with the modules loaded)."""
    return "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"


class Served(NamedTuple):
    """What a first task may return: its result, and the function that answers the search's
    requests after it (Helper.ask) from the state the task built."""
    result: object
    serve: Callable


def helper_main(conn, model: ModelSpec, cluster: ClusterSpec, o: SearchOptions, task=None) -> None:
    """The helper process (Helper): its first task, (function, arguments) or None, whose result
    goes back (None if it fails), then candidates priced as they come (pricing.priced_apart)
    and the search's requests answered (None if that fails: the search does the work) until
    told to stop."""
    gc.disable()
    serve = None
    try:
        if task is not None:
            fn, args = task
            try:
                got = fn(*args)
            except Exception:   # the search does the task itself
                got = None
            if isinstance(got, Served):
                got, serve = got
            conn.send(("task", got))
        conn.send(("ready", None))
        while True:
            s = conn.recv()
            if s is None:
                break
            if isinstance(s, Strategy):
                conn.send(("priced", s, priced_apart(model, cluster, s, o.uneven_chunks, not o.allow_tight)))
                continue
            try:
                got = serve(s[1])
            except Exception:   # (or its first task built no serve): the search does the work
                got = None
            conn.send(("answer", got))
    except (EOFError, OSError, KeyboardInterrupt):
        pass
    finally:
        conn.close()


class Helper:
    """A second process for a search (o.jobs >= 2): a first task (a half of the group bounds),
    then candidates priced ahead of the search. The search offers it the candidates it queued
    again and, while it is idle, those at the head of its queue; with none in hand the helper
    takes the cheapest-bounded of them that the search does not take next. When the search
    comes to price a candidate it takes the helper's result, pricing the next one pending
    itself while the helper finishes it, or prices it itself. Pricing is a
    pure function of the candidate, and the search decides in its own order as before, so the
    plans and counts are those of a serial search; only the time differs. Anything that stops
    the helper (no process can be started, it fails or dies) leaves the search to do its work
    itself, with the same result."""

    def __init__(self, proc, conn):
        self.proc, self.conn = proc, conn
        self.alive = True
        self.ready = False           # the helper takes candidates (its first task is done)
        self.task_result = None      # what its first task returned
        self.answers: list = []      # its answers to the search's requests (ask), in order
        self.open = 0                # requests asked and not answered yet
        self.pending: list = []      # (bound, tie, strategy): candidates it may price
        self.in_hand = None          # the candidate it is pricing
        self.results: dict = {}      # strategy -> priced_apart's result
        self.mine: set = set()       # candidates the search priced itself
        self.taken = 0               # results the search used (its report)
        self.kth = float("inf")      # the K-th best plan as of the last feed

    @classmethod
    def start(cls, model: ModelSpec, cluster: ClusterSpec, o: SearchOptions, task=None) -> "Helper | None":
        """The helper, or None when no process can be started. `task`: (function, arguments) it
        runs first (module-level, so a spawned process can take it), its result read with
        `first_result`."""
        try:
            method = start_method()
            ctx = multiprocessing.get_context(method)
            here, there = ctx.Pipe()
            proc = ctx.Process(target=helper_main, daemon=True, args=(there, model, cluster, o, task))
            proc.start()
        except (OSError, AssertionError, ValueError):   # e.g. inside a daemonic process
            return None
        there.close()
        return cls(proc, here)

    def receive(self, block: bool) -> None:
        """Read what the helper sent (with `block`, at least one message)."""
        try:
            while self.alive and (block or self.conn.poll()):
                block = False
                kind, *rest = self.conn.recv()
                if kind == "task":
                    self.task_result = rest[0]
                elif kind == "answer":
                    self.answers.append(rest[0])
                elif kind == "ready":
                    self.ready = True
                else:
                    s, got = rest
                    self.in_hand = None
                    if s not in self.mine:
                        self.results[s] = got
        except (EOFError, OSError):
            self.alive = False
            self.in_hand = None

    def offer(self, bound: float, tie: int, s: Strategy) -> None:
        """A candidate the search queued again (under this bound and tie): it may be priced."""
        heapq.heappush(self.pending, (bound, tie, s))

    def idle(self) -> bool:
        """Whether the helper is waiting for a candidate (alive, past its first task, none in
        hand)."""
        if self.alive:
            self.receive(False)
        return self.alive and self.ready and self.in_hand is None

    def feed(self, kth: float, next_bound: float) -> None:
        """Give the helper a candidate when it has none: the cheapest-bounded one pending that
        can still enter the top K (bound <= kth) and that the search does not take next (bound
        > next_bound, its queue's least: the search prices that one itself meanwhile)."""
        if not self.alive:
            return
        self.kth = kth
        self.receive(False)
        if not self.ready or self.in_hand is not None:
            return
        picked = self._pop_pending(kth, next_bound)
        if picked is None:
            return
        try:
            self.conn.send(picked)
            self.in_hand = picked
        except (OSError, ValueError):
            self.alive = False

    def take(self, s: Strategy, price=None):
        """priced_apart's result for s if the helper priced it (waiting while it prices it),
        else None: the search prices s itself. While the helper prices s, `price` (if given:
        the search's own priced_apart) prices here the next candidate pending, the one the
        helper would have taken after s, rather than wait idle."""
        while self.alive and self.in_hand == s:
            spare = self._spare() if price is not None else None
            if spare is None:
                self.receive(True)
            else:
                self.results[spare] = price(spare)
                self.receive(False)
        got = self.results.pop(s, None)
        if got is None:
            self.mine.add(s)
        else:
            self.taken += 1
        return got

    def _spare(self) -> Strategy | None:
        """The cheapest-bounded candidate pending that neither process has priced or is pricing
        and can still enter the top K (as of the last feed)."""
        return self._pop_pending(self.kth, -float("inf"))

    def _pop_pending(self, kth: float, above: float) -> Strategy | None:
        """Take off the pending queue the cheapest-bounded candidate with a bound in (above,
        kth] that neither process has priced or is pricing; those at or under `above` (the
        search's next entry) stay pending, those priced are dropped, and past kth nothing can
        enter the top K (the K-th best only rarely rises): the queue is cleared."""
        pending, head, picked = self.pending, [], None
        while pending:
            b, tie, s = heapq.heappop(pending)
            if b > kth:
                pending.clear()
                break
            if s == self.in_hand or s in self.mine or s in self.results:
                continue
            if b <= above:
                head.append((b, tie, s))
                continue
            picked = s
            break
        for item in head:
            heapq.heappush(pending, item)
        return picked

    def first_result(self):
        """What its first task returned: None if it had none, failed or died (the search then
        does it itself)."""
        while self.alive and not self.ready:
            self.receive(True)
        return self.task_result

    def ask(self, request) -> bool:
        """Ask the helper for its first task's `serve(request)`, answered after what it was
        given before (answer); False if it cannot be asked."""
        if not (self.alive and self.ready):
            return False
        try:
            self.conn.send(("ask", request))
        except (OSError, ValueError):
            self.alive = False
            return False
        self.open += 1
        return True

    def answer(self):
        """The answer to the oldest request open (waiting for it): None if the helper failed it
        or died (the search then does that work itself)."""
        while self.alive and not self.answers:
            self.receive(True)
        if not self.answers:
            return None
        self.open -= 1
        return self.answers.pop(0)

    def close(self) -> None:
        """Stop the helper: told to, or ended if it is still in a search, pricing or working on
        a request."""
        if self.alive and self.ready and self.in_hand is None and not self.open:
            try:
                self.conn.send(None)
            except (OSError, ValueError):
                pass
            self.proc.join(timeout=HELPER_STOP_S)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join()
        self.conn.close()
