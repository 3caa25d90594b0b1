"""The thread controller (models/runtime/threads.py): its decisions on fake clocks, and off when the user fixed the count."""
from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

from gatherlens.models.runtime import threads
from gatherlens.models.runtime.threads import MachineClock, ThreadConfig, ThreadControl


class Fake:
    """Fake clocks: wall time, this process's CPU time, the machine's idle core-seconds; the counts set."""

    def __init__(self, free: float = 2.0):
        self.t, self.cpu_s, self.idle, self.free, self.counts = 0.0, 0.0, 0.0, free, []

    def read(self):
        return self.t, self.idle, 0.0   # idle already holds what we used (free cores = idle / wall)

    def control(self, top: int = 2, config: ThreadConfig = ThreadConfig(policy="trial"), **kw) -> ThreadControl:
        self.t = 1.0                     # the model loaded for a second before the prompt
        self.idle = self.free
        machine = MachineClock(read=self.read)
        machine.mark = (0.0, 0.0, 0.0)
        return ThreadControl(top, config, clock=lambda: self.t, cpu=lambda: self.cpu_s, machine=machine,
                             set_threads=self.counts.append, get_threads=lambda: (self.counts or [top])[-1], **kw)

    def run(self, control: ThreadControl, steps: int, speed) -> None:
        """`steps` steps; speed(n) -> (wall seconds of a step on n threads, CPU / (n x wall))."""
        for _ in range(steps):
            control.before_step()
            wall, ratio = speed(control.n)
            self.t += wall
            self.cpu_s += ratio * control.n * wall
            self.idle += self.free * wall
            control.after_step()


def quiet(n):        # 2 threads: 10 ms a step, 1 thread: 17 ms; no preemption
    return {1: 0.017, 2: 0.010}[n], 1.0


def busy(n):         # a busy loop on one core: 2 threads wait for each other (40 ms), 1 thread 18 ms
    return {1: 0.018, 2: 0.040}[n], {1: 1.0, 2: 0.5}[n]


def test_quiet_machine_keeps_every_thread_and_never_touches_torch():
    fake = Fake(free=2.0)
    control = fake.control()
    fake.run(control, 200, quiet)
    control.finish()
    assert control.n == 2 and fake.counts == [] and control.decisions == []


def test_busy_machine_prefills_and_decodes_on_the_free_core_without_probing():
    fake = Fake(free=1.0)   # another program took one of the two cores before we started
    control = fake.control()
    fake.run(control, 100, busy)
    assert fake.counts == [1] and control.decisions == [(0, 2, 1, "free cores")]  # the machine shows no room
    control.finish()
    assert fake.counts == [1, 2]   # torch's count back as it was


def test_a_busy_core_arriving_midway_drops_a_thread_and_its_leaving_brings_it_back():
    fake = Fake(free=2.0)
    control = fake.control()
    fake.run(control, 20, quiet)
    fake.free = 1.0
    fake.run(control, 20, busy)
    assert control.n == 1 and [d[3].split(" ")[0] for d in control.decisions] == ["trial", "trial"]
    assert control.decisions[0][3].startswith("trial (cpu/wall") and control.decisions[1][3] == "trial won"
    fake.free = 2.0
    fake.run(control, 40, quiet)
    assert control.n == 2 and control.decisions[-1][3] == "trial won" and fake.counts == [1, 2]


def test_a_lost_trial_is_cut_short_and_the_next_waits_twice_as_long():
    fake = Fake(free=2.0)
    config = ThreadConfig(policy="trial", window=4, probe_every=16)
    control = fake.control(config=config)
    slow_alone = lambda n: ({1: 0.100, 2: 0.030}[n], {1: 1.0, 2: 0.6}[n])  # noqa: E731  preempted, yet 2 win
    fake.run(control, 1 + 4, slow_alone)                  # the prefill, a window: the trial starts
    assert control.n == 1
    fake.run(control, 1, slow_alone)                      # 100 ms: not yet over the window's 4 x 30 ms
    assert control.n == 1
    fake.run(control, 1, slow_alone)                      # 200 ms: it cannot win any more, cut short
    assert control.n == 2 and control.decisions[-1][3] == "trial lost"
    lost_at = control.decisions[-1][0]
    fake.run(control, 60, slow_alone)
    trials = [d[0] for d in control.decisions if d[3].startswith("trial (")]
    assert trials[1] - lost_at >= 2 * config.probe_every and control.n == 2


def test_without_proc_stat_the_prefill_keeps_torchs_count_and_probes_go_ahead():
    fake = Fake(free=2.0)
    control = ThreadControl(2, ThreadConfig(policy="trial"), clock=lambda: fake.t, cpu=lambda: fake.cpu_s,
                            machine=MachineClock(read=lambda: None), set_threads=fake.counts.append,
                            get_threads=lambda: (fake.counts or [2])[-1])
    fake.run(control, 1, busy)
    assert fake.counts == []
    fake.run(control, 30, busy)
    assert control.n == 1
    fake.free = 0.0
    fake.run(control, 40, quiet)   # no machine to ask: the probe runs and wins
    assert control.n == 2


@pytest.mark.parametrize("how", ["fixed", "env", "not the cpu", "one thread"])
def test_off_means_no_change_ever(how, monkeypatch):
    fake = Fake(free=1.0)
    monkeypatch.setattr(threads, "_FIXED", [how == "fixed"])
    if how == "env":
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
    else:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    on = threads.ThreadControl.start(on=how != "not the cpu").on
    control = fake.control(top=1 if how == "one thread" else 2, on=on)
    fake.run(control, 100, busy)
    control.finish()
    assert fake.counts == [] and control.decisions == []


def test_generate_with_threads_never_changes_the_count(tmp_path, monkeypatch):
    from test_generate import PROMPT, tiny_llama_folder

    from gatherlens.commands.generate import generate

    tiny = tiny_llama_folder(tmp_path / "tiny-llama")
    monkeypatch.setattr(threads, "_FIXED", [False])
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before, calls = torch.get_num_threads(), []
    monkeypatch.setattr(torch, "set_num_threads", lambda n: calls.append(n))
    controls = []
    monkeypatch.setattr(ThreadControl, "finish", lambda self: controls.append(self))
    res = CliRunner().invoke(generate, [PROMPT, "--model", str(tiny), "--max-new-tokens", "12", "--threads", "1"])
    assert res.exit_code == 0, res.output
    assert calls == [1] and controls and not any(c.on for c in controls)
    monkeypatch.undo()
    torch.set_num_threads(before)


def spinning(n):     # a busy loop on one core, our waiting thread spinning: CPU / (n x wall) stays high
    return {1: 0.018, 2: 0.040}[n], {1: 1.0, 2: 0.85}[n]


@pytest.mark.parametrize("policy", ["follow", "one"])
def test_follow_drops_to_the_free_core_and_comes_back(policy):
    """Must hold (issue 40): "follow" / "one" set the count from the cores the machine leaves free, within
    min_span seconds of a busy loop starting or ending, even while our waiting thread spins (CPU /
    (threads x wall) 0.85: the "trial" policy's signal, which never saw the busy core)."""
    fake = Fake(free=2.0)
    control = fake.control(config=ThreadConfig(policy=policy))
    fake.run(control, 40, quiet)
    assert control.n == 2 and fake.counts == []
    fake.free = 1.0
    fake.run(control, 40, spinning)                 # 40 x 40 ms: past min_span
    assert control.n == 1 and fake.counts == [1]
    fake.free = 2.0
    fake.run(control, 40, quiet)
    assert control.n == 2 and fake.counts == [1, 2]
    trial = fake.control(config=ThreadConfig(policy="trial"))
    fake.free = 2.0
    fake.run(trial, 20, quiet)
    fake.free = 1.0
    fake.run(trial, 60, spinning)
    assert trial.n == 2                             # what the old default did: 0.22x its quiet speed


def test_follow_leaves_the_count_alone_near_the_boundary_and_one_drops_on_any_load():
    """Must hold: "follow" keeps n while the free cores round to n (another program's short bursts) and
    takes one more only past n + 0.5 + hysteresis; on 4 cores with 3.2 free it takes 3, "one" takes 1."""
    fake = Fake(free=1.7)                           # 0.3 of a core taken now and then: stay on 2
    control = fake.control(config=ThreadConfig(policy="follow"))
    fake.run(control, 40, quiet)
    assert control.n == 2 and fake.counts == []
    fake = Fake(free=1.4)                           # 0.6 of a core taken: down to 1; 1.8 free: not yet up
    control = fake.control(config=ThreadConfig(policy="follow"))
    fake.run(control, 40, quiet)
    fake.free = 1.8
    fake.run(control, 40, quiet)
    assert control.n == 1 and fake.counts == [1]
    for policy, n in (("follow", 3), ("one", 1)):
        fake = Fake(free=3.2)
        control = fake.control(top=4, config=ThreadConfig(policy=policy))
        fake.run(control, 40, lambda n: (0.010, 1.0))
        assert control.n == n, policy


def test_a_long_prefill_looks_at_the_machine_between_its_chunks():
    """Must hold: a prompt of 3 chunks gives the controller two looks during its prefill (a busy core
    arriving in a 4K prefill is followed from the next 512 tokens on)."""
    from gatherlens.models.runtime.generation import last_logits

    class Model:
        def __call__(self, input_ids, **kw):
            return type("Out", (), {"logits": torch.zeros(1, input_ids.shape[1], 5)})

    looks = []
    last_logits(Model(), None, torch.zeros(1, 1100, dtype=torch.long), chunk=512, between=lambda: looks.append(1))
    assert looks == [1, 1]
