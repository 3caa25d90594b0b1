"""Torch threads that follow the CPUs really free: fewer while other programs take cores, more when they leave.

    >>> control = ThreadControl.start()     # the generation loop's (greedy_tokens); off after fix_threads(n)
    >>> for _ in range(steps):
    ...     control.before_step()           # the prefill first, then one decode step each
    ...     out = model(...)
    ...     control.after_step()
    >>> control.finish()                    # torch's count back as it was

Why: our operators (and torch's) split each call over torch's OpenMP threads and wait at its end
for the slowest. When another program keeps a core busy, one of our threads is preempted for a
whole time slice while the others spin at the barrier: with 2 threads on 2 cores and a busy loop
beside them, decoding ran at 0.27x its quiet speed, slower than on 1 thread; with this controller
at 0.65-0.71x, quiet speed unchanged (scripts/busy_core.py, 512 and 4K tokens). OMP_WAIT_POLICY=
PASSIVE held 1.0x busy but halved quiet decoding; GOMP_SPINCOUNT 1e4 / 1e5 did not help busy.

How, decided from clocks only (a few µs a step):
- the prefill (the first step) runs on the cores the machine left free since the last look
  (/proc/stat's idle time plus this process's own CPU time, over at least `min_span` seconds:
  the model's load, when this module was imported before it; without that, torch's count);
- decode steps: over each window of `window` steps, this process's CPU time against threads x
  wall time says whether our threads wait for a core (under `preempted`): then one thread fewer is
  tried. Every `probe_every` steps below the starting count, one more is tried if the machine
  left a core idle meanwhile (/proc/stat again, read only then). A trial runs
  `window` steps and is kept only if its steps were faster than the window before it (it is cut
  short once it cannot be); a trial that lost doubles the wait for the next (up to `max_wait`).

Off (nothing changes, ever) when the user fixed the count: `fix_threads(n)` (`--threads N`) or
OMP_NUM_THREADS in the environment; or with one thread to start from.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

__all__ = ["ThreadConfig", "DEFAULT_THREADS", "POLICIES", "ThreadControl", "fix_threads", "threads_fixed",
           "MachineClock"]


POLICIES = ("follow", "one", "trial", "off")


@dataclass(frozen=True)
class ThreadConfig:
    """The controller's settings (scripts/busy_core.py compares the policies).

    policy: "follow" (the default): every step (and between prefill chunks) the count is the cores the
    machine left free (idle plus ours, over at least `min_span` s), rounded; down at once (a thread more
    than the free cores waits at every barrier), up only past `hysteresis` more; our own spinning
    threads count as ours, so they cannot hide another program; "one": every thread while the machine
    is otherwise quiet, one while anything else takes a core; "trial": the count follows this process's
    CPU time against threads x wall with timed trials (before issue 40; spinning OpenMP threads keep
    that ratio high, so it missed a busy core); "off": torch's count, never changed.
    $GATHERLENS_THREADS_POLICY chooses one for a run.
    """

    policy: str = "follow"
    hysteresis: float = 0.35    # follow: one thread more only when the free cores reach n + 0.5 + this
    window: int = 4             # steps timed per thread count in a comparison
    probe_every: int = 16       # steps between trials of one thread more
    max_wait: int = 256         # the longest wait between trials after lost ones
    preempted: float = 0.8      # CPU time / (threads x wall) under this: our threads wait for a core
    min_span: float = 0.2       # seconds of machine history the prefill's count needs


def _default_config() -> ThreadConfig:
    policy = os.environ.get("GATHERLENS_THREADS_POLICY", "follow")
    return ThreadConfig(policy=policy if policy in POLICIES else "follow")


DEFAULT_THREADS = _default_config()
_FIXED = [False]


def fix_threads(n: int) -> None:
    """torch.set_num_threads(n), and the controller stays off from now on (the user chose n)."""
    torch.set_num_threads(n)
    _FIXED[0] = True


def threads_fixed() -> bool:
    """Whether the user fixed the thread count (fix_threads, or OMP_NUM_THREADS in the environment)."""
    return _FIXED[0] or bool(os.environ.get("OMP_NUM_THREADS"))


class MachineClock:
    """Cores the machine left free since the last look: /proc/stat's idle time plus our own CPU time.

        >>> clock = MachineClock(); ...; clock.free_cores(0.2)   # None: too short a span, or no /proc
    """

    def __init__(self, read=None):
        self.read = read or _read_machine
        self.mark = self.read()

    @property
    def known(self) -> bool:
        """Whether this machine tells its idle time (/proc/stat)."""
        return self.mark is not None

    def free_cores(self, min_span: float) -> float | None:
        """Free cores (idle + ours) per second since the mark, and the mark moves to now; None when
        unknown or under min_span seconds since the mark (which then stays)."""
        now, before = self.read(), self.mark
        if now is None or before is None or now[0] - before[0] < min_span:
            return None
        self.mark = now
        wall, idle, ours = (a - b for a, b in zip(now, before))
        return (idle + ours) / wall

    def reset(self) -> None:
        """The mark to now (the next span starts here)."""
        self.mark = self.read()


def _read_machine() -> tuple[float, float, float] | None:
    """(wall s, idle core-s of the machine, CPU s of this process), or None without /proc/stat."""
    try:
        with open("/proc/stat", "rb") as f:
            fields = f.readline().split()[1:]
    except OSError:
        return None
    t = os.times()
    return time.perf_counter(), (int(fields[3]) + int(fields[4])) / _TICK, t.user + t.system


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
MACHINE = MachineClock()  # since this module was imported (before a command loads its model)


class ThreadControl:
    """One generation's thread count: `before_step()` / `after_step()` around each forward pass."""

    def __init__(self, top: int, config: ThreadConfig = DEFAULT_THREADS, *, on: bool = True,
                 clock=time.perf_counter, cpu=time.process_time, machine: MachineClock = MACHINE,
                 set_threads=torch.set_num_threads, get_threads=torch.get_num_threads):
        self.top, self.config, self.on = top, config, on and top > 1 and config.policy != "off"
        self.clock, self.cpu, self.machine, self.set_threads = clock, cpu, machine, set_threads
        self.get_threads = get_threads
        self.n, self.step, self.wait, self.next_trial = top, 0, config.probe_every, 0
        self.times: list[float] = []        # this window's step times at n
        self.ratios: list[float] = []       # and their CPU / (n x wall)
        self.trial: tuple[int, float] | None = None   # (the count before, its window's mean step time)
        self.decisions: list[tuple[int, int, int, str]] = []   # (step, from, to, why)
        self.t0 = self.c0 = 0.0

    @classmethod
    def start(cls, config: ThreadConfig = DEFAULT_THREADS, *, on: bool = True) -> "ThreadControl":
        """A controller from torch's current count; off when the user fixed it (or on=False: not the CPU)."""
        return cls(torch.get_num_threads(), config, on=on and not threads_fixed())

    def before_step(self) -> None:
        """Mark the clocks (the first step, the prefill: set its count from the machine's free cores);
        "follow" / "one": every step's count from the cores the machine leaves free."""
        if not self.on:
            return
        if self.get_threads() != self.n:   # a step on another thread (a server's worker pool): OpenMP's count is
            self.set_threads(self.n)       # each thread's own, so this thread gets the controller's count too
        if self.config.policy != "trial":
            self.follow()
            self.t0, self.c0 = self.clock(), self.cpu()
            return
        if self.step == 0:
            free = self.machine.free_cores(self.config.min_span)
            if free is not None:
                self._switch(max(1, min(self.top, int(free + 0.5))), "free cores")
        self.t0, self.c0 = self.clock(), self.cpu()

    def follow(self) -> None:
        """"follow" / "one": the count from the cores free since the last look (idle plus ours, at least
        min_span seconds; else as it is). Also called between the chunks of a long prefill."""
        if not self.on or self.config.policy == "trial":
            return
        free = self.machine.free_cores(self.config.min_span)
        if free is None:
            return
        if self.config.policy == "one":
            n = self.top if free >= self.top - 0.5 else 1
        elif free < self.n - 0.5 or free >= self.n + 0.5 + self.config.hysteresis:   # down at once, up surely
            n = max(1, min(self.top, int(free + 0.5)))
        else:
            n = self.n
        self._switch(n, f"free cores {free:.2f}")

    def after_step(self) -> None:
        """Time the step; switch the count when a window or a trial says so ("trial" only)."""
        if not self.on:
            return
        if self.config.policy != "trial":
            self.step += 1
            return
        wall, cpu = self.clock() - self.t0, self.cpu() - self.c0
        self.step += 1
        if self.step == 1:  # the prefill: not a decode step to compare with
            self.next_trial = self.config.window + 1
            return
        self.times.append(wall)
        self.ratios.append(cpu / (self.n * wall) if wall > 0 else 1.0)
        if self.trial is not None:
            self._judge_trial()
        elif len(self.times) >= self.config.window:
            self._judge_window()

    def _judge_window(self) -> None:
        """A full window at n: try one thread fewer if ours waited for cores, one more if it is time."""
        mean, ratio = _mean(self.times), _mean(self.ratios)
        due = self.step >= self.next_trial
        if due and self.n > 1 and ratio < self.config.preempted:
            self._begin_trial(self.n - 1, mean, f"cpu/wall {ratio:.2f}")
        elif due and self.n < self.top and self._room():
            self._begin_trial(self.n + 1, mean, "probe")
        else:
            self.times, self.ratios = self.times[1:], self.ratios[1:]   # a sliding window

    def _room(self) -> bool:
        """Whether the machine left a core free for one thread more since the last look (unknown: yes)."""
        if not self.machine.known:
            return True
        free = self.machine.free_cores(self.config.min_span)
        if free is None or free < self.n + 0.5:     # too short a span to tell, or no: look again later
            self.next_trial = self.step + (self.config.window if free is None else self.config.probe_every)
        return free is not None and free >= self.n + 0.5

    def _begin_trial(self, n: int, mean: float, why: str) -> None:
        self.trial = (self.n, mean)
        self._switch(n, f"trial ({why})")

    def _judge_trial(self) -> None:
        """Keep the trial's count if its steps beat the window before; cut it short once they cannot."""
        before, mean = self.trial
        window, spent = self.config.window, sum(self.times)
        if spent >= window * mean:          # lost, even if it is not over
            self.trial, self.wait = None, min(2 * self.wait, self.config.max_wait)
            self._switch(before, "trial lost")
        elif len(self.times) >= window:     # won
            self.trial, self.wait = None, self.config.probe_every
            self.decisions.append((self.step, before, self.n, "trial won"))
            self.times, self.ratios = [], []
        else:
            return
        self.next_trial = self.step + self.wait

    def _switch(self, n: int, why: str) -> None:
        if n != self.n:
            self.decisions.append((self.step, self.n, n, why))
            self.set_threads(n)
            self.n = n
        self.times, self.ratios = [], []

    def finish(self) -> None:
        """torch's count back to where it started; the machine's mark to now (the next prefill's span)."""
        if self.on:
            if self.n != self.top:
                self.set_threads(self.top)
            self.machine.reset()


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)
