"""A backend added through the registry alone: `numpyref`, a pure-numpy device kind defined in this
file, is placed by a Plan, trains, is costed by the estimator and ranked by autotune, with no other
file of the package changed."""
from __future__ import annotations

import numpy as np
import pytest

import pearl
from pearl.errors import ConfigError
from pearl.kernels import registry
from pearl.kernels.cpu.sumtree import SumTree
from pearl.kernels.registry import REPLAY_TASKS, Backend


class NumpyRefBackend(Backend):
    """One simulated accelerator whose sum tree is the float64 numpy reference: prioritized
    replay's tasks for the discrete-action algorithms, nothing else."""

    kind = "numpyref"
    platform_keys = {"peak_gflops": True, "memory_bandwidth_gb_s": True}  # an accelerator, no cores
    call_counts = {"insert": 2, "sample": 3, "update_priorities": 2}

    def detect(self) -> list[dict]:
        return [{"id": "numpyref:0", "kind": self.kind, "name": "numpy reference sum tree"}]

    def check(self, device, platform=None, field: str = "device") -> None:
        if device.index != 0:
            raise ConfigError(f"{field}: {device}: no such device (numpyref has numpyref:0)")

    def can_run(self, task: str, workload) -> str | None:
        if task in REPLAY_TASKS and workload.replay_kind == "prioritized" and not workload.continuous:
            return None
        return f"has no {task} kernel for {workload.algo} with {workload.replay_kind} replay"

    def sum_tree(self, device, capacity: int, fanout: int, platform=None):
        return SumTree(capacity, fanout)


ON_NUMPYREF = {task: "numpyref:0" for task in REPLAY_TASKS}
SHORT = dict(replay="prioritized", total_steps=1500, learning_starts=200, hidden=[16, 16], seed=3)

PLATFORM = """name: numpyref_box
devices:
  - {id: cpu, kind: cpu, name: host, cores: 2, clock_mhz: 2600, peak_gflops: 166, memory_bandwidth_gb_s: 20,
     call_overhead_us: 5.0, power_w: {idle: 4, tdp: 12}}
  - {id: numpyref:0, kind: numpyref, name: numpy reference, peak_gflops: 50, memory_bandwidth_gb_s: 10,
     launch_us: 2.0, power_w: {idle: 1, tdp: 5}}
links:
  - {between: [cpu, numpyref:0], kind: host-memory, bandwidth_gb_s: 10, latency_us: 1}
"""


@pytest.fixture
def numpyref():
    backend = registry.register(NumpyRefBackend())
    yield backend
    registry.unregister("numpyref")


@pytest.fixture
def platform_yaml(tmp_path, numpyref):
    path = tmp_path / "numpyref_box.yaml"
    path.write_text(PLATFORM)
    return path


def test_a_plan_on_the_new_backend_trains_like_the_numpy_tree(numpyref):
    plan = pearl.Plan(devices={**pearl.Plan().devices, **ON_NUMPYREF})
    agent = pearl.DQN("CartPole-v1", plan=plan, **SHORT)
    assert type(agent.replay.tree) is SumTree
    summary = agent.train()
    assert summary["env_steps"] == 1500 and summary["updates"] > 0
    # the same tree on the cpu: the same run, weight for weight
    reference = pearl.DQN(config=pearl.config.apply_overrides(agent.config, {"replay.backend": "numpy"}))
    assert type(reference.replay.tree) is SumTree
    reference.train()
    np.testing.assert_array_equal(agent.learner.policy_weights(), reference.learner.policy_weights())


def test_the_placement_rule_asks_the_new_backend(numpyref):
    plan = pearl.Plan(devices={**pearl.Plan().devices, **ON_NUMPYREF})
    with pytest.raises(ConfigError, match=r"plan.devices.insert: numpyref:0 has no insert kernel for dqn with "
                                          r"uniform replay \(uniform replay runs on cpu, cuda:N or server:ADDR, "
                                          r"prioritized replay runs on cpu, cuda:N, fpga:N, numpyref:N, opencl:N or "
                                          r"server:ADDR"):
        pearl.DQN("CartPole-v1", plan=plan, total_steps=1000)
    bad = pearl.Plan(devices={**pearl.Plan().devices, **{t: "numpyref:1" for t in REPLAY_TASKS}})
    with pytest.raises(ConfigError, match=r"plan.devices.sample: numpyref:1: no such device"):
        pearl.DQN("CartPole-v1", plan=bad, **SHORT)


def test_unregistered_kinds_are_refused():
    with pytest.raises(ConfigError, match=r"plan.devices.sample: expected a device .* \(device kinds: cpu, cuda"):
        pearl.Plan(devices={"sample": "numpyref:0"}).check()


def test_the_estimator_costs_the_new_backend(platform_yaml):
    from pearl.config import ExperimentConfig, apply_overrides
    from pearl.estimator.costs import Costs
    from pearl.estimator.model import Candidate, predict
    from pearl.estimator.workload import workload_from_config
    from pearl.platforms import load_platform

    platform = load_platform(platform_yaml)
    assert platform.device("numpyref:0").peak_gflops == 50
    config = apply_overrides(ExperimentConfig(), {"replay.kind": "prioritized"})
    costs = Costs(platform, workload_from_config(config))
    cand = Candidate("prioritized", "numpyref:0", "cpu", "fused", 4, 64)
    for task in REPLAY_TASKS:
        seconds, source = costs.task_seconds(task, cand)
        assert source == "analytic" and seconds > 0
    # the backend's own call counts x its launch cost
    assert costs.task_seconds("sample", cand)[0] >= 3 * 2.0e-6
    prediction = predict(cand, costs)
    assert prediction.steps_per_s > 0 and "numpyref:0" in prediction.utilisation


def test_platform_yaml_takes_the_new_kinds_keys(tmp_path, numpyref):
    from pearl.platforms import load_platform

    path = tmp_path / "bad.yaml"
    path.write_text(PLATFORM.replace("peak_gflops: 50,", "peak_gflops: 50, cores: 8,"))
    with pytest.raises(ConfigError, match=r"devices\[1\].cores: unknown key for a numpyref device"):
        load_platform(path)


def test_autotune_ranks_plans_on_the_new_backend(platform_yaml):
    from pearl.config import ExperimentConfig, apply_overrides

    config = apply_overrides(ExperimentConfig(), {"replay.kind": "prioritized"})
    result = pearl.autotune(config, platform=str(platform_yaml), use_profile=False, envs=[1, 4])
    replay_devices = {p.candidate.replay_device for p in result.ranking.predictions}
    assert "numpyref:0" in replay_devices and "cpu" in replay_devices
