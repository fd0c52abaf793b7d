"""Step plans, the Poisson pacer (cumulative schedule, no drift) and the shape's ticks."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats

from spectest.loadgen.options import SpecOptions
from spectest.loadgen.shapes import PoissonPacer, SpecShape, plan_steps, step_at


def test_stepped_concurrency_plan():
    plan = plan_steps(SpecOptions(steps=(1, 2, 4), step_time=10), None, None)
    assert [(s.users, s.rate, s.start_s, s.end_s) for s in plan] == [
        (1, None, 0, 10), (2, None, 10, 20), (4, None, 20, 30)]
    assert step_at(plan, 0).users == 1 and step_at(plan, 19.99).users == 2
    assert step_at(plan, 30) is None


def test_rate_plan_uses_the_user_pool_and_run_time_cuts_it_short():
    plan = plan_steps(SpecOptions(request_rates=(2.0, 8.0), step_time=10, max_users=32), None, 15)
    assert [(s.users, s.rate, s.end_s) for s in plan] == [(32, 2.0, 10), (32, 8.0, 15)]


def test_plain_plan_is_locust_users_until_run_time_or_forever():
    assert plan_steps(SpecOptions(), 6, None)[0].users == 6
    assert plan_steps(SpecOptions(), 6, None)[0].end_s == math.inf
    assert plan_steps(SpecOptions(), None, 20)[0].end_s == 20


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_pacer_is_poisson_at_the_asked_rate():
    pacer = PoissonPacer(seed=1, clock=FakeClock())
    pacer.start(50.0, origin=0.0)
    t = np.array([pacer.next_arrival() for _ in range(20000)])
    gaps = np.diff(np.concatenate([[0.0], t]))
    assert len(t) / t[-1] == pytest.approx(50.0, rel=0.03)
    assert stats.kstest(gaps, "expon", args=(0, 1 / 50)).pvalue > 0.001


def test_pacer_schedule_does_not_drift_when_consumers_are_late():
    """Arrival k is origin + sum of k gaps, however late each request is actually taken."""
    on_time, late = FakeClock(), FakeClock()
    a, b = PoissonPacer(seed=2, clock=on_time), PoissonPacer(seed=2, clock=late)
    a.start(10.0, origin=0.0)
    b.start(10.0, origin=0.0)
    for _ in range(1000):
        t_a, t_b = a.next_arrival(), b.next_arrival()
        late.now = t_b + 0.25  # every request in b goes out 250 ms late
        assert t_a == t_b
    assert t_b == pytest.approx(100.0, rel=0.1)


def test_pacer_closed_loop_and_step_change():
    pacer = PoissonPacer(seed=0, clock=FakeClock())
    pacer.start(None)
    assert pacer.next_arrival() is None
    pacer.start(4.0, origin=500.0)
    assert pacer.next_arrival() > 500.0


class FakeRun:
    def __init__(self, plan, ok=True):
        self._plan, self.ok = plan, ok
        self.active = self.aborted = self.stop_requested = False
        self.steps = []

    def ensure_started(self):
        self.active, self.aborted = self.ok, not self.ok
        return self.ok

    def plan(self):
        return self._plan

    def on_step(self, step):
        self.steps.append(step.index)


def shape_with(run):
    shape = SpecShape()
    shape.runner = SimpleNamespace(environment=SimpleNamespace(spectest=run))
    return shape


def test_shape_reports_each_step_once_and_stops_after_the_last():
    run = FakeRun(plan_steps(SpecOptions(steps=(1, 3), step_time=10), None, None))
    shape = shape_with(run)
    shape.get_run_time = lambda: 0.5
    assert shape.tick() == (1, 1.0) and shape.tick() == (1, 1.0)
    shape.get_run_time = lambda: 12.0
    assert shape.tick() == (3, 3.0)
    shape.get_run_time = lambda: 20.0
    assert shape.tick() is None
    assert run.steps == [0, 1]


def test_shape_stops_when_the_run_cannot_start():
    run = FakeRun(plan_steps(SpecOptions(steps=(1,)), None, None), ok=False)
    assert shape_with(run).tick() is None and run.steps == []


def test_shape_ends_the_test_when_the_run_asks_to_stop():
    run = FakeRun(plan_steps(SpecOptions(), 4, None))
    shape = shape_with(run)
    shape.get_run_time = lambda: 1.0
    assert shape.tick() == (4, 4.0)
    run.stop_requested = True  # e.g. the server has been unreachable for too long
    assert shape.tick() is None
